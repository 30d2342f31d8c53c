"""Node maintenance, placement and scaling on the local cluster (real control plane, the
real kube-scheduler and eviction API, the process kubelet on labelled fake GPU nodes, the
real operator installed by the chart, the real sglang-router in front, CPU stand-in
ranks). One fresh cluster per drill; hard timeouts so a hang fails the test."""

from __future__ import annotations

from typing import Any

import pytest

from lockstep_dev.drills import DrillResult, run_drill


def drill(scenario: str, **kw: Any) -> DrillResult:
    result = run_drill(scenario, **kw)
    print(result.to_json())
    assert result.passed, f"{scenario}: {result.reason}\n{result.to_json()}"
    return result


@pytest.mark.timeout(600)
def test_kubectl_drain_of_a_decode_node_moves_the_group_make_before_break() -> None:
    # The drain completes on its own (the group's disruption budget refuses evictions
    # until the operator has moved it), the group lands whole in one rack elsewhere, it is
    # never out of service and no request through the router fails or hangs.
    r = drill("node-drain")
    m = r.maintenance
    assert m["drain_exit_code"] == 0 and m["node"] not in m["new_nodes"]
    assert len(m["new_racks"]) == 1
    assert m["out_of_service_s"] == 0 and m["requests_failed"] == 0
    assert m["requests_hanging"] == 0 and m["requests_sent"] > 0
    assert m["incident_verdict"] == "Maintenance" and m["restarts"] == [0, 0]
    assert m["epoch"][1] == m["epoch"][0] + 1


@pytest.mark.timeout(900)
def test_kubectl_scale_on_each_role_scales_with_no_request_lost() -> None:
    r = drill("scale")
    assert [s["scaled"] for s in r.scaling] == [[2, 3, 1], [1, 2, 1]]
    for s in r.scaling:
        assert s["requests_to_new_groups_before_admission"] == 0
        assert s["requests_to_removed_groups_after_drain"] == 0
        assert s["requests_failed_so_far"] == 0


@pytest.mark.timeout(900)
def test_a_warm_spare_keeps_capacity_through_a_desync_a_drain_and_a_scale_up_and_none_churns() -> (
    None
):
    # One cluster with no free GPU: the spare takes a desynced group's place within 15 s
    # of the verdict and the broken group becomes the spare; a drained node's group hands
    # over with no moment short of capacity and then waits unplaced creating nothing
    # until the node is back; a scale-up is served by the spare at once.
    r = drill("spares")
    (desync,) = r.steps
    assert desync["verdict_to_full_capacity_s"] <= 3.0
    assert desync["spares_after"] == [desync["group"]] != [desync["spare_before"]]
    assert desync["requests_to_the_group_after_verdict"] == 0 and desync["requests_failed"] == 0
    m = r.maintenance
    assert m["drain_exit_code"] == 0 and m["group_seconds_short"] == 0
    # The moved group could not be placed: withdrawn whole (as the `unplaceable` drill
    # shows on its own), said so, no restart counted, no pod created while waiting.
    assert m["pods_created_while_unplaceable"] == 0 and m["spares_after"] == [m["group"]]
    assert m["schedulable_condition"]["status"] == "False" and m["unschedulable_events"] >= 1
    assert m["restarts"][0] == m["restarts"][1] and m["requests_failed"] == 0
    (scale,) = r.scaling
    assert scale["scale_to_full_capacity_s"] <= 3.0 and scale["new_group"]["spare"]
    # Without a ready spare a drained group waits unplaced, creating nothing, then is back.
    alone = m["without_spare"]
    assert alone["pods_created_while_unplaceable"] == 0 and alone["group_seconds_short"] > 0


@pytest.mark.timeout(900)
def test_an_operator_upgrade_restarts_no_group_and_the_runtime_rolls_only_when_asked() -> None:
    u = drill("upgrade").maintenance["upgrade"]
    assert u["operator_replaced"] and u["groups_restarted"] == [] and u["requests_failed"] == 0
    assert set(u["runtimes_after"].values()) == {"lockstep.local/operator:checkout"}
    assert u["groups_rolled"] == ["decode/0", "decode/1", "prefill/0"]
    assert u["groups_out_at_once_max"] <= 1 and u["requests_failed_in_rollout"] == 0

"""End-to-end incident drills on the local cluster (real control plane, process kubelet,
CPU stand-in SGLang ranks in real gloo groups, the real operator). One fresh cluster per
scenario; each has a hard timeout so a hang fails the test instead of CI.

A desync, a hang, a killed rank, a rank stuck in the kernel and a deleted pod are one
drill through the real router (tests/e2e/test_router_drills.py: one cluster, five
incidents, in place then recreated),
which also judges the requests each incident caught. The concurrent drill is also watched
by a real Prometheus (the chart's alerts and dashboard)."""

from __future__ import annotations

from typing import Any

import pytest

from lockstep_dev.drills import DrillResult, run_drill


def drill(scenario: str, **kw: Any) -> DrillResult:
    result = run_drill(scenario, **kw)
    print(result.to_json())
    assert result.passed, f"{scenario}: {result.reason}\n{result.to_json()}"
    return result


@pytest.mark.timeout(420)
def test_an_agent_that_cannot_answer_escalates_to_recreate_away_from_its_node() -> None:
    # Also: POST /restart without the token (or with a wrong one) is refused, nothing restarts.
    r = drill("agent-down")
    assert r.restart_mode == "Recreate" and r.restarts["decode/0"] == 1
    (incident,) = [i for i in r.incidents if i["role"] == "decode" and i["group"] == 0]
    assert "did not accept the restart" in incident["escalation"]


@pytest.mark.timeout(900)
def test_steps_of_5_to_60_seconds_under_traffic_are_never_restarted() -> None:
    # Default step bounds; each length in turn for two whole steps (the drill checks
    # no incident, no restart and no warning Event per length). CI runs the shortest and
    # the longest length the promise covers (a longer step only keeps the probe failing
    # longer, judged by the same bound); `lockstep dev drill --scenario slow` runs all
    # four (5, 15, 30 and 60 s).
    r = drill("slow", slow_steps=(5.0, 60.0))
    assert [f["step_s"] for f in r.slow] == [5.0, 60.0]
    assert all(f["restarts"] == 0 and f["warning_events"] == 0 for f in r.slow)
    # Not vacuous: the long steps made the deep probe fail, and were judged busy.
    assert all(f["failed_probes_seen"] > 0 for f in r.slow if f["step_s"] >= 15)
    assert r.incidents == [] and all(n == 0 for n in r.restarts.values())


@pytest.mark.timeout(420)
def test_a_step_that_never_ends_is_hung_past_the_step_bound() -> None:
    # The drill deployment's bound: stepBounds.minSeconds 10 (examples/local-drill.yaml).
    r = drill("stuck-step")
    assert r.verdict == "Hung" and r.restarts["decode/0"] == 1
    assert r.time_to_detect_s is not None and r.time_to_detect_s >= 10


@pytest.mark.timeout(600)
def test_flapping_group_is_quarantined_after_its_budget() -> None:
    r = drill("flapping")
    assert r.restarts["decode/0"] == 2


@pytest.mark.timeout(420)
def test_operator_killed_mid_recovery_finishes_without_doubling() -> None:
    # The operator is the chart's Deployment: the kubelet restarts its killed container,
    # nothing in the drill starts it (drills/scenarios/operator_crash.py checks the same pod, +1).
    r = drill("operator-crash")
    assert r.restarts["decode/0"] == 1
    assert any("operator back by itself" in note for note in r.notes), r.notes


@pytest.mark.timeout(600)
def test_two_broken_groups_with_one_restart_slot_restart_one_after_the_other() -> None:
    # Watched by a real Prometheus as the chart's monitoring would (the ServiceMonitor's
    # scrape, the chart's alerts with every `for` a 120th: lockstep_dev.drills.monitoring):
    # with both decode groups out, decode has no serving group, then fewer than wanted
    # while they restart one after the other; both alerts fire after the fault and are
    # resolved once both are back, and every dashboard query draws something.
    alerts = ("LockstepRoleDown", "LockstepRoleBelowDesiredGroups")
    r = drill("concurrent", prometheus=alerts)
    assert r.restarts["decode/0"] == 1 and r.restarts["decode/1"] == 1
    seen = r.prometheus
    assert seen["targets"], seen
    assert all(any(first >= 0 for first, _ in seen["alerts"][a]) for a in alerts), seen
    assert all(panel["samples"] > 0 for panel in seen["dashboard"].values()), seen
    assert seen["restarts_shown"] >= 1.5, seen  # two restarts (increase() extrapolates)

"""Drills with the real sglang-router in front (as the operator renders it: PD mode,
Kubernetes service discovery with its own ServiceAccount and RBAC), every request going
through it, with a client that waits as a real one does (two minutes).

One cluster, five incidents in decode group 0, each recovered before the next: a desync
(restarted in place: the same pods, every container once), then a killed rank, a hang, a
rank stuck in the kernel (uninterruptible sleep inside its step: judged Hung from /proc
before the step bound, named alone) and a deleted pod (each within the escalation window:
recreated). For each, what a user would
notice: every request the incident caught ended 200 (the broken group's requests and the
prefill halves it left behind ended with 503 at once; the router retried them on a healthy
pair) and none waited more than 5 s past the verdict; a long stream on the group ended with
SGLang's abort event, not cut; the groups that stayed hold nothing of it afterwards; while
drained the router sent the group nothing, then sent it requests again once re-admitted;
no stale router worker is left.

The deployment asks for suspect nodes after 2 incidents, with the cordon on (the chart
granting it): the desync names both ranks, and the killed rank on the same pods is named
again (its peer, which exits when the collective breaks, beside it), so a node hosted the
outliers of two incidents. It is named (NodesSuspect, an Event) and cordoned before the
killed rank's restart places the group; no pod lands there afterwards; a second suspect
node, where there is one (the killed rank's peer named on another node), is told held back,
not cordoned (maxCordoned 1). The deleted pod is named as the only
outlier, with its node."""

from __future__ import annotations

import pytest

from lockstep_dev.drills import Drill
from lockstep_dev.drills.failover import holds_no_more


@pytest.mark.timeout(900)
def test_five_incidents_through_the_router_lose_no_request_and_cut_no_stream_silently() -> None:
    result = Drill("sequence", router=True, suspect_nodes={"incidents": 2, "cordon": True}).run()
    print(result.to_json())
    assert result.passed, f"{result.reason}\n{result.to_json()}"
    assert [(s["fault"], s["verdict"], s["restart_mode"]) for s in result.steps] == [
        ("desync", "Desynced", "InPlace"),
        ("kill-rank", "RankDown", "Recreate"),
        ("hang", "Hung", "Recreate"),
        ("stuck-in-kernel", "Hung", "Recreate"),
        ("delete-pod", "RankDown", "Recreate"),
    ]
    for step in result.steps:
        fo = step["failover"]
        assert fo["caught"] > 0 and fo["caught_ok"] == fo["caught"], step
        assert fo["longest_wait_past_verdict_s"] <= 5.0, step
        # Each stream decode/0 held ended with the engine's abort, every other completed.
        assert any(s["held"] for s in fo["streams"]), step
        assert all(s["how"] == ("aborted" if s["held"] else "completed") for s in fo["streams"]), (
            step
        )
        # The groups that stayed hold no more than while idle (a pair-probe try may
        # have been in flight at either read).
        for key in ("prefill/0", "decode/1"):
            assert holds_no_more(fo["loads_after"][key], fo["loads_before"][key]), step
        assert step["affected_received_while_drained"] == 0, step
        assert step["router_failed_after_drain"] == 0, step
    assert result.router_stale_workers == []
    assert all(i["state"] == "Closed" and i["evidence"] for i in result.incidents)
    assert result.restarts["decode/0"] == 5 and result.restarts["decode/1"] == 0
    # The killed rank ran on a node a desynced rank ran on: suspect after incident 2,
    # cordoned (alone), and no restart from then on placed a pod there.
    desync, killed = result.steps[:2]
    nodes = {o["node"] for o in desync["outliers"]} & {o["node"] for o in killed["outliers"]}
    suspects = result.suspects["nodes"]
    assert nodes and all(suspects[n][:2] == [desync["incident"], killed["incident"]] for n in nodes)
    (cordoned,) = result.suspects["cordoned"]
    assert cordoned in nodes
    assert all(p["node"] != cordoned for s in result.steps[1:] for p in s["pods"])


@pytest.mark.timeout(900)
def test_a_broken_kv_path_restarts_only_the_prefill_at_fault_and_no_kv_is_left_behind() -> None:
    result = Drill("pd-path", router=True).run()
    print(result.to_json())
    assert result.passed, f"{result.reason}\n{result.to_json()}"
    stall, down, leak, storm = result.steps
    assert [(s["group"], s["fault"], s["verdict"]) for s in (stall, down)] == [
        ("prefill/0", "transfer-stall", "TransferBroken"),
        ("prefill/1", "bootstrap-down", "TransferBroken"),
    ]
    for step in (stall, down):
        fo = step["failover"]
        assert fo["caught"] > 0 and fo["caught_ok"] == fo["caught"], step
        assert fo["longest_wait_past_verdict_s"] <= 5.0, step
    # kv-leak in decode/0: the KV its ended requests held, freed by the operator (no
    # incident, no restart), nothing held for ended requests anywhere after it.
    assert leak["fault"] == "kv-leak" and leak["leaked_tokens"] > 0, leak
    assert leak["time_to_free_s"] <= 30.0 and leak["blamed"] == [], leak
    assert not any(leak["ended_kv_after"].values()) and leak["events"], leak
    # The abort storm: after each round nothing held anywhere, no verdict, nothing failed.
    assert storm["fault"] == "abort-storm" and len(storm["rounds"]) == 3, storm
    assert any(r["waiting"] for r in storm["rounds"]) and any(
        r["streaming"] for r in storm["rounds"]
    )
    for r in storm["rounds"]:
        assert all(not any(v.values()) for v in r["held_after"].values()), r
    assert storm["blamed"] == [] and storm["traffic_failed"] == 0, storm
    assert result.restarts["decode/0"] == 0 and result.restarts["decode/1"] == 0
    assert all(i["state"] == "Closed" and i["evidence"] for i in result.incidents)

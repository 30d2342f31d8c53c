"""Drills with the real sglang-router in front (as the operator renders it: PD mode,
Kubernetes service discovery with its own ServiceAccount and RBAC), every request going
through it, with a client that waits as a real one does (two minutes).

One cluster, four incidents in decode group 0, each recovered before the next: a desync
(restarted in place: the same pods, every container once), then a hang, a killed rank and
a deleted pod (each within the escalation window: recreated). For each, what a user would
notice: every request the incident caught ended 200 (the broken group's requests and the
prefill halves it left behind ended with 503 at once; the router retried them on a healthy
pair) and none waited more than 5 s past the verdict; a long stream on the group ended with
SGLang's abort event, not cut; the groups that stayed hold nothing of it afterwards; while
drained the router sent the group nothing, then sent it requests again once re-admitted;
no stale router worker is left."""

from __future__ import annotations

import pytest

from lockstep_dev.drills import Drill


@pytest.mark.timeout(900)
def test_four_incidents_through_the_router_lose_no_request_and_cut_no_stream_silently() -> None:
    result = Drill("sequence", router=True).run()
    print(result.to_json())
    assert result.passed, f"{result.reason}\n{result.to_json()}"
    assert [(s["fault"], s["verdict"], s["restart_mode"]) for s in result.steps] == [
        ("desync", "Desynced", "InPlace"),
        ("hang", "Hung", "Recreate"),
        ("kill-rank", "RankDown", "Recreate"),
        ("delete-pod", "RankDown", "Recreate"),
    ]
    for step in result.steps:
        fo = step["failover"]
        assert fo["caught"] > 0 and fo["caught_ok"] == fo["caught"], step
        assert fo["longest_wait_past_verdict_s"] <= 5.0, step
        assert [s["how"] for s in fo["streams"]].count("aborted") == 1, step
        assert fo["loads_after"]["prefill/0"] == fo["loads_before"]["prefill/0"], step
        assert fo["loads_after"]["decode/1"] == fo["loads_before"]["decode/1"], step
        assert step["affected_received_while_drained"] == 0, step
        assert step["router_failed_after_drain"] == 0, step
    assert result.router_stale_workers == []
    assert all(i["state"] == "Closed" and i["evidence"] for i in result.incidents)
    assert result.restarts["decode/0"] == 4 and result.restarts["decode/1"] == 0

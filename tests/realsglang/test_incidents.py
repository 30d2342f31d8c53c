"""Incidents in the real SGLang 0.5.23 server (TP2 over gloo, on CPU): a refused layout,
a rank wedged in the request broadcast. Each test starts its own server. A forced
divergence and an in-place restart are the releases tier's, for every supported release
(tests/releases/test_release_servers.py); a stopped rank is test_serving.py's, and
through the local cluster tests/e2e/test_real_sglang_drills.py's.

Each test drives the real server through ``lockstep-sglang`` as a pod would and asserts
what an operator (or a user) sees: the deep probe, the rank state and evidence from the
pod agent, the process exit codes, the requests served.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from server import RealServer, operator_verdict, wait_for

pytestmark = pytest.mark.timeout(420)


def test_pipeline_parallelism_is_refused_at_start_as_the_operator_refuses_it(
    real_server: Callable[..., RealServer],
) -> None:
    server = real_server(tp=1, args=["--pp-size", "2"])
    assert server.wait_exit(timeout=180) == 2
    log = server.log.read_text()
    assert "--pp-size above 1 is not supported" in log
    assert "rank-engine-exit.json" not in os.listdir(server.state_dir)  # no hold, no crash


def test_a_rank_wedged_in_the_request_broadcast_is_judged_hung_with_every_rank_waiting(
    real_server: Callable[..., RealServer],
) -> None:
    """The hang fault wedges rank 1 in the request broadcast its peer waits in (alive,
    running, silent): the deep probe times out, both ranks report the same broadcast and
    no progress a second later, and the operator's own judgement of those answers is
    Hung (not Slow, not Desynced, not a stopped rank). The local cluster's stand-in drills
    recover it (tests/e2e/test_router_drills.py)."""
    from lockstep.core.verdicts import Signal, Verdict

    server = real_server()
    server.wait_ready()
    assert server.generate("before the hang").status_code == 200
    server.inject("hang", ranks=[1])

    def both_in_the_broadcast() -> dict[int, dict[str, object]] | None:
        states = {r["rank"]: r for r in server.ranks()["ranks"]}
        ops = {(r.get("collective") or {}).get("op") for r in states.values()}
        return states if ops == {"broadcast_pyobj"} else None

    wait_for(both_in_the_broadcast, 30, "both ranks in the request broadcast")
    first = server.ranks()
    resp = server.probe(timeout_s=3.0)
    assert resp.status_code == 504, resp.text
    assert resp.json()["status"] == "timeout"
    time.sleep(1.0)
    body = server.ranks()
    states = {r["rank"]: r for r in body["ranks"]}
    assert all(r["alive"] and r["process"] != "stopped" for r in states.values()), states
    verdict = operator_verdict("real-decode-0-0", resp, first, body)
    assert verdict.verdict is Verdict.HUNG, verdict
    assert {Signal.NO_PROGRESS, Signal.SAME_COLLECTIVE} <= verdict.signals, verdict
    assert "broadcast_pyobj" in verdict.reason, verdict.reason

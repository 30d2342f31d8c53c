"""lockstep's runtime inside a serving real SGLang 0.5.23 server (TP2 over gloo, on CPU).

One server for the module: every test here leaves it serving.

Each test drives the real server through ``lockstep-sglang`` as a pod would and asserts
what an operator (or a user) sees: the deep probe, the rank state and evidence from the
pod agent, the process exit codes, the requests served.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from server import RealServer, wait_for

pytestmark = pytest.mark.timeout(420)


def test_the_deep_probe_answers_200_and_reports_both_groups(shared_tp2: RealServer) -> None:
    resp = shared_tp2.probe()
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["ok"] is True and body["status"] == "ok"
    (reply,) = body["replies"]  # one TP group behind this server: rank 0 answers
    assert reply["tp_rank"] == 0
    # The no-op all-reduce ran on the TP CPU group and on the device group (gloo here).
    assert set(reply["groups_ms"]) == {"tp:cpu", "tp:device"}
    assert reply["iteration"] > 0


def test_it_serves_with_the_hooks_on(shared_tp2: RealServer) -> None:
    resp = shared_tp2.generate("the quick brown fox", max_new_tokens=8)
    assert resp.status_code == 200, resp.text
    assert resp.json()["meta_info"]["completion_tokens"] == 8


def test_decisions_reach_sglangs_consensus_checker_on_every_rank(
    shared_tp2: RealServer,
) -> None:
    def stats() -> dict[int, dict[str, Any]]:
        return {r["rank"]: r["consensus"] or {} for r in shared_tp2.ranks()["ranks"]}

    before = wait_for(
        lambda: (s := stats()) and all(v.get("checks") for v in s.values()) and s,
        30,
        "the consensus statistics of both ranks",
    )
    assert sorted(before) == [0, 1]
    for i in range(3):
        assert shared_tp2.generate(f"hello world {i}", max_new_tokens=4).status_code == 200

    def compared_more() -> dict[int, dict[str, Any]] | None:
        now = stats()
        grew = all(
            now[r]["decisions_checked"] > before[r]["decisions_checked"]
            and now[r]["events_checked"] > before[r]["events_checked"]
            for r in (0, 1)
        )
        return now if grew else None

    after = wait_for(compared_more, 30, "both ranks' checkers comparing the new decisions")
    # Both ranks compared the same event stream (the checker compares in lockstep).
    assert after[0]["checks"] > before[0]["checks"]
    ranks = shared_tp2.ranks()["ranks"]
    assert {r["last_decision"]["kind"] for r in ranks} <= {"batch", "idle"}


def test_a_stopped_rank_times_the_probe_out_and_the_state_shows_where_each_waits(
    shared_tp2: RealServer,
) -> None:
    pids = shared_tp2.rank_pids()
    os.kill(pids[1], signal.SIGSTOP)
    try:
        started = time.monotonic()
        resp = shared_tp2.probe(timeout_s=3.0)
        took = time.monotonic() - started
        assert resp.status_code == 504, resp.text
        assert resp.json()["status"] == "timeout"
        assert took < 3.0 + 2.0, f"the probe took {took:.1f}s against a 3 s timeout"
        time.sleep(1.0)
        states = {r["rank"]: r for r in shared_tp2.ranks()["ranks"]}
        # The running rank waits in the request broadcast the stopped one never joins;
        # the stopped one is frozen where it was (alive: a stop is not an exit).
        assert states[0]["collective"] is not None, states[0]
        assert states[0]["collective"]["op"] == "broadcast_pyobj"
        assert states[0]["collective"]["group"] == "tp:cpu"
        assert time.time() - states[0]["collective"]["since"] >= 1.0
        assert states[1]["alive"] is True
        assert states[1]["collective"] is not None, states[1]
    finally:
        os.kill(pids[1], signal.SIGCONT)
    # Resumed, the group serves again: a paused rank is not a broken one.
    wait_for(lambda: shared_tp2.probe().status_code == 200, 60, "the probe passing again")
    assert shared_tp2.generate("after the pause").status_code == 200

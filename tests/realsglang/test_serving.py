"""lockstep's runtime inside a serving real SGLang 0.5.23 server (TP2 over gloo, on CPU).

One server for the module: every test here leaves it serving.

Each test drives the real server through ``lockstep-sglang`` as a pod would and asserts
what an operator (or a user) sees: the deep probe, the rank state and evidence from the
pod agent, the process exit codes, the requests served.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from server import RealServer, operator_verdict, wait_for

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


# Where the rank is stopped: idle between requests, or with a request being generated
# (stopped 0.05 s or 0.4 s after it was sent: inside a step, a collective or the
# scheduler's loop). Five runs, both ranks.
STOPS = [(1, None), (0, None), (1, 0.4), (0, 0.4), (1, 0.05)]


@pytest.mark.parametrize(("rank", "after_s"), STOPS, ids=[f"r{r}-{a}" for r, a in STOPS])
def test_a_sigstopped_rank_is_judged_rank_down_and_named_wherever_it_stopped(
    shared_tp2: RealServer, rank: int, after_s: float | None
) -> None:
    """SIGSTOP of a rank's real scheduler process, as a wedged GPU process looks to the
    operator: the deep probe times out, the pod agent reports the rank `stopped` from
    /proc, and the operator's own judgement of those answers is RankDown (rank-stopped)
    with the stopped rank and its pod named as the outlier (the incident adds the pod's
    node: tests/unit/test_recovery.py); resumed, the group serves again and the request
    it caught completes."""
    from lockstep.core.verdicts import Signal, Verdict

    pod = "real-decode-0-0"
    pids = shared_tp2.rank_pids()
    caught: list[int] = []
    sender = None
    if after_s is not None:
        # 256 tokens whatever the random model samples (no early end of sequence).
        params = {"max_new_tokens": 256, "temperature": 0, "ignore_eos": True}
        request = {"text": "caught by the stop", "sampling_params": params}

        def send() -> None:
            url = f"{shared_tp2.url}/generate"
            caught.append(shared_tp2.http.post(url, json=request, timeout=120).status_code)

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(after_s)
    os.kill(pids[rank], signal.SIGSTOP)
    try:
        # The request was still being served when the rank stopped (not an idle stop).
        assert sender is None or (sender.is_alive() and not caught), caught
        started = time.monotonic()
        resp = shared_tp2.probe(timeout_s=3.0)
        took = time.monotonic() - started
        assert resp.status_code == 504, resp.text
        assert resp.json()["status"] == "timeout"
        assert took < 3.0 + 2.0, f"the probe took {took:.1f}s against a 3 s timeout"
        first = shared_tp2.ranks()
        time.sleep(1.0)
        body = shared_tp2.ranks()
        states = {r["rank"]: r for r in body["ranks"]}
        assert states[rank]["process"] == "stopped", states[rank]
        assert states[1 - rank]["process"] != "stopped", states[1 - rank]
        if after_s is None and rank == 1:
            # Idle: the running rank waits in the request broadcast the stopped one
            # never joins (a stop is not an exit: the stopped one is still there).
            other = states[0]["collective"]
            assert other is not None and other["op"] == "broadcast_pyobj", states[0]
            assert other["group"] == "tp:cpu" and time.time() - other["since"] >= 1.0
            assert states[1]["alive"] is True
        assert sender is None or sender.is_alive()  # held while the rank is stopped
        # The operator's judgement of what the probe and the agent answered.
        verdict = operator_verdict(pod, resp, first, body)
        assert verdict.verdict is Verdict.RANK_DOWN, verdict
        assert Signal.RANK_STOPPED in verdict.signals
        assert f"{pod}/r{rank} (stopped)" in verdict.reason
        named = [o for o in verdict.outliers if "stopped" in o.why]
        assert [(o.pod, o.rank) for o in named] == [(pod, rank)], verdict.outliers
    finally:
        os.kill(pids[rank], signal.SIGCONT)
        if sender is not None:
            sender.join(timeout=120)
    # Resumed, the group serves again: a paused rank is not a broken one, and the
    # request it held completes.
    wait_for(lambda: shared_tp2.probe().status_code == 200, 60, "the probe passing again")
    assert sender is None or caught == [200], caught
    assert shared_tp2.generate("after the pause").status_code == 200

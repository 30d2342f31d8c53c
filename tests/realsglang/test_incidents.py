"""Incidents in the real SGLang 0.5.23 server (TP2 over gloo, on CPU): a forced divergence,
an in-place restart, a refused layout. Each test starts its own server.

Each test drives the real server through ``lockstep-sglang`` as a pod would and asserts
what an operator (or a user) sees: the deep probe, the rank state and evidence from the
pod agent, the process exit codes, the requests served.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from server import RealServer, wait_for

pytestmark = pytest.mark.timeout(420)


def test_a_forced_divergence_ends_the_group_within_seconds_with_the_same_event_on_both_ranks(
    real_server: Callable[..., RealServer],
) -> None:
    server = real_server(hold_s=8)
    server.wait_ready()
    server.inject("desync", ranks=[1], epoch="0")
    time.sleep(0.5)  # every rank reads the switch at most every 50 ms
    sent = time.time()
    # The request the ranks disagree on: the client gets an answer it can retry (the
    # runtime ends what it holds before SGLang kills the server), not a hang or a cut.
    answer = server.generate("the request rank 1 drops", timeout=60)
    assert answer.status_code == 503, answer.text
    assert "the TP group went down" in answer.text
    failed_after = time.time() - sent
    assert failed_after < 20, f"the request failed only after {failed_after:.1f}s"
    ranks = wait_for(
        lambda: (r := server.ranks()["ranks"]) and all(x["consensus_failure"] for x in r) and r,
        20,
        "a consensus failure on both ranks",
    )
    failures = [r["consensus_failure"] for r in ranks]
    assert all(f["detected_at"] - sent < 5.0 for f in failures), failures
    # Both ranks name the same diverging event: rank 0's batch, rank 1's idle decision.
    first = [f["first_divergence"] for f in failures]
    assert first[0] == first[1] and first[0] is not None
    assert first[0]["events"]["1"].startswith("lockstep decision idle")
    assert "lockstep decision idle" not in first[0]["events"]["0"]
    # The engine is gone (SGLang kills it half a second after the held requests were
    # answered), the pod agent still serves the evidence, then the container ends.
    state = wait_for(
        lambda: (s := server.ranks())["engine_exit"] is not None and s, 10, "the engine's end"
    )
    assert state["engine_exit"]["signal"] == "SIGKILL"
    assert not any(r["alive"] for r in state["ranks"])
    assert server.wait_exit(timeout=30) == 1
    assert "the SGLang server ended (signal SIGKILL)" in server.log.read_text()


def test_an_in_place_restart_comes_back_in_the_next_epoch_on_the_next_port_and_serves(
    real_server: Callable[..., RealServer],
) -> None:
    server = real_server(args=["--dist-init-addr", "127.0.0.1:20000"])
    server.wait_ready()
    assert server.ranks()["epoch"] == "0"
    first_pids = set(server.rank_pids().values())
    asked = time.monotonic()
    resp = server.restart(epoch=1)
    assert resp.status_code == 202, resp.text
    assert resp.json() == {"restarting": True, "epoch": "1", "previous_epoch": "0"}
    assert server.wait_exit(timeout=15) == 75
    ended_after = time.monotonic() - asked
    assert ended_after < 5, f"the container ended {ended_after:.1f}s after the restart"
    # Every rank of the old epoch was SIGKILLed before the launcher exited; the kernel
    # tears a dying process down in its own time (a second or two for a GB of memory).
    wait_for(lambda: not any(_alive(pid) for pid in first_pids), 10, "the old ranks gone")
    server.start()  # what restartPolicy: Always does with the exited container
    server.wait_ready()
    state = server.ranks()
    assert state["epoch"] == "1" and state["previous_epoch"] == "0"
    assert "rendezvous port 20001" in server.log.read_text()
    assert server.generate("served again in epoch 1").status_code == 200
    # An ask for the epoch it already runs changes nothing (the operator may repeat it).
    again = server.restart(epoch=1)
    assert again.status_code == 200 and again.json()["restarting"] is False


def test_pipeline_parallelism_is_refused_at_start_as_the_operator_refuses_it(
    real_server: Callable[..., RealServer],
) -> None:
    server = real_server(tp=1, args=["--pp-size", "2"])
    assert server.wait_exit(timeout=180) == 2
    log = server.log.read_text()
    assert "--pp-size above 1 is not supported" in log
    assert "rank-engine-exit.json" not in os.listdir(server.state_dir)  # no hold, no crash


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"
    except OSError:
        return False

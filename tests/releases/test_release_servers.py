"""Every supported SGLang release served for real under lockstep's launcher: the real
server of 0.5.21, 0.5.22 and 0.5.23 (TP2 over gloo, on CPU), each from its own venv with
the torch it pins, through the deep probe, an in-place restart and a forced divergence.

One server per release, taken through what the operator does to a group: admitted by the
deep probe, restarted in place into the next epoch (the container exits 75 and comes
back on the next rendezvous port), then a divergence forced between its ranks, caught by
the consensus check on both, the request it caught answered 503, a request sent while
SGLang's crash diagnostics run answered 503 at once, and the group ended.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

import pytest
from release_venvs import release_pin
from server import HOST, RealServer, wait_for

from lockstep_sglang import pins, timeline

pytestmark = pytest.mark.timeout(900)  # a first run also makes the release's venv


def _installed(python: str, package: str) -> str:
    """The version of `package` that `python` imports (its metadata: nothing imported)."""
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("version", pins.SUPPORTED_VERSIONS)
def test_the_release_serves_restarts_in_place_and_ends_on_a_forced_divergence(
    version: str, release_server: Callable[..., RealServer]
) -> None:
    server = release_server(
        version,
        # The operator's rendezvous: base port + epoch (a restart moves to the next one).
        args=["--dist-init-addr", f"{HOST}:20000"],
        # The launcher refuses any other release; the schedulers are forked (the default:
        # each release's engine must take that path).
        env={"LOCKSTEP_SGLANG_VERSION": version},
        hold_s=5,
    )
    # The venv holds that release and the torch it pins (its wheel's metadata says which).
    assert _installed(server.python, "sglang") == version
    assert _installed(server.python, "torch").split("+")[0] == release_pin(version, "torch")
    assert _installed(server.python, "transformers") == release_pin(version, "transformers")
    ready_s = server.wait_ready()

    # Admitted: the deep probe's no-op all-reduce ran on both of the TP group's groups.
    probe = server.probe()
    assert probe.status_code == 200, probe.text
    (reply,) = probe.json()["replies"]
    assert set(reply["groups_ms"]) == {"tp:cpu", "tp:device"}
    answer = server.generate("served by the first epoch", max_new_tokens=8)
    assert answer.status_code == 200, answer.text
    assert answer.json()["meta_info"]["completion_tokens"] == 8

    # In place into epoch 1: the container ends 75, restartPolicy brings it back.
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
    back_s = server.wait_ready()
    state = server.ranks()
    assert state["epoch"] == "1" and state["previous_epoch"] == "0"
    assert "rendezvous port 20001" in server.log.read_text()
    assert server.generate("served again in epoch 1").status_code == 200
    # Both starts forked SGLang's schedulers from the engine process (SGLang imported
    # once per start, not again in every subprocess).
    starts = [e for e in timeline.read(server.state_dir) if e["event"] == "subprocess_start"]
    assert [e["method"] for e in starts] == ["fork", "fork"], starts
    # An ask for the epoch it already runs changes nothing (the operator may repeat it).
    again = server.restart(epoch=1)
    assert again.status_code == 200 and again.json()["restarting"] is False

    # A divergence forced into rank 1: caught on both ranks within seconds. The request
    # the ranks disagree on gets an answer the client can retry (the runtime ends what it
    # holds before SGLang kills the server), not a hang or a cut.
    server.inject("desync", ranks=[1], epoch="1")
    time.sleep(0.5)  # every rank reads the switch at most every 50 ms
    sent = time.time()
    caught = server.generate("the request rank 1 drops", timeout=60)
    assert caught.status_code == 503, caught.text
    assert "the TP group went down" in caught.text
    failed_after = time.time() - sent
    assert failed_after < 20, f"the request failed only after {failed_after:.1f}s"
    # SGLang's SIGQUIT handler then sleeps 5 s before its crash diagnostics and the kill.
    # A request sent meanwhile (a router's retry, its health check) is answered 503 at
    # once, never left without an answer until the kill resets its connection.
    time.sleep(1.5)
    late_sent = time.monotonic()
    late = server.generate("a retry sent while the server goes down", timeout=30)
    health = server.http.get(f"{server.url}/health", timeout=30)
    late_after = time.monotonic() - late_sent
    assert (late.status_code, health.status_code) == (503, 503), late.text
    assert late_after < 2, f"the fenced server answered only after {late_after:.1f}s"
    assert "Sleeping 5 seconds before crash diagnostics" in server.log.read_text()
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
    ended = wait_for(
        lambda: (e := server.ranks())["engine_exit"] is not None and e, 10, "the engine's end"
    )
    assert ended["engine_exit"]["signal"] == "SIGKILL"
    assert not any(r["alive"] for r in ended["ranks"])
    assert server.wait_exit(timeout=40) == 1
    assert "the SGLang server ended (signal SIGKILL)" in server.log.read_text()
    print(f"SGLang {version}: ready in {ready_s:.1f}s, epoch 1 ready in {back_s:.1f}s")


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

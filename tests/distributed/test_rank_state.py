"""Rank state across processes: torn-read safety, liveness, restarts, and the pod agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dist_support import wait_until

from lockstep_sglang.agent import PodAgent
from lockstep_sglang.rank_state import (
    archive_previous,
    process_state,
    read_rank_state,
    read_rank_states,
)

# Every write block carries one number n in every field it touches, so a read that mixes
# two writes of a block shows different numbers.
WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from lockstep_sglang.rank_state import RankStateWriter

    w = RankStateWriter.create(Path(sys.argv[1]), rank=int(sys.argv[2]), tp_rank=0)
    mode = sys.argv[3]
    print("ready", flush=True)
    n = 0
    while True:
        n += 1
        if mode == "hammer":
            w.record_decision(kind="batch", forward_mode=f"m{n}", batch_size=n,
                              rids_hash=f"{n:x}", seq=n)
            w.enter_collective(f"op{n}".encode(), f"g{n}".encode())
            w.exit_collective()
            w.enter_collective(f"op{n}".encode(), f"g{n}".encode())
        elif mode == "kernel":
            # The stand-in's stuck-in-kernel fault: inside a step, in D until killed.
            from lockstep_standin.kernel_wait import wait_in_kernel
            w.begin_iteration()
            wait_in_kernel(90, Path(sys.argv[1]) / "lib")
        else:
            w.begin_iteration()
            w.enter_collective(b"broadcast_pyobj", b"tp:cpu", opaque=True)
            w.enter_collective(b"broadcast", b"tp:cpu")  # hidden by the opaque outer one
            time.sleep(3600)
    """
)


@pytest.fixture
def writers(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def _start(procs: list[subprocess.Popen[str]], state_dir: Path, rank: int, mode: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(state_dir), str(rank), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"


def test_reads_never_mix_two_writes(tmp_path: Path, writers: list[subprocess.Popen[str]]) -> None:
    _start(writers, tmp_path, 0, "hammer")
    path = tmp_path / "rank-0.state"
    reads = torn = flagged = 0
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        state = read_rank_state(path)
        decision, collective = state["last_decision"], state["collective"]
        if decision is None or collective is None:
            continue
        if "error" in state:
            flagged += 1  # the reader said it could not get a clean copy
            continue
        reads += 1
        # Each write block (a decision; a collective entry) must be read whole.
        n = decision["seq"]
        in_decision = {
            n,
            decision["batch_size"],
            int(decision["rids_hash"], 16),
            int((decision["forward_mode"] or "m0")[1:]),
        }
        in_collective = {int(collective["op"][2:]), int(collective["group"][1:])}
        torn += len(in_decision) != 1 or len(in_collective) != 1
    assert reads > 500
    assert torn == 0
    assert flagged < reads / 10


TOKEN = "operator-token"


def _get(url: str, body: bytes | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    req.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_agent_serves_live_dead_and_previous_ranks(
    tmp_path: Path, writers: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCKSTEP_POD_NAME", "demo-decode-0-0")
    monkeypatch.setenv("LOCKSTEP_GROUP_EPOCH", "3")
    # A previous incarnation's files are archived, not lost, when the ranks restart.
    _start(writers, tmp_path, 0, "idle")
    writers[0].kill()
    writers[0].wait(timeout=10)
    archive_previous(tmp_path)
    _start(writers, tmp_path, 0, "idle")
    _start(writers, tmp_path, 1, "idle")

    server, _ = PodAgent(tmp_path, token=TOKEN).serve_in_thread("127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        status, body = _get(f"{base}/ranks")
        assert status == 200
        assert (body["pod"], body["epoch"]) == ("demo-decode-0-0", "3")
        assert [s["rank"] for s in body["ranks"]] == [0, 1]
        assert [s["alive"] for s in body["ranks"]] == [True, True]
        assert [(s["rank"], s["alive"]) for s in body["previous"]] == [(0, False)]
        live = body["ranks"][0]
        assert live["pid"] == writers[1].pid
        assert live["iteration"] == 1
        # The opaque broadcast_pyobj hides the broadcast inside it.
        assert (live["collective"]["op"], live["collective"]["group"]) == (
            "broadcast_pyobj",
            "tp:cpu",
        )
        assert live["collective"]["seq"] == 1

        os.kill(writers[2].pid, signal.SIGKILL)
        writers[2].wait(timeout=10)
        wait_until(
            lambda: not read_rank_states(tmp_path)[1]["alive"], 5, "the dead rank shown dead"
        )
        status, body = _get(f"{base}/ranks")
        assert [s["alive"] for s in body["ranks"]] == [True, False]
        # Its last state stays readable: where it was when it died.
        assert body["ranks"][1]["collective"]["op"] == "broadcast_pyobj"

        assert _get(f"{base}/healthz") == (200, {"ok": True})
        assert _get(f"{base}/nope")[0] == 404
        assert _get(f"{base}/ranks", b"{}")[0] == 405
        assert _get(f"{base}/stacks", b"[1]")[0] == 400
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(60)
def test_the_agent_reports_a_stopped_rank_stopped_and_a_reaped_one_gone(
    tmp_path: Path, writers: list[subprocess.Popen[str]]
) -> None:
    """`process` is the OS state from /proc: a rank sent SIGSTOP is alive to kill(0)
    but "stopped"; SIGCONT makes it "sleeping" again; killed and not yet reaped it is a
    zombie (and not alive); reaped, "gone"."""
    _start(writers, tmp_path, 0, "idle")
    proc = writers[0]

    def state() -> tuple[bool, str | None]:
        s = read_rank_states(tmp_path)[0]
        return s["alive"], s["process"]

    # Asleep in its loop (it may still be running for a moment after saying ready).
    wait_until(lambda: state() == (True, "sleeping"), 5, "the idle rank shown sleeping")
    os.kill(proc.pid, signal.SIGSTOP)
    wait_until(lambda: state() == (True, "stopped"), 5, "the stopped rank shown stopped")
    os.kill(proc.pid, signal.SIGCONT)
    wait_until(lambda: state() == (True, "sleeping"), 5, "the resumed rank shown sleeping")
    os.kill(proc.pid, signal.SIGKILL)
    wait_until(lambda: state() == (False, "zombie"), 5, "the unreaped rank shown a zombie")
    proc.wait(timeout=10)
    assert state() == (False, "gone")


@pytest.mark.timeout(120)
def test_a_rank_waiting_in_the_kernel_is_reported_uninterruptible_dumped_and_killable(
    tmp_path: Path, writers: list[subprocess.Popen[str]]
) -> None:
    """The stand-in's stuck-in-kernel fault puts a real rank in uninterruptible sleep
    (what a GPU driver call that never returns looks like): the agent reports it
    `uninterruptible`, its stack dump answers at once (py-spy cannot pause a process in
    D: it reads it without pausing, instead of waiting out its timeout), and SIGKILL
    ends it and the helper's child with it."""
    _start(writers, tmp_path, 0, "kernel")
    proc = writers[0]
    agent = PodAgent(tmp_path, token=TOKEN)
    wait_until(
        lambda: agent.ranks()["ranks"][0]["process"] == "uninterruptible", 60, "the rank in D"
    )
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 1, children
    started = time.monotonic()
    (stack,) = agent.stacks(timeout_s=10)["stacks"]
    took = time.monotonic() - started
    assert stack["ok"], stack["error"]
    assert "wait_in_kernel" in stack["stack"], stack["stack"]
    assert took < 5, f"the dump of a rank in D took {took:.1f}s"
    assert process_state(proc.pid) == "uninterruptible"
    # SIGKILL ends it (what the pod agent sends a group's ranks), its helper child too.
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    child = int(children[0])
    wait_until(lambda: process_state(child) in ("gone", "zombie"), 5, "the helper child gone")


def test_stack_dumps_are_bounded_and_one_at_a_time(
    tmp_path: Path, writers: list[subprocess.Popen[str]]
) -> None:
    _start(writers, tmp_path, 0, "idle")
    slow = tmp_path / "slow-py-spy"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    agent = PodAgent(tmp_path, py_spy=str(slow), token=TOKEN)
    server, _ = agent.serve_in_thread("127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        first: dict[str, Any] = {}

        def dump() -> None:
            start = time.monotonic()
            first["result"] = _get(f"{base}/stacks", json.dumps({"timeout_s": 1.5}).encode())
            first["took"] = time.monotonic() - start

        thread = threading.Thread(target=dump)
        thread.start()
        wait_until(agent._stacks_busy.locked, 5, "the first dump to start")
        assert _get(f"{base}/stacks", b"{}")[0] == 429
        thread.join(20)
        status, body = first["result"]
        assert status == 200
        (stack,) = body["stacks"]
        assert stack["ok"] is False and "longer than 1.5s" in stack["error"]
        assert first["took"] < 10  # bounded by timeout_s, not by the 30 s dump

        # The real py-spy on the live rank.
        status, body = _get(f"{base}/ranks")
        real = PodAgent(tmp_path).stacks(timeout_s=20)
        (stack,) = real["stacks"]
        assert stack["ok"], stack["error"]
        assert stack["pid"] == writers[0].pid
        assert "sleep" in stack["stack"] or "<module>" in stack["stack"]
    finally:
        server.shutdown()
        server.server_close()

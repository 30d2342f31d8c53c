"""In-place group restart, the runtime's half: the pod agent's ``POST /restart``.

Real processes throughout: a two-pod stand-in group (gloo ranks) restarted into a new
epoch and brought back by restarting the pod processes with the same env and argv, as
the kubelet restarts a container; and the image's layout (the agent as its own process
beside a launcher-like main process, also as a PID namespace's PID 1) without SGLang.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from dist_support import wait_until
from test_standin import AGENT_PORT, DIST_PORT, Launcher, StandinPod, generate, wait_serving

from lockstep_sglang.agent import RESTART_EXIT_CODE, PodAgent, RestartOrder, descendants
from lockstep_sglang.config import dist_port
from lockstep_standin.protocol import expected_text

TOKEN = "t0ken-from-the-secret"
RESTART_MAIN = Path(__file__).with_name("restart_main.py")
REPO = Path(__file__).resolve().parents[2]


def post_restart(
    http: httpx.Client, base: str, epoch: Any, token: str | None = TOKEN, **body: Any
) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return http.post(
        f"{base}/restart", json={"epoch": epoch, **body}, headers=headers, timeout=10.0
    )


def agent_url(pod: StandinPod) -> str:
    return f"http://{pod.ip}:{AGENT_PORT}"


def listening(ip: str, port: int) -> bool:
    """A TCP socket listens on ``ip:port`` (read from /proc: nothing connects to it)."""
    want = f"{struct.unpack('=I', socket.inet_aton(ip))[0]:08X}:{port:04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(line.split()[1] == want and line.split()[3] == "0A" for line in lines)


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    launch = Launcher()
    try:
        yield launch
    finally:
        launch.kill_all()
        for d in launch.dirs:
            shutil.rmtree(d, ignore_errors=True)


# -- the stand-in group ---------------------------------------------------------------


def test_two_pod_group_restarts_in_place_into_the_new_epoch_on_its_new_port(
    launcher: Launcher,
) -> None:
    pods = launcher.group(tp=2, nnodes=2, LOCKSTEP_AGENT_TOKEN=TOKEN)
    leader, follower = pods
    wait_serving(leader, pods)
    assert dist_port(3) == DIST_PORT and listening(leader.ip, dist_port(3))
    before = {pod.ip: pod.rank_pids() for pod in pods}
    http = leader.http

    # Refused: nothing changes, nothing ends.
    for token in (None, "wrong-token", TOKEN[:-1]):
        refused = post_restart(http, agent_url(follower), "4", token=token)
        assert refused.status_code == 401, refused.text
        assert refused.headers["www-authenticate"].startswith("Bearer")
    basic = http.post(f"{agent_url(follower)}/restart", json={"epoch": "4"},
                      headers={"Authorization": f"Basic {TOKEN}"})  # fmt: skip
    assert basic.status_code == 401
    for bad, field in (({"epoch": "four"}, "epoch"), ({"epoch": "4", "reason": 5}, "reason")):
        answer = http.post(f"{agent_url(follower)}/restart", json=bad,
                           headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert answer.status_code == 400 and answer.json()["error"].startswith(f"{field}:")
    older = post_restart(http, agent_url(follower), "2")
    assert older.status_code == 409 and older.json()["running_epoch"] == "3", older.text
    same = post_restart(http, agent_url(follower), "3")
    assert same.status_code == 200, same.text
    assert same.json() == {"restarting": False, "epoch": "3", "reason": "already running epoch 3"}
    time.sleep(0.5)
    assert all(pod.proc.poll() is None for pod in pods)
    assert {pod.ip: pod.rank_pids() for pod in pods} == before
    assert not any((pod.pod_dir / "state" / "epoch").exists() for pod in pods)
    assert leader.get("/lockstep/probe?timeout=5").status_code == 200

    # The operator's restart: both pods at once.
    with ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(lambda p: post_restart(http, agent_url(p), "4", reason="drill"), pods)
        )
    sent = time.monotonic()
    for answer in answers:
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"restarting": True, "epoch": "4", "previous_epoch": "3"}
    assert [pod.wait_exit(timeout=10) for pod in pods] == [RESTART_EXIT_CODE] * 2
    assert time.monotonic() - sent < 5.0
    old_ranks = [pid for pids in before.values() for pid in pids.values()]
    wait_until(lambda: all(gone(pid) for pid in old_ranks), 5, "the old ranks to end")
    for pod in pods:
        assert (pod.pod_dir / "state" / "epoch").read_text() == "4\n"
        assert "restart in place into epoch 4 (from 3): drill" in pod.output()

    # The kubelet starts the same containers again: same env (epoch 3), same argv
    # (port 20003); the ranks meet in epoch 4 on its port and serve.
    restarted = [launcher.restart(pod) for pod in pods]
    assert restarted[0].env["LOCKSTEP_GROUP_EPOCH"] == "3"
    wait_serving(restarted[0], restarted)
    for pod in restarted:
        state = pod.ranks()
        assert state["epoch"] == "4"
        assert json.loads((pod.pod_dir / "ranks.json").read_text())["epoch"] == "4"
        # The killed incarnation's rank state is kept as evidence.
        assert [s["alive"] for s in state["previous"]] == [False]
        # ...of the epoch it ran: the operator does not take its failure for epoch 4's.
        assert state["previous_epoch"] == "3"
    assert listening(restarted[0].ip, dist_port(4))
    assert not listening(restarted[0].ip, dist_port(3))
    assert "rendezvous port 20004" in restarted[0].output()
    assert restarted[0].get("/lockstep/probe?timeout=5").status_code == 200
    reply = generate(restarted[0], "after restart", 3)
    assert reply.status_code == 200 and reply.json()["text"] == expected_text("after restart", 3)

    # The operator retries: nothing happens again.
    pids = {pod.ip: pod.rank_pids() for pod in restarted}
    for pod in restarted:
        again = post_restart(http, agent_url(pod), "4")
        assert again.status_code == 200 and again.json()["restarting"] is False, again.text
    time.sleep(1.0)
    assert all(pod.proc.poll() is None for pod in restarted)
    assert {pod.ip: pod.rank_pids() for pod in restarted} == pids


# -- the agent's contract, in process ------------------------------------------------


def test_agent_restart_contract_accepts_once_per_epoch_and_persists_first(
    tmp_path: Path,
) -> None:
    orders: list[RestartOrder] = []
    # Unlimited: this test sends a dozen restarts at once (the budget has its own test).
    agent = PodAgent(
        tmp_path, epoch="3", restart=orders.append, token=TOKEN, environ={}, rate_limits={}
    )
    disabled = [
        PodAgent(tmp_path, epoch="3", restart=orders.append, environ={}),
        PodAgent(tmp_path, epoch="3", restart=None, token=TOKEN, environ={}),
    ]
    servers = [a.serve_in_thread("127.0.0.1", 0)[0] for a in [agent, *disabled]]
    base, *off = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    epoch_file = tmp_path / "epoch"
    try:
        with httpx.Client() as http:
            for url in off:
                answer = post_restart(http, url, "4")
                assert answer.status_code == 403 and "disabled" in answer.json()["error"]
            assert "LOCKSTEP_AGENT_TOKEN" in post_restart(http, off[0], "4").json()["error"]
            assert post_restart(http, base, "4", token=None).status_code == 401
            auth = {"Authorization": f"Bearer {TOKEN}"}
            for raw, field in ((b"[1]", "body"), (b"{", "body"), (b"{}", "epoch"),
                               (b'{"epoch": "-4"}', "epoch"), (b'{"epoch": 4.5}', "epoch")):  # fmt: skip
                answer = http.post(f"{base}/restart", content=raw, headers=auth)
                assert answer.status_code == 400, answer.text
                assert answer.json()["error"].startswith(f"{field}:")
            assert not epoch_file.exists() and orders == []

            accepted = post_restart(http, base, "5", reason="desync in group 0")
            assert accepted.status_code == 202
            assert accepted.headers["connection"] == "close"
            assert epoch_file.read_text() == "5\n"  # on disk before the answer
            wait_until(lambda: orders, 5, "the restart action")
            assert orders == [RestartOrder("5", "3", "desync in group 0")]

            pending = post_restart(http, base, 5)
            assert pending.json() == {
                "restarting": False,
                "epoch": "5",
                "reason": "already restarting into epoch 5",
            }
            for other in ("6", "4", "2"):
                conflict = post_restart(http, base, other)
                assert conflict.status_code == 409, conflict.text
                assert conflict.json()["pending_epoch"] == "5"
            time.sleep(0.2)
            assert len(orders) == 1 and epoch_file.read_text() == "5\n"
            ranks = http.get(f"{base}/ranks", headers=auth)
            assert ranks.json()["epoch"] == "3"  # until the restart
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


# -- the image's layout: the agent as its own process ---------------------------------


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    cmd = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "true"]
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
    return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=1.0).status_code == 200
    return False


@pytest.mark.parametrize("as_pid1", [False, True], ids=["child", "pid1"])
def test_agent_process_ends_the_main_process_its_tree_and_itself(as_pid1: bool) -> None:
    if as_pid1 and not _can_unshare():
        pytest.skip("no unprivileged PID namespaces here (unshare --user --pid)")
    workdir = Path(tempfile.mkdtemp(prefix="ls-restart-"))
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "LOCKSTEP_STATE_DIR": str(workdir / "state"),
        "LOCKSTEP_AGENT_HOST": "127.0.0.1",
        "LOCKSTEP_AGENT_PORT": str(port),
        "LOCKSTEP_AGENT_TOKEN": TOKEN,
        "LOCKSTEP_GROUP_EPOCH": "3",
    }
    cmd = [sys.executable, str(RESTART_MAIN), "--workdir", str(workdir), "--epoch", "3"]
    if as_pid1:
        cmd = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", *cmd]
    log = workdir / "main.log"
    tree: set[int] = set()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
        )
    try:
        ready_file = workdir / "ready.json"
        wait_until(ready_file.exists, 30, f"the main process to start:\n{log.read_text()}")
        ready = json.loads(ready_file.read_text())
        wait_until(lambda: _answers(f"{base}/healthz"), 10, "the agent")
        if as_pid1:
            assert ready["main"] == 1
        else:
            # Agent, two ranks, and the child of rank 1 (it may still be starting).
            tree = wait_until(
                lambda: len(found := descendants(proc.pid)) == 4 and found, 10, "four processes"
            )
            assert {ready["agent"], *ready["ranks"]} < tree, tree

        with httpx.Client() as http:
            assert post_restart(http, base, "4", token="nope").status_code == 401
            auth = {"Authorization": f"Bearer {TOKEN}"}
            assert http.get(f"{base}/ranks", headers=auth).json()["epoch"] == "3"
            time.sleep(0.3)
            assert proc.poll() is None
            answer = post_restart(http, base, "4", reason="drill")
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"restarting": True, "epoch": "4", "previous_epoch": "3"}
        assert proc.wait(timeout=10) == RESTART_EXIT_CODE, log.read_text()
        assert (workdir / "state" / "epoch").read_text() == "4\n"
        assert "restarted in place" in log.read_text()
        wait_until(lambda: all(gone(pid) for pid in tree), 5, "every process of the tree")
        wait_until(lambda: not _answers(f"{base}/healthz"), 5, "the agent to end")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)

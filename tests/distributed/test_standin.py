"""The CPU stand-in SGLang server: real pods of real gloo ranks, serving, probed, broken.

Each pod is an independent ``python -m lockstep_standin`` process on its own
loopback address with its own pod directory, started with the argv the operator renders,
as the process kubelet starts them. The tests talk to them only from outside: HTTP on
the leader pod, the pod agents' ``/ranks``, the fault file and ``ranks.json``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from dist_support import wait_until

from lockstep_sglang.faults import FaultWatcher, parse_fault
from lockstep_sglang.rank_state import read_rank_states
from lockstep_standin.protocol import expected_text
from lockstep_standin.settings import parse_server_args

HTTP_PORT = 30000
AGENT_PORT = 8999
AGENT_TOKEN = "operator-token"  # what the operator's Secret would hold
DIST_PORT = 20003
REPO = Path(__file__).resolve().parents[2]


@dataclass
class StandinPod:
    """One stand-in pod process and where to reach it."""

    ip: str
    pod_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path
    argv: list[str]
    env: dict[str, str]
    http: httpx.Client

    @property
    def base(self) -> str:
        return f"http://{self.ip}:{HTTP_PORT}"

    def get(self, path: str, timeout: float = 10.0) -> httpx.Response:
        return self.http.get(f"{self.base}{path}", timeout=timeout)

    def post(self, path: str, body: dict[str, Any], timeout: float = 20.0) -> httpx.Response:
        return self.http.post(f"{self.base}{path}", json=body, timeout=timeout)

    def ranks(self) -> dict[str, Any]:
        resp = self.http.get(
            f"http://{self.ip}:{AGENT_PORT}/ranks",
            timeout=5.0,
            headers={"Authorization": f"Bearer {self.env.get('LOCKSTEP_AGENT_TOKEN', '')}"},
        )
        resp.raise_for_status()
        body: dict[str, Any] = resp.json()
        return body

    def rank_pids(self) -> dict[int, int]:
        data = json.loads((self.pod_dir / "ranks.json").read_text())
        return {int(r["rank"]): int(r["pid"]) for r in data["ranks"]}

    def fault(self, **fault: Any) -> None:
        tmp = self.pod_dir / "fault.json.tmp"
        tmp.write_text(json.dumps(fault))
        os.replace(tmp, self.pod_dir / "fault.json")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"pod {self.ip} still running after {timeout}s:\n{self.output()[-3000:]}"
            ) from None


@dataclass
class Launcher:
    """Starts stand-in pods; ``kill_all`` ends every one (and its ranks)."""

    pods: list[StandinPod] = field(default_factory=list)
    # One client: a bare httpx.get builds a new TLS context per call (~100 ms).
    http: httpx.Client = field(default_factory=httpx.Client)
    dirs: list[str] = field(default_factory=list)
    # A random 127.x.y.0/24 per test: other tests or a local cluster may run beside us.
    net: str = field(
        default_factory=lambda: f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
    )

    def group(self, tp: int, nnodes: int, **env: str) -> list[StandinPod]:
        """Start the ``nnodes`` pods of one TP group, each as its own process."""
        ips = [f"{self.net}.{10 + len(self.pods) + i}" for i in range(nnodes)]
        started = []
        for node in range(nnodes):
            argv = [
                "--model-path", "/models/tiny", "--disaggregation-mode", "decode",
                "--tp-size", str(tp), "--nnodes", str(nnodes), "--host", "0.0.0.0",
                "--port", str(HTTP_PORT), "--disaggregation-bootstrap-port", "8998",
                "--disaggregation-transfer-backend", "mooncake",
                "--served-model-name", "tiny", "--disable-overlap-schedule",
                "--dist-timeout", "600", "--node-rank", str(node),
                "--dist-init-addr", f"{ips[0]}:{DIST_PORT}",
            ]  # fmt: skip
            started.append(self.pod(ips[node], argv, env, name=f"tiny-decode-0-{node}"))
        return started

    def pod(self, ip: str, argv: list[str], env: dict[str, str], name: str) -> StandinPod:
        pod_dir = Path(tempfile.mkdtemp(prefix="ls-standin-"))
        self.dirs.append(str(pod_dir))
        full_env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "LOCKSTEP_POD_IP": ip,
            "LOCKSTEP_POD_DIR": str(pod_dir),
            "LOCKSTEP_AGENT_PORT": str(AGENT_PORT),
            "LOCKSTEP_POD_NAME": name,
            "LOCKSTEP_GROUP_EPOCH": "3",
            "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER": "1",
            "LOCKSTEP_GLOO_TIMEOUT_SECONDS": "20",
            "LOCKSTEP_STANDIN_REQUEST_TIMEOUT_S": "10",
            # After its ranks end a pod holds its agent up (30 s by default): short here.
            "LOCKSTEP_EXIT_HOLD_S": "1",
            "LOCKSTEP_AGENT_TOKEN": AGENT_TOKEN,
            **env,
        }
        return self._start(ip, pod_dir, argv, full_env, pod_dir / "pod.log")

    def restart(self, pod: StandinPod) -> StandinPod:
        """The same container again (same pod directory), as a kubelet restart does."""
        return self._start(pod.ip, pod.pod_dir, pod.argv, pod.env, pod.pod_dir / "pod-2.log")

    def _start(
        self, ip: str, pod_dir: Path, argv: list[str], env: dict[str, str], log: Path
    ) -> StandinPod:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lockstep_standin", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,  # killpg below reaches the pod's ranks too
            )
        pod = StandinPod(ip, pod_dir, proc, log, argv, env, self.http)
        self.pods.append(pod)
        return pod

    def kill_all(self) -> None:
        for pod in self.pods:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.proc.pid, signal.SIGKILL)
            for pid in _rank_pids_or_empty(pod):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pod in self.pods:
            with contextlib.suppress(subprocess.TimeoutExpired):
                pod.proc.wait(timeout=10)
        self.http.close()


def _rank_pids_or_empty(pod: StandinPod) -> list[int]:
    try:
        return list(pod.rank_pids().values())
    except (OSError, ValueError, KeyError):
        return []


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    launch = Launcher()
    try:
        yield launch
    finally:
        launch.kill_all()
        for d in launch.dirs:
            shutil.rmtree(d, ignore_errors=True)


def _healthy(pod: StandinPod) -> bool:
    assert pod.proc.poll() is None, f"pod exited early:\n{pod.output()[-3000:]}"
    try:
        return pod.get("/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_serving(leader: StandinPod, pods: list[StandinPod], timeout: float = 60) -> None:
    wait_until(lambda: _healthy(leader), timeout, f"{leader.ip} to serve", step=0.2)
    for pod in pods:
        wait_until(lambda p=pod: len(p.ranks()["ranks"]) > 0, 10, f"{pod.ip} rank state")


def iterations(pod: StandinPod) -> dict[int, int]:
    return {s["rank"]: s["iteration"] for s in pod.ranks()["ranks"]}


def generate(pod: StandinPod, text: str, n: int, **extra: Any) -> httpx.Response:
    return pod.post("/generate", {"text": text, "sampling_params": {"max_new_tokens": n}, **extra})


# -- argv and faults (no processes) -------------------------------------------------


def test_operator_argv_is_understood_and_unknown_flags_are_kept_for_the_log() -> None:
    args = parse_server_args(
        ["--model-path", "/m", "--disaggregation-mode", "prefill", "--tp-size", "4",
         "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "127.0.0.9:20001",
         "--port", "30000", "--mem-fraction-static", "0.8", "--disable-overlap-schedule"]
    )  # fmt: skip
    assert (args.tp_size, args.nnodes, args.node_rank) == (4, 2, 1)
    assert list(args.local_ranks) == [2, 3]
    assert args.disaggregation_mode == "prefill"
    assert args.ignored == ("--mem-fraction-static", "0.8", "--disable-overlap-schedule")
    with pytest.raises(ValueError, match="multiple of --nnodes"):
        parse_server_args(["--model-path", "/m", "--tp-size", "3", "--nnodes", "2"])
    with pytest.raises(ValueError, match="--dist-init-addr is required"):
        parse_server_args(["--model-path", "/m", "--tp-size", "2", "--nnodes", "2"])


def test_fault_file_targets_and_a_malformed_file_is_no_fault(tmp_path: Path) -> None:
    desync = parse_fault({"kind": "desync", "ranks": None})
    assert [r for r in (2, 3) if desync.targets(r, [2, 3], None)] == [3]
    hang = parse_fault({"kind": "hang", "ranks": [2], "epoch": "4"})
    assert hang.targets(2, [2, 3], "4") and not hang.targets(2, [2, 3], "5")
    assert not hang.targets(3, [2, 3], "4")
    watcher = FaultWatcher(tmp_path / "fault.json")
    assert watcher.current().kind == "none"
    (tmp_path / "fault.json").write_text('{"kind": "slow", "step_sec')
    assert watcher.current().kind == "none"
    (tmp_path / "fault.json").write_text('{"kind": "slow", "step_seconds": 0.5}')
    assert watcher.current().step_seconds == 0.5
    with pytest.raises(ValueError, match="kind"):
        parse_fault({"kind": "explode"})


# -- running groups ---------------------------------------------------------------------


def test_two_pod_group_serves_probes_runs_slow_and_dies_together_on_a_desync(
    launcher: Launcher,
) -> None:
    pods = launcher.group(tp=2, nnodes=2)
    leader, follower = pods
    wait_serving(leader, pods)

    # No bootstrap room: the decode group runs it alone (PD pairs: test_standin_pd.py).
    first = generate(leader, "hello lockstep", 8)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["text"] == expected_text("hello lockstep", 8)
    assert body["meta_info"]["completion_tokens"] == 8
    assert generate(leader, "hello lockstep", 8).json()["text"] == body["text"]
    completions = leader.post("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 3})
    assert [c["text"] for c in completions.json()["choices"]] == [
        expected_text("a", 3),
        expected_text("b", 3),
    ]
    assert leader.get("/get_model_info").json()["model_path"] == "/models/tiny"
    info = leader.get("/get_server_info").json()
    assert (info["tp_size"], info["nnodes"]) == (2, 2)
    assert "--disable-overlap-schedule" in info["ignored_args"]
    assert leader.get("/health_generate").status_code == 200

    probe = leader.get("/lockstep/probe?timeout=5")
    assert probe.status_code == 200, probe.text
    (reply,) = probe.json()["replies"]
    assert set(reply["groups_ms"]) == {"tp:cpu", "tp:device"}

    # Each pod agent serves its own rank; the loop advances while idle.
    answers = [pod.ranks() for pod in pods]
    assert [a["pod"] for a in answers] == ["tiny-decode-0-0", "tiny-decode-0-1"]
    assert all(a["epoch"] == "3" for a in answers)
    before = {**iterations(leader), **iterations(follower)}
    assert set(before) == {0, 1}
    time.sleep(1.0)
    after = {**iterations(leader), **iterations(follower)}
    assert all(after[r] > before[r] for r in (0, 1)), (before, after)

    # Slow steps on rank 1: slower answers, still right, iterations keep advancing.
    follower.fault(kind="slow", ranks=[1], step_seconds=0.4)
    started = time.monotonic()
    slow = generate(leader, "slow one", 4)
    assert slow.status_code == 200 and slow.json()["text"] == expected_text("slow one", 4)
    assert time.monotonic() - started >= 1.2
    mid = iterations(follower)
    slow_again = generate(leader, "slow two", 3)
    assert slow_again.status_code == 200
    assert iterations(follower)[1] > mid[1]
    follower.fault(kind="none")
    assert generate(leader, "fast again", 2).json()["text"] == expected_text("fast again", 2)

    # Desync: rank 1 decides the opposite of rank 0 -> the consensus ends both pods.
    follower.fault(kind="desync", ranks=[1])
    injected = time.time()
    codes = [pod.wait_exit(timeout=15) for pod in pods]
    assert all(code != 0 for code in codes), codes
    for pod in pods:
        (state,) = read_rank_states(pod.pod_dir / "state")
        failure = state["consensus_failure"]
        assert failure is not None, pod.output()[-3000:]
        assert failure["detected_at"] - injected < 5.0
        first_div = failure["first_divergence"]
        assert first_div is not None
        events = first_div["events"]
        assert set(events) == {"0", "1"}
        assert all((e or "").startswith("lockstep decision") for e in events.values())
        assert events["0"] != events["1"]
        assert "TP ranks diverged" in pod.output()

    # The evidence outlives the container restart it caused: the restarted pod's agent
    # serves it as the previous incarnation while the new rank waits for its group.
    restarted = launcher.restart(follower)

    def previous_failure() -> Any:
        with contextlib.suppress(httpx.HTTPError):
            previous = restarted.ranks()["previous"]
            return previous and previous[0]["consensus_failure"]
        return None

    evidence = wait_until(previous_failure, 20, "the previous incarnation's evidence")
    assert evidence["first_divergence"]["events"]["1"].startswith("lockstep decision")


@pytest.mark.parametrize(
    ("load", "where"),
    [("busy", ("run_batch", "tp:device")), ("idle", ("broadcast_pyobj", "tp:cpu"))],
    ids=["busy", "idle"],
)
def test_one_pod_group_hang_fails_the_probe_without_a_consensus_failure(
    launcher: Launcher, load: str, where: tuple[str, str]
) -> None:
    (pod,) = launcher.group(tp=2, nnodes=1, LOCKSTEP_STANDIN_REQUEST_TIMEOUT_S="2")
    wait_serving(pod, [pod])
    assert generate(pod, "one pod", 4).json()["text"] == expected_text("one pod", 4)
    assert pod.get("/lockstep/probe?timeout=5").status_code == 200

    answers: list[httpx.Response] = []
    if load == "busy":
        # A request long enough to still be running when the fault lands.
        worker = threading.Thread(target=lambda: answers.append(generate(pod, "long", 4000)))
        worker.start()
        wait_until(
            lambda: all(
                (s["last_decision"] or {}).get("kind") == "batch" for s in pod.ranks()["ranks"]
            ),
            5,
            "the group running a batch",
        )
    pod.fault(kind="hang", ranks=[1])

    def stuck_in_the_same_collective() -> bool:
        states = pod.ranks()["ranks"]
        return len(states) == 2 and all(
            s["collective"] is not None
            and (s["collective"]["op"], s["collective"]["group"]) == where
            for s in states
        )

    wait_until(stuck_in_the_same_collective, 5, f"both ranks in {where}")
    started = time.monotonic()
    stuck = generate(pod, "never answered", 4)
    assert stuck.status_code == 504, stuck.text
    assert time.monotonic() - started < 4.0
    if load == "busy":
        worker.join(10)
        assert [a.status_code for a in answers] == [504]

    before = pod.ranks()["ranks"]
    for timeout in (1.0, 1.0):
        started = time.monotonic()
        probe = pod.get(f"/lockstep/probe?timeout={timeout}")
        assert probe.status_code == 504, probe.text
        assert not probe.json()["joined"], "a timed-out probe must not stay in flight"
        assert time.monotonic() - started < timeout + 1.0
    after = pod.ranks()["ranks"]
    assert before[0]["collective"]["seq"] == before[1]["collective"]["seq"]
    for b, a in zip(before, after, strict=True):
        assert a["iteration"] == b["iteration"], "a hung group made progress"
        assert a["collective"] == b["collective"]
        assert a["last_decision"] == b["last_decision"]
        assert a["alive"] and a["consensus_failure"] is None
    # Like SGLang's /health: blind to the hang. The deep probe is what sees it.
    assert pod.get("/health").status_code == 200

    # The main process is not wedged with its ranks: a stop ends it and them, in time.
    pids = list(pod.rank_pids().values())
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.wait_exit(timeout=8) == 0
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), f"rank pid {pid} left"


def test_slow_steps_longer_than_the_gloo_timeout_start_and_stop_together_on_every_rank(
    launcher: Launcher,
) -> None:
    # A slow model step is slow on every rank; each rank reads its own pod's fault file,
    # here a second apart (the drills' writer reaches the pods one by one). Were a rank
    # to sleep out its step alone, its peer would wait in the forward's collective past
    # the gloo timeout and the group would die; the slow drill lost a group that way.
    gloo_timeout_s, slow_s = 4.0, 6.0
    pods = launcher.group(
        tp=2,
        nnodes=2,
        LOCKSTEP_GLOO_TIMEOUT_SECONDS=str(gloo_timeout_s),
        LOCKSTEP_STANDIN_REQUEST_TIMEOUT_S="120",
    )
    leader, follower = pods
    wait_serving(leader, pods)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        leader.fault(kind="slow", step_seconds=slow_s)
        started = time.monotonic()
        slow = pool.submit(
            lambda: leader.post(
                "/generate",
                {"text": "slow together", "sampling_params": {"max_new_tokens": 2}},
                timeout=120,
            )
        )
        time.sleep(1.0)
        follower.fault(kind="slow", step_seconds=slow_s)
        answer = slow.result(timeout=120)
        took = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    assert answer.json()["text"] == expected_text("slow together", 2)
    assert took >= slow_s, took
    # Cleared the same way, a second apart, in the middle of a slow request.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        slow = pool.submit(
            lambda: leader.post(
                "/generate",
                {"text": "cleared apart", "sampling_params": {"max_new_tokens": 3}},
                timeout=120,
            )
        )
        time.sleep(1.0)
        follower.fault(kind="none")
        time.sleep(1.0)
        leader.fault(kind="none")
        assert slow.result(timeout=120).status_code == 200
    assert generate(leader, "fast again", 2).json()["text"] == expected_text("fast again", 2)
    assert all(pod.proc.poll() is None for pod in pods), leader.output()[-3000:]


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def test_stalled_rank_hangs_the_group_and_a_killed_rank_ends_both_pods(
    launcher: Launcher,
) -> None:
    gloo_timeout_s = 8.0
    hold_s = 4.0
    pods = launcher.group(
        tp=2,
        nnodes=2,
        LOCKSTEP_GLOO_TIMEOUT_SECONDS=str(gloo_timeout_s),
        LOCKSTEP_EXIT_HOLD_S=str(hold_s),
    )
    leader, follower = pods
    wait_serving(leader, pods)
    assert leader.get("/lockstep/probe?timeout=5").status_code == 200
    (rank1_pid,) = follower.rank_pids().values()

    os.kill(rank1_pid, signal.SIGSTOP)
    stalled_at = time.monotonic()
    probe = leader.get("/lockstep/probe?timeout=1")
    assert probe.status_code == 504, probe.text
    assert all(s["consensus_failure"] is None for s in leader.ranks()["ranks"])
    assert time.monotonic() - stalled_at < gloo_timeout_s - 2, "checks ran too late"

    os.kill(rank1_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    # As the real launcher: the pod agent keeps serving how the ranks ended for the
    # hold (the operator's window to read it and restart the group in place)...
    ended = wait_until(lambda: follower.ranks()["engine_exit"], 3, "the ended ranks' record")
    assert ended["signal"] == "SIGKILL" and ended["exit_code"] is None
    assert not any(r["alive"] for r in follower.ranks()["ranks"])
    # ... then the container exits with the rank's status.
    assert follower.wait_exit(timeout=hold_s + 5) == 128 + signal.SIGKILL
    assert time.monotonic() - killed_at >= hold_s - 0.5
    assert leader.wait_exit(timeout=gloo_timeout_s + 5) != 0
    assert "rank 0" in leader.output() and "ended with status" in leader.output()


def test_bad_argv_is_refused_with_the_reason(launcher: Launcher) -> None:
    pod = launcher.pod(
        f"{launcher.net}.9", ["--model-path", "/m", "--tp-size", "2", "--nnodes", "2"], {}, "bad"
    )
    assert pod.wait_exit(timeout=30) == 2
    assert "--dist-init-addr is required" in pod.output()

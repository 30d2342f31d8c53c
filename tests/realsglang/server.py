"""The real SGLang server through ``lockstep-sglang``, on CPU, for tests (0.5.23 from the
test venv; another supported release with ``python=`` its own venv's interpreter, see
``.ci/setup-release-venv``).

``RealServer`` starts the launcher exactly as a pod's container would (the launcher as
the main process, its pod agent, the engine with lockstep's hooks, SGLang's schedulers)
with the CPU support of :mod:`lockstep_dev.localcluster.sglang_cpu`, on free local ports,
with its own state directory and log, and kills its whole process group when the test
ends. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from lockstep_dev.localcluster import sglang_cpu

TOKEN = "real-sglang-test-token"
HOST = "127.0.0.1"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until truthy (returned); ``AssertionError`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def operator_verdict(
    pod: str, probe: httpx.Response, first: Mapping[str, Any], then: Mapping[str, Any]
) -> Any:
    """The operator's own judgement (``lockstep.core.verdicts.classify_group``) of a one-pod
    group on node-a from what the real server answered: the deep probe's answer and two
    of its pod agent's rank reports (``first``, then ``then`` a moment later)."""
    from lockstep.clients.agent_client import report_from_ranks
    from lockstep.core.verdicts import GroupObservation, PodView, ProbeOutcome, classify_group

    obs = GroupObservation(
        epoch=0,
        expected_pods=1,
        probe=ProbeOutcome(probe.json()["status"], error=probe.json().get("error")),
        pods=(PodView(name=pod, uid="uid-0", epoch=0, node="node-a"),),
        agents=(report_from_ranks(pod, dict(then), 0),),
    )
    previous = report_from_ranks(pod, dict(first), 0).ranks or ()
    return classify_group(obs, previous, now=time.time())


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class RealServer:
    """One ``lockstep-sglang`` container on this machine."""

    def __init__(
        self,
        workdir: Path,
        model: Path,
        *,
        tp: int = 2,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        epoch: int = 0,
        hold_s: float = 30.0,
        cores: Sequence[int] | None = None,
        mode: str | None = None,
        python: str = sys.executable,
    ) -> None:
        """``mode``: ``prefill`` or ``decode`` for a PD server (mooncake over TCP; a
        prefill gets a bootstrap port), None for a plain one."""
        self.workdir = workdir
        self.python = python
        self.state_dir = workdir / "state"
        self.fault_file = workdir / "fault.json"
        self.port = free_port()
        self.agent_port = free_port()
        self.bootstrap_port = free_port()
        pd: list[str] = []
        if mode is not None:
            pd = ["--disaggregation-mode", mode, "--disaggregation-transfer-backend", "mooncake"]
            if mode == "prefill":
                pd += ["--disaggregation-bootstrap-port", str(self.bootstrap_port)]
        self.args = [
            "--model-path",
            str(model),
            "--served-model-name",
            sglang_cpu.SERVED_NAME,
            "--tp",
            str(tp),
            "--host",
            HOST,
            "--port",
            str(self.port),
            *pd,
            *sglang_cpu.cpu_flags(mode),
            *args,
        ]
        base = {
            **os.environ,
            "LOCKSTEP_STATE_DIR": str(self.state_dir),
            "LOCKSTEP_AGENT_HOST": HOST,
            "LOCKSTEP_AGENT_PORT": str(self.agent_port),
            "LOCKSTEP_AGENT_TOKEN": TOKEN,
            "LOCKSTEP_GROUP_EPOCH": str(epoch),
            "LOCKSTEP_EXIT_HOLD_S": str(hold_s),
            "LOCKSTEP_GLOO_TIMEOUT_S": "60",
            "LOCKSTEP_TEST_FAULT_FILE": str(self.fault_file),
            "PYTHONWARNINGS": "ignore",
            **(env or {}),
        }
        self.env = sglang_cpu.cpu_env(base, cores=cores or [i % 2 for i in range(tp)])
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.http = httpx.Client(trust_env=False, timeout=10)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def agent(self) -> str:
        return f"http://{HOST}:{self.agent_port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"container-{self.starts}.log"

    def start(self, *extra: str) -> RealServer:
        """Start (or, after it exited, start again: a container restart) the launcher."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [self.python, "-m", "lockstep_sglang.launcher", *self.args, *extra]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def wait_ready(self, timeout: float = 240.0) -> float:
        """Until the deep probe answers 200; returns the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get(f"{self.url}/lockstep/probe", timeout=5).status_code == 200:
                    return time.monotonic() - started
            time.sleep(1.0)
        raise AssertionError(f"not ready after {timeout:.0f}s:\n{self.tail()}")

    def probe(self, timeout_s: float = 5.0) -> httpx.Response:
        return self.http.get(
            f"{self.url}/lockstep/probe", params={"timeout": timeout_s}, timeout=timeout_s + 10
        )

    def generate(self, text: str, max_new_tokens: int = 8, timeout: float = 60.0) -> Any:
        body = {
            "text": text,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
        }
        return self.http.post(f"{self.url}/generate", json=body, timeout=timeout)

    def ranks(self) -> dict[str, Any]:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        data: dict[str, Any] = self.http.get(f"{self.agent}/ranks", timeout=5, headers=auth).json()
        return data

    def restart(self, epoch: int, token: str = TOKEN) -> httpx.Response:
        return self.http.post(
            f"{self.agent}/restart",
            json={"epoch": str(epoch), "reason": "test"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )

    def inject(self, kind: str, ranks: Sequence[int] | None = None, **extra: Any) -> None:
        fault = {"kind": kind, "ranks": None if ranks is None else list(ranks), **extra}
        tmp = self.fault_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(fault))
        tmp.replace(self.fault_file)

    def rank_pids(self) -> dict[int, int]:
        return {int(r["rank"]): int(r["pid"]) for r in self.ranks()["ranks"]}

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=15)
        # Whatever the group left (a rank in another session would be a bug: fail loud).
        self.http.close()


@contextlib.contextmanager
def started_servers(model: Path, prefix: str) -> Iterator[Callable[..., RealServer]]:
    """``make(**options)``: a started (not yet ready) server in its own temporary
    directory; every one made is killed, and its directory removed, at the end."""
    started: list[RealServer] = []

    def make(**options: Any) -> RealServer:
        server = RealServer(Path(tempfile.mkdtemp(prefix=prefix)), model, **options)
        started.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in started:
            server.stop()
            shutil.rmtree(server.workdir, ignore_errors=True)

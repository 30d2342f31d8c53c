"""The container runtime: one process group per container, its log, its end.

Stands in for the real kubelet's container runtime (`pkg/kubelet/kuberuntime` over a CRI
runtime such as containerd): a container is a process started in a new session (so its
group can be signalled as one), writing to its log file after a header line
(`containerlogs.run_header`); a container that exits is reaped with whatever it left in
its group. `PodContainer` is what the kubelet knows of one container of a pod: its spec,
its current process, and the state its status is made from.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lockstep_dev.localcluster.containerlogs import run_header
from lockstep_dev.localcluster.kubelet.common import Obj, rfc3339
from lockstep_dev.localcluster.kubelet.status import ContainerView

LOG_MAX_BYTES = 16 * 1024 * 1024


class StartFailed(Exception):
    """A container's process could not be started (the message says why)."""


@dataclass
class PodContainer:
    """One container of a pod and its current process; touched by its pod's thread only."""

    spec: Obj
    log_path: Path
    restart_count: int = 0
    process: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    started_mono: float = 0.0
    waiting: tuple[str, str] = ("ContainerCreating", "")
    terminated: Obj | None = None  # final (no restart coming)
    last_terminated: Obj | None = None
    next_start: float = 0.0
    backoff: float = 0.0
    permanent: bool = False  # a waiting reason no retry can change
    ready: bool = False
    probe_next: float = 0.0
    probe_failures: int = 0
    probe_successes: int = 0
    rendezvous_since: float | None = None
    restart_pending: bool = False  # the next start is a restart (restartCount + 1)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def termination_path(self) -> Path:
        """The file standing in for the container's /dev/termination-log."""
        return self.log_path.with_name(f"{self.log_path.stem}.termination")

    def view(self) -> ContainerView:
        if self.process is not None:
            state: Obj = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None:
            state = {"terminated": self.terminated}
        else:
            reason, message = self.waiting
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        return ContainerView(
            name=self.name,
            image=str(self.spec.get("image", "")),
            state=state,
            last_state={"terminated": self.last_terminated} if self.last_terminated else {},
            restart_count=self.restart_count,
            ready=self.ready and self.process is not None,
            started=self.process is not None,
            container_id=f"process://{self.process.pid}" if self.process is not None else "",
        )


def start_process(
    argv: list[str], env: Mapping[str, str], *, cwd: Path, log_path: Path, restart: int
) -> tuple[subprocess.Popen[bytes], float]:
    """Start a container's process in its own session, its output appended to `log_path`
    after a run header (`restart`: the run's restart count); the process and when it
    started. Raises `StartFailed` when the program cannot start (the header is written
    already); an `OSError` of the log itself is not caught."""
    rotate_log(log_path)
    started = time.time()
    with open(log_path, "ab") as log:
        log.write(run_header(rfc3339(started), restart, argv))
        log.flush()
        try:
            process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise StartFailed(f"starting {argv[0]}: {exc}") from exc
    return process, started


def leader_exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether a container's main process exited, without reaping it: until it is reaped
    its process group id cannot be reused, so killing the group stays safe."""
    if process.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return True
    return info is not None


def reap_group(process: subprocess.Popen[bytes]) -> int:
    """Kill whatever the exited main process left in its group, then reap it."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.wait()


def kill_container(container: PodContainer, sig: signal.Signals, *, wait: float) -> int | None:
    """Send `sig` to the container's process group; after SIGKILL wait up to `wait`
    seconds for the process. Returns the pid of a process reaped now (the container then
    has none), else None."""
    process = container.process
    if process is None:
        return None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
    if sig != signal.SIGKILL:
        return None
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=wait)
    if process.returncode is None:
        return None
    container.process = None
    return process.pid


def rotate_log(path: Path) -> None:
    """Keep a container log bounded: past `LOG_MAX_BYTES` it moves to `<name>.1`."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > LOG_MAX_BYTES:
            path.replace(path.with_name(path.name + ".1"))

"""Node maintenance on a cluster, the way an administrator does it: the real `kubectl
cordon`, `uncordon` and `drain`.

`drain` runs `kubectl drain <node> --ignore-daemonsets --delete-emptydir-data
--timeout=<t>s` and returns a `DrainResult`; `start_drain` starts the same command and
returns a `Drain` handle at once, so a drill can keep sending traffic while the node
empties and then `wait()` for it::

    with start_drain(cp.kubeconfig, "lockstep-gpu-1", timeout_s=120) as running:
        while running.running:
            send_requests()
        result = running.wait(timeout=10)
    print(result.returncode, f"{result.seconds:.1f}s", result.evicted)

What `kubectl drain` does (kubectl v1.34), which is what the tests rely on:
cordon the node (`spec.unschedulable`), list its pods, refuse (before evicting anything)
pods without a controller owner reference unless `--force`, then evict each pod through
the eviction API (`pods/eviction`, policy/v1). The API server refuses an eviction that a
PodDisruptionBudget does not allow (429); kubectl retries it every 5 s until `--timeout`
runs out and then exits 1 with the pods still there. An allowed eviction is a graceful
delete; kubectl waits until each pod is gone. Pods of DaemonSets are skipped
(`--ignore-daemonsets`); emptyDir data is lost with the pod (`--delete-emptydir-data`,
without which kubectl refuses such pods).

Every kubectl here runs in its own session and is bounded twice: by `--timeout` (kubectl's
own, for the evictions) and by a process bound (`timeout_s` plus `PROCESS_SLACK_S`) after
which its process group is killed; drains still running when the interpreter exits are
killed too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from lockstep_dev.localcluster.controlplane import find_kubectl

PROCESS_SLACK_S = 30.0
"""How long past its own `--timeout` a kubectl may run before its process group is killed
(cordoning, listing and discovery come before the timeout starts)."""
CORDON_TIMEOUT_S = 30.0

_EVICTED = re.compile(r"^pod/(\S+) evicted$")


class MaintenanceError(RuntimeError):
    """kubectl cordon/uncordon failed or did not finish in time."""


@dataclass(frozen=True)
class DrainResult:
    """How one `kubectl drain` ended."""

    node: str
    returncode: int
    """kubectl's exit status: 0 drained; 1 refused or timed out (see `output`); negative
    (a signal) when `killed`."""
    seconds: float
    """From start to exit, as measured here (kubectl's own start-up included)."""
    output: str
    """kubectl's stdout and stderr, interleaved as written."""
    killed: bool = False
    """Killed here: past its process bound, or stopped by `Drain.stop()`."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def evicted(self) -> tuple[str, ...]:
        """Names of the pods kubectl reported evicted (`pod/<name> evicted`)."""
        return tuple(
            m.group(1) for line in self.output.splitlines() if (m := _EVICTED.match(line.strip()))
        )


class Drain:
    """A running `kubectl drain`; see `start_drain`. A context manager: leaving it kills
    the drain if it is still running."""

    def __init__(self, node: str, argv: Sequence[str], process_timeout_s: float) -> None:
        self.node = node
        self.argv = list(argv)
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._killed = False
        self._ended: float | None = None
        self._started = time.monotonic()
        self._process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _running.add(self)
        # The pipe is read all along, so a long drain never blocks on a full pipe.
        self._reader = threading.Thread(target=self._read, name=f"drain-{node}", daemon=True)
        self._reader.start()
        self._bound = threading.Timer(process_timeout_s, self._kill)
        self._bound.daemon = True
        self._bound.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.running:
            self.stop()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    @property
    def seconds(self) -> float:
        """Seconds since the start, or until the end once it ended."""
        end = self._ended if self._ended is not None else time.monotonic()
        return end - self._started

    @property
    def output(self) -> str:
        """What kubectl wrote so far."""
        with self._lock:
            return "".join(self._lines)

    def wait(self, timeout: float | None = None) -> DrainResult:
        """Wait for kubectl to exit and return how it ended. Raises `TimeoutError` (and
        leaves the drain running) when it did not end within `timeout` seconds."""
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"kubectl drain {self.node} still running after {timeout}s"
            ) from None
        return self._finish()

    def stop(self) -> DrainResult:
        """Kill kubectl (its process group) and return how it ended. The node stays
        cordoned and pods already evicted stay evicted, as with Ctrl-C."""
        self._kill()
        self._process.wait()
        return self._finish()

    def _finish(self) -> DrainResult:
        self._bound.cancel()
        self._reader.join(timeout=5.0)
        if self._ended is None:
            self._ended = time.monotonic()
        _running.discard(self)
        return DrainResult(
            node=self.node,
            returncode=self._process.returncode,
            seconds=self._ended - self._started,
            output=self.output,
            killed=self._killed,
        )

    def _read(self) -> None:
        stdout = self._process.stdout
        assert stdout is not None
        with stdout:
            for raw in stdout:
                with self._lock:
                    self._lines.append(raw.decode(errors="replace"))
        # EOF comes when kubectl exits: that is the end as measured here.
        self._process.wait()
        self._ended = time.monotonic()

    def _kill(self) -> None:
        if self._process.poll() is None:
            self._killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)


def kubectl_argv(kubeconfig: Path, *args: str, kubectl: Path | None = None) -> list[str]:
    """kubectl with this kubeconfig and a discovery cache beside it (not ~/.kube/cache,
    which every local control plane on the same port would share)."""
    binary = kubectl or find_kubectl()
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--cache-dir={kubeconfig.parent / 'kubectl-cache'}",
        *args,
    ]


def start_drain(
    kubeconfig: Path,
    node: str,
    timeout_s: float,
    *,
    pod_selector: str | None = None,
    grace_period_s: int | None = None,
    extra_args: Sequence[str] = (),
    kubectl: Path | None = None,
) -> Drain:
    """Start `kubectl drain <node> --ignore-daemonsets --delete-emptydir-data
    --timeout=<timeout_s>s` and return at once. `pod_selector` drains only matching pods
    (`--pod-selector`), `grace_period_s` overrides the pods' grace periods
    (`--grace-period`), `extra_args` go last (e.g. `--disable-eviction`, `--force`)."""
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive (kubectl reads 0 as no timeout)")
    args = [
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        f"--timeout={timeout_s:g}s",
    ]
    if pod_selector is not None:
        args.append(f"--pod-selector={pod_selector}")
    if grace_period_s is not None:
        args.append(f"--grace-period={grace_period_s}")
    argv = kubectl_argv(kubeconfig, *args, *extra_args, kubectl=kubectl)
    return Drain(node, argv, timeout_s + PROCESS_SLACK_S)


def drain(
    kubeconfig: Path,
    node: str,
    timeout_s: float,
    *,
    pod_selector: str | None = None,
    grace_period_s: int | None = None,
    extra_args: Sequence[str] = (),
    kubectl: Path | None = None,
) -> DrainResult:
    """Drain `node` and wait for kubectl to exit (see `start_drain`). A failed drain is a
    result (`ok` false), not an exception."""
    with start_drain(
        kubeconfig,
        node,
        timeout_s,
        pod_selector=pod_selector,
        grace_period_s=grace_period_s,
        extra_args=extra_args,
        kubectl=kubectl,
    ) as running:
        # The process bound kills kubectl first; this only guards a hung pipe.
        return running.wait(timeout=timeout_s + 2 * PROCESS_SLACK_S)


def cordon(kubeconfig: Path, node: str, *, kubectl: Path | None = None) -> None:
    """`kubectl cordon <node>`: no new pods on it; those there keep running."""
    _run(kubeconfig, "cordon", node, kubectl=kubectl)


def uncordon(kubeconfig: Path, node: str, *, kubectl: Path | None = None) -> None:
    """`kubectl uncordon <node>`: schedulable again."""
    _run(kubeconfig, "uncordon", node, kubectl=kubectl)


def _run(kubeconfig: Path, verb: str, node: str, *, kubectl: Path | None) -> None:
    argv = kubectl_argv(kubeconfig, verb, node, kubectl=kubectl)
    # subprocess.run kills kubectl when the bound passes (it starts no children).
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CORDON_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise MaintenanceError(
            f"kubectl {verb} {node} did not finish in {CORDON_TIMEOUT_S:.0f}s"
        ) from exc
    if done.returncode != 0:
        raise MaintenanceError(
            f"kubectl {verb} {node} failed ({done.returncode}): "
            f"{done.stderr.strip() or done.stdout.strip()}"
        )


# Drains still running when the interpreter exits are killed (a test interrupted).
_running: weakref.WeakSet[Drain] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for running in list(_running):
        with contextlib.suppress(Exception):
            running._kill()

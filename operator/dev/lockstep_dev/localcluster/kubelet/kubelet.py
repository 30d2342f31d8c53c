"""The process kubelet itself: `ProcessKubelet`, which owns the nodes, the pod watch and
the pod workers.

Stands in for the real kubelet's main object and sync loop (`pkg/kubelet/kubelet.go`:
`Kubelet.Run` starts the node status and lease loops and the pod sources, `HandlePod*`
hands each pod bound to one of its nodes to its pod worker). The nodes are `node`, the
watch `podsource`, how a pod is run `pod_workers`; the package's docstring
(`lockstep_dev.localcluster.kubelet`) says what a pod becomes here.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from lockstep_dev.localcluster.containerlogs import ContainerLogServer
from lockstep_dev.localcluster.controlplane import LocalControlPlane
from lockstep_dev.localcluster.engines import CommandTable, Engine
from lockstep_dev.localcluster.kubelet.argv import STANDIN_ENGINE
from lockstep_dev.localcluster.kubelet.common import LOG_NAME, REQUEST_TIMEOUT, KubeletError, Obj
from lockstep_dev.localcluster.kubelet.env import INHERITED_ENV
from lockstep_dev.localcluster.kubelet.network import AddressPool
from lockstep_dev.localcluster.kubelet.node import (
    NODE_PREFIX,
    NodeShape,
    build_node,
    heartbeat,
    node_names,
    register_node,
    remove_node,
    wait_schedulable,
)
from lockstep_dev.localcluster.kubelet.pod_workers import PodWorker
from lockstep_dev.localcluster.kubelet.podsource import PodSource
from lockstep_dev.localcluster.kubelet.serviceaccounts import ServiceAccountKubeconfigs

# Process groups still running when the interpreter exits (a caller that never stopped
# its kubelet) are killed here.
_running: weakref.WeakSet[ProcessKubelet] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for kubelet in list(_running):
        with contextlib.suppress(Exception):
            kubelet.kill_all()


class ProcessKubelet:
    """Fake GPU nodes whose pods run as local processes; see the package docstring.

    A context manager (`start()` / `stop()`), and also a `ControlPlaneExtension`: an
    instance made without a control plane is called with one, returns itself, and is
    entered by `LocalControlPlane` once the control plane is ready.

    `root_dir` holds one directory per pod incarnation, `pods/<namespace>_<name>_<uid>/`,
    with `container.log` (the first container's output; others write
    `container-<name>.log`). Without `root_dir` a temporary directory is used and removed
    on stop. `stop()` kills every process the kubelet started, and with
    `remove_nodes_on_stop` deletes its nodes (and their leases) so the scheduler stops
    using them; pod objects are left as they are.

    Nodes are named `<node_prefix>-<i>`; `node_labels` (by node name, e.g.
    `rack_labels(names, racks)`) adds labels to one node on top of the shape's. The
    kubelet writes a node's metadata only when it registers it (an adopted node left by
    an earlier kubelet gets its labels merged in, keeping others'); heartbeats patch the
    status subresource only, so labels added by others (`kubectl label`) and a cordon
    (`spec.unschedulable` and its taint, `kubectl cordon` or `drain`) stay as they are.
    Evicting a pod (the eviction API, as `kubectl drain` does) is a graceful deletion:
    its processes get SIGTERM, then SIGKILL after the grace period, and the pod object
    is removed.
    """

    def __init__(
        self,
        controlplane: LocalControlPlane | None = None,
        *,
        nodes: int = 1,
        node_prefix: str = NODE_PREFIX,
        shape: NodeShape | None = None,
        node_labels: Mapping[str, Mapping[str, str]] | None = None,
        root_dir: Path | None = None,
        address_pool: str = "127.0.64.0/18",
        commands: CommandTable | None = None,
        engine: Engine | None = None,
        inherit_env: Sequence[str] = INHERITED_ENV,
        extra_env: Mapping[str, str] | None = None,
        heartbeat_seconds: float = 10.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 10.0,
        backoff_reset: float = 60.0,
        rendezvous_timeout: float = 60.0,
        start_timeout: float = 60.0,
        remove_nodes_on_stop: bool = True,
    ) -> None:
        if nodes < 1:
            raise ValueError("a process kubelet needs at least one node")
        self._cp = controlplane
        self.node_names = node_names(nodes, node_prefix)
        self.shape = shape or NodeShape()
        unknown = sorted(set(node_labels or {}) - set(self.node_names))
        if unknown:
            raise ValueError(f"node_labels for nodes this kubelet does not have: {unknown}")
        self.node_labels = {n: dict((node_labels or {}).get(n, {})) for n in self.node_names}
        self._given_root = root_dir
        self._root: Path | None = None
        self._addresses = AddressPool(address_pool)
        self.engine = engine
        self.commands = dict(
            commands if commands is not None else (engine or STANDIN_ENGINE).commands
        )
        self._inherit = tuple(inherit_env)
        self._extra_env = dict(extra_env or {})
        self.heartbeat_seconds = heartbeat_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.backoff_reset = backoff_reset
        self.rendezvous_timeout = rendezvous_timeout
        self._start_timeout = start_timeout
        self._remove_nodes = remove_nodes_on_stop
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._workers: dict[str, PodWorker] = {}  # by pod UID
        self._finished: set[str] = set()  # UIDs whose worker is done: never run again
        self._pods: dict[tuple[str, str], Obj] = {}  # every pod seen, by (namespace, name)
        self._groups: set[int] = set()  # process groups alive, for the safety nets
        self._accounts = ServiceAccountKubeconfigs(lambda: self.root_dir / "serviceaccounts")
        self._threads: list[threading.Thread] = []
        self._source = PodSource(
            observe=self._observe,
            relisted=self._relisted,
            stopping=self._stopping,
            record=self._record,
        )
        self._logs = ContainerLogServer(self._log_path)
        self._logs_port = 0
        self._ready_since = time.time()
        self._started = False
        self.errors: list[str] = []
        """Unexpected errors of the background threads (they keep going), newest last."""

    # -- as an extension and a context manager ----------------------------------------

    def __call__(self, controlplane: LocalControlPlane) -> Self:
        """The `ControlPlaneExtension` protocol: bind to the ready control plane."""
        if self._cp is not None and self._cp is not controlplane:
            raise KubeletError("this kubelet already belongs to another control plane")
        self._cp = controlplane
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """Register the nodes, start heartbeats and the pod watch, and wait (bounded by
        `start_timeout`) until the scheduler may place pods on every node."""
        if self._cp is None:
            raise KubeletError("no control plane: pass one, or use the kubelet as extension")
        if self._started:
            raise KubeletError("already started")
        self._started = True
        self._stopping.clear()
        _running.add(self)
        try:
            if self._given_root is not None:
                self._given_root.mkdir(parents=True, exist_ok=True)
                self._root = self._given_root.resolve()
            else:
                self._root = Path(tempfile.mkdtemp(prefix="lockstep-kubelet-"))
            (self._root / "pods").mkdir(exist_ok=True)
            self._logs_port = self._logs.start()
            with self._http() as http:
                for name in self.node_names:
                    register_node(http, build_node(name, self.shape, self.node_labels[name]))
                self._heartbeat(http)
            self._spawn_thread("heartbeat", self._heartbeat_loop)
            self._spawn_thread("pod-watch", self._watch_loop)
            self._wait_schedulable()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every process this kubelet started, stop its threads and (by default)
        remove its nodes; idempotent. Pod objects are left as they are."""
        if not self._started:
            return
        self._stopping.set()
        # Shutting the watch's socket down ends its blocking read at once.
        with contextlib.suppress(Exception):
            self._source.interrupt()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.wake()
        for worker in workers:
            worker.join(timeout=10.0)
        for thread in self._threads:
            thread.join(timeout=5.0)
        self.kill_all()
        self._logs.stop()
        if self._remove_nodes and self._cp is not None and self._cp.running:
            with contextlib.suppress(Exception), self._http() as http:
                for name in self.node_names:
                    remove_node(http, name)
        if self._root is not None and self._given_root is None:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root = None
        self._threads.clear()
        with self._lock:
            self._workers.clear()
            self._pods.clear()
            self._finished.clear()
        self._accounts.clear()
        self._started = False
        _running.discard(self)

    def kill_all(self) -> None:
        """SIGKILL every process group this kubelet started that may still be alive."""
        with self._lock:
            groups = list(self._groups)
            self._groups.clear()
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)

    # -- what the dev tooling and tests read -------------------------------------------

    @property
    def root_dir(self) -> Path:
        if self._root is None:
            raise KubeletError("the kubelet is not running")
        return self._root

    def pod_dir(self, namespace: str, name: str) -> Path | None:
        """The directory of the pod's current incarnation on this kubelet, if it runs here."""
        worker = self._worker(namespace, name)
        return worker.dir if worker is not None else None

    def address_of(self, namespace: str, name: str) -> str | None:
        """The loopback address of a pod running on this kubelet."""
        worker = self._worker(namespace, name)
        return worker.ip if worker is not None else None

    def processes(self) -> dict[tuple[str, str], int]:
        """`(namespace, name)` -> pid of the pod's first container, for running pods."""
        with self._lock:
            workers = list(self._workers.values())
        out: dict[tuple[str, str], int] = {}
        for worker in workers:
            pid = worker.pid()
            if pid is not None and not worker.terminating:
                out[(worker.namespace, worker.name)] = pid
        return out

    def log_tail(self, namespace: str, name: str, *, lines: int = 100) -> str:
        """The last `lines` lines of the pod's first container log ('' when none)."""
        directory = self.pod_dir(namespace, name)
        if directory is None:
            return ""
        try:
            with open(directory / LOG_NAME, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 256 * 1024))
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _log_path(self, namespace: str, name: str, container: str) -> Path | None:
        """The log file of a container of a pod this kubelet runs (also while it ends)."""
        with self._lock:
            found = [
                w for w in self._workers.values() if (w.namespace, w.name) == (namespace, name)
            ]
        found.sort(key=lambda w: w.terminating)  # the live incarnation first
        for worker in found:
            for run in worker.containers:
                if run.name == container:
                    return run.log_path
        return None

    def _worker(self, namespace: str, name: str) -> PodWorker | None:
        with self._lock:
            found = [
                w
                for w in self._workers.values()
                if w.namespace == namespace and w.name == name and not w.terminating
            ]
        return found[-1] if found else None

    # -- nodes -------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        assert self._cp is not None
        return self._cp.http_client(timeout=REQUEST_TIMEOUT)

    def _heartbeat(self, http: httpx.Client) -> None:
        assert self._cp is not None
        heartbeat(
            http,
            self.node_names,
            self.shape,
            now=time.time(),
            ready_since=self._ready_since,
            version=self._cp.info.kubernetes_version,
            kubelet_port=self._logs_port,
        )

    def _heartbeat_loop(self) -> None:
        with self._http() as http:
            while not self._stopping.wait(self.heartbeat_seconds):
                try:
                    self._heartbeat(http)
                except Exception as exc:  # the next beat may succeed; keep beating
                    self._record(f"heartbeat: {exc!r}")

    def _wait_schedulable(self) -> None:
        with self._http() as http:
            wait_schedulable(http, self.node_names, self._start_timeout)

    # -- pods --------------------------------------------------------------------------

    def _spawn_thread(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"kubelet-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _record(self, error: str) -> None:
        if not self._stopping.is_set():
            self.errors.append(error)
            del self.errors[:-100]

    def _watch_loop(self) -> None:
        with self._http() as http:
            self._source.run(http)

    def _relisted(self, seen: set[str]) -> None:
        """A list of every pod held the UIDs `seen`: the workers of the others end, and
        pods no longer there are forgotten."""
        with self._lock:
            vanished = [w for uid, w in self._workers.items() if uid not in seen]
            known = {
                (ns, n): p for (ns, n), p in self._pods.items() if p["metadata"]["uid"] in seen
            }
            self._pods = known
        for worker in vanished:
            worker.update(None)

    def _observe(self, pod: Obj, gone: bool) -> None:
        """A pod as the watch saw it (`gone`: deleted): a new one bound to one of this
        kubelet's nodes gets a worker, a known one's worker is told."""
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        uid = meta["uid"]
        with self._lock:
            if gone:
                if self._pods.get(key, {}).get("metadata", {}).get("uid") == uid:
                    del self._pods[key]
            else:
                self._pods[key] = pod
            worker = self._workers.get(uid)
            if (
                worker is None
                and not gone
                and uid not in self._finished
                and not self._stopping.is_set()
                and (pod.get("spec") or {}).get("nodeName") in self.node_names
                and (
                    meta.get("deletionTimestamp")
                    or (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                )
            ):
                worker = PodWorker(self, pod)
                self._workers[uid] = worker
                worker.start()
                return
        if worker is not None:
            worker.update(None if gone else pod)

    def _forget(self, worker: PodWorker) -> None:
        with self._lock:
            if self._workers.get(worker.uid) is worker:
                del self._workers[worker.uid]
            if not self._stopping.is_set():
                self._finished.add(worker.uid)

    def rendezvous_ip(self, namespace: str, name: str) -> str | None:
        """The address of a live pod by name: from this kubelet's own pods first (known
        before their status lands), then from any pod's reported podIP."""
        with self._lock:
            for worker in self._workers.values():
                if (worker.namespace, worker.name) == (namespace, name) and not worker.terminating:
                    return worker.ip
            pod = self._pods.get((namespace, name))
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        ip = (pod.get("status") or {}).get("podIP")
        return str(ip) if ip else None

    def service_account_kubeconfig(self, http: httpx.Client, namespace: str, account: str) -> Path:
        """A kubeconfig for a ServiceAccount (minted once per account and kubelet).
        Raises `MissingConfig` while the account does not exist."""
        assert self._cp is not None
        return self._accounts.get(http, self._cp, namespace, account)

    def _inherited_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in self._inherit if k in os.environ}
        env.update(self._extra_env)
        return env

    def _track(self, group: int, alive: bool) -> None:
        with self._lock:
            if alive:
                self._groups.add(group)
            else:
                self._groups.discard(group)

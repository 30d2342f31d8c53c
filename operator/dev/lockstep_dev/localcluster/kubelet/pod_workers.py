"""Pod workers: one thread per pod incarnation, which owns the pod's processes.

Stands in for the real kubelet's pod workers and pod sync (`pkg/kubelet/pod_workers.go`,
`SyncPod` and `SyncTerminatingPod` in `pkg/kubelet/kubelet.go`, the start and kill of
containers in `pkg/kubelet/kuberuntime`): each tick a worker runs the init containers in
order, each to success, then starts the containers that are due, reaps those that
exited and restarts them per the pod's `restartPolicy` after a back-off (doubling up to
`backoff_max`, reset after `backoff_reset` seconds of running), probes readiness and
reports the pod's status. A deleted pod's containers get SIGTERM, then SIGKILL after the
grace period, and the worker removes the pod object as a kubelet does.

What a container becomes comes from `env` and `argv`, its process from `runtime`, its
readiness from `prober`, the pod's status from `status`. A worker belongs to its
`ProcessKubelet` (`kubelet`) and uses the kubelet's own members (its address pool, its
lock, its error list, its process-group tracking): they are one part of the real
kubelet, split in two files.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import TYPE_CHECKING

import httpx

from lockstep_dev.localcluster.engines import ContainerContext, EngineError
from lockstep_dev.localcluster.kubelet.argv import (
    DIST_INIT_FLAG,
    STANDIN_ENGINE,
    dist_init_pod,
    dist_init_target,
    local_argv,
    with_dist_init_ip,
    with_pod_host,
)
from lockstep_dev.localcluster.kubelet.common import (
    LOG_NAME,
    CannotRun,
    ContainerConfigError,
    MissingConfig,
    Obj,
    checked,
    rfc3339,
)
from lockstep_dev.localcluster.kubelet.env import (
    container_env,
    mount_map,
    read_secret,
    volume_dirs,
)
from lockstep_dev.localcluster.kubelet.prober import arm_probe, update_readiness
from lockstep_dev.localcluster.kubelet.runtime import (
    PodContainer,
    StartFailed,
    kill_container,
    leader_exited,
    reap_group,
    start_process,
)
from lockstep_dev.localcluster.kubelet.serviceaccounts import service_account_of
from lockstep_dev.localcluster.kubelet.status import (
    TERMINATION_ENV,
    PodStatusManager,
    terminated_state,
    termination_message,
)

if TYPE_CHECKING:
    from lockstep_dev.localcluster.kubelet.kubelet import ProcessKubelet

TICK_SECONDS = 0.1
"""How often each pod's thread looks at its processes when nothing else wakes it."""

CONFIG_RETRY_SECONDS = 1.0
"""How soon a container waiting for configuration (a Secret, a ServiceAccount) is
tried again."""


def restarts(restart_policy: str, exit_code: int) -> bool:
    """Whether a container that exited with `exit_code` is started again."""
    return restart_policy == "Always" or (restart_policy == "OnFailure" and exit_code != 0)


def next_backoff(current: float, initial: float, maximum: float) -> float:
    """The back-off before the next start: `initial` first, then doubled up to `maximum`
    (`current` 0 after a reset)."""
    return initial if current <= 0 else min(current * 2, maximum)


class PodWorker(threading.Thread):
    """Runs one pod incarnation (one UID): its address, directory and processes."""

    def __init__(self, kubelet: ProcessKubelet, pod: Obj) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.kubelet = kubelet
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.ip = kubelet._addresses.allocate()
        self.dir = kubelet.root_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.terminating = False
        self._pod: Obj | None = pod
        self._gone = False
        self._wake = threading.Event()
        self._pod_lock = threading.Lock()
        self.restart_policy = str(pod["spec"].get("restartPolicy", "Always"))
        self._status = PodStatusManager(
            self.namespace,
            self.name,
            self.uid,
            pod_ip=self.ip,
            restart_policy=self.restart_policy,
        )
        previous = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}
        self.containers: list[PodContainer] = []
        for i, spec in enumerate(pod["spec"]["containers"]):
            log = self.dir / (LOG_NAME if i == 0 else f"container-{spec['name']}.log")
            # A pod that an earlier kubelet ran continues its restart count.
            before = previous.get(spec["name"], {})
            self.containers.append(
                PodContainer(
                    spec=spec,
                    log_path=log,
                    restart_count=int(before.get("restartCount", 0)),
                    restart_pending=bool(before.get("started") or before.get("lastState")),
                )
            )
        self.volumes = volume_dirs(pod, self.dir)
        # Init containers run one after the other, each to success, before any container
        # starts (a failed one is run again after a back-off); once all succeeded the pod
        # is initialized for good (container restarts do not run them again).
        previous_init = {
            s["name"]: s for s in (pod.get("status") or {}).get("initContainerStatuses") or []
        }
        self.init_containers = [
            PodContainer(
                spec=spec,
                log_path=self.dir / f"init-{spec['name']}.log",
                restart_count=int(previous_init.get(spec["name"], {}).get("restartCount", 0)),
                waiting=("PodInitializing", "") if i else ("ContainerCreating", ""),
            )
            for i, spec in enumerate(pod["spec"].get("initContainers") or [])
        ]
        if self.init_containers:
            for container in self.containers:
                container.waiting = ("PodInitializing", "")

    # called from other threads
    def update(self, pod: Obj | None) -> None:
        """The pod as the watch saw it now; None: it is gone from the API server."""
        with self._pod_lock:
            if pod is None:
                self._gone = True
            else:
                self._pod = pod
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def pid(self) -> int | None:
        """The pid of the first container's process, if it runs."""
        process = self.containers[0].process if self.containers else None
        return process.pid if process is not None else None

    # the pod's thread
    def run(self) -> None:
        kubelet = self.kubelet
        http = kubelet._http()
        try:
            while not kubelet._stopping.is_set():
                with self._pod_lock:
                    pod, gone = self._pod, self._gone
                assert pod is not None
                if gone or pod["metadata"].get("deletionTimestamp"):
                    self._terminate(http, gone)
                    return
                self._step(pod, http)
                try:
                    self._report(http, pod)
                except Exception as exc:
                    kubelet._record(f"status of {self.namespace}/{self.name}: {exc!r}")
                self._wake.wait(TICK_SECONDS)
                self._wake.clear()
        except Exception as exc:
            kubelet._record(f"pod {self.namespace}/{self.name}: {exc!r}")
        finally:
            for container in [*self.init_containers, *self.containers]:
                self._kill(container, signal.SIGKILL, wait=5.0)
            http.close()
            kubelet._addresses.release(self.ip)
            kubelet._forget(self)

    def pending_init(self) -> list[str]:
        """The init containers that have not completed yet."""
        return [c.name for c in self.init_containers if c.terminated is None]

    def _step_init(self, pod: Obj, http: httpx.Client) -> bool:
        """Run the init containers in order; True once every one completed."""
        for container in self.init_containers:
            if container.terminated is not None:
                continue
            if container.process is not None:
                self._init_exited(container)
            elif not container.permanent and time.monotonic() >= container.next_start:
                self._start(container, pod, http)
            return False
        return True

    def _init_exited(self, container: PodContainer) -> None:
        terminated = self._reap(container)
        if terminated is None:
            return
        code = terminated["exitCode"]
        if code == 0:
            container.terminated = terminated
            return
        container.last_terminated = terminated
        container.restart_pending = True
        message = f"back-off restarting failed init container {container.name} (exit code {code})"
        self._backoff(container, ("Init:CrashLoopBackOff", message))

    def _step(self, pod: Obj, http: httpx.Client) -> None:
        if not self._step_init(pod, http):
            return
        now = time.monotonic()
        for container in self.containers:
            if container.process is not None:
                if self._exited(container):
                    continue
                update_readiness(container, now, self.ip)
            elif (
                not container.permanent
                and container.terminated is None
                and now >= container.next_start
            ):
                self._start(container, pod, http)

    def _start(self, container: PodContainer, pod: Obj, http: httpx.Client) -> None:
        kubelet = self.kubelet
        try:
            inherited = kubelet._inherited_env()
            account = service_account_of(pod)
            if account is not None:
                inherited["KUBECONFIG"] = str(
                    kubelet.service_account_kubeconfig(http, self.namespace, account)
                )
            env = container_env(
                container.spec,
                pod,
                pod_ip=self.ip,
                pod_dir=self.dir,
                inherited=inherited,
                secrets=lambda name: read_secret(http, self.namespace, name),
                mounts=mount_map(container.spec, self.volumes),
            )
            mounts = mount_map(container.spec, self.volumes)
            argv = local_argv(container.spec, env, kubelet.commands, mounts)
        except CannotRun as exc:
            container.waiting, container.permanent = ("ContainerCannotRun", str(exc)), True
            return
        except MissingConfig as exc:
            # As a kubelet does for a Secret that is not there yet: say so and try again.
            container.waiting = ("CreateContainerConfigError", str(exc))
            container.next_start = time.monotonic() + CONFIG_RETRY_SECONDS
            return
        except ContainerConfigError as exc:
            container.waiting, container.permanent = ("CreateContainerConfigError", str(exc)), True
            return
        resolved = self._resolve_rendezvous(container, argv)
        if resolved is None:
            return
        container.rendezvous_since = None
        argv = with_pod_host(resolved, self.ip)
        try:
            argv, env = (kubelet.engine or STANDIN_ENGINE).complete(
                argv, env, ContainerContext(container.spec, pod, self.ip, self.dir, mounts)
            )
        except EngineError as exc:
            self._backoff(container, ("RunContainerError", str(exc)))
            return
        # A process has no /dev/termination-log of its own: each container run gets a
        # fresh file of the pod's directory, named in the variable lockstep's runtime
        # reads (`lockstep_sglang.termination`), read back as the terminated state's
        # message when the process ends (as a kubelet reads the mounted file).
        container.termination_path.unlink(missing_ok=True)
        env = {**env, TERMINATION_ENV: str(container.termination_path)}
        restart = container.restart_count + (1 if container.restart_pending else 0)
        try:
            process, started = start_process(
                argv, env, cwd=self.dir, log_path=container.log_path, restart=restart
            )
        except StartFailed as exc:
            self._backoff(container, ("RunContainerError", str(exc)))
            return
        kubelet._track(process.pid, alive=True)
        if container.restart_pending:
            container.restart_count += 1
            container.restart_pending = False
        container.process = process
        container.started_at = rfc3339(started)
        container.started_mono = time.monotonic()
        arm_probe(container)

    def _resolve_rendezvous(self, container: PodContainer, argv: list[str]) -> list[str] | None:
        """`argv` with the host of its `--dist-init-addr` replaced by the address of the
        pod it names; None while that pod has none (the container waits, and says so)."""
        kubelet = self.kubelet
        target = dist_init_target(argv)
        peer = dist_init_pod(target[1]) if target else None
        if target is None or peer is None:
            return argv
        ip = self.ip if peer == self.name else kubelet.rendezvous_ip(self.namespace, peer)
        if ip is None:
            now = time.monotonic()
            if container.rendezvous_since is None:
                container.rendezvous_since = now
            what = f"the IP of pod {peer} ({DIST_INIT_FLAG} {target[1]}:{target[2]})"
            # Past the bound the wait goes on (the pod may still come), but the
            # status says it is stuck, as a kubelet does for a missing ConfigMap.
            if now - container.rendezvous_since > kubelet.rendezvous_timeout:
                limit = f"{kubelet.rendezvous_timeout:g}s"
                container.waiting = ("CreateContainerConfigError", f"no {what} after {limit}")
            else:
                container.waiting = ("ContainerCreating", f"waiting for {what}")
            return None
        return with_dist_init_ip(argv, ip)

    def _reap(self, container: PodContainer) -> Obj | None:
        """If the container's main process exited: reap it (killing what it left in its
        group) and return its `terminated` state; the container then has no process."""
        process = container.process
        assert process is not None
        if not leader_exited(process):
            return None
        returncode = reap_group(process)
        self.kubelet._track(process.pid, alive=False)
        terminated = terminated_state(
            returncode,
            started_at=container.started_at,
            finished_at=rfc3339(time.time()),
            pid=process.pid,
            message=termination_message(container.termination_path),
        )
        container.process = None
        return terminated

    def _exited(self, container: PodContainer) -> bool:
        """Reap the container's process if it exited, killing what it left in its group."""
        terminated = self._reap(container)
        if terminated is None:
            return False
        code = terminated["exitCode"]
        container.ready = False
        if not restarts(self.restart_policy, code):
            container.terminated = terminated
            return True
        container.last_terminated = terminated
        container.restart_pending = True
        if time.monotonic() - container.started_mono >= self.kubelet.backoff_reset:
            container.backoff = 0.0
        message = f"back-off restarting failed container {container.name} (exit code {code})"
        self._backoff(container, ("CrashLoopBackOff", message))
        return True

    def _backoff(self, container: PodContainer, waiting: tuple[str, str]) -> None:
        kubelet = self.kubelet
        container.backoff = next_backoff(
            container.backoff, kubelet.backoff_initial, kubelet.backoff_max
        )
        container.next_start = time.monotonic() + container.backoff
        reason, message = waiting
        container.waiting = (reason, f"{message}; next try in {container.backoff:g}s")

    def _report(self, http: httpx.Client, pod: Obj) -> None:
        self._status.report(
            http,
            pod,
            [c.view() for c in self.containers],
            [c.view() for c in self.init_containers],
            self.pending_init(),
        )

    def _terminate(self, http: httpx.Client, gone: bool) -> None:
        """SIGTERM every container's group, SIGKILL after the grace period, then remove
        the pod object the way a kubelet does."""
        with self.kubelet._lock:
            self.terminating = True
        started = time.monotonic()
        for container in self.init_containers:
            self._kill(container, signal.SIGKILL, wait=5.0)
        for container in self.containers:
            self._kill(container, signal.SIGTERM, wait=0.0)
        while any(c.process is not None for c in self.containers):
            with self._pod_lock:
                pod = self._pod
            assert pod is not None
            grace = 0.0 if gone else float(pod["metadata"].get("deletionGracePeriodSeconds", 0))
            if time.monotonic() - started >= grace or self.kubelet._stopping.is_set():
                break
            for container in self.containers:
                if container.process is not None and leader_exited(container.process):
                    self._kill(container, signal.SIGKILL, wait=5.0)
            self._wake.wait(TICK_SECONDS)
            self._wake.clear()
        for container in self.containers:
            self._kill(container, signal.SIGKILL, wait=5.0)
        if gone:
            return
        response = http.request(
            "DELETE",
            f"/api/v1/namespaces/{self.namespace}/pods/{self.name}",
            json={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
        )
        if response.status_code not in (404, 409):
            checked(response, f"deleting pod {self.namespace}/{self.name}")

    def _kill(self, container: PodContainer, sig: signal.Signals, *, wait: float) -> None:
        reaped = kill_container(container, sig, wait=wait)
        if reaped is not None:
            self.kubelet._track(reaped, alive=False)

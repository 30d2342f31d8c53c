"""The local cluster: a real control plane, the process kubelet and the real operator.

`DevCluster` is what `lockstep dev up`, the drills, the end-to-end tests and the
benchmarks run on. Everything it starts is stopped by `stop()` (also on errors): the
operator is a child process (so a drill can kill and restart it like a crash), the
control plane and the kubelet are the `lockstep.localcluster` pieces.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from lockstep import constants as c
from lockstep.localcluster import sglang_cpu
from lockstep.localcluster.controlplane import LocalControlPlane, repo_root
from lockstep.localcluster.engines import EngineName, engine
from lockstep.localcluster.kubelet import NodeShape, ProcessKubelet


def crd_path() -> Path:
    """The committed CRD (the operator package is run from a checkout here)."""
    root = repo_root()
    if root is None:
        raise RuntimeError("lockstep dev runs from a source checkout (crds/ not found)")
    return root / "crds" / f"{c.CRD_NAME}.yaml"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.2) -> Any:
    """Poll until truthy; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


class OperatorProcess:
    """`lockstep operator` as a child process with its own log."""

    def __init__(self, kubeconfig: Path, log_path: Path, namespace: str | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.namespace = namespace
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        args = [
            sys.executable,
            "-m",
            "lockstep.cli",
            "operator",
            "--liveness-port",
            "0",
            "--metrics-port",
            "0",
        ]
        if self.namespace:
            args += ["--namespace", self.namespace]
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL: a crash, nothing cleaned up."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class DevCluster:
    """Control plane + process kubelet + operator, in a working directory."""

    def __init__(
        self,
        workdir: Path,
        *,
        nodes: int = 4,
        gpus_per_node: int = 8,
        audit_log: bool = False,
        before_operator: Callable[[LocalControlPlane], Path | None] | None = None,
        engine: EngineName = "standin",
    ) -> None:
        """`before_operator` runs once the control plane and kubelet are up and may
        return a kubeconfig for the operator to use instead of the admin one (e.g. the
        chart's ServiceAccount bound to the chart's RBAC, for the least-privilege drill);
        `audit_log` turns the API server's audit log on; `engine` is what SGLang pods run
        (`standin`, or `sglang`: the real server on CPU, see
        :mod:`lockstep.localcluster.engines`)."""
        self.workdir = workdir
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.audit_log = audit_log
        self.before_operator = before_operator
        self.engine = engine
        self._stack = ExitStack()
        self.cp: LocalControlPlane | None = None
        self.kubelet: ProcessKubelet | None = None
        self.operator: OperatorProcess | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.engine == "sglang":
            sglang_cpu.ensure_model()  # once per machine; the pods load it
        try:
            self.cp = self._stack.enter_context(
                LocalControlPlane(
                    workdir=self.workdir / "controlplane",
                    crds=[crd_path()],
                    audit_log=self.audit_log,
                )
            )
            self.kubelet = self._stack.enter_context(
                ProcessKubelet(
                    self.cp,
                    nodes=self.nodes,
                    shape=NodeShape(gpus=self.gpus_per_node),
                    root_dir=self.workdir / "kubelet",
                    engine=engine(self.engine),
                )
            )
            kubeconfig = self.before_operator(self.cp) if self.before_operator else None
            self.operator = OperatorProcess(
                kubeconfig or self.cp.kubeconfig, self.workdir / "operator.log"
            )
            self.operator.start()
            self._stack.callback(self.operator.stop)
        except BaseException:
            self.stop()
            raise
        self._write_state()
        return self

    def stop(self) -> None:
        self._stack.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _write_state(self) -> None:
        assert self.cp is not None
        state = {
            "pid": os.getpid(),
            "kubeconfig": str(self.cp.kubeconfig),
            "server": self.cp.server,
            "kubelet_root": str(self.workdir / "kubelet"),
            "engine": self.engine,
            "operator_log": str(self.workdir / "operator.log"),
        }
        (self.workdir / "state.json").write_text(json.dumps(state, indent=2))

    # --------------------------------------------------------------------- API

    @property
    def api(self) -> k8s.ApiClient:
        assert self.cp is not None
        return self.cp.api_client()

    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    def ensure_namespace(self, name: str) -> None:
        try:
            self.core().create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
        except ApiException as err:
            if err.status != 409:
                raise

    def apply(self, obj: Mapping[str, Any]) -> None:
        """Create a PDDeployment (or replace its spec)."""
        ns = obj["metadata"].get("namespace", "default")
        self.ensure_namespace(ns)
        custom = self.custom()
        try:
            custom.create_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL, dict(obj))
        except ApiException as err:
            if err.status != 409:
                raise
            custom.patch_namespaced_custom_object(
                c.GROUP, c.VERSION, ns, c.PLURAL, obj["metadata"]["name"], {"spec": obj["spec"]}
            )

    def pdd(self, namespace: str, name: str) -> dict[str, Any]:
        obj = self.custom().get_namespaced_custom_object(
            c.GROUP, c.VERSION, namespace, c.PLURAL, name
        )
        assert isinstance(obj, dict)
        return obj

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        items = self.core().list_namespaced_pod(namespace, label_selector=selector).items
        return [self.api.sanitize_for_serialization(p) for p in items]  # type: ignore[no-untyped-call]

    def events(self, namespace: str) -> list[dict[str, Any]]:
        items = self.core().list_namespaced_event(namespace).items
        return [self.api.sanitize_for_serialization(e) for e in items]  # type: ignore[no-untyped-call]

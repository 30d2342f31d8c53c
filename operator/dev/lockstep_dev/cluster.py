"""The local cluster: a real control plane, the process kubelet and the real operator.

`DevCluster` is what `lockstep dev up`, the drills and the end-to-end tests run on.
Everything it starts is stopped by `stop()` (also on errors). The operator runs one of
two ways (`operator=`):

- `chart` (the default): installed with the real Helm chart (`charts/lockstep`, release
  `lockstep` in `lockstep-system`, the webhook on with its self-signed certificate) into
  the local control plane, where the process kubelet runs the Deployment's pod as a
  process (`lockstep operator` mapped to this checkout's), under the chart's
  ServiceAccount and RBAC. The API server reaches the webhook through its Service
  (`LocalControlPlane(route_services=True)`); a killed operator is restarted by the
  kubelet, a deleted pod replaced by the ReplicaSet. Its log is the pod's container log;
  `<workdir>/operator.log` links to the current pod's.
- `process`: a child process with the admin kubeconfig (or `before_operator`'s), which a
  caller starts and kills itself (`OperatorProcess`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import httpx
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from lockstep.api import constants as c
from lockstep_dev.localcluster import sglang_cpu
from lockstep_dev.localcluster.controlplane import LocalControlPlane, find_helm, repo_root
from lockstep_dev.localcluster.engines import EngineName, engine
from lockstep_dev.localcluster.kubelet import (
    LOG_NAME,
    NodeShape,
    ProcessKubelet,
    node_names,
    rack_labels,
)

OperatorMode = Literal["chart", "process"]
OPERATOR_MODES: tuple[OperatorMode, ...] = ("chart", "process")
RELEASE = "lockstep"
RELEASE_NAMESPACE = "lockstep-system"
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
# What the local cluster sets on top of the chart's defaults: an image name that says
# what runs (the kubelet maps the entrypoint, it pulls nothing); everything else, the
# webhook with its self-signed certificate included, is the chart's default.
CHART_VALUES: dict[str, Any] = {
    "image": {"repository": "lockstep.local/operator", "tag": "checkout", "pullPolicy": "Never"},
}


def checkout() -> Path:
    root = repo_root()
    if root is None:
        raise RuntimeError("lockstep dev runs from a source checkout (crds/ not found)")
    return root


def crd_paths() -> list[Path]:
    """Every committed CRD, the PDDeployment's and the per-role PDRoleScale's (the
    operator package is run from a checkout here)."""
    return sorted((checkout() / "crds").glob("*.yaml"))


def chart_path() -> Path:
    return checkout() / "charts" / "lockstep"


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


def _is_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return not pod["metadata"].get("deletionTimestamp") and any(
        cond.get("type") == "Ready" and cond.get("status") == "True"
        for cond in status.get("conditions") or []
    )


def restart_count(pod: Mapping[str, Any]) -> int:
    """The operator container's restart count in a pod object."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount", 0)) for s in statuses)


class ChartOperator:
    """The operator as the chart installs it: `helm upgrade --install` into the local
    control plane, run by the process kubelet as the Deployment's pod."""

    def __init__(
        self,
        cp: LocalControlPlane,
        kubelet: ProcessKubelet,
        workdir: Path,
        *,
        values: Mapping[str, Any] | None = None,
        timeout: float = 180.0,
    ) -> None:
        self.cp = cp
        self.kubelet = kubelet
        self.workdir = workdir
        self.values = dict(values if values is not None else CHART_VALUES)
        self.timeout = timeout
        self.namespace = RELEASE_NAMESPACE
        self.log_link = workdir / "operator.log"

    # ---------------------------------------------------------------- install

    def helm(self, *args: str, timeout: float = 120.0) -> str:
        """Run helm against the local control plane; raise with helm's stderr on failure."""
        home = self.workdir / "helm"
        env = dict(
            os.environ,
            KUBECONFIG=str(self.cp.kubeconfig),
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_CONFIG_HOME=str(home / "config"),
            HELM_DATA_HOME=str(home / "data"),
        )
        argv = [str(find_helm()), *args]
        try:
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(
                f"helm {' '.join(args[:2])} did not finish in {timeout:.0f}s"
            ) from exc
        if done.returncode != 0:
            raise RuntimeError(
                f"helm {' '.join(args[:2])} failed (exit {done.returncode}):\n"
                f"{done.stderr.strip() or done.stdout.strip()}"
            )
        return done.stdout

    def install(self) -> None:
        """Install (or upgrade) the chart and wait until the operator pod is Ready and
        the API server's calls to its webhook are answered."""
        values = self.workdir / "chart-values.yaml"
        values.write_text(yaml.safe_dump(self.values))
        self.helm(
            "upgrade",
            "--install",
            RELEASE,
            str(chart_path()),
            "--namespace",
            self.namespace,
            "--create-namespace",
            "--values",
            str(values),
            "--timeout",
            f"{self.timeout:.0f}s",
        )
        self.wait_ready(self.timeout)
        self.wait_webhook(self.timeout)

    # ---------------------------------------------------------------- the pod

    def pods(self) -> list[dict[str, Any]]:
        with self.cp.http_client() as http:
            response = http.get(
                f"/api/v1/namespaces/{self.namespace}/pods",
                params={"labelSelector": OPERATOR_SELECTOR},
            )
        response.raise_for_status()
        items: list[dict[str, Any]] = response.json().get("items") or []
        return items

    def pod(self) -> dict[str, Any] | None:
        """The operator's pod that is not being deleted (the newest, if several)."""
        live = [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")]
        live.sort(key=lambda p: str(p["metadata"].get("creationTimestamp", "")))
        return live[-1] if live else None

    def wait_ready(
        self,
        timeout: float,
        *,
        other_than: str | None = None,
        restarts_at_least: int = 0,
    ) -> dict[str, Any]:
        """Wait until an operator pod is Ready (a pod other than the one with UID
        `other_than`, or one whose container restarted `restarts_at_least` times) and
        its process runs here. Raises naming the pod's state and log on timeout."""

        def ready() -> dict[str, Any] | None:
            return self.ready_pod(other_than=other_than, restarts_at_least=restarts_at_least)

        try:
            pod: dict[str, Any] = wait_for(ready, timeout, "the operator pod Ready", poll=0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.diagnostics()}") from None
        self.link_log()
        return pod

    def ready_pod(
        self, *, other_than: str | None = None, restarts_at_least: int = 0
    ) -> dict[str, Any] | None:
        """The operator pod if it is Ready and its process runs here (and it is not the
        pod with UID `other_than`, and its container restarted `restarts_at_least`
        times); else None."""
        pod = self.pod()
        if pod is None or not _is_ready(pod):
            return None
        if other_than is not None and pod["metadata"]["uid"] == other_than:
            return None
        if restart_count(pod) < restarts_at_least or self.pid(pod) is None:
            return None
        return pod

    def wait_webhook(self, timeout: float) -> None:
        """Wait until a server-side dry run of a PDDeployment create passes the chart's
        webhooks (the API server -> Service -> pod route and the injected CA work)."""
        obj = yaml.safe_load((checkout() / "examples" / "local-drill.yaml").read_text())
        obj["metadata"] = {"name": "lockstep-webhook-check", "namespace": self.namespace}
        path = f"/apis/{c.GROUP}/{c.VERSION}/namespaces/{self.namespace}/{c.PLURAL}"
        last = ["no answer yet"]

        def answered() -> bool:
            try:
                with self.cp.http_client() as http:
                    response = http.post(path, params={"dryRun": "All"}, json=obj)
            except httpx.HTTPError as exc:
                last[0] = str(exc)
                return False
            last[0] = f"{response.status_code}: {response.text[:500]}"
            return response.status_code == 201

        try:
            wait_for(answered, timeout, "the chart's admission webhook to answer", poll=0.5)
        except TimeoutError as exc:
            raise TimeoutError(
                f"{exc}; last answer to a dry-run create: {last[0]}\n{self.diagnostics()}"
            ) from None

    def pid(self, pod: Mapping[str, Any] | None = None) -> int | None:
        """The pid of the operator container's process on the kubelet."""
        pod = pod or self.pod()
        if pod is None:
            return None
        return self.kubelet.processes().get((self.namespace, pod["metadata"]["name"]))

    def log_path(self) -> Path | None:
        """The current operator pod's container log."""
        pod = self.pod()
        if pod is None:
            return None
        directory = self.kubelet.pod_dir(self.namespace, pod["metadata"]["name"])
        return directory / LOG_NAME if directory is not None else None

    def link_log(self) -> None:
        """Point `<workdir>/operator.log` at the current operator pod's log."""
        with contextlib.suppress(OSError, httpx.HTTPError):
            target = self.log_path()
            if target is None:
                return
            if self.log_link.is_symlink() and self.log_link.readlink() == target:
                return
            tmp = self.log_link.with_name(self.log_link.name + ".tmp")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(target)
            tmp.replace(self.log_link)

    def diagnostics(self) -> str:
        parts = []
        try:
            for pod in self.pods():
                meta, status = pod["metadata"], pod.get("status") or {}
                states = [
                    f"{s.get('name')}: {json.dumps(s.get('state'))} restarts {s.get('restartCount')}"
                    for s in status.get("containerStatuses") or []
                ]
                parts.append(
                    f"pod {meta['name']} phase {status.get('phase')} node "
                    f"{(pod.get('spec') or {}).get('nodeName')} {'; '.join(states)}"
                )
                log = self.kubelet.log_tail(self.namespace, meta["name"], lines=30)
                if log:
                    parts.append(f"--- its log (last 30 lines)\n{log}")
        except (httpx.HTTPError, OSError) as exc:
            parts.append(f"(could not read the operator pods: {exc})")
        if not parts:
            parts.append(f"no operator pod in {self.namespace} ({OPERATOR_SELECTOR})")
        if self.kubelet.errors:
            parts.append(f"kubelet errors: {self.kubelet.errors[-3:]}")
        return "\n".join(parts)

    # ---------------------------------------------------------------- replicas (ha)

    def ready_pods(self) -> list[dict[str, Any]]:
        """Every operator pod that is Ready with its process running here."""
        return [
            p
            for p in self.pods()
            if not p["metadata"].get("deletionTimestamp") and _is_ready(p) and self.pid(p)
        ]

    def lease(self) -> dict[str, Any]:
        """The spec of the chart's leader-election Lease ({} while there is none)."""
        # The chart names the Lease after the release's full name (the release here).
        with self.cp.http_client() as http:
            response = http.get(
                f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{RELEASE}"
            )
        if response.status_code != 200:
            return {}
        return dict(response.json().get("spec") or {})

    def leader(self) -> str | None:
        """The holder of the chart's leader-election Lease (a pod name), if any."""
        holder = self.lease().get("holderIdentity")
        return str(holder) if holder else None

    def pod_named(self, name: str) -> dict[str, Any] | None:
        return next((p for p in self.pods() if p["metadata"]["name"] == name), None)

    # ---------------------------------------------------------------- faults

    def kill(self) -> int:
        """SIGKILL the operator container's process (a crash; the kubelet restarts it).
        Returns the pid killed."""
        pid = self.pid()
        if pid is None:
            raise RuntimeError(f"no running operator process\n{self.diagnostics()}")
        os.kill(pid, signal.SIGKILL)
        return pid

    def delete_pod(self) -> str:
        """Delete the operator's pod (its ReplicaSet makes a new one). Returns its UID."""
        pod = self.pod()
        if pod is None:
            raise RuntimeError(f"no operator pod to delete\n{self.diagnostics()}")
        name = pod["metadata"]["name"]
        with self.cp.http_client() as http:
            response = http.delete(f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        response.raise_for_status()
        return str(pod["metadata"]["uid"])

    @property
    def alive(self) -> bool:
        return self.pid() is not None


class DevCluster:
    """Control plane + process kubelet + operator, in a working directory."""

    def __init__(
        self,
        workdir: Path,
        *,
        nodes: int = 4,
        gpus_per_node: int = 8,
        racks: int | None = None,
        node_labels: Mapping[str, Mapping[str, str]] | None = None,
        audit_log: bool = False,
        before_operator: Callable[[LocalControlPlane], Path | None] | None = None,
        engine: EngineName = "standin",
        operator: OperatorMode = "chart",
        image_env: Mapping[str, str] | None = None,
        chart_values: Mapping[str, Any] | None = None,
    ) -> None:
        """`operator` is how the operator runs (see the module docstring: `chart`, the
        default, or `process`); `before_operator` (process mode only) runs once the
        control plane and kubelet are up and may return a kubeconfig for the operator to
        use instead of the admin one (e.g. the chart's ServiceAccount bound to the
        chart's RBAC, for the least-privilege drill); `audit_log` turns the API server's
        audit log on; `engine` is what SGLang pods run (`standin`, or `sglang`: the real
        server on CPU, see :mod:`lockstep_dev.localcluster.engines`); `image_env` is env the
        local SGLang image carries (the baseline drill's runtime without lockstep's
        consensus: a PDDeployment may not switch it off).

        Nodes are `lockstep-gpu-0` ... `lockstep-gpu-<nodes - 1>` (`node_names`), each
        with `gpus_per_node` GPUs. `racks` spreads them over that many racks round-robin
        (node i gets `topology.kubernetes.io/rack=rack-<i % racks>`); `node_labels` adds
        labels per node name on top (and wins over the rack label)."""
        if operator not in OPERATOR_MODES:
            raise ValueError(f"unknown operator mode {operator!r}; one of {OPERATOR_MODES}")
        if before_operator is not None and operator != "process":
            raise ValueError("before_operator needs operator='process' (the chart sets its own)")
        self.operator_mode: OperatorMode = operator
        self.workdir = workdir
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.node_labels = self._labels(nodes, racks, node_labels or {})
        self.audit_log = audit_log
        self.before_operator = before_operator
        self.engine = engine
        self.image_env = dict(image_env or {})
        # Values the chart is installed with on top of CHART_VALUES (e.g. ha).
        self.chart_values = dict(chart_values or {})
        self._stack = ExitStack()
        self.cp: LocalControlPlane | None = None
        self.kubelet: ProcessKubelet | None = None
        self.operator: OperatorProcess | ChartOperator | None = None
        self._stopping = threading.Event()

    @staticmethod
    def _labels(
        nodes: int, racks: int | None, extra: Mapping[str, Mapping[str, str]]
    ) -> dict[str, dict[str, str]]:
        names = node_names(nodes)
        unknown = sorted(set(extra) - set(names))
        if unknown:
            raise ValueError(f"node_labels for nodes the cluster does not have: {unknown}")
        labels = rack_labels(names, racks) if racks is not None else {}
        return {n: {**labels.get(n, {}), **extra.get(n, {})} for n in names}

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.engine == "sglang":
            sglang_cpu.ensure_model()  # once per machine; the pods load it
        try:
            self.cp = self._stack.enter_context(
                LocalControlPlane(
                    workdir=self.workdir / "controlplane",
                    crds=crd_paths(),
                    audit_log=self.audit_log,
                    route_services=True,  # the API server reaches the chart's webhook
                )
            )
            self.kubelet = self._stack.enter_context(
                ProcessKubelet(
                    self.cp,
                    nodes=self.nodes,
                    shape=NodeShape(gpus=self.gpus_per_node),
                    node_labels=self.node_labels,
                    root_dir=self.workdir / "kubelet",
                    engine=engine(self.engine, self.image_env),
                )
            )
            if self.operator_mode == "chart":
                chart = ChartOperator(
                    self.cp, self.kubelet, self.workdir,
                    values={**CHART_VALUES, **self.chart_values},
                )  # fmt: skip
                self.operator = chart
                chart.install()
                self._start_log_linker(chart)
            else:
                kubeconfig = self.before_operator(self.cp) if self.before_operator else None
                process = OperatorProcess(
                    kubeconfig or self.cp.kubeconfig, self.workdir / "operator.log"
                )
                self.operator = process
                process.start()
                self._stack.callback(process.stop)
        except BaseException:
            self.stop()
            raise
        self._write_state()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._stack.close()

    def _start_log_linker(self, chart: ChartOperator) -> None:
        """Keep `<workdir>/operator.log` pointing at the current operator pod's log."""

        def loop() -> None:
            while not self._stopping.wait(2.0):
                chart.link_log()

        self._stopping.clear()
        thread = threading.Thread(target=loop, name="operator-log-link", daemon=True)
        thread.start()
        self._stack.callback(thread.join, 5.0)
        self._stack.callback(self._stopping.set)

    @property
    def chart_operator(self) -> ChartOperator:
        """The chart-installed operator (chart mode only)."""
        if not isinstance(self.operator, ChartOperator):
            raise RuntimeError(f"the operator runs in {self.operator_mode} mode, not chart")
        return self.operator

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
            "operator": self.operator_mode,
            "operator_log": str(self.workdir / "operator.log"),
        }
        if self.operator_mode == "chart":
            state["operator_namespace"] = RELEASE_NAMESPACE
            state["operator_logs_command"] = f"kubectl logs -n {RELEASE_NAMESPACE} deploy/{RELEASE}"
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

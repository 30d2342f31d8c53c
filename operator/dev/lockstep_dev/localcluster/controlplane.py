"""Start, use and stop a real local Kubernetes control plane.

The control plane is `lockstep-controlplane`, a small Go program of ours (source in
`tests/controlplane/`) that runs embedded etcd, kube-apiserver, kube-controller-manager and
kube-scheduler built from Kubernetes' own Go modules, all on 127.0.0.1. This module builds it
when needed (through `.ci/build-controlplane`, which caches the binary outside the
repository), starts it in a fresh directory, waits until it is ready and stops every process
it started, also when the caller fails half way.

Typical use::

    with LocalControlPlane() as cp:
        cp.install_crd(Path("crds/pddeployments.lockstep.dev.yaml"))
        namespace = cp.new_namespace()
        with cp.http_client() as http:
            http.get(f"/api/v1/namespaces/{namespace}/configmaps")

Requests to the API server go through httpx with the admin client certificate, so objects
reach the server exactly as written (the `kubernetes` client's models would round-trip
them); `api_client()` hands out an official client for code that wants one.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from lockstep_dev.localcluster.serviceproxy import ServiceProxy

BINARY_NAME = "lockstep-controlplane"
BINARY_ENV = "LOCKSTEP_CONTROLPLANE_BIN"
"""Environment variable naming a prebuilt binary (skips the build)."""
KUBECTL_ENV = "LOCKSTEP_KUBECTL"
"""Environment variable naming the kubectl to use (default: `.ci/fetch-tools`, then PATH)."""
HELM_ENV = "LOCKSTEP_HELM"
"""Environment variable naming the helm (v3) to use (default: `.ci/fetch-tools`, then PATH)."""

DEFAULT_BUILD_TIMEOUT = 3600.0
DEFAULT_READY_TIMEOUT = 120.0
DEFAULT_STOP_TIMEOUT = 30.0
DEFAULT_WAIT_TIMEOUT = 60.0

TEST_NAMESPACE_LABEL = "lockstep.dev/test-namespace"
FIELD_MANAGER = "lockstep-localcluster"

_POLL_SECONDS = 0.05
_LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started, used or stopped."""


@dataclass(frozen=True)
class ReadyInfo:
    """What the control plane reports once every component is healthy."""

    server: str
    kubeconfig: Path
    ca_file: Path
    client_cert: Path
    client_key: Path
    dir: Path
    log_dir: Path
    etcd: str
    audit_log: Path | None
    kubernetes_version: str
    pid: int
    components: Mapping[str, int]
    start_seconds: float

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ReadyInfo:
        audit = raw.get("auditLog") or None
        return cls(
            server=str(raw["server"]),
            kubeconfig=Path(raw["kubeconfig"]),
            ca_file=Path(raw["caFile"]),
            client_cert=Path(raw["clientCert"]),
            client_key=Path(raw["clientKey"]),
            dir=Path(raw["dir"]),
            log_dir=Path(raw["logDir"]),
            etcd=str(raw["etcd"]),
            audit_log=Path(audit) if audit else None,
            kubernetes_version=str(raw["kubernetesVersion"]),
            pid=int(raw["pid"]),
            components={str(k): int(v) for k, v in dict(raw["components"]).items()},
            start_seconds=float(raw["startSeconds"]),
        )


ControlPlaneExtension = Callable[["LocalControlPlane"], AbstractContextManager[object]]
"""Something that runs beside a ready control plane, such as a process kubelet that
registers nodes: called with the control plane once it is ready, entered, and exited
(in reverse order) before the control plane stops."""


def repo_root() -> Path | None:
    """The lockstep source checkout this module runs from, if it runs from one."""
    for parent in Path(__file__).resolve().parents:
        if (parent / ".ci" / "build-controlplane").is_file() and (parent / "tests").is_dir():
            return parent
    return None


def _run_tool_script(script: Path, timeout: float) -> Path:
    """Run one of the repository's `.ci` scripts that print a path as their last line."""
    try:
        done = subprocess.run(
            ["bash", str(script)],
            stdout=subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ControlPlaneError(f"{script} did not finish in {timeout:.0f}s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ControlPlaneError(f"{script} failed with exit code {done.returncode}")
    return Path(lines[-1])


def build_controlplane(*, timeout: float = DEFAULT_BUILD_TIMEOUT) -> Path:
    """Return the path of a `lockstep-controlplane` binary, building it if needed.

    Order: `$LOCKSTEP_CONTROLPLANE_BIN`; the repository's `.ci/build-controlplane` (cached,
    so a no-op after the first build); `lockstep-controlplane` on PATH.
    """
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        path = Path(explicit)
        if not os.access(path, os.X_OK):
            raise ControlPlaneError(f"{BINARY_ENV}={explicit} is not an executable file")
        return path
    root = repo_root()
    if root is not None:
        return _run_tool_script(root / ".ci" / "build-controlplane", timeout)
    found = shutil.which(BINARY_NAME)
    if found:
        return Path(found)
    raise ControlPlaneError(
        f"no {BINARY_NAME}: set {BINARY_ENV}, run from a lockstep checkout, or put it on PATH"
    )


def find_kubectl(*, timeout: float = 600.0) -> Path:
    """Return a kubectl: `$LOCKSTEP_KUBECTL`, the repository's `.ci/fetch-tools`, PATH."""
    return _find_tool("kubectl", KUBECTL_ENV, "kubectl", timeout)


def find_helm(*, timeout: float = 600.0) -> Path:
    """Return a helm (v3): `$LOCKSTEP_HELM`, the repository's `.ci/fetch-tools`, PATH."""
    return _find_tool("helm", HELM_ENV, "helm (v3)", timeout)


def _find_tool(name: str, env: str, what: str, timeout: float) -> Path:
    explicit = os.environ.get(env)
    if explicit:
        return Path(explicit)
    root = repo_root()
    if root is not None and (root / ".ci" / "fetch-tools").is_file():
        return _run_tool_script(root / ".ci" / "fetch-tools", timeout) / name
    found = shutil.which(name)
    if found:
        return Path(found)
    raise ControlPlaneError(f"no {name}: set {env} or put {what} on PATH")


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# Control planes still running when the interpreter exits (a test run interrupted between
# start and stop) are stopped here; the Go supervisor also exits when its parent dies.
_running: weakref.WeakSet[LocalControlPlane] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for cp in list(_running):
        with contextlib.suppress(Exception):
            cp.stop()


class LocalControlPlane:
    """One local control plane: a context manager that starts it and always stops it.

    `crds` are installed before the controllers start, so the garbage collector knows
    their kinds at once (it re-reads discovery only every 30 s: owner references to a kind
    installed later, with `install_crd`, are honoured after up to a minute).

    Every process it starts lives in one new process group, so `stop()` (called by
    `__exit__`, by `start()` when start-up fails, and at interpreter exit) leaves nothing
    behind. The working directory holds certificates, kubeconfigs, etcd's data and
    the component logs (`log_dir`); it is removed on stop unless `workdir` was given.

    `route_services` gives the API server a route to Services (webhooks and aggregated
    APIs behind a Service reach a ready pod of it) through a
    :class:`~lockstep_dev.localcluster.serviceproxy.ServiceProxy`, as kube-proxy would.
    """

    def __init__(
        self,
        *,
        binary: Path | None = None,
        workdir: Path | None = None,
        audit_log: bool = False,
        crds: Sequence[Path] = (),
        apiserver_args: Sequence[str] = (),
        controller_manager_args: Sequence[str] = (),
        scheduler_args: Sequence[str] = (),
        extensions: Sequence[ControlPlaneExtension] = (),
        route_services: bool = False,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        build_timeout: float = DEFAULT_BUILD_TIMEOUT,
    ) -> None:
        self._binary = binary
        self._given_workdir = workdir
        self._audit = audit_log
        self._crds = [Path(p).resolve() for p in crds]
        self._apiserver_args = list(apiserver_args)
        self._controller_manager_args = list(controller_manager_args)
        self._scheduler_args = list(scheduler_args)
        self._extensions = list(extensions)
        self._route_services = route_services
        self._service_proxy: ServiceProxy | None = None
        self._ready_timeout = ready_timeout
        self._stop_timeout = stop_timeout
        self._build_timeout = build_timeout
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._info: ReadyInfo | None = None
        self._extension_stack = ExitStack()

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> Self:
        """Start the control plane and wait (bounded) until every component is ready."""
        if self._proc is not None:
            raise ControlPlaneError("already started")
        binary = self._binary or build_controlplane(timeout=self._build_timeout)
        self._binary = binary
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self._workdir = self._given_workdir.resolve()
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="lockstep-cp-"))
        _running.add(self)
        try:
            ready_file = self._workdir / "ready.json"
            ready_file.unlink(missing_ok=True)
            if self._route_services:
                self._service_proxy = ServiceProxy()
                self._service_proxy.start()
            with open(self._supervisor_log, "ab") as log:
                self._proc = subprocess.Popen(
                    [str(binary), "run", *self._run_flags()],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._info = self._wait_ready(ready_file)
            if self._service_proxy is not None:
                self._service_proxy.attach(self.http_client)
            for extension in self._extensions:
                self._extension_stack.enter_context(extension(self))
        except BaseException:
            self.stop()
            raise
        return self

    def _run_flags(self) -> list[str]:
        assert self._workdir is not None
        flags = ["--dir", str(self._workdir), "--exit-with-parent"]
        flags += ["--ready-timeout", f"{self._ready_timeout}s"]
        if self._audit:
            flags += ["--audit-log", str(self._workdir / "logs" / "audit.log")]
        flags += [f"--crd={p}" for p in self._crds]
        if self._service_proxy is not None:
            egress = self._workdir / "egress-selector.yaml"
            egress.write_text(self._service_proxy.egress_config())
            flags.append(f"--apiserver-arg=--egress-selector-config-file={egress}")
        flags += [f"--apiserver-arg={a}" for a in self._apiserver_args]
        flags += [f"--controller-manager-arg={a}" for a in self._controller_manager_args]
        flags += [f"--scheduler-arg={a}" for a in self._scheduler_args]
        return flags

    def _wait_ready(self, ready_file: Path) -> ReadyInfo:
        assert self._proc is not None
        # The supervisor enforces ready_timeout itself; the margin covers its clean exit.
        deadline = time.monotonic() + self._ready_timeout + 10.0
        while time.monotonic() < deadline:
            if ready_file.exists():
                return ReadyInfo.from_json(json.loads(ready_file.read_text()))
            if self._proc.poll() is not None:
                raise ControlPlaneError(
                    f"control plane exited with code {self._proc.returncode} before it was "
                    f"ready:\n{self._diagnostics()}"
                )
            time.sleep(_POLL_SECONDS)
        raise ControlPlaneError(
            f"control plane not ready in {self._ready_timeout:.0f}s:\n{self._diagnostics()}"
        )

    def stop(self) -> None:
        """Stop every process this control plane started; idempotent.

        SIGTERM lets the supervisor stop the components in order (it waits for them);
        whatever is left after `stop_timeout` is killed with its whole process group.
        """
        try:
            self._extension_stack.close()
        finally:
            proc, self._proc = self._proc, None
            _running.discard(self)
            try:
                if proc is not None:
                    self._terminate(proc)
            finally:
                service_proxy, self._service_proxy = self._service_proxy, None
                if service_proxy is not None:
                    service_proxy.stop()
            if self._workdir is not None and self._given_workdir is None:
                shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            self._info = None

    def _terminate(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self._stop_timeout)
            except subprocess.TimeoutExpired:
                # The group id stays reserved while the unreaped supervisor exists, so
                # this only reaches processes it started.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=self._stop_timeout)
                raise ControlPlaneError(
                    f"control plane did not stop in {self._stop_timeout:.0f}s; killed it"
                ) from None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- where things are ------------------------------------------------------------

    @property
    def info(self) -> ReadyInfo:
        """Everything the running control plane reported at start."""
        if self._info is None:
            raise ControlPlaneError("control plane is not running")
        return self._info

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._info is not None

    @property
    def server(self) -> str:
        """The API server's URL, `https://127.0.0.1:<port>`."""
        return self.info.server

    @property
    def kubeconfig(self) -> Path:
        """An admin kubeconfig (user `lockstep-admin`, group `system:masters`)."""
        return self.info.kubeconfig

    @property
    def ca_file(self) -> Path:
        return self.info.ca_file

    @property
    def workdir(self) -> Path:
        return self.info.dir

    @property
    def log_dir(self) -> Path:
        """`etcd.log`, `kube-apiserver.log`, ... and `audit.log` when auditing is on."""
        return self.info.log_dir

    @property
    def audit_log(self) -> Path | None:
        return self.info.audit_log

    @property
    def _supervisor_log(self) -> Path:
        assert self._workdir is not None
        return self._workdir / "controlplane.log"

    def _diagnostics(self) -> str:
        assert self._workdir is not None
        parts = [f"--- {self._supervisor_log}\n{_tail(self._supervisor_log)}"]
        logs = self._workdir / "logs"
        if logs.is_dir():
            for log in sorted(logs.glob("*.log")):
                parts.append(f"--- {log}\n{_tail(log, 15)}")
        return "\n".join(parts)

    # -- using it --------------------------------------------------------------------

    def http_client(self, *, timeout: float = 10.0) -> httpx.Client:
        """A new httpx client for the API server as the admin user; the caller closes it.

        Requests go out exactly as written (no model round trip), which is what checking
        the server's own validation needs."""
        tls = ssl.create_default_context(cafile=str(self.ca_file))
        tls.load_cert_chain(str(self.info.client_cert), str(self.info.client_key))
        return httpx.Client(base_url=self.server, verify=tls, timeout=timeout)

    def api_client(self) -> k8s.ApiClient:
        """A new `kubernetes.client.ApiClient` for the admin user; the caller closes it."""
        configuration = k8s.Configuration()
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped upstream
            config_file=str(self.kubeconfig),
            client_configuration=configuration,
            persist_config=False,
        )
        return k8s.ApiClient(configuration)

    def user_kubeconfig(
        self, user: str, groups: Sequence[str] = (), path: Path | None = None
    ) -> Path:
        """Write a kubeconfig for `user` in `groups` (a client certificate signed by the
        cluster CA), e.g. to check that an RBAC role is enough and no more."""
        out = path or self.workdir / f"user-{user.replace(':', '_')}.kubeconfig"
        assert self._binary is not None  # resolved by start()
        args = [str(self._binary), "kubeconfig", "--dir", str(self.workdir), "--user", user]
        args += [f"--group={g}" for g in groups]
        args += ["--out", str(out)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise ControlPlaneError(f"minting a kubeconfig for {user}: {done.stderr.strip()}")
        return out

    def install_crd(self, path: Path, *, timeout: float = DEFAULT_WAIT_TIMEOUT) -> list[str]:
        """Apply (server-side) every CustomResourceDefinition in a YAML file and wait until
        each is established and served. Returns the CRD names."""
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        crds = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
        if not crds:
            raise ControlPlaneError(f"{path} holds no CustomResourceDefinition")
        deadline = time.monotonic() + timeout
        with self.http_client() as http:
            for crd in crds:
                name = crd["metadata"]["name"]
                _check(
                    http.patch(
                        f"{_CRD_PATH}/{name}",
                        params={"fieldManager": FIELD_MANAGER, "force": "true"},
                        headers={"Content-Type": "application/apply-patch+yaml"},
                        content=json.dumps(crd),
                    ),
                    f"applying CRD {name}",
                )
            for crd in crds:
                _wait_crd_served(http, crd, deadline)
        return [str(crd["metadata"]["name"]) for crd in crds]

    def new_namespace(
        self,
        prefix: str = "test",
        *,
        labels: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_WAIT_TIMEOUT,
    ) -> str:
        """Create a namespace with a fresh name and wait until pods can be admitted in it
        (its `default` service account exists). Returns its name."""
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "generateName": f"{prefix}-",
                "labels": {TEST_NAMESPACE_LABEL: "true", **(labels or {})},
            },
        }
        with self.http_client() as http:
            created = _check(http.post("/api/v1/namespaces", json=body), "creating a namespace")
            name = str(created["metadata"]["name"])
            _wait(
                lambda: _exists(http, f"/api/v1/namespaces/{name}/serviceaccounts/default"),
                time.monotonic() + timeout,
                f"service account default in namespace {name}",
            )
        return name

    def delete_namespace(
        self, name: str, *, wait: bool = False, timeout: float = DEFAULT_WAIT_TIMEOUT
    ) -> None:
        """Delete a namespace; with `wait`, until the namespace controller has emptied
        and removed it."""
        with self.http_client() as http:
            response = http.delete(f"/api/v1/namespaces/{name}")
            if response.status_code == 404:
                return
            _check(response, f"deleting namespace {name}")
            if wait:
                _wait(
                    lambda: not _exists(http, f"/api/v1/namespaces/{name}"),
                    time.monotonic() + timeout,
                    f"namespace {name} deleted",
                )

    def kubectl(
        self,
        *args: str,
        kubectl: Path | None = None,
        timeout: float = DEFAULT_WAIT_TIMEOUT,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane (admin kubeconfig, private discovery
        cache) and return the finished process; `check` raises on a non-zero exit."""
        binary = kubectl or find_kubectl()
        cmd = [
            str(binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.workdir / 'kubectl-cache'}",
            *args,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}"
            )
        return done


_CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def _check(response: httpx.Response, what: str) -> dict[str, Any]:
    """The JSON body of a successful response; a ControlPlaneError naming `what` otherwise."""
    if response.is_success:
        body: dict[str, Any] = response.json()
        return body
    raise ControlPlaneError(f"{what}: HTTP {response.status_code}: {response.text[:2000]}")


def _exists(http: httpx.Client, path: str) -> bool:
    response = http.get(path)
    if response.status_code == 404:
        return False
    _check(response, f"reading {path}")
    return True


def _wait_crd_served(http: httpx.Client, crd: Mapping[str, Any], deadline: float) -> None:
    name = crd["metadata"]["name"]
    group = crd["spec"]["group"]
    plural = crd["spec"]["names"]["plural"]

    def established() -> bool:
        current = _check(http.get(f"{_CRD_PATH}/{name}"), f"reading CRD {name}")
        conditions = (current.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    _wait(established, deadline, f"CRD {name} established")
    for version in crd["spec"]["versions"]:
        if version.get("served", True):
            path = f"/apis/{group}/{version['name']}/{plural}"
            _wait(functools.partial(_exists, http, path), deadline, f"{path} served")


def _wait(predicate: Callable[[], bool], deadline: float, what: str) -> None:
    """Poll `predicate` until it holds; raise when `deadline` (monotonic) passes."""
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise ControlPlaneError(f"timed out waiting for {what}")
        time.sleep(0.1)

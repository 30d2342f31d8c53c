"""Operator integration harness: the real operator process, and a fake kubelet.

The operator runs as it does in production (`lockstep operator`, a separate process with
its own kubeconfig) against the real local API server. Nothing runs the pods' containers
in this tier, so `FakeKubelet` plays the node: it gives each new pod a loopback address
and a `FakePod` (probe route + pod agent) there, reports it Running and Ready, and
finishes deletions the way a kubelet does. Tests script the fake pods' behaviour.
"""

from __future__ import annotations

import base64
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from fakepod import FakePod
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parent.parent
GROUP, VERSION, PLURAL = "lockstep.dev", "v1alpha1", "pddeployments"

# Loopback addresses for fake pods: 127.0.8.x upwards, never 127.0.0.1.
_ADDRESSES: Iterator[str] = (f"127.0.{a}.{b}" for a in itertools.count(8) for b in range(2, 250))
_ADDR_LOCK = threading.Lock()


def next_address() -> str:
    with _ADDR_LOCK:
        return next(_ADDRESSES)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.2) -> Any:
    """Poll until `predicate()` is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class OperatorProcess:
    """`lockstep operator` watching one namespace, logging to a file."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log_path: Path,
        extra_args: list[str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log_path = log_path
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lockstep.cli",
                "operator",
                "--namespace",
                self.namespace,
                "--liveness-port",
                "0",
                "--metrics-port",
                "0",
                *self.extra_args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return self

    def kill(self) -> None:
        """SIGKILL: an operator crash, nothing flushed, nothing cleaned up."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class FakeKubelet:
    """Runs the pods of one namespace as `FakePod`s on loopback addresses."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.core = k8s.CoreV1Api(api)
        self.namespace = namespace
        self.pods: dict[str, FakePod] = {}  # by pod UID
        self.names: dict[str, str] = {}  # uid -> name
        self.restarts: dict[str, int] = {}  # uid -> container restarts
        self.default_mode: str = "healthy"
        # A termination message every new pod's container ends with, exit status 2, as a
        # runtime that refuses to start (None: the pods run).
        self.refusal: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.errors: list[str] = []

    def start(self) -> FakeKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for pod in self.pods.values():
            pod.stop()
        self.pods.clear()

    def fakes(self, selector: str) -> list[FakePod]:
        """The fake pods behind the pods matching a label selector."""
        items = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return [self.pods[p.metadata.uid] for p in items if p.metadata.uid in self.pods]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as err:  # keep the node alive; the test reads errors
                self.errors.append(repr(err))
            self._stop.wait(0.2)

    def sync(self) -> None:
        items = self.core.list_namespaced_pod(self.namespace).items
        for pod in items:
            meta = pod.metadata
            labels = meta.labels or {}
            if meta.deletion_timestamp is not None:
                fake = self.pods.pop(meta.uid, None)
                if fake is not None:
                    fake.stop()
                try:
                    self.core.delete_namespaced_pod(
                        meta.name,
                        self.namespace,
                        grace_period_seconds=0,
                        body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=meta.uid)),
                    )
                except ApiException as err:
                    if err.status not in (404, 409):
                        raise
                continue
            if meta.uid in self.pods:
                fake = self.pods[meta.uid]
                if fake.take_restart() is not None:
                    # The agent ended the container: it starts again in place.
                    self.restarts[meta.uid] = self.restarts.get(meta.uid, 0) + 1
                    self.report_running(meta.name, fake.ip, self.restarts[meta.uid])
                continue
            if "lockstep.dev/rank" not in labels:
                continue
            if self.refusal is not None:
                if meta.uid not in self.names:
                    self.names[meta.uid] = meta.name
                    self.report_refused(meta.name, self.refusal)
                continue
            rank = int(labels["lockstep.dev/rank"])
            fake = FakePod(next_address(), first_rank=rank, leader=rank == 0)
            fake.set_mode(self.default_mode)  # type: ignore[arg-type]
            fake.token = self._secret_env(pod, "LOCKSTEP_AGENT_TOKEN")
            fake.epoch = int(labels.get("lockstep.dev/epoch", "0"))
            fake.start()
            self.pods[meta.uid] = fake
            self.names[meta.uid] = meta.name
            self.report_running(meta.name, fake.ip)

    def _secret_env(self, pod: Any, name: str) -> str | None:
        """An env var from a secretKeyRef, resolved as a kubelet does."""
        for var in pod.spec.containers[0].env or []:
            ref = var.value_from.secret_key_ref if var.name == name and var.value_from else None
            if ref is not None:
                secret = self.core.read_namespaced_secret(ref.name, self.namespace)
                return base64.b64decode(secret.data[ref.key]).decode()
        return None

    def report_running(self, name: str, ip: str, restarts: int = 0) -> None:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
            "containerStatuses": [
                {
                    "name": "sglang",
                    "image": "sglang",
                    "imageID": "",
                    "ready": True,
                    "restartCount": restarts,
                    "started": True,
                    "state": {"running": {"startedAt": started}},
                }
            ],
        }
        self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    def report_refused(self, name: str, message: str) -> None:
        status = report_refused_status(message)
        self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})


def report_refused_status(message: str, restarts: int = 3) -> dict[str, Any]:
    """The status of a pod whose container refused to start, over and over (exit status 2,
    its termination message kept in the last state), as a kubelet reports it."""
    ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {
                "name": "sglang",
                "image": "sglang",
                "imageID": "",
                "ready": False,
                "restartCount": restarts,
                "started": False,
                "state": {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": "back-off restarting failed container sglang",
                    }
                },
                "lastState": {
                    "terminated": {
                        "exitCode": 2,
                        "reason": "Error",
                        "message": message,
                        "startedAt": ended,
                        "finishedAt": ended,
                    }
                },
            }
        ],
    }


def install_crd(plane: Any) -> None:
    """Install every committed CRD (the PDDeployment's and the PDRoleScale's, which the
    operator watches and writes) and wait until the API server serves them."""
    api = plane.api_client()
    ext = k8s.ApiextensionsV1Api(api)
    for path in sorted((REPO / "crds").glob("*.yaml")):
        ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
    custom = k8s.CustomObjectsApi(api)

    def served() -> bool:
        try:
            custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
            custom.list_cluster_custom_object(GROUP, VERSION, "pdrolescales")
        except ApiException:
            return False
        return True

    wait_for(served, 60, "the CRDs served")

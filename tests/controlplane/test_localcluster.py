"""The local control plane itself: it leaves nothing behind, RBAC and auditing work as
in production, the scheduler places a GPU pod on a registered node, and extensions (the
hook a process kubelet uses) run while the control plane is up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lockstep_dev.localcluster import LocalControlPlane

WAIT = 30.0


def alive(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def test_stop_leaves_nothing_behind_even_when_the_body_fails(controlplane_binary: Path) -> None:
    seen: list[str] = []

    @contextlib.contextmanager
    def extension(cp: LocalControlPlane) -> Iterator[None]:
        seen.append(f"enter running={cp.running}")
        yield
        seen.append(f"exit running={cp.running}")

    plane = LocalControlPlane(binary=controlplane_binary, extensions=[extension])
    with pytest.raises(RuntimeError, match="test body failed"), plane:
        info = plane.info
        assert all(alive(pid) for pid in [info.pid, *info.components.values()])
        assert set(info.components) == {
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        }
        raise RuntimeError("test body failed")

    assert seen == ["enter running=True", "exit running=True"]
    assert not any(alive(pid) for pid in [info.pid, *info.components.values()])
    assert not info.dir.exists()
    assert not plane.running


PARENT = """
import json, sys, time
from pathlib import Path
from lockstep_dev.localcluster import LocalControlPlane
cp = LocalControlPlane(binary=Path(sys.argv[1])).start()
print(json.dumps([cp.info.pid, *cp.info.components.values()]), flush=True)
time.sleep(600)
"""


def test_control_plane_stops_when_its_parent_is_killed(controlplane_binary: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(controlplane_binary)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        pids: list[int] = json.loads(parent.stdout.readline())
        assert len(pids) == 4 and all(alive(pid) for pid in pids)
        # SIGKILL: no atexit, no __exit__; the supervisor notices it was orphaned.
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=WAIT)
        wait_until(lambda: not any(alive(pid) for pid in pids), "every process to exit")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=WAIT)
        if parent.stdout is not None:
            parent.stdout.close()


def test_user_kubeconfig_is_bound_by_rbac(
    controlplane: LocalControlPlane, kubectl: Path, http: httpx.Client, namespace: str
) -> None:
    alice = controlplane.user_kubeconfig("alice", groups=["lockstep:testers"])

    def as_alice(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(kubectl), f"--kubeconfig={alice}", *args],
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )

    denied = as_alice("get", "configmaps", "-n", namespace)
    assert denied.returncode != 0
    assert 'User "alice" cannot list resource "configmaps"' in denied.stderr

    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    role = {
        "metadata": {"name": "configmap-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
    }
    binding = {
        "metadata": {"name": "testers-read-configmaps"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "configmap-reader",
        },
        "subjects": [{"kind": "Group", "name": "lockstep:testers"}],
    }
    assert http.post(f"{rbac}/roles", json=role).status_code == 201
    assert http.post(f"{rbac}/rolebindings", json=binding).status_code == 201

    allowed = as_alice("get", "configmaps", "-n", namespace, "-o", "name")
    assert allowed.returncode == 0, allowed.stderr
    assert "configmap/kube-root-ca.crt" in allowed.stdout.split()
    assert as_alice("auth", "can-i", "delete", "configmaps", "-n", namespace).stdout.strip() == "no"
    assert as_alice("auth", "can-i", "list", "configmaps", "-n", "default").stdout.strip() == "no"


def test_audit_log_records_who_did_what(
    controlplane: LocalControlPlane, http: httpx.Client, namespace: str
) -> None:
    audit_log = controlplane.audit_log
    assert audit_log is not None
    configmap = {"metadata": {"name": "audited"}, "data": {"k": "v"}}
    assert (
        http.post(f"/api/v1/namespaces/{namespace}/configmaps", json=configmap).status_code == 201
    )

    def creation() -> dict[str, Any] | None:
        for line in audit_log.read_text().splitlines():
            event: dict[str, Any] = json.loads(line)
            ref = event.get("objectRef", {})
            if (
                event["verb"] == "create"
                and event["stage"] == "ResponseComplete"
                and ref.get("resource") == "configmaps"
                and ref.get("namespace") == namespace
                and ref.get("name") == "audited"
            ):
                return event
        return None

    wait_until(lambda: creation() is not None, "the audit event")
    event = creation()
    assert event is not None
    assert event["user"]["username"] == "lockstep-admin"
    assert "system:masters" in event["user"]["groups"]
    assert event["responseStatus"]["code"] == 201


def test_scheduler_binds_a_gpu_pod_to_a_registered_node(http: httpx.Client, namespace: str) -> None:
    pod = {
        "metadata": {"name": "rank-0"},
        "spec": {
            "containers": [
                {
                    "name": "sglang",
                    "image": "registry.local/sglang:test",
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                }
            ]
        },
    }
    pod_path = f"/api/v1/namespaces/{namespace}/pods/rank-0"
    assert http.post(f"/api/v1/namespaces/{namespace}/pods", json=pod).status_code == 201

    def scheduled_condition() -> dict[str, Any]:
        conditions = http.get(pod_path).json().get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "PodScheduled"), {})

    # No node has GPUs yet: the scheduler reports the pod unschedulable.
    wait_until(lambda: scheduled_condition().get("reason") == "Unschedulable", "Unschedulable")

    # Register a Ready node with GPUs, as a process kubelet would.
    node_name = f"gpu-{namespace}"
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"}
    node = {"metadata": {"name": node_name, "labels": {"kubernetes.io/hostname": node_name}}}
    assert http.post("/api/v1/nodes", json=node).status_code == 201
    try:
        status = {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "test node",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                    }
                ],
            }
        }
        response = http.patch(
            f"/api/v1/nodes/{node_name}/status",
            headers={"Content-Type": "application/strategic-merge-patch+json"},
            json=status,
        )
        assert response.status_code == 200, response.text
        wait_until(
            lambda: http.get(pod_path).json()["spec"].get("nodeName") == node_name, "binding"
        )
    finally:
        http.delete(f"/api/v1/nodes/{node_name}")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@pytest.fixture(autouse=True)
def _no_leftover_kubeconfig_env() -> Iterator[None]:
    # The tests pass kubeconfigs explicitly; a developer's KUBECONFIG must not leak in.
    saved = os.environ.pop("KUBECONFIG", None)
    yield
    if saved is not None:
        os.environ["KUBECONFIG"] = saved

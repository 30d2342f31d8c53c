"""The process kubelet's nodes: registration, node status and the node Lease.

Stands in for the real kubelet's node status manager (`pkg/kubelet/kubelet_node_status.go`:
register the Node, then post its status with a fresh heartbeat) and its node lease
controller (`pkg/kubelet/nodelease`: renew the Lease in `kube-node-lease` that the node
lifecycle controller reads). The pure part builds the objects (`build_node`,
`build_node_status`, the Lease); the rest sends them, one request per call, and leaves the
when (the heartbeat loop) to `ProcessKubelet`.

A node's metadata is written only when it is registered (an adopted node left by an
earlier kubelet gets its labels merged in, keeping others'); heartbeats patch the status
subresource only, so labels added by others and a cordon stay as they are.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from lockstep_dev.localcluster.kubelet.common import (
    FIELD_MANAGER,
    HOST_IP,
    KubeletError,
    Obj,
    checked,
    micro_time,
    rfc3339,
)

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
NODE_LABEL = "lockstep.dev/process-kubelet"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# Not a well-known Kubernetes label (zone and region are); the name follows their scheme,
# and the local cluster's topology-aware placement tests select on it.
RACK_LABEL = "topology.kubernetes.io/rack"
NODE_PREFIX = "lockstep-gpu"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40

_LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"


@dataclass(frozen=True)
class NodeShape:
    """What every fake node offers."""

    gpus: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)


# -- pure: the objects -----------------------------------------------------------------


def build_node(name: str, shape: NodeShape, extra_labels: Mapping[str, str] | None = None) -> Obj:
    """The Node object a process kubelet registers (status is set separately):
    the kubelet's own labels, then the shape's, then this node's `extra_labels`."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        GPU_PRODUCT_LABEL: shape.gpu_product,
        "nvidia.com/gpu.count": str(shape.gpus),
        NODE_LABEL: "true",
        **shape.labels,
        **(extra_labels or {}),
    }
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def build_node_status(
    name: str,
    shape: NodeShape,
    *,
    now: float,
    ready_since: float,
    version: str,
    kubelet_port: int = 0,
) -> Obj:
    """A Ready node status with a fresh heartbeat. The only address is the InternalIP:
    the API server tries a Hostname address first, and node names do not resolve."""
    capacity = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": str(shape.pods),
        GPU_RESOURCE: str(shape.gpus),
    }

    def condition(kind: str, status: str, reason: str, message: str) -> Obj:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": rfc3339(now),
            "lastTransitionTime": rfc3339(ready_since),
        }

    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "no pressure"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "no pressure"),
            condition("Ready", "True", "KubeletReady", "lockstep process kubelet is posting"),
        ],
        "addresses": [{"type": "InternalIP", "address": HOST_IP}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "kubeletVersion": version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "containerRuntimeVersion": "lockstep-process://1",
            "kernelVersion": os.uname().release,
            "osImage": "local processes",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def build_lease(name: str, node_uid: str, now: float) -> Obj:
    """The Lease of node `name` (owned by the Node, so it goes with it), renewed `now`."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": name,
                    "uid": node_uid,
                }
            ],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": micro_time(now),
        },
    }


def node_names(count: int, prefix: str = NODE_PREFIX) -> list[str]:
    """The names of a process kubelet's nodes: `<prefix>-0` ... `<prefix>-<count - 1>`."""
    return [f"{prefix}-{i}" for i in range(count)]


def rack_labels(node_names: Sequence[str], racks: int) -> dict[str, dict[str, str]]:
    """Spread nodes over `racks` racks round-robin: node i gets `RACK_LABEL: rack-<i % racks>`
    (a `node_labels` value for `ProcessKubelet`)."""
    if racks < 1:
        raise ValueError("racks must be at least 1")
    return {name: {RACK_LABEL: f"rack-{i % racks}"} for i, name in enumerate(node_names)}


def node_schedulable(node: Mapping[str, Any]) -> bool:
    """Ready, and the node lifecycle controller has lifted its not-ready taint."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(t.get("key") == NOT_READY_TAINT for t in taints)


# -- sending them ----------------------------------------------------------------------


def register_node(http: httpx.Client, node: Obj) -> None:
    """Create the Node; one left by an earlier kubelet is adopted (its labels merged)."""
    name = node["metadata"]["name"]
    response = http.post("/api/v1/nodes", json=node, params={"fieldManager": FIELD_MANAGER})
    if response.status_code == 409:  # left by an earlier kubelet: adopt it
        response = http.patch(
            f"/api/v1/nodes/{name}",
            headers={"Content-Type": "application/merge-patch+json"},
            json={"metadata": {"labels": node["metadata"]["labels"]}},
        )
    checked(response, f"registering node {name}")


def heartbeat(
    http: httpx.Client,
    names: Sequence[str],
    shape: NodeShape,
    *,
    now: float,
    ready_since: float,
    version: str,
    kubelet_port: int,
) -> None:
    """One heartbeat of every node: its status (the status subresource only), then its
    Lease."""
    for name in names:
        status = build_node_status(
            name,
            shape,
            now=now,
            ready_since=ready_since,
            version=version,
            kubelet_port=kubelet_port,
        )
        checked(
            http.patch(
                f"/api/v1/nodes/{name}/status",
                headers={"Content-Type": "application/strategic-merge-patch+json"},
                json={"status": status},
            ),
            f"node {name} status",
        )
        renew_lease(http, name, now)


def renew_lease(http: httpx.Client, name: str, now: float) -> None:
    """Renew the Lease of node `name`, creating it when there is none."""
    renewed = http.patch(
        f"{_LEASES}/{name}",
        headers={"Content-Type": "application/merge-patch+json"},
        json={"spec": {"renewTime": micro_time(now)}},
    )
    if renewed.status_code != 404:
        checked(renewed, f"lease of node {name}")
        return
    node = checked(http.get(f"/api/v1/nodes/{name}"), f"reading node {name}")
    created = http.post(_LEASES, json=build_lease(name, node["metadata"]["uid"], now))
    if created.status_code != 409:
        checked(created, f"creating the lease of node {name}")


def wait_schedulable(http: httpx.Client, names: Sequence[str], timeout: float) -> None:
    """Wait until the scheduler may place pods on every node (`node_schedulable`);
    `KubeletError` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = [checked(http.get(f"/api/v1/nodes/{n}"), f"reading node {n}") for n in names]
        if all(node_schedulable(n) for n in nodes):
            return
        if time.monotonic() > deadline:
            raise KubeletError(
                f"nodes {list(names)} not schedulable after "
                f"{timeout:.0f}s (is the node lifecycle controller up?)"
            )
        time.sleep(0.2)


def remove_node(http: httpx.Client, name: str) -> None:
    """Delete node `name` and its Lease (responses unchecked: best effort on stop)."""
    http.delete(f"/api/v1/nodes/{name}")
    http.delete(f"{_LEASES}/{name}")

"""Node maintenance on the local cluster: the real `kubectl cordon` and `kubectl drain`
(`lockstep_dev.localcluster.maintenance`) against the real API server, its eviction API and
the controller manager's disruption controller, with the process kubelet running the pods.

A pod here is Ready once its process runs: the kubelet maps the `sleeper` command to a
local Python process, and the pods have no readiness probe and no readiness gate. Each pod
names a ConfigMap as its controller owner: `kubectl drain` refuses pods without one
(unless --force), and the garbage collector keeps a pod whose owner exists. Drain times
are printed (run with -s to see them), not asserted.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lockstep_dev.cluster import DevCluster
from lockstep_dev.localcluster import LocalControlPlane
from lockstep_dev.localcluster.kubelet import RACK_LABEL, ProcessKubelet, rack_labels
from lockstep_dev.localcluster.maintenance import Drain, cordon, drain, start_drain, uncordon

WAIT = 30.0
PREFIX = "maint-gpu"
NODES = [f"{PREFIX}-0", f"{PREFIX}-1", f"{PREFIX}-2"]
# Ends at once on SIGTERM, as a well-behaved server does.
SLEEPER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("sleeping", flush=True)
time.sleep(3600)
"""


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def kubelet(
    controlplane: LocalControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProcessKubelet]:
    """Three nodes of their own over two racks; `sleeper` maps to the SLEEPER script."""
    with ProcessKubelet(
        controlplane,
        nodes=3,
        node_prefix=PREFIX,
        node_labels=rack_labels(NODES, 2),
        root_dir=tmp_path_factory.mktemp("maintenance"),
        address_pool="127.0.98.0/24",
        commands={("sleeper",): (sys.executable, "-c", SLEEPER)},
        heartbeat_seconds=1.0,
    ) as running:
        yield running
        assert not running.errors


@pytest.fixture
def nodes(controlplane: LocalControlPlane, kubelet: ProcessKubelet) -> Iterator[list[str]]:
    """The kubelet's nodes, uncordoned again after the test, whatever it did."""
    yield kubelet.node_names
    for name in kubelet.node_names:
        uncordon(controlplane.kubeconfig, name)


class Cluster:
    """Objects of one test namespace, read and written as the admin."""

    def __init__(self, http: httpx.Client, namespace: str) -> None:
        self.http = http
        self.namespace = namespace
        self.pods = f"/api/v1/namespaces/{namespace}/pods"

    def owner(self, name: str) -> dict[str, Any]:
        """A ConfigMap to name as the pods' controller owner."""
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
        response = self.http.post(f"/api/v1/namespaces/{self.namespace}/configmaps", json=body)
        assert response.status_code == 201, response.text
        created: dict[str, Any] = response.json()
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": name,
            "uid": created["metadata"]["uid"],
            "controller": True,
        }

    def run_pod(self, name: str, node: str, owner: dict[str, Any], app: str) -> int:
        """Create a pod pinned to `node` (with an emptyDir, as the SGLang pods' runtime
        volume), wait until it is Ready and return its process id."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app}, "ownerReferences": [owner]},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "terminationGracePeriodSeconds": 5,
                "containers": [
                    {
                        "name": "main",
                        "image": "lockstep.local/sleeper",
                        "command": ["sleeper"],
                        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                    }
                ],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
            },
        }
        response = self.http.post(self.pods, json=body)
        assert response.status_code == 201, response.text
        wait_until(lambda: self.ready(name), f"pod {name} Ready")
        return int(self.pod(name)["status"]["containerStatuses"][0]["containerID"].split("//")[1])

    def pod(self, name: str) -> dict[str, Any]:
        response = self.http.get(f"{self.pods}/{name}")
        if response.status_code == 404:
            return {}
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def ready(self, name: str) -> bool:
        conditions = (self.pod(name).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def node(self, name: str) -> dict[str, Any]:
        response = self.http.get(f"/api/v1/nodes/{name}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


@pytest.fixture
def cluster(http: httpx.Client, namespace: str) -> Cluster:
    return Cluster(http, namespace)


@pytest.mark.timeout(60)
def test_nodes_carry_their_rack_and_heartbeats_keep_others_labels_and_a_cordon(
    controlplane: LocalControlPlane, nodes: list[str], cluster: Cluster
) -> None:
    racks = {n: cluster.node(n)["metadata"]["labels"].get(RACK_LABEL) for n in nodes}
    assert racks == {NODES[0]: "rack-0", NODES[1]: "rack-1", NODES[2]: "rack-0"}

    node = nodes[2]
    controlplane.kubectl("label", "node", node, "maintenance.example/window=tonight")
    cordon(controlplane.kubeconfig, node)
    beat = cluster.node(node)["status"]["conditions"][-1]["lastHeartbeatTime"]
    # Heartbeats every second: wait for a few of them (heartbeat times have 1 s steps).
    wait_until(
        lambda: cluster.node(node)["status"]["conditions"][-1]["lastHeartbeatTime"] > beat,
        "a heartbeat after the cordon",
    )
    time.sleep(2.5)
    after = cluster.node(node)
    ready = next(c for c in after["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert after["spec"].get("unschedulable") is True
    assert after["metadata"]["labels"]["maintenance.example/window"] == "tonight"
    assert after["metadata"]["labels"][RACK_LABEL] == "rack-0"
    print(f"\ncordoned node taints: {after['spec'].get('taints')}")

    uncordon(controlplane.kubeconfig, node)
    assert not cluster.node(node)["spec"].get("unschedulable")


@pytest.mark.timeout(90)
def test_drain_evicts_the_pod_stops_its_process_and_leaves_the_node_cordoned(
    controlplane: LocalControlPlane, kubelet: ProcessKubelet, nodes: list[str], cluster: Cluster
) -> None:
    node = nodes[0]
    owner = cluster.owner("evictee-owner")
    pid = cluster.run_pod("evictee", node, owner, app="evictee")
    assert kubelet.processes()[(cluster.namespace, "evictee")] == pid
    assert alive(pid)

    result = drain(controlplane.kubeconfig, node, timeout_s=30)
    print(f"\ndrain of {node} (one pod): exit {result.returncode} in {result.seconds:.2f}s")
    print(result.output)

    assert result.ok, result.output
    assert not result.killed
    assert result.evicted == ("evictee",)
    assert cluster.pod("evictee") == {}, "drain waits until the evicted pod is gone"
    wait_until(lambda: not alive(pid), "the evicted pod's process stopped", timeout=5)
    assert (cluster.namespace, "evictee") not in kubelet.processes()
    assert cluster.node(node)["spec"].get("unschedulable") is True


@pytest.mark.timeout(120)
def test_a_disruption_budget_blocks_drain_until_the_pods_are_deleted(
    controlplane: LocalControlPlane, kubelet: ProcessKubelet, nodes: list[str], cluster: Cluster
) -> None:
    node = nodes[1]
    owner = cluster.owner("guarded-owner")
    names = ["guarded-0", "guarded-1"]
    pids = {name: cluster.run_pod(name, node, owner, app="guarded") for name in names}
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": len(names), "selector": {"matchLabels": {"app": "guarded"}}},
    }
    pdbs = f"/apis/policy/v1/namespaces/{cluster.namespace}/poddisruptionbudgets"
    response = cluster.http.post(pdbs, json=pdb)
    assert response.status_code == 201, response.text

    def budget_judged() -> dict[str, Any]:
        status: dict[str, Any] = cluster.http.get(f"{pdbs}/guarded").json().get("status") or {}
        return status if status.get("observedGeneration") and "currentHealthy" in status else {}

    status = wait_until(budget_judged, "the disruption controller to judge the budget")
    assert (status["currentHealthy"], status["disruptionsAllowed"]) == (2, 0)

    blocked = drain(controlplane.kubeconfig, node, timeout_s=10)
    print(
        f"\ndrain of {node} under the budget: exit {blocked.returncode} in {blocked.seconds:.2f}s"
    )
    print(blocked.output)
    assert not blocked.ok and not blocked.killed
    assert "disruption budget" in blocked.output
    assert blocked.evicted == ()
    for name in names:
        pod = cluster.pod(name)
        assert pod and not pod["metadata"].get("deletionTimestamp"), f"{name} was evicted"
        assert alive(pids[name])
    assert cluster.node(node)["spec"].get("unschedulable") is True

    # A second drain keeps retrying the evictions; deleting the pods (what an operator
    # does to move a group off the node) lets it finish.
    with start_drain(controlplane.kubeconfig, node, timeout_s=60) as running:
        time.sleep(3)
        assert running.running, running.output
        assert all(cluster.pod(name) for name in names)
        deleted_at = running.seconds
        for name in names:
            assert cluster.http.delete(f"{cluster.pods}/{name}").status_code == 200
        result = running.wait(timeout=60)
    print(
        f"drain of {node} once the pods were deleted at {deleted_at:.2f}s: "
        f"exit {result.returncode} in {result.seconds:.2f}s"
    )
    print(result.output)
    assert result.ok, result.output
    assert result.evicted == (), "the pods were deleted, not evicted"
    for name in names:
        assert cluster.pod(name) == {}
        assert not alive(pids[name])


@pytest.mark.timeout(30)
def test_a_drain_past_its_process_bound_is_killed_with_its_process_group(tmp_path: Path) -> None:
    # A stand-in for a kubectl that hangs: a shell whose child sleeps too.
    running = Drain("stuck", ["sh", "-c", "sleep 60 & echo child $!; wait"], process_timeout_s=1.0)
    wait_until(lambda: "child" in running.output, "the stand-in started", timeout=5)
    child = int(running.output.split()[1])
    result = running.wait(timeout=10)
    assert result.killed and result.returncode < 0
    assert 1.0 <= result.seconds < 5.0
    assert not alive(running.pid)
    wait_until(lambda: not alive(child), "the stand-in's child killed too", timeout=5)
    with pytest.raises(ValueError, match="positive"):
        start_drain(tmp_path / "kubeconfig", "node", timeout_s=0)


def test_dev_cluster_node_labels_spread_racks_and_take_extra_labels(tmp_path: Path) -> None:
    cluster = DevCluster(
        tmp_path, nodes=3, racks=2, node_labels={"lockstep-gpu-1": {RACK_LABEL: "rack-9"}}
    )
    assert cluster.node_labels == {
        "lockstep-gpu-0": {RACK_LABEL: "rack-0"},
        "lockstep-gpu-1": {RACK_LABEL: "rack-9"},
        "lockstep-gpu-2": {RACK_LABEL: "rack-0"},
    }
    assert DevCluster(tmp_path, nodes=2).node_labels == {"lockstep-gpu-0": {}, "lockstep-gpu-1": {}}
    with pytest.raises(ValueError, match="lockstep-gpu-7"):
        DevCluster(tmp_path, nodes=2, node_labels={"lockstep-gpu-7": {"a": "b"}})

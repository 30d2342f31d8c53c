"""The process kubelet's pure parts, without a control plane (tests/controlplane/
test_kubelet.py runs the whole kubelet): the package's layout, a pod's status and its
condition transitions, a container's end and restart, its environment and argv, a
node's objects."""

from __future__ import annotations

import ast
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

import lockstep_dev.localcluster.kubelet as kubelet_package
from lockstep_dev.localcluster.engines import CommandTable
from lockstep_dev.localcluster.kubelet import (
    RACK_LABEL,
    CannotRun,
    ContainerConfigError,
    ContainerView,
    MissingConfig,
    NodeShape,
    build_node,
    build_node_status,
    container_env,
    local_argv,
    mount_map,
    node_names,
    node_schedulable,
    rack_labels,
    with_dist_init_ip,
    with_pod_host,
)
from lockstep_dev.localcluster.kubelet.node import LEASE_SECONDS, build_lease
from lockstep_dev.localcluster.kubelet.pod_workers import next_backoff, restarts
from lockstep_dev.localcluster.kubelet.runtime import PodContainer
from lockstep_dev.localcluster.kubelet.status import (
    build_pod_status,
    condition_objects,
    exit_code,
    pod_conditions,
    terminated_state,
)

pytestmark = pytest.mark.unit

PACKAGE = Path(kubelet_package.__file__).parent
MAX_MODULE_LINES = 450


# -- the layout ------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_every_module_is_small_and_says_what_it_stands_in_for(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name} is over {MAX_MODULE_LINES}"
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert doc, f"{path.name} has no docstring"
    if path.name not in ("__init__.py", "common.py"):
        assert "Stands in for" in doc, f"{path.name} does not say which part of a kubelet"


def test_the_package_exports_what_its_callers_import() -> None:
    # cluster.py, drills.py and the controlplane tests import these from the package.
    for name in (
        "GPU_PRODUCT_LABEL",
        "LOG_NAME",
        "RACK_LABEL",
        "NodeShape",
        "ProcessKubelet",
        "local_argv",
        "node_names",
        "rack_labels",
    ):
        assert name in kubelet_package.__all__
        assert getattr(kubelet_package, name) is not None


# -- pod status ------------------------------------------------------------------------


def view(name: str, *, ready: bool = True, state: dict[str, Any] | None = None) -> ContainerView:
    return ContainerView(
        name=name,
        image="img",
        state=state or {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        last_state={},
        restart_count=0,
        ready=ready,
        started="running" in (state or {"running": {}}),
    )


POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
    "spec": {"readinessGates": [{"conditionType": "lockstep.dev/ready"}]},
    "status": {"conditions": [{"type": "lockstep.dev/ready", "status": "False"}]},
}


def test_a_condition_keeps_its_transition_time_until_it_changes() -> None:
    first, transitions = condition_objects(pod_conditions(POD, [view("a", ready=False)]), {}, "t1")
    assert {c["type"]: c["lastTransitionTime"] for c in first}["Ready"] == "t1"
    ready = next(c for c in first if c["type"] == "Ready")
    assert ready["reason"] == "ContainersNotReady" and ready["status"] == "False"
    # The container becomes ready: ContainersReady changes, Ready (gate False) does not.
    second, transitions = condition_objects(pod_conditions(POD, [view("a")]), transitions, "t2")
    by_type = {c["type"]: c for c in second}
    assert by_type["ContainersReady"]["lastTransitionTime"] == "t2"
    assert by_type["Ready"]["lastTransitionTime"] == "t1"
    assert by_type["Ready"]["reason"] == "ReadinessGatesNotReady"
    assert by_type["PodScheduled"]["reason"] is None  # null: a strategic merge patch deletes
    # The gate's own condition is never written by the kubelet.
    assert "lockstep.dev/ready" not in by_type


def test_the_pod_status_carries_phase_addresses_and_init_containers() -> None:
    done = view("init", state={"terminated": {"exitCode": 0}})
    status, transitions = build_pod_status(
        POD,
        [view("a")],
        [done],
        [],
        restart_policy="Always",
        pod_ip="127.0.64.5",
        start_time="t0",
        transitions={},
        now="t1",
    )
    assert status["phase"] == "Running"
    assert (status["podIP"], status["hostIP"], status["startTime"]) == (
        "127.0.64.5",
        "127.0.0.1",
        "t0",
    )
    assert status["podIPs"] == [{"ip": "127.0.64.5"}]
    assert [s["name"] for s in status["initContainerStatuses"]] == ["init"]
    assert set(transitions) == {"PodScheduled", "Initialized", "ContainersReady", "Ready"}
    pending, _ = build_pod_status(
        POD,
        [view("a", ready=False, state={"waiting": {"reason": "PodInitializing"}})],
        [],
        ["init"],
        restart_policy="Always",
        pod_ip="127.0.64.5",
        start_time="t0",
        transitions={},
        now="t1",
    )
    initialized = next(c for c in pending["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "False" and initialized["reason"] == "ContainersNotInitialized"
    assert pending["phase"] == "Pending" and "initContainerStatuses" not in pending


def test_an_exit_is_reported_as_a_container_runtime_does() -> None:
    assert exit_code(0) == (0, None) and exit_code(3) == (3, None)
    assert exit_code(-signal.SIGKILL) == (137, 9)
    killed = terminated_state(-signal.SIGTERM, started_at="a", finished_at="b", pid=42)
    assert killed == {
        "exitCode": 143,
        "reason": "Error",
        "startedAt": "a",
        "finishedAt": "b",
        "containerID": "process://42",
        "signal": 15,
    }
    assert terminated_state(0, started_at="a", finished_at="b", pid=1)["reason"] == "Completed"


def test_restart_policy_and_backoff() -> None:
    assert restarts("Always", 0) and restarts("OnFailure", 1) and restarts("Always", 1)
    assert not restarts("OnFailure", 0) and not restarts("Never", 1)
    backoffs = [0.0]
    for _ in range(5):
        backoffs.append(next_backoff(backoffs[-1], 1.0, 10.0))
    assert backoffs[1:] == [1.0, 2.0, 4.0, 8.0, 10.0]


def test_a_container_view_follows_its_process() -> None:
    waiting = PodContainer(spec={"name": "c", "image": "i"}, log_path=Path("/nonexistent"))
    assert waiting.view().state == {"waiting": {"reason": "ContainerCreating"}}
    waiting.waiting = ("CrashLoopBackOff", "back-off")
    waiting.last_terminated = {"exitCode": 1}
    seen = waiting.view()
    assert seen.state == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}
    assert seen.last_state == {"terminated": {"exitCode": 1}} and not seen.started


# -- what a container becomes ----------------------------------------------------------


def test_the_environment_resolves_fields_secrets_and_mounts(tmp_path: Path) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"role": "decode"}},
        "spec": {"nodeName": "n0"},
    }
    spec = {
        "name": "c",
        "env": [
            {"name": "A", "value": "a"},
            {"name": "B", "value": "$(A)-$$-$(NOPE) /data/x"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {
                "name": "ROLE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}},
            },
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": True}},
            },
        ],
    }
    env = container_env(
        spec,
        pod,
        pod_ip="127.0.64.7",
        pod_dir=tmp_path,
        inherited={"PATH": "/bin"},
        secrets=lambda name: {"k": "v"} if name == "s" else None,
        mounts={"/data": "/local/data"},
    )
    assert env == {
        "PATH": "/bin",
        "LOCKSTEP_POD_IP": "127.0.64.7",
        "LOCKSTEP_POD_DIR": str(tmp_path),
        "A": "a",
        "B": "a-$-$(NOPE) /local/data/x",
        "POD": "p",
        "IP": "127.0.64.7",
        "ROLE": "decode",
        "S": "v",
    }
    with pytest.raises(MissingConfig, match='secret "s" not found'):
        container_env(spec, pod, pod_ip="", pod_dir=tmp_path, inherited={}, secrets=None)
    with pytest.raises(ContainerConfigError, match="envFrom"):
        container_env(
            {"name": "c", "envFrom": [{}]}, pod, pod_ip="", pod_dir=tmp_path, inherited={}
        )


def test_the_argv_maps_the_entrypoint_and_rewrites_hosts_and_mounts() -> None:
    commands: CommandTable = {("lockstep-sglang",): (sys.executable, "-m", "lockstep_standin")}
    spec = {
        "name": "c",
        "command": ["lockstep-sglang"],
        "args": ["--host", "0.0.0.0", "--dist-init-addr", "p-0.svc:5000", "--dir=/data/m"],
        "volumeMounts": [{"name": "v", "mountPath": "/data/"}],
    }
    mounts = mount_map(spec, {"v": Path("/local/v")})
    assert mounts == {"/data": "/local/v"}
    argv = local_argv(spec, {}, commands, mounts)
    assert argv[:3] == [sys.executable, "-m", "lockstep_standin"]
    assert argv[-1] == "--dir=/local/v/m"
    argv = with_pod_host(with_dist_init_ip(argv, "127.0.64.9"), "127.0.64.8")
    assert argv[3:7] == ["--host", "127.0.64.8", "--dist-init-addr", "127.0.64.9:5000"]
    # The router's metrics listener too (two routers on this machine collided on
    # 0.0.0.0:29000), in both spellings; a named address is kept.
    router = ["--prometheus-host", "0.0.0.0", "--prometheus-host=::", "--host", "10.0.0.1"]
    assert with_pod_host(router, "127.0.64.7") == [
        "--prometheus-host", "127.0.64.7", "--prometheus-host=127.0.64.7", "--host", "10.0.0.1",
    ]  # fmt: skip
    with pytest.raises(CannotRun, match="no command"):
        local_argv({"name": "c", "image": "x"}, {}, commands)
    with pytest.raises(CannotRun, match="not mapped"):
        local_argv({"name": "c", "command": ["no-such-program-here"]}, {"PATH": ""}, commands)


# -- nodes -----------------------------------------------------------------------------


def test_node_objects() -> None:
    names = node_names(3, "gpu")
    assert names == ["gpu-0", "gpu-1", "gpu-2"]
    labels = rack_labels(names, 2)
    assert [labels[n][RACK_LABEL] for n in names] == ["rack-0", "rack-1", "rack-0"]
    node = build_node("gpu-1", NodeShape(gpus=4, labels={"a": "b"}), labels["gpu-1"])
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "4"
    assert node["metadata"]["labels"]["a"] == "b"
    assert node["metadata"]["labels"][RACK_LABEL] == "rack-1"
    status = build_node_status("gpu-1", NodeShape(), now=0.0, ready_since=0.0, version="v1.34")
    assert status["capacity"]["nvidia.com/gpu"] == "8"
    assert not node_schedulable(
        {"status": status, "spec": {"taints": [{"key": "node.kubernetes.io/not-ready"}]}}
    )
    assert node_schedulable({"status": status})
    lease = build_lease("gpu-1", "uid-1", 1.5)
    assert lease["spec"] == {
        "holderIdentity": "gpu-1",
        "leaseDurationSeconds": LEASE_SECONDS,
        "renewTime": "1970-01-01T00:00:01.500000Z",
    }
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "uid-1"

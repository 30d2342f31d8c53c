"""The process kubelet against the real control plane: its fake GPU nodes stay Ready, the
real scheduler places GPU pods on them, and each pod runs as local processes on its own
loopback address with the status, readiness, restarts and deletion a kubelet gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import pdd_obj

from lockstep.api.models import parse_pddeployment
from lockstep.core.builders import build_agent_token_secret, build_group_pods, dist_port
from lockstep.core.policy import evaluate
from lockstep_dev.localcluster import LocalControlPlane
from lockstep_dev.localcluster.kubelet import GPU_PRODUCT_LABEL, NodeShape, ProcessKubelet

WAIT = 30.0
GATE = "lockstep.dev/group-healthy"
PORT = 8080

# A container: records its argv and a few variables in its pod directory, then serves
# /health on its pod address. MODE (env) changes what it does:
#   exit-once    exits 3 the first time, serves after the restart
#   ignore-term  ignores SIGTERM (only SIGKILL ends it)
SERVER = """
import http.server, json, os, pathlib, signal, sys
ip, pod_dir = os.environ["LOCKSTEP_POD_IP"], pathlib.Path(os.environ["LOCKSTEP_POD_DIR"])
mode = os.environ.get("MODE", "")
print("run starting", flush=True)
keys = ["LOCKSTEP_POD_IP", "LOCKSTEP_POD_DIR", "LOCKSTEP_POD_NAME", "POD_NAME", "POD_UID",
        "GREETING", "PATH", "TOKEN", "SPARE", "KUBECONFIG"]
record = {"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}
(pod_dir / "record.tmp").write_text(json.dumps(record))
(pod_dir / "record.tmp").replace(pod_dir / "record.json")
if mode == "exit-once" and not (pod_dir / "exited").exists():
    (pod_dir / "exited").touch()
    sys.exit(3)
def on_term(*_):
    (pod_dir / "sigterm").touch()
    if mode != "ignore-term":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("serving on", ip, flush=True)
http.server.HTTPServer((ip, 8080), Health).serve_forever()
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
    """Two fake GPU nodes for this module; `lockstep-sglang` maps to the SERVER script."""
    with ProcessKubelet(
        controlplane,
        nodes=2,
        node_prefix="kubelet-test-gpu",
        root_dir=tmp_path_factory.mktemp("kubelet"),
        address_pool="127.0.96.0/24",
        commands={
            ("lockstep-sglang",): (sys.executable, "-c", SERVER),
            # A stock image's pod: the runtime copied by its init container, then the
            # injected launcher (the server script here, once the copy is there).
            ("lockstep-runtime-install",): (sys.executable, "-m", "lockstep_sglang.install"),
            ("python3", "/opt/lockstep/runtime/launch.py"): (sys.executable, "-c", SERVER),
        },
        heartbeat_seconds=1.0,
        backoff_initial=0.5,
        backoff_max=2.0,
    ) as running:
        yield running
        assert not running.errors


def container(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "sglang",
        "image": "lmsysorg/sglang:v0.5.23",
        "command": ["lockstep-sglang"],
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "failureThreshold": 1,
        },
        "resources": {"limits": {"nvidia.com/gpu": "2"}},
    }
    return {**base, **fields}


def pod(name: str, *, grace: int = 1, gates: bool = False, **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": grace,
        "containers": [container(**fields)],
    }
    if gates:
        spec["readinessGates"] = [{"conditionType": GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


class Pods:
    """Create and read the pods of one namespace."""

    def __init__(self, http: httpx.Client, namespace: str) -> None:
        self.http = http
        self.path = f"/api/v1/namespaces/{namespace}/pods"

    def create(self, body: dict[str, Any]) -> None:
        response = self.http.post(self.path, json=body)
        assert response.status_code == 201, response.text

    def get(self, name: str) -> dict[str, Any] | None:
        response = self.http.get(f"{self.path}/{name}")
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def status(self, name: str) -> dict[str, Any]:
        found = self.get(name)
        return (found or {}).get("status") or {}

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        conditions = self.status(name).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), {})

    def container_status(self, name: str) -> dict[str, Any]:
        statuses = self.status(name).get("containerStatuses") or [{}]
        return dict(statuses[0])

    def ready(self, name: str) -> bool:
        return self.condition(name, "Ready").get("status") == "True"


@pytest.fixture
def pods(http: httpx.Client, namespace: str, kubelet: ProcessKubelet) -> Pods:
    return Pods(http, namespace)


def record_of(kubelet: ProcessKubelet, namespace: str, name: str) -> dict[str, Any]:
    def written() -> Path | None:
        directory = kubelet.pod_dir(namespace, name)
        return (
            directory / "record.json"
            if directory and (directory / "record.json").exists()
            else None
        )

    path: Path = wait_until(written, f"{name} running and its record written")
    record: dict[str, Any] = json.loads(path.read_text())
    return record


@pytest.mark.timeout(30)
def test_nodes_register_with_gpus_and_heartbeats_advance(
    kubelet: ProcessKubelet, http: httpx.Client
) -> None:
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"

    def beats() -> list[tuple[str, str]]:
        out = []
        for name in kubelet.node_names:
            node = http.get(f"/api/v1/nodes/{name}").json()
            ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
            lease = http.get(f"{lease_path}/{name}").json()
            out.append((ready["lastHeartbeatTime"], lease["spec"]["renewTime"]))
        return out

    assert kubelet.node_names == ["kubelet-test-gpu-0", "kubelet-test-gpu-1"]
    for name in kubelet.node_names:
        node = http.get(f"/api/v1/nodes/{name}").json()
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"][GPU_PRODUCT_LABEL] == NodeShape().gpu_product
        assert not node["spec"].get("taints")
        assert node["status"]["addresses"][0] == {"type": "InternalIP", "address": "127.0.0.1"}
    first = beats()
    wait_until(
        lambda: all(a[0] != b[0] and a[1] != b[1] for a, b in zip(first, beats(), strict=True)),
        "node heartbeat and lease renewal to advance",
        timeout=10,
    )


@pytest.mark.timeout(60)
def test_nodes_stay_ready_past_the_node_monitor_grace_period(controlplane_binary: Path) -> None:
    # A control plane of its own whose node lifecycle controller gives up on a node after
    # 4 s without a heartbeat; the kubelet runs as its extension.
    kubelet = ProcessKubelet(nodes=1, node_prefix="grace-gpu", heartbeat_seconds=1.0)
    with (
        LocalControlPlane(
            binary=controlplane_binary,
            controller_manager_args=["--node-monitor-grace-period=4s", "--node-monitor-period=1s"],
            extensions=[kubelet],
        ) as cp,
        cp.http_client() as http,
    ):
        name = kubelet.node_names[0]
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            node = http.get(f"/api/v1/nodes/{name}").json()
            ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
            assert ready["status"] == "True", ready
            assert not node["spec"].get("taints"), node["spec"]["taints"]
            time.sleep(0.5)
        assert not kubelet.errors
    assert kubelet.processes() == {}


@pytest.mark.timeout(60)
def test_gpu_pod_runs_as_a_process_and_ready_waits_for_the_readiness_gate(
    kubelet: ProcessKubelet, pods: Pods, namespace: str, http: httpx.Client
) -> None:
    env = [
        {"name": "GREETING", "value": "hello $(POD_NAME)"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    ]
    pods.create(pod("rank-0", gates=True, env=env, args=["--port", "$(POD_NAME)"]))

    wait_until(lambda: pods.container_status("rank-0").get("ready"), "the container ready")
    found = pods.get("rank-0")
    assert found is not None
    assert found["spec"]["nodeName"] in kubelet.node_names
    status = found["status"]
    ip = kubelet.address_of(namespace, "rank-0")
    assert ip is not None and ip.startswith("127.0.96.")
    assert status["phase"] == "Running"
    assert status["podIP"] == ip and status["podIPs"] == [{"ip": ip}]
    assert status["hostIP"] == "127.0.0.1"
    assert pods.condition("rank-0", "ContainersReady")["status"] == "True"
    assert pods.condition("rank-0", "Ready")["status"] == "False"
    assert pods.condition("rank-0", "Ready")["reason"] == "ReadinessGatesNotReady"
    assert httpx.get(f"http://{ip}:{PORT}/health", trust_env=False).status_code == 200

    record = record_of(kubelet, namespace, "rank-0")
    pod_dir = kubelet.pod_dir(namespace, "rank-0")
    assert pod_dir is not None and pod_dir.name == f"{namespace}_rank-0_{found['metadata']['uid']}"
    assert record["argv"] == ["--port", "rank-0"]
    assert record["env"]["LOCKSTEP_POD_IP"] == ip
    assert record["env"]["LOCKSTEP_POD_DIR"] == str(pod_dir)
    assert record["env"]["POD_NAME"] == "rank-0"
    assert record["env"]["POD_UID"] == found["metadata"]["uid"]
    assert record["env"]["GREETING"] == "hello $(POD_NAME)"  # defined after it: not expanded
    assert record["env"]["PATH"] == os.environ["PATH"]
    assert "serving on" in kubelet.log_tail(namespace, "rank-0")
    assert kubelet.processes()[(namespace, "rank-0")] > 0

    # The operator's gate: the kubelet merges its conditions by type and never drops it.
    gate = {"type": GATE, "status": "True", "reason": "GroupHealthy"}
    response = http.patch(
        f"/api/v1/namespaces/{namespace}/pods/rank-0/status",
        headers={"Content-Type": "application/strategic-merge-patch+json"},
        json={"status": {"conditions": [gate]}},
    )
    assert response.status_code == 200, response.text
    wait_until(lambda: pods.ready("rank-0"), "Ready once the gate is True")
    time.sleep(1.5)  # a few status rounds later the gate is still the operator's
    assert pods.condition("rank-0", GATE)["status"] == "True"
    assert pods.condition("rank-0", GATE)["reason"] == "GroupHealthy"


@pytest.mark.timeout(60)
def test_dist_init_addr_host_becomes_the_rank0_pod_ip(
    kubelet: ProcessKubelet, pods: Pods, namespace: str
) -> None:
    def rank(index: int) -> dict[str, Any]:
        addr = f"grp-0.grp.{namespace}.svc:20005"
        args = ["--node-rank", str(index), "--dist-init-addr", addr, "--nnodes", "2"]
        return pod(f"grp-{index}", args=args)

    # Rank 1 first: it waits for rank 0's address instead of starting with a bad one.
    pods.create(rank(1))
    waiting = wait_until(
        lambda: pods.container_status("grp-1").get("state", {}).get("waiting", {}).get("message"),
        "rank 1 waiting for rank 0",
    )
    assert "grp-0" in waiting
    assert kubelet.processes().get((namespace, "grp-1")) is None
    pods.create(rank(0))

    wait_until(lambda: pods.container_status("grp-1").get("ready"), "rank 1 ready")
    ip0 = kubelet.address_of(namespace, "grp-0")
    assert ip0 is not None and ip0 != kubelet.address_of(namespace, "grp-1")
    for index in (0, 1):
        argv = record_of(kubelet, namespace, f"grp-{index}")["argv"]
        assert argv == [
            "--node-rank",
            str(index),
            "--dist-init-addr",
            f"{ip0}:20005",
            "--nnodes",
            "2",
        ]


@pytest.mark.timeout(60)
def test_the_operators_group_pods_run_with_the_rendezvous_and_host_made_local(
    kubelet: ProcessKubelet, pods: Pods, namespace: str, http: httpx.Client
) -> None:
    # A two-pod decode group exactly as the operator builds it (no owner: nothing to
    # garbage-collect it), created through the API server.
    obj = pdd_obj(decode={"tp": 2, "gpusPerPod": 1, "podsPerGroup": 2})
    obj["metadata"] = {"name": "m", "namespace": namespace}
    pdd = parse_pddeployment(obj)
    group = build_group_pods(pdd, "decode", 0, 3, evaluate(pdd.spec).roles["decode"])
    # The pods read the agent token from the deployment's Secret, as the operator makes it.
    secret = http.post(
        f"/api/v1/namespaces/{namespace}/secrets", json=build_agent_token_secret(pdd, "t0ken")
    )
    assert secret.status_code == 201, secret.text
    for body in group:
        pods.create(body)
    names = [body["metadata"]["name"] for body in group]

    records = [record_of(kubelet, namespace, name) for name in names]
    ip0 = kubelet.address_of(namespace, names[0])
    assert ip0 is not None
    for name, record in zip(names, records, strict=True):
        argv = record["argv"]
        assert argv[argv.index("--dist-init-addr") + 1] == f"{ip0}:{dist_port(3)}"
        assert argv[argv.index("--host") + 1] == kubelet.address_of(namespace, name)
        assert record["env"]["LOCKSTEP_POD_NAME"] == name
        found = pods.get(name)
        assert found is not None and found["spec"]["nodeName"] in kubelet.node_names
    # Nothing answers the operator's probe ports here: running, never Ready.
    assert pods.status(names[1])["phase"] == "Running"
    assert not pods.ready(names[1])


@pytest.mark.timeout(60)
def test_a_container_that_exits_is_restarted_with_its_restart_count_and_both_logs(
    kubelet: ProcessKubelet, pods: Pods, namespace: str, http: httpx.Client
) -> None:
    pods.create(pod("flaky", env=[{"name": "MODE", "value": "exit-once"}]))

    wait_until(lambda: pods.container_status("flaky").get("ready"), "ready after the restart")
    status = pods.container_status("flaky")
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["lastState"]["terminated"]["reason"] == "Error"
    assert "running" in status["state"]
    assert pods.status("flaky")["phase"] == "Running"

    # pods/log through the API server reaches the kubelet: this run, and the one before.
    current = http.get(f"{pods.path}/flaky/log", params={"tailLines": "1"})
    assert current.status_code == 200, current.text
    assert current.text.startswith("serving on ")
    previous = http.get(f"{pods.path}/flaky/log", params={"previous": "true"})
    assert previous.status_code == 200, previous.text
    assert previous.text == "run starting\n"


@pytest.mark.timeout(60)
def test_a_process_killed_from_outside_is_restarted(
    kubelet: ProcessKubelet, pods: Pods, namespace: str
) -> None:
    pods.create(pod("victim"))
    wait_until(lambda: pods.container_status("victim").get("ready"), "ready")
    pid = kubelet.processes()[(namespace, "victim")]

    os.kill(pid, signal.SIGKILL)

    wait_until(
        lambda: (
            pods.container_status("victim").get("restartCount") == 1
            and pods.container_status("victim").get("ready")
        ),
        "restarted and ready again",
    )
    terminated = pods.container_status("victim")["lastState"]["terminated"]
    assert terminated["exitCode"] == 137 and terminated["signal"] == 9
    new_pid = kubelet.processes()[(namespace, "victim")]
    assert new_pid != pid and alive(new_pid)


@pytest.mark.timeout(60)
def test_deleting_a_pod_stops_its_process_within_the_grace_period(
    kubelet: ProcessKubelet, pods: Pods, namespace: str, http: httpx.Client
) -> None:
    # One process ends on SIGTERM (long grace, never used up); one ignores SIGTERM and
    # is killed when its 2 s grace is over.
    pods.create(pod("polite", grace=30))
    pods.create(pod("stubborn", grace=2, env=[{"name": "MODE", "value": "ignore-term"}]))
    for name in ("polite", "stubborn"):
        wait_until(lambda name=name: pods.container_status(name).get("ready"), f"{name} ready")
    pids = {name: kubelet.processes()[(namespace, name)] for name in ("polite", "stubborn")}
    dirs = {name: kubelet.pod_dir(namespace, name) for name in ("polite", "stubborn")}
    ips = {kubelet.address_of(namespace, name) for name in ("polite", "stubborn")}

    started = time.monotonic()
    for name in ("polite", "stubborn"):
        assert http.delete(f"{pods.path}/{name}").status_code == 200
    wait_until(lambda: pods.get("polite") is None, "polite pod gone", timeout=10)
    polite_took = time.monotonic() - started
    wait_until(lambda: pods.get("stubborn") is None, "stubborn pod gone", timeout=15)
    stubborn_took = time.monotonic() - started

    assert polite_took < 10, "a process that ends on SIGTERM does not wait for its grace"
    assert 1.8 <= stubborn_took < 10, "SIGKILL only once the grace period is over"
    for name in ("polite", "stubborn"):
        assert not alive(pids[name])
        directory = dirs[name]
        assert directory is not None and (directory / "sigterm").exists()
        assert kubelet.pod_dir(namespace, name) is None
    assert ips.isdisjoint(kubelet.address_of(namespace, n) for n in ("polite", "stubborn"))


@pytest.mark.timeout(60)
def test_stopping_the_kubelet_kills_its_processes_even_when_the_caller_fails(
    controlplane: LocalControlPlane,
    kubelet: ProcessKubelet,
    pods: Pods,
    namespace: str,
    http: httpx.Client,
) -> None:
    # A second kubelet with a node of its own; the pod is pinned to that node.
    other = ProcessKubelet(
        controlplane,
        node_prefix="kubelet-stop-gpu",
        address_pool="127.0.97.0/24",
        commands={("lockstep-sglang",): (sys.executable, "-c", SERVER)},
    )
    body = pod("orphan")
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": other.node_names[0]}
    with pytest.raises(RuntimeError, match="caller failed"), other:
        pods.create(body)
        wait_until(lambda: pods.container_status("orphan").get("ready"), "ready")
        pid = other.processes()[(namespace, "orphan")]
        root = other.root_dir
        raise RuntimeError("caller failed")

    wait_until(lambda: not alive(pid), "the pod's process killed", timeout=5)
    assert not root.exists()
    assert http.get(f"/api/v1/nodes/{other.node_names[0]}").status_code == 404
    assert (namespace, "orphan") not in kubelet.processes()


@pytest.mark.timeout(30)
def test_an_unmapped_command_cannot_run_and_says_why(
    kubelet: ProcessKubelet, pods: Pods, namespace: str
) -> None:
    pods.create(pod("unmapped", command=["no-such-sglang-binary", "--serve"]))
    pods.create(
        pod(
            "secret-env",
            env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        )
    )

    def waiting(name: str) -> dict[str, Any]:
        state = pods.container_status(name).get("state", {})
        found: dict[str, Any] = state.get("waiting", {})
        return found if found.get("reason") not in (None, "ContainerCreating") else {}

    unmapped = wait_until(lambda: waiting("unmapped"), "unmapped command reported")
    assert unmapped["reason"] == "ContainerCannotRun"
    assert "no-such-sglang-binary" in unmapped["message"]
    secret = wait_until(lambda: waiting("secret-env"), "secret env reported")
    assert secret["reason"] == "CreateContainerConfigError"
    assert "secretKeyRef" in secret["message"]
    assert pods.status("unmapped")["phase"] == "Pending"
    assert not pods.ready("unmapped")
    assert (namespace, "unmapped") not in kubelet.processes()


@pytest.mark.timeout(60)
def test_secret_env_waits_for_its_secret_and_key_then_starts_with_the_value(
    kubelet: ProcessKubelet, pods: Pods, namespace: str, http: httpx.Client
) -> None:
    env = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "agent", "key": "token"}}},
        {
            "name": "SPARE",
            "valueFrom": {"secretKeyRef": {"name": "absent", "key": "x", "optional": True}},
        },
    ]
    pods.create(pod("with-secret", env=env))

    def waiting_message() -> str:
        state = pods.container_status("with-secret").get("state", {})
        waiting = state.get("waiting", {})
        if waiting.get("reason") != "CreateContainerConfigError":
            return ""
        return str(waiting.get("message", ""))

    message = wait_until(waiting_message, "the missing secret reported")
    assert 'secret "agent" not found' in message and "agent/token" in message
    assert (namespace, "with-secret") not in kubelet.processes()

    secrets = f"/api/v1/namespaces/{namespace}/secrets"
    created = http.post(
        secrets,
        json={"metadata": {"name": "agent"}, "stringData": {"other": "x"}},
    )
    assert created.status_code == 201, created.text
    wait_until(
        lambda: 'key "token" not in secret "agent"' in waiting_message(),
        "the missing key reported",
    )

    patched = http.patch(
        f"{secrets}/agent",
        headers={"Content-Type": "application/merge-patch+json"},
        json={"stringData": {"token": "s3cret"}},
    )
    assert patched.status_code == 200, patched.text
    record = record_of(kubelet, namespace, "with-secret")
    assert record["env"]["TOKEN"] == "s3cret"
    assert record["env"]["SPARE"] is None  # optional and missing: not set
    wait_until(lambda: pods.container_status("with-secret").get("ready"), "ready")


@pytest.mark.timeout(60)
def test_a_pod_with_a_service_account_gets_credentials_limited_to_its_rbac(
    kubelet: ProcessKubelet, pods: Pods, namespace: str, http: httpx.Client, kubectl: Path
) -> None:
    created = http.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts", json={"metadata": {"name": "reader"}}
    )
    assert created.status_code == 201, created.text
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    role = {
        "metadata": {"name": "reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    assert http.post(f"{rbac}/roles", json=role).status_code == 201
    binding = {
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    }
    assert http.post(f"{rbac}/rolebindings", json=binding).status_code == 201
    body = pod("reader-pod")
    body["spec"]["serviceAccountName"] = "reader"
    pods.create(body)  # the API server refuses a pod whose account does not exist

    record = record_of(kubelet, namespace, "reader-pod")
    kubeconfig = record["env"]["KUBECONFIG"]
    assert kubeconfig and Path(kubeconfig).exists()

    def can(verb: str, resource: str) -> str:
        done = subprocess.run(
            [
                str(kubectl),
                "--kubeconfig",
                kubeconfig,
                "-n",
                namespace,
                "auth",
                "can-i",
                verb,
                resource,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return done.stdout.strip()

    assert can("watch", "pods") == "yes"
    assert can("list", "secrets") == "no"
    assert can("delete", "pods") == "no"
    whoami = subprocess.run(
        [str(kubectl), "--kubeconfig", kubeconfig, "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    user = json.loads(whoami.stdout)["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{namespace}:reader"
    assert f"system:serviceaccounts:{namespace}" in user["groups"]


@pytest.mark.timeout(60)
def test_init_containers_run_in_order_to_success_before_the_containers_on_shared_volumes(
    kubelet: ProcessKubelet, pods: Pods, namespace: str
) -> None:
    # The first init container fails once (retried after a back-off), then writes into
    # the pod's emptyDir; the second takes a while; the container sees the same volume
    # at its mount path, which becomes the volume's local directory in argv and env.
    body = pod(
        "initialized",
        args=["--data=/work/data"],
        env=[{"name": "GREETING", "value": "/work/data"}],
        volumeMounts=[{"name": "work", "mountPath": "/work", "readOnly": True}],
    )
    body["spec"]["volumes"] = [{"name": "work", "emptyDir": {}}]
    body["spec"]["initContainers"] = [
        {
            "name": "fill",
            "image": "busybox",
            "command": ["sh", "-c",
                        "test -f /work/tried || { touch /work/tried; exit 4; }; "
                        "echo from-init > /work/data"],
            "volumeMounts": [{"name": "work", "mountPath": "/work"}],
        },
        {"name": "wait", "image": "busybox", "command": ["sh", "-c", "sleep 2"]},
    ]  # fmt: skip
    pods.create(body)
    initializing = wait_until(
        lambda: (
            (s := pods.status("initialized")).get("initContainerStatuses")
            and s["initContainerStatuses"][1]["state"].get("running")
            and s
        ),
        "the second init container running",
    )
    assert initializing["phase"] == "Pending"
    assert pods.condition("initialized", "Initialized")["status"] == "False"
    assert pods.container_status("initialized")["state"]["waiting"]["reason"] == "PodInitializing"
    fill = initializing["initContainerStatuses"][0]
    assert fill["state"]["terminated"]["reason"] == "Completed" and fill["restartCount"] == 1
    assert fill["lastState"]["terminated"]["exitCode"] == 4

    wait_until(lambda: pods.ready("initialized"), "the container ready after both")
    initialized = pods.condition("initialized", "Initialized")
    assert initialized["status"] == "True" and "reason" not in initialized
    statuses = pods.status("initialized")["initContainerStatuses"]
    assert [s["state"]["terminated"]["exitCode"] for s in statuses] == [0, 0]
    record = record_of(kubelet, namespace, "initialized")
    local = kubelet.pod_dir(namespace, "initialized") / "volumes" / "work"  # type: ignore[operator]
    assert record["env"]["GREETING"] == str(local / "data")
    assert record["argv"] == [f"--data={local / 'data'}"]
    assert (local / "data").read_text() == "from-init\n"

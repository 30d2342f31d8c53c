"""Every refusal lockstep's runtime knows, end to end on the local cluster: the real
launcher (and the runtime's install step) in pods the process kubelet runs on the real
control plane; each refusal lands in the pod's status as the container's termination
message (`RuntimeRefused: ...`, `RuntimeInstallFailed: ...`), where the operator reads it
(tests/controlplane/test_operator.py shows it lifted into status and an Event)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lockstep_dev.localcluster import LocalControlPlane, sglang_cpu
from lockstep_dev.localcluster.kubelet import ProcessKubelet

WAIT = 120.0  # the refusals after SGLang's imports take a loaded machine tens of seconds


@pytest.fixture(scope="module")
def kubelet(
    controlplane: LocalControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProcessKubelet]:
    """One fake GPU node whose `lockstep-sglang` is the real launcher."""
    with ProcessKubelet(
        controlplane,
        nodes=1,
        node_prefix="refusal-test-gpu",
        root_dir=tmp_path_factory.mktemp("kubelet"),
        address_pool="127.0.97.0/24",
        commands={
            ("lockstep-sglang",): (sys.executable, "-m", "lockstep_sglang.launcher"),
            ("lockstep-runtime-install",): (sys.executable, "-m", "lockstep_sglang.install"),
        },
        heartbeat_seconds=1.0,
    ) as running:
        yield running
        assert not running.errors


def cpu_env() -> list[dict[str, str]]:
    """What the real SGLang needs on this CPU machine, as a pod's env."""
    env = sglang_cpu.cpu_env({}, cores=[0])
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def refused_pod(
    name: str, *, env: list[dict[str, str]], args: list[str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": "refusal-test-gpu-0"},
            "containers": [
                {
                    "name": "sglang",
                    "image": "lmsysorg/sglang:v0.5.23",
                    "command": ["lockstep-sglang"],
                    "args": args or [],
                    "env": [{"name": "LOCKSTEP_AGENT", "value": "0"}, *env],
                }
            ],
        },
    }


def ended(http: httpx.Client, namespace: str, name: str, kind: str) -> dict[str, Any]:
    """The terminated state of the pod's first container of `kind` (or init container):
    its state, or its last state while the kubelet backs off restarting it (as a failed
    init container is, whatever the pod's restart policy)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    deadline = time.monotonic() + WAIT
    last: Any = None
    while time.monotonic() < deadline:
        status = http.get(path).json().get("status") or {}
        for s in status.get(kind) or []:
            last = s
            terminated = (s.get("state") or {}).get("terminated") or (s.get("lastState") or {}).get(
                "terminated"
            )
            if terminated:
                return dict(terminated)
        time.sleep(0.3)
    raise AssertionError(f"{name}: no terminated {kind} after {WAIT}s (last: {last})")


CASES = {
    # The launcher, before anything starts: a malformed setting of its own.
    "setting": (
        [{"name": "LOCKSTEP_GLOO_TIMEOUT_S", "value": "soon"}],
        [],
        "LOCKSTEP_GLOO_TIMEOUT_S",
    ),
    # The launcher, restarted in place into a newer epoch (the state dir's): the
    # rendezvous address it must move to that epoch's port is no host:port.
    "epoch": (
        [{"name": "LOCKSTEP_GROUP_EPOCH", "value": "4"}],
        ["--dist-init-addr", "no-port-here"],
        "--dist-init-addr",
    ),
    # The engine's pin check: the image's SGLang is not the release the deployment declares.
    "release": (
        [*cpu_env(), {"name": "LOCKSTEP_SGLANG_VERSION", "value": "0.5.22"}],
        [],
        "0.5.22",
    ),
    # The engine, after SGLang parsed the server arguments: a mode the probe cannot reach.
    "mode": (
        cpu_env(),
        ["--model-path", str(sglang_cpu.model_dir()), *sglang_cpu.cpu_flags(None), "--pp-size", "2"],
        "--pp-size above 1 is not supported",
    ),
}  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_refusal_is_the_containers_termination_message(
    case: str, kubelet: ProcessKubelet, http: httpx.Client, namespace: str, tmp_path: Path
) -> None:
    env, args, says = CASES[case]
    name = f"refused-{case}"
    state = tmp_path / "state"
    state.mkdir()
    (state / "epoch").write_text("5\n")  # an in-place restart's (the epoch case reads it)
    env = [*env, {"name": "LOCKSTEP_STATE_DIR", "value": str(state)}]
    response = http.post(
        f"/api/v1/namespaces/{namespace}/pods", json=refused_pod(name, env=env, args=args)
    )
    assert response.status_code == 201, response.text
    terminated = ended(http, namespace, name, "containerStatuses")
    assert terminated["exitCode"] == 2, terminated
    message = str(terminated.get("message"))
    assert message.startswith("RuntimeRefused: ") and says in message, message
    assert "lockstep-sglang refuses to start" not in message  # the reason, not the banner


@pytest.mark.timeout(120)
def test_a_runtime_install_that_cannot_write_says_so_in_the_init_containers_status(
    kubelet: ProcessKubelet, http: httpx.Client, namespace: str, tmp_path: Path
) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the runtime volume should be")
    pod = refused_pod("refused-install", env=[])
    pod["spec"]["initContainers"] = [
        {
            "name": "lockstep-runtime",
            "image": "ghcr.io/lockstep-dev/operator:0.1.0",
            "command": ["lockstep-runtime-install", str(blocked / "runtime")],
        }
    ]
    response = http.post(f"/api/v1/namespaces/{namespace}/pods", json=pod)
    assert response.status_code == 201, response.text
    terminated = ended(http, namespace, "refused-install", "initContainerStatuses")
    message = str(terminated.get("message"))
    assert terminated["exitCode"] == 1 and message.startswith("RuntimeInstallFailed: "), message
    assert str(blocked) in message

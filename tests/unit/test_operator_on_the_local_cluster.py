"""What runs the chart's operator pod on the local cluster: the kubelet's mapping of the
operator image's entrypoint, and the API server's route to a Service's ready pod."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from lockstep.cli.main import build_parser
from lockstep_dev.drills import NODE_SCENARIOS, SCENARIOS
from lockstep_dev.localcluster.engines import ContainerContext, engine
from lockstep_dev.localcluster.kubelet import local_argv
from lockstep_dev.localcluster.serviceproxy import RouteError, resolve

OPERATOR = {
    "name": "operator",
    "command": ["lockstep", "operator"],
    "args": ["--liveness-port=8080", "--webhook-port=9443"],
    "ports": [{"name": "webhook", "containerPort": 9443}],
}


@pytest.mark.parametrize("name", ["standin", "sglang"])
def test_the_operator_entrypoint_runs_this_checkout_bound_to_the_pod_address(name: str) -> None:
    eng = engine(name)  # type: ignore[arg-type]
    argv = local_argv(OPERATOR, {}, eng.commands)
    assert argv == [sys.executable, "-m", "lockstep.cli", "operator", *OPERATOR["args"]]
    ctx = ContainerContext(OPERATOR, {}, "127.0.64.9", Path("/nonexistent"))
    argv, env = eng.complete(argv, {"A": "1"}, ctx)
    assert argv[-1] == "--bind-address=127.0.64.9" and env == {"A": "1"}
    # The flag is the operator's own.
    args = build_parser().parse_args(argv[3:])
    assert args.bind_address == "127.0.64.9" and args.webhook_addr is None


def test_the_operator_binds_every_address_by_default() -> None:
    args = build_parser().parse_args(["operator"])
    assert args.bind_address == "0.0.0.0"


def pod(name: str, ip: str, *, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "sys", "labels": {"app": "op"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"containers": [OPERATOR]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


SERVICE = {
    "metadata": {"name": "op-webhook", "namespace": "sys"},
    "spec": {
        "clusterIP": "10.0.0.7",
        "selector": {"app": "op"},
        "ports": [{"port": 443, "targetPort": "webhook"}],
    },
}


def pods_of(items: list[dict[str, Any]]) -> Any:
    def lookup(namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        assert (namespace, dict(selector)) == ("sys", {"app": "op"})
        return items

    return lookup


def test_a_cluster_ip_goes_to_a_ready_pod_at_the_named_target_port() -> None:
    items = [pod("old", "127.0.64.1", deleting=True), pod("starting", "127.0.64.2", ready=False)]
    items.append(pod("ready", "127.0.64.3"))
    assert resolve([SERVICE], pods_of(items), "10.0.0.7", 443) == ("127.0.64.3", 9443)


def test_other_addresses_pass_through() -> None:
    assert resolve([SERVICE], pods_of([]), "127.0.0.1", 10250) is None


def test_a_service_without_a_ready_pod_or_port_is_refused_by_name() -> None:
    with pytest.raises(RouteError, match="sys/op-webhook has no ready endpoint"):
        resolve([SERVICE], pods_of([pod("starting", "127.0.64.2", ready=False)]), "10.0.0.7", 443)
    with pytest.raises(RouteError, match="no port 80"):
        resolve([SERVICE], pods_of([]), "10.0.0.7", 80)


# ------------------------------------------------------------- the image's own env

DRILL_SCENARIOS = sorted({*SCENARIOS, *NODE_SCENARIOS})

SGLANG_POD = {
    "name": "sglang",
    "command": ["lockstep-sglang"],
    "args": ["--tp-size", "1"],
    "env": [{"name": "HF_HOME", "value": "/cache"}],
}


def test_the_local_image_env_reaches_sglang_containers_under_their_own_env() -> None:
    eng = engine("standin", {"LOCKSTEP_CONSENSUS": "0", "HF_HOME": "/image"})
    argv = local_argv(SGLANG_POD, {}, eng.commands)
    ctx = ContainerContext(SGLANG_POD, {}, "127.0.64.9", Path("/nonexistent"))
    _, env = eng.complete(argv, {"HF_HOME": "/cache"}, ctx)
    # As a Dockerfile's ENV: under the container's own env, which wins.
    assert env["LOCKSTEP_CONSENSUS"] == "0" and env["HF_HOME"] == "/cache"
    # Not the operator's container, nor any other.
    op_argv = local_argv(OPERATOR, {}, eng.commands)
    op_ctx = ContainerContext(OPERATOR, {}, "127.0.64.9", Path("/nonexistent"))
    assert "LOCKSTEP_CONSENSUS" not in eng.complete(op_argv, {}, op_ctx)[1]
    # By default an image carries none.
    assert "LOCKSTEP_CONSENSUS" not in engine("standin").complete(argv, {}, ctx)[1]


def test_the_real_server_runs_eager_on_cpu_unless_the_pod_turns_dynamo_on() -> None:
    # Inductor's C++ compile of SGLang's few torch.compile'd functions cost a cold TP2
    # pod 26 s of its 63 s start here (sglang_cpu's docstring); a pod's own env still wins.
    eng = engine("sglang")
    argv = local_argv(SGLANG_POD, {}, eng.commands)
    ctx = ContainerContext(SGLANG_POD, {}, "127.0.64.9", Path("/nonexistent"))
    assert eng.complete(argv, {}, ctx)[1]["TORCHDYNAMO_DISABLE"] == "1"
    own = eng.complete(argv, {"TORCHDYNAMO_DISABLE": "0"}, ctx)[1]
    assert own["TORCHDYNAMO_DISABLE"] == "0"


@pytest.mark.parametrize("scenario", DRILL_SCENARIOS)
def test_every_drill_deployment_passes_the_models_and_the_policy(
    scenario: str, tmp_path: Path
) -> None:
    # The drills (e2e tier) run these specs through the webhook and the operator.
    from lockstep.core.webhook import review
    from lockstep_dev.drills import REAL_SGLANG_SCENARIOS, Drill, drill_spec

    engines = ["standin", *(["sglang"] if scenario in REAL_SGLANG_SCENARIOS else [])]
    for name in engines:
        for router in (False, True):
            kind: Any = name
            drill = Drill(scenario, workdir=tmp_path, engine=kind, router=router)
            decision = review(drill_spec(**drill.spec_overrides()))
            assert decision.allowed, (scenario, name, router, decision.message)


def test_the_baseline_drill_runs_without_the_consensus_from_the_image(tmp_path: Path) -> None:
    from lockstep_dev.drills import Drill

    drill = Drill("baseline", workdir=tmp_path)
    assert drill.cluster.image_env == {"LOCKSTEP_CONSENSUS": "0"}
    overrides = drill.spec_overrides()
    assert all("env" not in overrides.get(role, {}) for role in ("prefill", "decode"))

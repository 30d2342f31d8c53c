"""Every value the operator writes into a Kubernetes object is checked with Kubernetes' own
rules when the PDDeployment is written: `lockstep check`, the admission webhook and the
operator's parse refuse what the API server, the kubelet or Kueue would refuse on every
pod, each problem naming the field and the fix; and what the builders derive from an
accepted spec (names, labels, selectors) passes the same rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from factories import pdd_obj, with_path

from lockstep.api import constants as c
from lockstep.api import k8s_rules as k8s
from lockstep.api.models import MAX_NAME_LENGTH, InvalidPDDeployment, parse_pddeployment
from lockstep.cli.main import main
from lockstep.core.builders import (
    build_all,
    build_group_pdb,
    build_group_pods,
    kueue_pod_group_name,
)
from lockstep.core.policy import evaluate
from lockstep.core.webhook import review

pytestmark = pytest.mark.unit

BASE = pdd_obj()
ROLE = {"tp": 1, "gpusPerPod": 1}


def decode(**fields: Any) -> dict[str, Any]:
    return pdd_obj(decode={**ROLE, **fields})


def placement(**fields: Any) -> dict[str, Any]:
    return decode(placement=fields)


def required(*requirements: dict[str, Any]) -> dict[str, Any]:
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": list(requirements)}]
        }
    }


# (case, object, the field path the problem names, in its message, in its fix)
CASES: list[tuple[str, dict[str, Any], str, str, str]] = [
    # ------------------------------------------------------------------ names
    (
        "name longer than the derived names allow",
        with_path(BASE, "metadata.name", "a" * (MAX_NAME_LENGTH + 1)),
        "metadata.name",
        "63",
        f"at most {MAX_NAME_LENGTH}",
    ),
    (
        "name not DNS-1035",
        with_path(BASE, "metadata.name", "9model"),
        "metadata.name",
        "DNS-1035",
        "starting with a letter",
    ),
    (
        "name with a newline",
        with_path(BASE, "metadata.name", "model\n"),
        "metadata.name",
        "DNS-1035",
        "lowercase",
    ),
    (
        "priority class not a subdomain",
        decode(priorityClassName="High_Priority"),
        "spec.decode.priorityClassName",
        "PriorityClass name",
        "lowercase",
    ),
    (
        "scheduler name not a subdomain",
        placement(schedulerName="My Scheduler"),
        "spec.decode.placement.schedulerName",
        "scheduler name",
        "lowercase",
    ),
    (
        "weights claim not a PVC name",
        with_path(BASE, "spec.model.weights", {"persistentVolumeClaim": "Weights_PVC"}),
        "spec.model.weights.persistentVolumeClaim",
        "PersistentVolumeClaim name",
        "lowercase",
    ),
    # ------------------------------------------------------------------ labels
    (
        "topologyKey with a space",
        placement(topologyKey="topology.kubernetes.io/rack name"),
        "spec.decode.placement.topologyKey",
        "not a node label key",
        "topology.kubernetes.io/zone",
    ),
    (
        "topologyKey with an empty name",
        placement(topologyKey="topology.kubernetes.io/"),
        "spec.decode.placement.topologyKey",
        "empty name",
        "label key",
    ),
    (
        "spread topologyKey with two slashes",
        placement(spread=[{"topologyKey": "topology.kubernetes.io/zone/a"}]),
        "spec.decode.placement.spread[0].topologyKey",
        "'/'",
        "label key",
    ),
    (
        "nodeSelector key not a label key",
        decode(nodeSelector={"gpu type": "h200"}),
        "spec.decode.nodeSelector",
        "'gpu type'",
        "label key",
    ),
    (
        "nodeSelector value not a label value",
        decode(nodeSelector={"nvidia.com/gpu.product": "NVIDIA H200"}),
        "spec.decode.nodeSelector.nvidia.com/gpu.product",
        "label value",
        "at most 63",
    ),
    (
        "Kueue queue with capitals",
        placement(gang={"kueue": {"queueName": "GPU-Queue"}}),
        "spec.decode.placement.gang.kueue.queueName",
        "pattern",
        "LocalQueue",
    ),
    (
        "Kueue queue with an underscore",
        placement(gang={"kueue": {"queueName": "gpu_queue"}}),
        "spec.decode.placement.gang.kueue.queueName",
        "pattern",
        "LocalQueue",
    ),
    # ------------------------------------------------------------------ selectors
    (
        "node affinity operator Equals",
        placement(nodeAffinity=required({"key": "pool", "operator": "Equals", "values": ["a"]})),
        "spec.decode.placement.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator",
        "not a node selector operator",
        "In, NotIn, Exists, DoesNotExist, Gt, Lt",
    ),
    (
        "node affinity In without values",
        placement(nodeAffinity=required({"key": "pool", "operator": "In", "values": []})),
        "spec.decode.placement.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].values",
        "In needs values",
        "one or more values",
    ),
    (
        "node affinity Gt with a word",
        placement(nodeAffinity=required({"key": "gen", "operator": "Gt", "values": ["h100"]})),
        "spec.decode.placement.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].values",
        "one integer",
        "integer",
    ),
    (
        "node affinity key not a label key",
        placement(nodeAffinity=required({"key": "gpu pool", "operator": "Exists"})),
        "spec.decode.placement.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key",
        "not a label key",
        "label key",
    ),
    (
        "node affinity without terms",
        placement(nodeAffinity={"requiredDuringSchedulingIgnoredDuringExecution": {}}),
        "spec.decode.placement.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms",
        "at least one term",
        "one or more terms",
    ),
    (
        "preference weight out of range",
        placement(
            nodeAffinity={
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 0,
                        "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
                    }
                ]
            }
        ),
        "spec.decode.placement.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
        ".weight",
        "0",
        "1..100",
    ),
    # ------------------------------------------------------------------ tolerations
    (
        "Exists toleration with a value",
        decode(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "value": "true"}]),
        "spec.decode.tolerations[0].value",
        "Exists",
        "remove value",
    ),
    (
        "tolerationSeconds without NoExecute",
        decode(tolerations=[{"key": "k", "operator": "Exists", "tolerationSeconds": 30}]),
        "spec.decode.tolerations[0].tolerationSeconds",
        "NoExecute",
        "effect: NoExecute",
    ),
    (
        "Equal toleration without a key",
        decode(tolerations=[{"value": "x"}]),
        "spec.decode.tolerations[0].operator",
        "no key",
        "operator: Exists",
    ),
    (
        "toleration key not a label key",
        decode(tolerations=[{"key": "gpu node", "operator": "Exists"}]),
        "spec.decode.tolerations[0].key",
        "taint key",
        "label key",
    ),
    # ------------------------------------------------------------------ quantities
    (
        "memory in GB",
        decode(resources={"requests": {"memory": "512GB"}}),
        "spec.decode.resources.requests.memory",
        "not a Kubernetes quantity",
        "64Gi",
    ),
    (
        "negative cpu",
        decode(resources={"requests": {"cpu": -4}}),
        "spec.decode.resources.requests.cpu",
        "negative",
        ">= 0",
    ),
    (
        "request above its limit",
        decode(resources={"requests": {"cpu": "32"}, "limits": {"cpu": "16"}}),
        "spec.decode.resources.requests.cpu",
        "above its limit",
        "requests.cpu <= limits.cpu",
    ),
    (
        "extended resource overcommitted",
        decode(resources={"requests": {"rdma/ib": "1"}}),
        "spec.decode.resources.requests.rdma/ib",
        "cannot be overcommitted",
        "limits.rdma/ib",
    ),
    (
        "unprefixed unknown resource",
        decode(resources={"limits": {"gpu": "8"}}),
        "spec.decode.resources.limits.gpu",
        "not a resource a container can request",
        "cpu, memory",
    ),
    (
        "GPUs in resources",
        decode(resources={"limits": {"nvidia.com/gpu": "8"}}),
        "spec.decode.resources.limits.nvidia.com/gpu",
        "set by the operator from gpusPerPod",
        "spec.decode.gpusPerPod",
    ),
    # ------------------------------------------------------------------ images
    (
        "image with capitals",
        with_path(BASE, "spec.image", "LMSysOrg/SGLang:v0.5.23"),
        "spec.image",
        "lowercase",
        "image reference",
    ),
    (
        "image with a space",
        with_path(BASE, "spec.image", "lmsysorg/sglang v0.5.23"),
        "spec.image",
        "not an image reference",
        "lmsysorg/sglang:v0.5.23-cu130",
    ),
    (
        "image with a scheme",
        with_path(BASE, "spec.image", "https://ghcr.io/sgl/sglang:0.5.23"),
        "spec.image",
        "not an image reference",
        "image reference",
    ),
    (
        "runtime image with an empty tag",
        with_path(BASE, "spec.runtime", {"image": "ghcr.io/lockstep-dev/operator:"}),
        "spec.runtime.image",
        "not an image reference",
        "image reference",
    ),
    (
        "router image with trailing whitespace",
        with_path(BASE, "spec.router", {"image": "lmsysorg/sglang-router:0.3.2 "}),
        "spec.router.image",
        "whitespace",
        "image reference",
    ),
    # ------------------------------------------------------------------ containers
    (
        "python with an argument",
        with_path(BASE, "spec.runtime", {"python": "python3 -u"}),
        "spec.runtime.python",
        "one file name",
        "absolute path",
    ),
    (
        "python a relative path",
        with_path(BASE, "spec.runtime", {"python": "venv/bin/python"}),
        "spec.runtime.python",
        "relative path",
        "/usr/bin/python3",
    ),
    (
        "python only blanks",
        with_path(BASE, "spec.runtime", {"python": "   "}),
        "spec.runtime.python",
        "whitespace",
        "absolute path",
    ),
    (
        "python from a variable",
        with_path(BASE, "spec.runtime", {"python": "$PYTHON"}),
        "spec.runtime.python",
        "shell",
        "absolute path",
    ),
    (
        "python empty",
        with_path(BASE, "spec.runtime", {"python": ""}),
        "spec.runtime.python",
        "at least 1 character",
        "give it a value",
    ),
    (
        "env name starting with a digit",
        decode(env=[{"name": "1_TOKEN", "value": "x"}]),
        "spec.decode.env[0].name",
        "environment variable name",
        "HF_HOME",
    ),
    (
        "env with value and valueFrom",
        decode(
            env=[
                {
                    "name": "T",
                    "value": "x",
                    "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
                }
            ]
        ),
        "spec.decode.env[0]",
        "both value and valueFrom",
        "keep one",
    ),
    (
        "env source misspelt",
        decode(env=[{"name": "T", "valueFrom": {"secretRef": {"name": "s", "key": "k"}}}]),
        "spec.decode.env[0].valueFrom",
        "names no source",
        "secretKeyRef",
    ),
    (
        "env secret name with capitals",
        decode(env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "HF", "key": "t"}}}]),
        "spec.decode.env[0].valueFrom.secretKeyRef.name",
        "Secret name",
        "lowercase",
    ),
    (
        "env field a pod does not have",
        decode(env=[{"name": "T", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}]),
        "spec.decode.env[0].valueFrom.fieldRef.fieldPath",
        "not a pod field",
        "status.podIP",
    ),
    (
        "weights mount relative",
        with_path(BASE, "spec.model.weights", {"hostPath": "/nvme/models", "mountPath": "models"}),
        "spec.model.weights.mountPath",
        "absolute",
        "/models",
    ),
    (
        "weights over the shared memory mount",
        with_path(
            BASE, "spec.model.weights", {"hostPath": "/nvme/models", "mountPath": "/dev/shm"}
        ),
        "spec.model.weights.mountPath",
        "operator mounts",
        "another path",
    ),
    (
        "weights host path relative",
        with_path(BASE, "spec.model.weights", {"hostPath": "nvme/models"}),
        "spec.model.weights.hostPath",
        "absolute",
        "absolute path",
    ),
    # ------------------------------------------------------------------ cross-field bounds
    (
        "step minSeconds above maxSeconds",
        with_path(BASE, "spec.health", {"stepBounds": {"minSeconds": 200, "maxSeconds": 100}}),
        "spec.health.stepBounds.minSeconds",
        "above maxSeconds",
        "minSeconds <= maxSeconds",
    ),
]

IDS = [case[0] for case in CASES]


def problem(obj: dict[str, Any], field: str) -> Any:
    with pytest.raises(InvalidPDDeployment) as info:
        parse_pddeployment(obj)
    found = [p for p in info.value.problems if p.field == field]
    assert found, f"no problem at {field}: {[str(p) for p in info.value.problems]}"
    return found[0]


@pytest.mark.parametrize(("case", "obj", "field", "says", "fix"), CASES, ids=IDS)
def test_a_value_kubernetes_refuses_is_refused_naming_the_field_and_the_fix(
    case: str, obj: dict[str, Any], field: str, says: str, fix: str
) -> None:
    found = problem(obj, field)
    assert says in found.message, case
    assert fix in found.fix, case


@pytest.mark.parametrize(("case", "obj", "field", "says", "fix"), CASES, ids=IDS)
def test_the_webhook_refuses_the_same_with_the_same_words(
    case: str, obj: dict[str, Any], field: str, says: str, fix: str
) -> None:
    decision = review(obj)
    assert not decision.allowed, case
    assert str(problem(obj, field)) in decision.message


@pytest.mark.parametrize("mode", ["Enforce", "Reject", "Warn"])
def test_lockstep_check_refuses_in_every_mode_with_rule_field_and_fix(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = decode(
        nodeSelector={"gpu type": "h200"},
        tolerations=[{"key": "k", "value": "v", "operator": "Exists"}],
    )
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(obj))
    assert main(["check", "-f", str(path), "-o", "json", "--mode", mode]) == 1
    report = json.loads(capsys.readouterr().out)
    found = {f["field"]: f for f in report["findings"]}
    assert found["spec.decode.nodeSelector"]["rule"] == "kubernetes"
    assert "label key" in found["spec.decode.nodeSelector"]["fix"]
    assert found["spec.decode.tolerations[0].value"]["action"] == "rejected"


def test_every_problem_is_reported_at_once() -> None:
    obj = with_path(
        decode(priorityClassName="High", nodeSelector={"a b": "c"}),
        "spec.image",
        "Bad Image",
    )
    with pytest.raises(InvalidPDDeployment) as info:
        parse_pddeployment(obj)
    fields = {p.field for p in info.value.problems}
    assert {"spec.image", "spec.decode.priorityClassName", "spec.decode.nodeSelector"} <= fields


GOOD_VALUES = [
    decode(
        nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H200", "pool": ""},
        tolerations=[
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 30,
            },
            {"operator": "Exists"},
        ],
        priorityClassName="system.high-priority",
        resources={
            "requests": {"cpu": "16", "memory": "512Gi", "rdma/ib": 1},
            "limits": {"memory": "512Gi", "rdma/ib": "1"},
        },
        env=[
            {"name": "HF_HOME", "value": "/cache"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        placement={
            "topologyKey": "topology.kubernetes.io/rack",
            "spread": [{"topologyKey": "topology.kubernetes.io/zone"}],
            "schedulerName": "default-scheduler",
            "nodeAffinity": required({"key": "gen", "operator": "Gt", "values": ["7"]}),
            "gang": {"kueue": {"queueName": "team-a.gpu"}},
        },
    ),
    with_path(BASE, "spec.image", "localhost:5000/lmsysorg/sglang@sha256:" + "ab" * 32),
    with_path(
        BASE,
        "spec.runtime",
        {"python": "/opt/venv/bin/python3", "image": "registry.local:5000/op:1"},
    ),
    with_path(BASE, "spec.model.weights", {"hostPath": "/nvme/models", "mountPath": "/weights/"}),
    # Not injected: the image's own entrypoint runs, runtime.python is never used.
    with_path(BASE, "spec.runtime", {"inject": False, "python": "python3 -u"}),
]


@pytest.mark.parametrize("obj", GOOD_VALUES)
def test_values_kubernetes_accepts_pass(obj: dict[str, Any]) -> None:
    pdd = parse_pddeployment(obj)
    assert review(obj).allowed
    assert evaluate(pdd.spec).accepted


# ----------------------------------------------------- what the builders derive


# Both label sets and every selector the operator writes: keys and values.
def _labels_of(obj: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if (
                key in ("labels", "matchLabels", "selector")
                and isinstance(value, dict)
                and all(isinstance(v, str) for v in value.values())
            ):
                out.extend(value.items())
            out.extend(_labels_of(value))
    elif isinstance(obj, list):
        for item in obj:
            out.extend(_labels_of(item))
    return out


def test_the_longest_names_the_builders_derive_are_names_kubernetes_accepts() -> None:
    # The longest name, the most groups (the last one in the move slot "b") and the most
    # pods per group, with a gang: every name, hostname, subdomain and label passes.
    name = "a" * MAX_NAME_LENGTH
    obj = with_path(pdd_obj(), "metadata.name", name)
    obj["spec"]["prefill"] = {
        "tp": 32, "gpusPerPod": 1, "podsPerGroup": 32, "replicas": 512,
        "placement": {"gang": {"kueue": {"queueName": "q"}}},
    }  # fmt: skip
    pdd = parse_pddeployment(obj)
    policy = evaluate(pdd.spec).roles["prefill"]
    pods = build_group_pods(pdd, "prefill", 511, 10**9 - 1, policy, slot=1)
    last = pods[-1]
    assert last["metadata"]["name"] == f"{name}-prefill-511b-31"
    for pod in pods:
        assert k8s.dns1123_label(pod["metadata"]["name"]) is None
        assert k8s.dns1123_label(pod["spec"]["hostname"]) is None
        assert k8s.dns1035_label(pod["spec"]["subdomain"]) is None
        for key, value in _labels_of(pod):
            assert k8s.qualified_name(key) is None, key
            assert k8s.label_value(value) is None, (key, value)
    group = kueue_pod_group_name(pdd, "prefill", 511, 10**9 - 1)
    assert k8s.label_value(group) is None and k8s.dns1123_subdomain(group) is None
    pdb = build_group_pdb(pdd, "prefill", 511, 1)
    assert k8s.dns1035_label(pdb["metadata"]["name"]) is None
    for o in build_all(
        pdd.model_copy(
            update={
                "spec": pdd.spec.model_copy(
                    update={"prefill": pdd.spec.prefill.model_copy(update={"replicas": 1})}
                )
            }
        )
    ):
        namer = k8s.dns1035_label if o["kind"] == "Service" else k8s.dns1123_subdomain
        assert namer(o["metadata"]["name"]) is None, o["metadata"]["name"]
        for key, value in _labels_of(o):
            assert k8s.qualified_name(key) is None, key
            assert k8s.label_value(value) is None, (key, value)


def test_the_operators_own_label_keys_are_label_keys() -> None:
    keys = [
        c.LABEL_DEPLOYMENT, c.LABEL_ROLE, c.LABEL_GROUP, c.LABEL_RANK, c.LABEL_EPOCH,
        c.LABEL_SLOT, c.LABEL_COMPONENT, c.APP_NAME, c.APP_INSTANCE, c.APP_COMPONENT,
        c.APP_MANAGED_BY, c.READINESS_GATE, c.ANNOTATION_SPEC_HASH, c.KUEUE_QUEUE_NAME,
        c.KUEUE_POD_GROUP_NAME, c.KUEUE_POD_GROUP_TOTAL_COUNT,
    ]  # fmt: skip
    assert [k for k in keys if k8s.qualified_name(k) is not None] == []


def test_the_operator_refuses_a_runtime_image_that_is_not_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["operator", "--runtime-image", "ghcr.io/Lockstep/operator:0.1.0"]) == 2
    err = capsys.readouterr().err
    assert "--runtime-image" in err and "lowercase" in err and "fix:" in err

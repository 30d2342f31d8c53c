"""Kubernetes' own rules (`lockstep.api.k8s_rules`), value by value: what the API server, the
kubelet and Kueue accept and refuse, checked against the examples Kubernetes documents."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from lockstep.api import k8s_rules as k8s

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("rule", "good", "bad"),
    [
        (
            k8s.dns1123_label,
            ["a", "0", "my-name", "123-abc", "a" * 63],
            ["", "A", "a_b", "-a", "a-", "a.b", "a" * 64, "a\n"],
        ),
        (
            k8s.dns1123_subdomain,
            ["a", "example.com", "high-priority", "a.b-c.d", "a" * 253],
            ["", "Example.com", "a..b", ".a", "a.", "a_b", "a.-b", "a" * 254],
        ),
        (
            k8s.dns1035_label,
            ["a", "my-name", "a1"],
            ["", "1a", "my_name", "a-", "My", "a" * 64],
        ),
        (
            k8s.qualified_name,
            [
                "pool",
                "topology.kubernetes.io/zone",
                "nvidia.com/gpu.product",
                "MyName",
                "my.name",
                "123-abc",
                "example.com/" + "a" * 63,
            ],
            [
                "",
                "topology.kubernetes.io/",
                "/zone",
                "a/b/c",
                "Example.COM/zone",
                "zone name",
                "-zone",
                "zone_",
                "a" * 64,
                "topology.kubernetes.io zone",
            ],
        ),
        (
            k8s.label_value,
            ["", "h200", "NVIDIA-H200", "a_b.c-d", "a" * 63],
            ["-a", "a-", "a b", "a/b", "a" * 64],
        ),
        (
            k8s.env_var_name,
            ["HF_HOME", "my.env-name", "MY_ENV.NAME", "MyEnvName1", "_X", "-x"],
            ["", "1X", "A=B", "A B", ".", "..", "..x"],
        ),
        (
            k8s.config_map_key,
            ["token", "a.b_c-d", "A1"],
            ["", "a/b", "a b", ".", "..", "..a", "a" * 254],
        ),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_name_rules_accept_and_refuse_as_kubernetes(
    rule: Any, good: list[str], bad: list[str]
) -> None:
    for value in good:
        assert rule(value) is None, value
    for value in bad:
        why = rule(value)
        assert isinstance(why, str) and why, value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", Decimal(8)),
        (8, Decimal(8)),
        ("500m", Decimal("0.5")),
        ("64Gi", Decimal(64 * 2**30)),
        ("1.5Gi", Decimal("1.5") * 2**30),
        ("2k", Decimal(2000)),
        ("1E", Decimal(10) ** 18),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("12e-3", Decimal("0.012")),
        ("100u", Decimal("0.0001")),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("+1", Decimal(1)),
        ("-1", Decimal(-1)),
    ],
)
def test_quantities_parse_as_the_api_server_reads_them(text: int | str, value: Decimal) -> None:
    assert k8s.parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "NaN", "Infinity", "1K", "1KB", "1 Gi", " 1", "1_000", "1ki", "Gi", "1.2.3", "e3"]
)
def test_what_is_no_quantity_is_refused(text: str) -> None:
    # The Kubernetes client's parse_quantity takes several of these; the API server does not.
    with pytest.raises(ValueError, match="quantity"):
        k8s.parse_quantity(text)


@pytest.mark.parametrize(
    "image",
    [
        "lmsysorg/sglang:v0.5.23-cu130",
        "sglang",
        "registry.local/sglang:0.5.23-lockstep",
        "localhost:5000/team/sglang:latest",
        "ghcr.io/lockstep-dev/operator:0.1.0",
        "Registry.Example.com/x/y",
        "[::1]:5000/x:1",
        "a__b/c.d-e:TAG_1",
        "lmsysorg/sglang@sha256:" + "a" * 64,
        "lmsysorg/sglang:v1@sha256:" + "0" * 64,
    ],
)
def test_image_references_the_kubelet_pulls_are_accepted(image: str) -> None:
    assert k8s.image_reference(image) is None


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ("lmsysorg/SGLang:v0.5.23", "lowercase"),
        ("lmsysorg/sglang:v0.5.23 ", "whitespace"),
        ("lmsysorg/sglang v0.5.23", "grammar"),
        ("lmsysorg/sglang:", "grammar"),
        ("lmsysorg/sglang:-x", "grammar"),
        ("lmsysorg//sglang", "grammar"),
        ("https://ghcr.io/x/y", "grammar"),
        ("lmsysorg/sglang@sha256:abc", "grammar"),
        ("x:" + "t" * 129, "grammar"),
        ("a" * 64, "hexadecimal"),
        ("", "grammar"),
    ],
)
def test_what_is_no_image_reference_is_refused_saying_why(image: str, says: str) -> None:
    why = k8s.image_reference(image)
    assert why is not None and says in why


def _paths(violations: list[k8s.Violation]) -> list[str]:
    assert all(v.message and v.fix for v in violations)
    return [v.path for v in violations]


@pytest.mark.parametrize(
    ("req", "path"),
    [
        ({"key": "pool", "operator": "Equals", "values": ["a"]}, ".operator"),
        ({"key": "pool", "operator": "in", "values": ["a"]}, ".operator"),
        ({"key": "pool", "operator": "In", "values": []}, ".values"),
        ({"key": "pool", "operator": "In"}, ".values"),
        ({"key": "pool", "operator": "Exists", "values": ["a"]}, ".values"),
        ({"key": "gen", "operator": "Gt", "values": ["1", "2"]}, ".values"),
        ({"key": "gen", "operator": "Lt", "values": ["h200"]}, ".values"),
        ({"key": "pool name", "operator": "Exists"}, ".key"),
        ({"operator": "Exists"}, ".key"),
        ({"key": "pool", "operator": "In", "values": ["h 200"]}, ".values[0]"),
        ({"key": "pool", "operator": "In", "values": ["a"], "value": "a"}, ".value"),
    ],
)
def test_node_selector_requirements_follow_their_operator(req: dict[str, Any], path: str) -> None:
    assert path in _paths(k8s.node_selector_requirement(req, ""))


@pytest.mark.parametrize(
    "req",
    [
        {"key": "pool", "operator": "In", "values": ["h200", "b200"]},
        {"key": "pool", "operator": "NotIn", "values": ["cpu"]},
        {"key": "spot", "operator": "DoesNotExist"},
        {"key": "gen", "operator": "Gt", "values": ["7"]},
        {"key": "nvidia.com/gpu.count", "operator": "Lt", "values": ["-1"]},
    ],
)
def test_good_node_selector_requirements_pass(req: dict[str, Any]) -> None:
    assert k8s.node_selector_requirement(req, "") == []


def test_node_affinity_walks_required_and_preferred_terms() -> None:
    affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "Equal", "values": ["a"]}]},
                {},
                {"matchFields": [{"key": "metadata.labels", "operator": "Exists"}]},
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 0, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}},
            {"weight": 5},
        ],
    }
    req = ".requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    pref = ".preferredDuringSchedulingIgnoredDuringExecution"
    assert set(_paths(k8s.node_affinity(affinity))) == {
        f"{req}[0].matchExpressions[0].operator",
        f"{req}[1]",
        f"{req}[2].matchFields[0].key",
        f"{req}[2].matchFields[0].operator",
        f"{req}[2].matchFields[0].values",
        f"{pref}[0].weight",
        f"{pref}[1].preference",
    }
    empty = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    assert _paths(k8s.node_affinity(empty)) == [f"{req}"]


@pytest.mark.parametrize(
    ("args", "path"),
    [
        (("nvidia.com/gpu", "Equal", "a b", "NoSchedule", None), ".value"),
        (("bad key", "Exists", None, None, None), ".key"),
        ((None, "Equal", "x", None, None), ".operator"),
        (("k", "Exists", "x", None, None), ".value"),
        (("k", "Exists", None, "NoSchedule", 30), ".tolerationSeconds"),
        (("k", "Exists", None, None, 30), ".tolerationSeconds"),
    ],
)
def test_tolerations_are_checked_field_against_field(args: tuple[Any, ...], path: str) -> None:
    assert path in _paths(k8s.toleration(*args))


def test_good_tolerations_pass() -> None:
    assert k8s.toleration("nvidia.com/gpu", "Exists", None, "NoSchedule", None) == []
    assert k8s.toleration(None, "Exists", None, None, None) == []
    assert k8s.toleration("node.kubernetes.io/unreachable", "Exists", None, "NoExecute", 30) == []


@pytest.mark.parametrize(
    ("source", "path"),
    [
        ({}, ""),
        (
            {"secretKeyRef": {"name": "s", "key": "k"}, "fieldRef": {"fieldPath": "spec.nodeName"}},
            "",
        ),
        ({"secretRef": {"name": "s"}}, ".secretRef"),
        ({"secretKeyRef": {"name": "S_1", "key": "k"}}, ".secretKeyRef.name"),
        ({"secretKeyRef": {"key": "k"}}, ".secretKeyRef.name"),
        ({"configMapKeyRef": {"name": "c", "key": "a/b"}}, ".configMapKeyRef.key"),
        ({"configMapKeyRef": {"name": "c"}}, ".configMapKeyRef.key"),
        ({"fieldRef": {"fieldPath": "status.phase"}}, ".fieldRef.fieldPath"),
        ({"fieldRef": {"fieldPath": "metadata.labels"}}, ".fieldRef.fieldPath"),
        ({"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}, ".resourceFieldRef.resource"),
        (
            {"resourceFieldRef": {"resource": "limits.cpu", "containerName": "router"}},
            ".resourceFieldRef.containerName",
        ),
        (
            {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1x"}},
            ".resourceFieldRef.divisor",
        ),
    ],
)
def test_env_var_sources_name_exactly_one_well_formed_source(
    source: dict[str, Any], path: str
) -> None:
    assert path in _paths(k8s.env_var_source(source, "sglang"))


@pytest.mark.parametrize(
    "source",
    [
        {"secretKeyRef": {"name": "hf", "key": "token", "optional": True}},
        {"configMapKeyRef": {"name": "cfg.v1", "key": "HF_HOME"}},
        {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
        {"fieldRef": {"fieldPath": "metadata.labels['lockstep.dev/group']"}},
        {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
        {"resourceFieldRef": {"resource": "requests.cpu", "containerName": "sglang"}},
    ],
)
def test_good_env_var_sources_pass(source: dict[str, Any]) -> None:
    assert k8s.env_var_source(source, "sglang") == []


@pytest.mark.parametrize(
    ("requests", "limits", "path", "says"),
    [
        ({"memory": "64GB"}, {}, ".requests.memory", "quantity"),
        ({"cpu": "-1"}, {}, ".requests.cpu", "negative"),
        ({"cpu": -2}, {}, ".requests.cpu", "negative"),
        ({"cpu": "8"}, {"cpu": "4"}, ".requests.cpu", "above its limit"),
        ({"memory": "2Gi"}, {"memory": "2G"}, ".requests.memory", "above its limit"),
        ({"rdma/ib": "1"}, {}, ".requests.rdma/ib", "equal limit"),
        ({"rdma/ib": "1"}, {"rdma/ib": "2"}, ".requests.rdma/ib", "differs"),
        ({}, {"rdma/ib": "500m"}, ".limits.rdma/ib", "whole units"),
        ({"gpu": "1"}, {}, ".requests.gpu", "not a resource a container can request"),
        ({"Memory": "1Gi"}, {}, ".requests.Memory", "not a resource"),
        ({"hugepages-2M B": "1"}, {}, ".requests.hugepages-2M B", "not a resource name"),
        ({"kubernetes.io/cpu": "1"}, {}, ".requests.kubernetes.io/cpu", "kubernetes.io"),
        ({"hugepages-2Mi": "2Mi"}, {}, ".requests.hugepages-2Mi", "equal limit"),
    ],
)
def test_container_resources_are_checked_as_the_api_server_does(
    requests: dict[str, Any], limits: dict[str, Any], path: str, says: str
) -> None:
    found = k8s.container_resources(requests, limits)
    assert any(v.path == path and says in v.message for v in found), found


def test_good_container_resources_pass() -> None:
    requests = {"cpu": "16", "memory": "512Gi", "ephemeral-storage": "100Gi", "rdma/ib": "1"}
    limits = {"cpu": 32, "memory": "512Gi", "rdma/ib": "1", "hugepages-1Gi": "4Gi"}
    assert k8s.container_resources(requests, limits) == []

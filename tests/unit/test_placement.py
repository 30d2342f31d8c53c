"""spec.<role>.placement: what each field renders into the pods, how it merges with the
operator's own node preferences, what it does to the template hash, and what the models
and the CRD schema refuse."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from factories import pdd_obj, with_path

from lockstep.api import constants as c
from lockstep.api.models import InvalidPDDeployment, PDDeployment, parse_pddeployment
from lockstep.core.builders import build_all, build_group_pods
from lockstep.core.crd import build_crd
from lockstep.core.policy import evaluate
from lockstep.core.reconcile import stale_groups

RACK = "topology.kubernetes.io/rack"
ZONE = "topology.kubernetes.io/zone"

NODE_AFFINITY: dict[str, Any] = {
    "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h200"]}]}
        ]
    },
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {
            "weight": 10,
            "preference": {
                "matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}],
            },
        }
    ],
}


def decode_with(placement: dict[str, Any], **role: Any) -> dict[str, Any]:
    """A deployment whose decode groups span two pods and carry `placement`."""
    spec = {"tp": 2, "gpusPerPod": 1, "podsPerGroup": 2, "replicas": 2, **role}
    return pdd_obj(decode={**spec, "placement": placement})


def pods_of(obj: dict[str, Any], group: int = 0, epoch: int = 0, **kw: Any) -> list[Any]:
    pdd = parse_pddeployment(obj)
    return build_group_pods(pdd, "decode", group, epoch, evaluate(pdd.spec).roles["decode"], **kw)


def spec_hashes(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH] for p in pods]


# ------------------------------------------------------------------------- defaults


def test_no_placement_renders_nothing_and_keeps_the_template_hash() -> None:
    plain = pods_of(decode_with({}))
    for pod in plain:
        for key in ("affinity", "topologySpreadConstraints", "schedulerName"):
            assert key not in pod["spec"]
        assert not any(k.startswith("kueue.x-k8s.io/") for k in pod["metadata"]["labels"])
    # The field's defaults do not move the hash of a spec that never mentions placement.
    obj = decode_with({})
    del obj["spec"]["decode"]["placement"]
    assert spec_hashes(pods_of(obj)) == spec_hashes(plain)
    pdd = parse_pddeployment(obj)
    assert pdd.spec.decode.placement.scheduling_timeout_seconds == 300
    assert pdd.spec.decode.placement.spread == []


# ----------------------------------------------------------------------- topologyKey


def test_a_group_epoch_is_held_in_one_domain_of_the_topology_key() -> None:
    leader, follower = pods_of(decode_with({"topologyKey": RACK}), group=1, epoch=4)
    group_epoch = {
        c.LABEL_DEPLOYMENT: "m",
        c.LABEL_ROLE: "decode",
        c.LABEL_GROUP: "1",
        c.LABEL_EPOCH: "4",
    }
    (term,) = leader["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term == {"labelSelector": {"matchLabels": group_epoch}, "topologyKey": RACK}
    # The leader matches its own term: it may be placed first, anywhere.
    assert group_epoch.items() <= leader["metadata"]["labels"].items()
    # The other ranks follow the leader: their term selects it, and not themselves, so a
    # rank 1 never picks the domain before its leader does.
    (term,) = follower["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term == {
        "labelSelector": {"matchLabels": {**group_epoch, c.LABEL_RANK: "0"}},
        "topologyKey": RACK,
    }
    assert follower["metadata"]["labels"][c.LABEL_RANK] == "1"


# ---------------------------------------------------------------------------- spread


def test_groups_spread_by_their_leaders_only() -> None:
    placement = {
        "topologyKey": RACK,
        "spread": [
            {"topologyKey": ZONE, "maxSkew": 2, "whenUnsatisfiable": "DoNotSchedule"},
            {"topologyKey": RACK},
        ],
    }
    leader, follower = pods_of(decode_with(placement))
    leaders = {c.LABEL_DEPLOYMENT: "m", c.LABEL_ROLE: "decode", c.LABEL_RANK: "0"}
    assert leader["spec"]["topologySpreadConstraints"] == [
        {
            "maxSkew": 2,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": leaders},
        },
        {
            "maxSkew": 1,
            "topologyKey": RACK,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": leaders},
        },
    ]
    assert "topologySpreadConstraints" not in follower["spec"]


# ------------------------------------------------------- nodeAffinity, schedulerName


def test_node_affinity_and_scheduler_name_are_passed_through() -> None:
    placement = {"nodeAffinity": NODE_AFFINITY, "schedulerName": "volcano"}
    for pod in pods_of(decode_with(placement)):
        assert pod["spec"]["affinity"] == {"nodeAffinity": NODE_AFFINITY}
        assert pod["spec"]["schedulerName"] == "volcano"


def test_avoided_nodes_are_added_to_the_placement_not_put_in_its_place() -> None:
    placement = {"topologyKey": RACK, "nodeAffinity": NODE_AFFINITY}
    plain = pods_of(decode_with(placement), epoch=3)
    avoiding = pods_of(decode_with(placement), epoch=3, avoid_nodes=["gpu-b", "gpu-a"])
    for before, after in zip(plain, avoiding, strict=True):
        affinity = after["spec"]["affinity"]
        node = affinity["nodeAffinity"]
        assert (
            node["requiredDuringSchedulingIgnoredDuringExecution"]
            == NODE_AFFINITY["requiredDuringSchedulingIgnoredDuringExecution"]
        )
        preferred = node["preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred[0] == NODE_AFFINITY["preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert [p["preference"].get("matchFields") for p in preferred[1:]] == [
            [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-a"]}],
            [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-b"]}],
        ]
        assert affinity["podAffinity"] == before["spec"]["affinity"]["podAffinity"]
    # A preference, not a template change; and the spec's own object is never mutated.
    assert spec_hashes(plain) == spec_hashes(avoiding)
    assert plain == pods_of(decode_with(placement), epoch=3)


# ----------------------------------------------------------------------------- gang


def test_kueue_admits_each_group_epoch_as_one_pod_group() -> None:
    obj = decode_with({"gang": {"kueue": {"queueName": "gpu-serving"}}})
    for epoch in (0, 5):
        for pod in pods_of(obj, group=1, epoch=epoch):
            labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
            assert labels[c.KUEUE_QUEUE_NAME] == "gpu-serving"
            assert labels[c.KUEUE_POD_GROUP_NAME] == f"m-decode-1-e{epoch}"
            assert annotations[c.KUEUE_POD_GROUP_TOTAL_COUNT] == "2"


# ---------------------------------------------------------------------- spec hash


FULL: dict[str, Any] = {
    "topologyKey": RACK,
    "spread": [{"topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}],
    "nodeAffinity": NODE_AFFINITY,
    "schedulerName": "default-scheduler",
    "gang": {"kueue": {"queueName": "q"}},
}


def test_placement_leaves_the_template_hash_alone_across_epochs() -> None:
    obj = decode_with(FULL)
    at0, at9 = pods_of(obj, epoch=0), pods_of(obj, epoch=9)
    assert spec_hashes(at0) == spec_hashes(at9)
    # ...while the epoch does reach what the scheduler and Kueue see.
    assert at0 != at9
    # A group restarted into a later epoch is not judged stale by the reconcile.
    pdd = parse_pddeployment(obj)
    objects = build_all(pdd, epochs={("decode", 0): 9, ("decode", 1): 2})
    for i, o in enumerate(objects):
        o["metadata"]["uid"] = f"u{i}"
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert stale_groups(pdd, evaluate(pdd.spec), pods, {("decode", 0): 9, ("decode", 1): 2}) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("topologyKey", ZONE),
        ("spread", [{"topologyKey": ZONE}]),
        (
            # Another pool (an empty nodeSelectorTerms is refused, as the API server does).
            "nodeAffinity",
            {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "pool", "operator": "In", "values": ["b200"]}
                            ]
                        }
                    ]
                }
            },
        ),
        ("schedulerName", "kueue-scheduler"),
        ("gang", {"kueue": {"queueName": "other"}}),
    ],
)
def test_a_placement_change_rolls_the_groups(field: str, value: Any) -> None:
    before = decode_with(FULL)
    after = decode_with({**FULL, field: value})
    # Any pod of a group whose hash differs makes the group stale (spread: the leader).
    assert spec_hashes(pods_of(before))[0] != spec_hashes(pods_of(after))[0]


def test_the_scheduling_timeout_is_no_template_change() -> None:
    longer = decode_with({**FULL, "schedulingTimeoutSeconds": 900})
    assert spec_hashes(pods_of(decode_with(FULL))) == spec_hashes(pods_of(longer))
    assert parse_pddeployment(longer).spec.decode.placement.scheduling_timeout_seconds == 900


# ------------------------------------------------------------------------ refused


BASE = decode_with({})
BAD: list[tuple[str, str, Any, str]] = [
    (
        "whenUnsatisfiable typo",
        "spread",
        [{"topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedul"}],
        "spec.decode.placement.spread[0].whenUnsatisfiable",
    ),
    ("maxSkew 0", "spread", [{"topologyKey": ZONE, "maxSkew": 0}], "spread[0].maxSkew"),
    ("spread without key", "spread", [{"maxSkew": 1}], "spread[0].topologyKey"),
    ("timeout too short", "schedulingTimeoutSeconds", 5, "placement.schedulingTimeoutSeconds"),
    ("timeout too long", "schedulingTimeoutSeconds", 86401, "schedulingTimeoutSeconds"),
    ("empty topologyKey", "topologyKey", "", "spec.decode.placement.topologyKey"),
    ("queue not a label value", "gang", {"kueue": {"queueName": "a b"}}, "kueue.queueName"),
    ("unknown gang", "gang", {"volcano": {}}, "spec.decode.placement.gang.volcano"),
]


def problems_of(obj: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidPDDeployment) as info:
        parse_pddeployment(obj)
    assert all(p.fix for p in info.value.problems)
    return [p.field for p in info.value.problems]


def crd_schema() -> dict[str, Any]:
    s: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return s


@pytest.mark.parametrize(("case", "field", "value", "path"), BAD, ids=[b[0] for b in BAD])
def test_bad_placement_is_refused_by_the_models_and_the_crd(
    case: str, field: str, value: Any, path: str
) -> None:
    obj = with_path(BASE, f"spec.decode.placement.{field}", value)
    assert any(path in p for p in problems_of(obj)), case
    if case != "unknown gang":  # unknown fields: the API server prunes or rejects them
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(obj, crd_schema())


def test_the_crd_schema_takes_a_full_placement() -> None:
    jsonschema.validate(decode_with(FULL), crd_schema())
    placement = crd_schema()["properties"]["spec"]["properties"]["decode"]["properties"][
        "placement"
    ]
    assert placement["properties"]["nodeAffinity"] == {
        "x-kubernetes-preserve-unknown-fields": True,
        "type": "object",
        "description": placement["properties"]["nodeAffinity"]["description"],
    }
    rules = [r["rule"] for r in placement["x-kubernetes-validations"]]
    assert any("exists_one" in r for r in rules)


def test_cross_field_rules_of_placement() -> None:
    twice = with_path(
        BASE,
        "spec.decode.placement.spread",
        [{"topologyKey": ZONE}, {"topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}],
    )
    assert "spec.decode.placement.spread" in problems_of(twice)
    typo = with_path(
        BASE, "spec.decode.placement.nodeAffinity", {"requiredDuringScheduling": {"x": 1}}
    )
    assert "spec.decode.placement.nodeAffinity" in problems_of(typo)


def test_placement_is_per_role() -> None:
    obj = decode_with({"topologyKey": RACK})
    pdd: PDDeployment = parse_pddeployment(obj)
    prefill = build_group_pods(pdd, "prefill", 0, 0, evaluate(pdd.spec).roles["prefill"])
    assert "affinity" not in prefill[0]["spec"]

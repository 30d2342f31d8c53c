"""PDDeployment validation: every bad input names its field path and a fix."""

from __future__ import annotations

from typing import Any

import pytest
from factories import GOOD_EXAMPLES, pdd_obj, with_path

from lockstep.api.models import InvalidPDDeployment, parse_pddeployment

BASE = pdd_obj()


def problems_of(obj: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidPDDeployment) as info:
        parse_pddeployment(obj)
    for p in info.value.problems:
        assert p.fix, f"problem without a fix: {p}"
    return [p.field for p in info.value.problems]


@pytest.mark.parametrize("path", GOOD_EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path: Any) -> None:
    import yaml

    pdd = parse_pddeployment(yaml.safe_load(path.read_text()))
    assert pdd.spec.prefill.tp == pdd.spec.prefill.gpus_per_pod * pdd.spec.prefill.pods_per_group


def test_defaults_are_filled() -> None:
    pdd = parse_pddeployment(BASE)
    assert pdd.spec.safety.mode == "Enforce"
    assert pdd.spec.safety.overlap_schedule == "Disabled"
    assert pdd.spec.health.failure_threshold == 3
    assert pdd.spec.recovery.policy == "RestartGroup"
    assert pdd.spec.recovery.backoff.base_seconds == 30
    assert pdd.spec.transfer.backend == "mooncake"
    assert pdd.spec.decode.replicas == 1


# (what is wrong, the object, the field path the error must name)
SCHEMA_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("wrong apiVersion", with_path(BASE, "apiVersion", "lockstep.dev/v1"), "apiVersion"),
    ("wrong kind", with_path(BASE, "kind", "Deployment"), "kind"),
    ("tp not an int", with_path(BASE, "spec.decode.tp", "two"), "spec.decode.tp"),
    ("tp zero", with_path(BASE, "spec.decode.tp", 0), "spec.decode.tp"),
    ("negative replicas", with_path(BASE, "spec.prefill.replicas", -1), "spec.prefill.replicas"),
    (
        "gpusPerPod above 16",
        with_path(BASE, "spec.prefill.gpusPerPod", 17),
        "spec.prefill.gpusPerPod",
    ),
    (
        "missing image",
        {**BASE, "spec": {k: v for k, v in BASE["spec"].items() if k != "image"}},
        "spec.image",
    ),
    (
        "missing decode",
        {**BASE, "spec": {k: v for k, v in BASE["spec"].items() if k != "decode"}},
        "spec.decode",
    ),
    ("missing model path", with_path(BASE, "spec.model", {}), "spec.model.path"),
    ("empty model path", with_path(BASE, "spec.model.path", ""), "spec.model.path"),
    (
        "bad transfer backend",
        with_path(BASE, "spec.transfer.backend", "nccl"),
        "spec.transfer.backend",
    ),
    ("bad safety mode", with_path(BASE, "spec.safety.mode", "Strict"), "spec.safety.mode"),
    (
        "bad overlapSchedule",
        with_path(BASE, "spec.safety.overlapSchedule", "On"),
        "spec.safety.overlapSchedule",
    ),
    (
        "bad recovery policy",
        with_path(BASE, "spec.recovery.policy", "Restart"),
        "spec.recovery.policy",
    ),
    (
        "bad router policy",
        with_path(BASE, "spec.router.policy", "least_load"),
        "spec.router.policy",
    ),
    ("unknown spec field", with_path(BASE, "spec.replicas", 2), "spec.replicas"),
    (
        "misspelt role field",
        with_path(BASE, "spec.decode.podPerGroup", 2),
        "spec.decode.podPerGroup",
    ),
    ("args not a list", with_path(BASE, "spec.decode.args", "--foo"), "spec.decode.args"),
    (
        "env item without name",
        with_path(BASE, "spec.decode.env", [{"value": "1"}]),
        "spec.decode.env[0].name",
    ),
    (
        "health period zero",
        with_path(BASE, "spec.health.periodSeconds", 0),
        "spec.health.periodSeconds",
    ),
    (
        "budget window too short",
        with_path(BASE, "spec.recovery.budget.windowSeconds", 5),
        "spec.recovery.budget.windowSeconds",
    ),
    (
        "watchdog default too big",
        with_path(BASE, "spec.safety.watchdogTimeoutSeconds", 999999),
        "spec.safety.watchdogTimeoutSeconds",
    ),
    (
        "bad toleration operator",
        with_path(BASE, "spec.decode.tolerations", [{"operator": "In"}]),
        "spec.decode.tolerations[0].operator",
    ),
    (
        "bad pull policy",
        with_path(BASE, "spec.imagePullPolicy", "Sometimes"),
        "spec.imagePullPolicy",
    ),
]


@pytest.mark.parametrize(("case", "obj", "field"), SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_schema_errors_name_the_field(case: str, obj: dict[str, Any], field: str) -> None:
    assert field in problems_of(obj), case


CROSS_CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "tp != gpusPerPod * podsPerGroup",
        with_path(BASE, "spec.decode", {"tp": 16, "gpusPerPod": 8, "podsPerGroup": 1}),
        "spec.decode.tp",
    ),
    (
        "dpAttention with dp 1",
        with_path(BASE, "spec.decode", {"tp": 2, "gpusPerPod": 2, "dpAttention": True}),
        "spec.decode.dp",
    ),
    (
        "dp does not divide tp",
        with_path(BASE, "spec.decode", {"tp": 4, "gpusPerPod": 4, "dp": 3}),
        "spec.decode.dp",
    ),
    (
        "ep does not divide tp",
        with_path(BASE, "spec.prefill", {"tp": 8, "gpusPerPod": 8, "ep": 3}),
        "spec.prefill.ep",
    ),
    (
        "zero replicas when not paused",
        with_path(BASE, "spec.decode.replicas", 0),
        "spec.decode.replicas",
    ),
    (
        "different transfer backends",
        with_path(BASE, "spec.decode.transfer", {"backend": "nixl"}),
        "spec.decode.transfer.backend",
    ),
    (
        "probe timeout above period",
        with_path(BASE, "spec.health", {"periodSeconds": 2, "timeoutSeconds": 5}),
        "spec.health.timeoutSeconds",
    ),
    (
        "backoff max below base",
        with_path(BASE, "spec.recovery.backoff", {"baseSeconds": 60, "maxSeconds": 30}),
        "spec.recovery.backoff.maxSeconds",
    ),
    (
        "watchdog above its own bound",
        with_path(
            BASE, "spec.safety", {"watchdogTimeoutSeconds": 600, "maxWatchdogTimeoutSeconds": 300}
        ),
        "spec.safety.watchdogTimeoutSeconds",
    ),
    (
        "two weight sources",
        with_path(BASE, "spec.model.weights", {"hostPath": "/a", "persistentVolumeClaim": "b"}),
        "spec.model.weights",
    ),
    ("name too long", with_path(BASE, "metadata.name", "m" * 41), "metadata.name"),
    ("name not DNS-1035", with_path(BASE, "metadata.name", "My_Model"), "metadata.name"),
]


@pytest.mark.parametrize(("case", "obj", "field"), CROSS_CASES, ids=[c[0] for c in CROSS_CASES])
def test_cross_field_errors_name_the_field(case: str, obj: dict[str, Any], field: str) -> None:
    assert field in problems_of(obj), case


def test_zero_replicas_allowed_when_paused() -> None:
    obj = with_path(with_path(BASE, "spec.decode.replicas", 0), "spec.paused", True)
    assert parse_pddeployment(obj).spec.decode.replicas == 0


def test_misspelt_field_suggests_the_right_one() -> None:
    with pytest.raises(InvalidPDDeployment) as info:
        parse_pddeployment(with_path(BASE, "spec.decode.podPerGroup", 2))
    (problem,) = info.value.problems
    assert "podsPerGroup" in problem.fix


def test_every_problem_is_reported_at_once() -> None:
    obj = with_path(with_path(BASE, "spec.decode.tp", 0), "spec.safety.mode", "Nope")
    fields = problems_of(obj)
    assert {"spec.decode.tp", "spec.safety.mode"} <= set(fields)


def test_tp_error_says_the_product() -> None:
    obj = with_path(BASE, "spec.decode", {"tp": 16, "gpusPerPod": 8})
    with pytest.raises(InvalidPDDeployment) as info:
        parse_pddeployment(obj)
    assert "set tp to 8" in info.value.problems[0].fix

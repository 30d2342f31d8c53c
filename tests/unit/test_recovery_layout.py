"""The recovery package's shape (issue: the house, third draft): every step has exactly
one handler in the dispatcher's table, no step is dispatched by name, and no module or
class grows past what a reader holds at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lockstep.core import recovery
from lockstep.core.recovery import STEP_TABLE, Step

pytestmark = pytest.mark.unit

PACKAGE = Path(recovery.__file__).parent
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 250


def test_the_step_table_covers_every_step_once() -> None:
    assert set(STEP_TABLE) == set(Step)
    assert all(callable(handler) for handler in STEP_TABLE.values())


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_modules_and_classes_stay_small_and_nothing_is_dispatched_by_name(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name} is over {MAX_MODULE_LINES}"
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= MAX_CLASS_LINES, f"class {node.name} has {length} lines"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
            pytest.fail(f"{path.name}:{node.lineno}: getattr (dispatch by name?)")


def test_a_record_written_by_the_operator_before_sub_records_still_loads() -> None:
    # Flat fields, as the annotation of an operator before this layout holds them.
    from lockstep.core.recovery import GroupRecord

    ref = {"name": "m-decode-0-0", "uid": "u0"}
    old = GroupRecord.from_json(
        '{"role": "decode", "index": 0, "step": "HandingOver", "epoch": 3, "failures": 2, '
        '"last_sample": "s1", "restarts": 4, "backoff_streak": 2, "last_restart_at": 7.0, '
        '"mode": "InPlace", "manual": true, "handled_request": "r1", "rollout": true, '
        '"maintenance": "node n1 is cordoned", "maintenance_nodes": ["n1"], '
        f'"old_pods": [{ref}], "retry_at": 9.0, "drained_at": 5.0, "drain_done": true, '
        '"withdrawals": 1, "unschedulable": "0/3 nodes"}'.replace("'", '"')
    )
    assert (old.detection.failures, old.detection.last_sample) == (2, "s1")
    assert (old.budget.restarts, old.budget.backoff_streak, old.budget.last_restart_at) == (
        4,
        2,
        7.0,
    )
    assert (old.manual.requested, old.manual.handled_request, old.manual.rollout) == (
        True,
        "r1",
        True,
    )
    assert old.restart.mode == "InPlace" and old.restart.old_pods == ()
    # old_pods and retry_at belonged to whichever concern the step was in: a move here.
    assert old.move.reason == "node n1 is cordoned" and old.move.nodes == ("n1",)
    assert [p.uid for p in old.move.old_pods] == ["u0"] and old.move.retry_at == 9.0
    assert (old.drain.started_at, old.drain.done) == (5.0, True)
    assert (old.placement.withdrawals, old.placement.unschedulable) == (1, "0/3 nodes")
    # Withdrawn epochs: the placement's.
    withdrawn = GroupRecord.from_json(
        f'{{"role": "decode", "index": 1, "step": "Unschedulable", "old_pods": [{ref}], '
        '"retry_at": 4.0}'.replace("'", '"')
    )
    assert [p.uid for p in withdrawn.placement.withdrawn] == ["u0"]
    assert withdrawn.placement.retry_at == 4.0 and withdrawn.move.retry_at is None
    # And the new layout round-trips.
    assert GroupRecord.from_json(old.to_json()) == old


# -------------------------------------------------------------------- one judge

PRODUCT = PACKAGE.parent.parent  # operator/lockstep


def _calls(name: str) -> list[str]:
    """Where in the product `name(...)` is called, as `module:line`."""
    found = []
    for path in sorted(PRODUCT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if called == name:
                    found.append(f"{path.relative_to(PRODUCT)}:{node.lineno}")
    return found


def test_one_judge_classify_group_is_called_once_and_only_verdicts_makes_verdicts() -> None:
    assert [c.split(":")[0] for c in _calls("classify_group")] == ["control/judge.py"]
    makers = {c.split(":")[0] for c in _calls("GroupVerdict")}
    assert makers and all(m.startswith("core/verdicts/") for m in makers), makers


def test_an_incident_keeps_its_verdict_as_a_verdict_and_other_kinds_apart() -> None:
    """Manual and maintenance restarts are incidents of their own kind, not verdicts; the
    record is stored as an older operator wrote it (the label in `verdict`) and loads."""
    from lockstep.core.recovery import IncidentKind, IncidentRecord
    from lockstep.core.verdicts import Verdict

    base = {"id": "decode-0-1", "epoch": 0, "reason": "r", "first_failure_at": 1.0}
    failure = IncidentRecord.model_validate({**base, "detected_at": 2.0, "verdict": "Hung"})
    assert (failure.kind, failure.verdict, failure.label) == (
        IncidentKind.FAILURE,
        Verdict.HUNG,
        "Hung",
    )
    moved = IncidentRecord.model_validate({**base, "detected_at": 2.0, "verdict": "Maintenance"})
    assert (moved.kind, moved.verdict, moved.label) == (
        IncidentKind.MAINTENANCE,
        None,
        "Maintenance",
    )
    for rec in (failure, moved):
        stored = rec.model_dump(mode="json")
        assert stored["verdict"] == rec.label
        assert IncidentRecord.model_validate(stored) == rec

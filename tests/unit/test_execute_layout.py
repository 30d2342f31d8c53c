"""The shell's shape (issue: the house, fourth draft): every recovery action has exactly
one manager in the executor's table, the control round names no recovery step, and the
capture book keeps a capture from the round that read it until its group stops waiting."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args

import pytest

import lockstep.control
from lockstep.api.models import Incident
from lockstep.core.evidence import Capture, CaptureBook
from lockstep.core.recovery import (
    Action,
    CaptureEvidence,
    CloseIncident,
    CreateEpoch,
    DeletePods,
    EmitEvent,
    EndRequests,
    OpenIncident,
    PodRef,
    Reason,
    RestartInPlace,
    SetGate,
    UpdateIncident,
)
from lockstep.execute import ACTION_TABLE

pytestmark = pytest.mark.unit

REF = (PodRef(name="m-decode-0-0", uid="u0"),)
INCIDENT = Incident(id="decode-0-1", role="decode", group=0, epoch=0, verdict="Desynced")
ONE_OF_EACH: list[Action] = [
    SetGate(REF, False),
    EndRequests(REF, "why"),
    CaptureEvidence("decode-0-1", REF, stacks=True, log_lines=10, max_bytes=1000),
    RestartInPlace(REF, 1, "why"),
    DeletePods(REF, 5),
    CreateEpoch(1),
    OpenIncident(INCIDENT),
    UpdateIncident(INCIDENT),
    CloseIncident(INCIDENT),
    EmitEvent(Reason.DRAINED, "m"),
]
MANAGERS = ("pods", "routers", "requests", "capture", "restarts", "scale", "incidents", "nodes")


class Recorder:
    """A manager that records which of its methods the table called."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def __getattr__(self, method: str) -> Any:
        return lambda *args, **kwargs: self.calls.append(f"{self.name}.{method}")


def test_every_action_type_has_exactly_one_handler_calling_exactly_one_manager() -> None:
    assert set(ACTION_TABLE) == set(get_args(Action))
    assert {type(a) for a in ONE_OF_EACH} == set(get_args(Action))
    for action in ONE_OF_EACH:
        calls: list[str] = []
        execution = SimpleNamespace(**{m: Recorder(m, calls) for m in MANAGERS})
        ACTION_TABLE[type(action)](execution, ("decode", 0), action)  # type: ignore[arg-type]
        assert len(calls) == 1, f"{type(action).__name__}: {calls}"


CONTROL = Path(lockstep.control.__file__).parent


@pytest.mark.parametrize("path", sorted(CONTROL.glob("*.py")), ids=lambda p: p.name)
def test_the_control_round_names_no_recovery_step(path: Path) -> None:
    """What a record asks of a round comes from `recovery.needs`, not from step names."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert "Step" not in {a.name for a in node.names}, f"{path.name} imports Step"
            assert not (node.module or "").endswith("recovery.steps"), path.name
        if isinstance(node, ast.Name):
            assert node.id != "Step", f"{path.name}:{node.lineno} names Step"


def capture(incident_id: str) -> Capture:
    return Capture(incident_id, 0, (("m-decode-0-0", "{}"),), "[m-decode-0-0] ranks: {}")


def test_a_capture_stays_in_the_book_while_its_group_waits_and_goes_after() -> None:
    book = CaptureBook()
    book.begin()
    book.put(capture("a"), evicted=("old",))
    assert set(book.fresh()) == {"a"} and book.evicted == {"old"}
    book.settle(waiting={"a"})
    # The next round judges what it read; nothing is new any more.
    book.begin()
    assert book.get("a") == capture("a") and book.fresh() == {} and book.evicted == set()
    book.settle(waiting=set())  # the group moved on: the capture is dropped
    assert book.get("a") is None


def test_a_round_that_never_recorded_leaves_no_capture_behind() -> None:
    book = CaptureBook()
    book.begin()
    book.put(capture("a"))
    book.begin()  # the round failed before its record step: the planner asks again
    assert book.get("a") is None and book.fresh() == {}

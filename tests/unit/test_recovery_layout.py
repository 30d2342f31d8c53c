"""The recovery package's shape (issue: the house, third draft): every step has exactly
one handler in the dispatcher's table, no step is dispatched by name, and no module or
class grows past what a reader holds at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lockstep import recovery
from lockstep.recovery import STEP_TABLE, Step

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

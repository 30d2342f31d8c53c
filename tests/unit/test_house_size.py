"""Every module of the operator stays what a reader holds at once (issue: the house,
fourth draft): under 600 lines, every class under 250. The recovery package, a state
machine read step by step, keeps its tighter bound (tests/unit/test_recovery_layout.py:
450 lines a module)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lockstep

pytestmark = pytest.mark.unit

PRODUCT = Path(lockstep.__file__).parent
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 250


@pytest.mark.parametrize(
    "path",
    sorted(PRODUCT.rglob("*.py")),
    ids=lambda p: str(p.relative_to(PRODUCT)),
)
def test_every_module_and_class_of_the_operator_stays_small(path: Path) -> None:
    text = path.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(PRODUCT)}: {lines} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= MAX_CLASS_LINES, f"class {node.name}: {length} lines"

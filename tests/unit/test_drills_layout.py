"""The drills package's shape (issue 26, drills as a registry): one module per scenario,
each registered under its name; the name lists callers import are derived from the
registry; the shared modules never ask which scenario runs; no module grows past what a
reader holds at once."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from lockstep_dev import drills
from lockstep_dev.drills import NODE_SCENARIOS, REAL_SGLANG_SCENARIOS, REGISTRY, SCENARIOS

pytestmark = pytest.mark.unit

PACKAGE = Path(drills.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
SCENARIO_MODULES = sorted(p for p in (PACKAGE / "scenarios").glob("*.py") if p.stem != "__init__")
SHARED = sorted(PACKAGE.glob("*.py"))
MAX_MODULE_LINES = 450


def test_every_scenario_module_is_registered_under_its_name_once() -> None:
    defined = {}
    for path in SCENARIO_MODULES:
        module = importlib.import_module(f"lockstep_dev.drills.scenarios.{path.stem}")
        defined[module.SCENARIO.name] = module.SCENARIO
        assert path.stem == module.SCENARIO.name.replace("-", "_")
    assert defined == dict(REGISTRY)
    assert tuple(REGISTRY) == SCENARIOS


def test_the_name_lists_callers_import_hold_what_they_held() -> None:
    assert set(SCENARIOS) == {
        "desync",
        "sequence",
        "hang",
        "rank-kill",
        "pod-delete",
        "slow",
        "stuck-step",
        "flapping",
        "operator-crash",
        "concurrent",
        "agent-down",
        "baseline",
        "node-drain",
        "unplaceable",
        "scale",
        "spares",
        "capacity",
        "upgrade",
        "ha",
        "pd-path",
    }
    assert REAL_SGLANG_SCENARIOS == (
        "desync",
        "hang",
        "rank-kill",
        "sequence",
        "pod-delete",
        "operator-crash",
        "spares",
        "capacity",
        "pd-path",
    )
    assert NODE_SCENARIOS == ("node-drain", "unplaceable", "spares", "capacity", "upgrade")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_stay_small_and_nothing_is_dispatched_by_name(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name} is over {MAX_MODULE_LINES}"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
            pytest.fail(f"{path.name}:{node.lineno}: getattr (dispatch by name?)")


@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.name)
def test_the_shared_modules_never_ask_which_scenario_runs(path: Path) -> None:
    names = set(SCENARIOS)
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            assert not (isinstance(operand, ast.Attribute) and operand.attr == "scenario"), (
                f"{path.name}:{node.lineno}: compares the scenario's name"
            )
            constants = [operand, *getattr(operand, "elts", [])]
            assert not any(isinstance(c, ast.Constant) and c.value in names for c in constants), (
                f"{path.name}:{node.lineno}: compares with a scenario's name"
            )

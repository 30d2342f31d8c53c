"""The house rules of DESIGN.md: who may import what."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from factories import REPO

OPERATOR = REPO / "operator/lockstep"
PURE = ["models.py", "crd.py", "builders.py", "constants.py", "policy"]


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def files(*names: str) -> list[Path]:
    out: list[Path] = []
    for name in names:
        p = OPERATOR / name
        out.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return out


def test_operator_never_imports_sglang_or_torch() -> None:
    for path in OPERATOR.rglob("*.py"):
        bad = imported_roots(path) & {"sglang", "torch", "lockstep_sglang"}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_pure_core_imports_no_kopf_and_no_kubernetes_client() -> None:
    for path in files(*PURE):
        bad = imported_roots(path) & {"kopf", "kubernetes", "httpx"}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_cli_import_loads_neither_sglang_nor_torch() -> None:
    code = (
        "import sys, lockstep.cli, lockstep.builders, lockstep.policy; "
        "print(sorted(m for m in ('sglang', 'torch', 'kopf') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

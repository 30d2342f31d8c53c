"""The house rules (docs/architecture.md, "Layers"): who may import what.

The rules themselves are import-linter contracts in pyproject.toml ([tool.importlinter]);
this runs them, and checks what a static import graph cannot see: what importing the
CLI actually loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from factories import REPO


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sysconfig.get_path("scripts")) / "lint-imports"
    assert lint_imports.exists(), f"{lint_imports} is missing: pip install -e '.[dev]'"
    # This checkout's packages, whichever checkout the venv was installed from.
    path = os.pathsep.join(str(REPO / p) for p in ("operator", "images/sglang", "operator/dev"))
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(
        [str(lint_imports), "--no-cache", "--no-logo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        pytest.fail(
            f"lint-imports: a house rule is broken\n{out.stdout}{out.stderr}", pytrace=False
        )


def test_cli_import_loads_neither_sglang_nor_torch_nor_kopf() -> None:
    code = (
        "import sys, lockstep.cli, lockstep.core.builders, lockstep.core.policy; "
        "print(sorted(m for m in ('sglang', 'torch', 'kopf') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

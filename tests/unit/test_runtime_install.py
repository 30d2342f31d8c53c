"""`lockstep-runtime-install`: what an init container copies into a stock SGLang pod,
and that the copied launcher is the one that runs (against the SGLang installed here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lockstep_sglang.install import main

pytestmark = pytest.mark.unit


def test_the_runtime_is_copied_without_the_stand_in_and_its_launcher_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "opt/lockstep/runtime"
    assert main([str(dest)]) == 0
    out = capsys.readouterr().out
    assert f"lockstep runtime 0.1.0 in {dest}" in out
    package = dest / "lockstep_sglang"
    assert (package / "launcher.py").is_file() and (package / "hooks.py").is_file()
    assert not (package / "standin").exists() and not list(package.rglob("__pycache__"))
    assert (dest / "VERSION").read_text() == "0.1.0\n"
    # Run again (an init container restarted): replaced, not nested.
    assert main([str(dest)]) == 0
    assert not (package / "lockstep_sglang").exists()
    # The launcher a stock image's Python runs, with nothing of this checkout on its
    # path: it imports the copy (marked here) and checks the SGLang it finds (the one
    # installed here) against the versions and sources its hooks were written for.
    with (package / "__init__.py").open("a") as init:
        init.write("\nprint('lockstep_sglang from', __file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(dest / "launch.py"), "--lockstep-check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"lockstep_sglang from {package / '__init__.py'}" in done.stdout


def test_an_unwritable_destination_fails_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([str(blocker / "runtime")]) == 1

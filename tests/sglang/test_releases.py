"""Every supported SGLang release, from its own source (its wheel, no dependencies):
the committed flag table is what its `ServerArgs` defines, and every pinned function and
seed fix is what its source holds. The real-SGLang tier runs the newest release."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from factories import REPO, sglang_source

from lockstep.core.policy import supported_versions
from lockstep_sglang import pins

pytestmark = pytest.mark.sglang


def test_the_operator_and_the_runtime_support_the_same_releases() -> None:
    assert supported_versions() == pins.SUPPORTED_VERSIONS == ("0.5.21", "0.5.22", "0.5.23")
    assert supported_versions()[-1] == pins.SGLANG_VERSION
    # Every release pins the same functions (only their digests differ).
    targets = {v: set(p.sources) for v, p in pins.SUPPORTED.items()}
    assert all(t == targets[pins.SGLANG_VERSION] for t in targets.values())


def with_release(version: str, *argv: str) -> subprocess.CompletedProcess[str]:
    src = str(sglang_source(version))
    path = [src, str(REPO / "images/sglang-cpu/site"), str(REPO / "images/sglang")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "PYTHONWARNINGS": "ignore",
        "PYTHONDONTWRITEBYTECODE": "1",
        "SGLANG_USE_CPU_ENGINE": "1",
    }
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("version", pins.SUPPORTED_VERSIONS)
def test_each_release_matches_its_flag_table_pins_and_seed_fixes(version: str) -> None:
    flags = with_release(version, str(REPO / ".ci/gen-sglang-flags"), "--check")
    assert flags.returncode == 0, flags.stderr[-2000:]
    checked = with_release(version, "-m", "lockstep_sglang.pins", "--check")
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert f"SGLang {version}: 43 pins match" in checked.stdout

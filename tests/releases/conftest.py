"""Fixtures of the releases tier: every supported SGLang release's real server on CPU,
each from a virtual environment of its own with the torch that release pins.

0.5.23 runs from the test venv (``.ci/setup-venv`` installs its pins); 0.5.21 and 0.5.22
from ``.venv-releases/<version>`` (``.ci/setup-release-venv``, run here when missing: a
first run downloads and installs a torch per release, about half a minute each here with
uv). The servers are the
real-SGLang tier's (``tests/realsglang/server.py``): the launcher as a pod's container
runs it, killed when the test ends.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lockstep_dev.localcluster import sglang_cpu

REPO = Path(__file__).resolve().parents[2]
# The real-SGLang tier's server harness, shared rather than copied.
sys.path.insert(0, str(REPO / "tests" / "realsglang"))

from release_venvs import release_python  # noqa: E402
from server import RealServer, started_servers  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return sglang_cpu.ensure_model()


@pytest.fixture
def release_server(tiny_model: Path) -> Iterator[Callable[..., RealServer]]:
    """``release_server(version, **options)``: a started server of that release."""
    with started_servers(tiny_model, "ls-release-") as make:
        yield lambda version, **options: make(python=release_python(version), **options)

"""Fixtures of the real-SGLang tier: the real SGLang 0.5.23 server on CPU.

Set-up (``.ci/setup-sglang-cpu``, run by ``.ci/setup-venv``): the tiny random model,
the mooncake libraries. Each server is a real ``lockstep-sglang`` container process
tree on local ports (tests/realsglang/server.py); every one started is killed when its
test (or, for the shared one, the module) ends.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from server import RealServer

from lockstep.localcluster import sglang_cpu


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random Qwen2 (generated once, deterministic)."""
    return sglang_cpu.ensure_model()


@pytest.fixture
def real_server(tiny_model: Path) -> Iterator[Callable[..., RealServer]]:
    """``real_server(**options)``: a started (not yet ready) server, killed at the end."""
    started: list[RealServer] = []
    dirs: list[Path] = []

    def make(**options: Any) -> RealServer:
        workdir = Path(tempfile.mkdtemp(prefix="ls-real-"))
        dirs.append(workdir)
        server = RealServer(workdir, tiny_model, **options)
        started.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in started:
            server.stop()
        for workdir in dirs:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_tp2(tiny_model: Path) -> Iterator[RealServer]:
    """One TP2 server for the tests that leave it serving."""
    workdir = Path(tempfile.mkdtemp(prefix="ls-real-shared-"))
    server = RealServer(workdir, tiny_model).start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

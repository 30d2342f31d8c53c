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

import pytest
from server import RealServer, started_servers

from lockstep_dev.localcluster import sglang_cpu


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random Qwen2 (generated once, deterministic)."""
    return sglang_cpu.ensure_model()


@pytest.fixture
def real_server(tiny_model: Path) -> Iterator[Callable[..., RealServer]]:
    """``real_server(**options)``: a started (not yet ready) server, killed at the end."""
    with started_servers(tiny_model, "ls-real-") as make:
        yield make


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


@pytest.fixture
def real_router(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """``real_router(prefill, decode)``: sglang-router 0.3.2 in PD mode in front of two
    real servers; returns its URL once it routes to both; killed at the end."""
    import os
    import signal
    import subprocess
    import sys

    import httpx
    from server import HOST, free_port, wait_for

    procs: list[subprocess.Popen[bytes]] = []

    def start(prefill: RealServer, decode: RealServer) -> str:
        port = free_port()
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        cmd += ["--prefill", prefill.url, str(prefill.bootstrap_port), "--decode", decode.url]
        cmd += ["--host", HOST, "--port", str(port), "--prometheus-host", HOST]
        cmd += ["--prometheus-port", str(free_port())]
        with (tmp_path / "router.log").open("wb") as log:
            procs.append(
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
        url = f"http://{HOST}:{port}"

        def routes_both() -> bool:
            try:
                workers = httpx.get(f"{url}/workers", timeout=2, trust_env=False).json()
            except (httpx.HTTPError, ValueError):
                return False
            return sum(1 for w in workers.get("workers", []) if w.get("is_healthy")) == 2

        wait_for(routes_both, 90, "the router to route to the prefill and the decode")
        return url

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

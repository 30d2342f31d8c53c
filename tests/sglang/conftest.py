"""Fixtures for tests against the real SGLang 0.5.23 source.

SGLang's import prints CUDA-only warnings on a CPU machine, which ``filterwarnings =
error`` would turn into failures; it is imported once, lazily (only tests that need it
pay the ~15 s), with those warnings silenced. Hooks installed in this process are undone
after each test, so other tiers in the same pytest run see SGLang and torch untouched.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

HERE = Path(__file__).parent


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Keep SWIG's runtime capsule alive through interpreter shutdown.

    sentencepiece 0.2.1 (SGLang's pin, imported with SGLang's tokenizer stack) registers
    a ``swig_runtime_data4`` module whose capsule destructor dereferences an already freed
    type when the interpreter clears modules at exit, so the whole pytest process ends
    with SIGSEGV after every test passed (google/sentencepiece#1145). One extra reference
    to the capsule means its destructor never runs; the process exits normally.
    """
    module = sys.modules.get("swig_runtime_data4")
    capsule = getattr(module, "type_pointer_capsule", None)
    if capsule is not None:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(capsule))


@pytest.fixture(scope="session")
def sglang_hooks() -> ModuleType:
    """``lockstep_sglang.hooks``, with SGLang imported."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from lockstep_sglang import hooks
    return hooks


@pytest.fixture
def restore_hooks(sglang_hooks: ModuleType) -> Iterator[ModuleType]:
    """Snapshot every global the hooks replace; put it back after the test."""
    import torch.distributed as dist
    from sglang.srt.disaggregation import decode, prefill
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.entrypoints import engine, http_server
    from sglang.srt.managers import io_struct, scheduler, tokenizer_manager
    from sglang.srt.managers.scheduler_components.request_receiver import (
        SchedulerRequestReceiver,
    )
    from sglang.srt.utils import rank_consensus_checker as rcc

    owners: list[tuple[Any, str]] = [
        (dist, "new_group"),
        (rcc, "_check_for_consensus"),
        (engine, "run_data_parallel_controller_process"),
        (engine.Engine, "_launch_scheduler_processes"),
        (io_struct, "_msgpack_decoder"),
        (io_struct, "_all_types"),
        (SchedulerRequestReceiver, "_pull_raw_reqs"),
        (decode.DecodePreallocQueue, "_update_handshake_waiters"),
        (decode.DecodePreallocQueue, "pop_preallocated"),
        (decode.DecodeTransferQueue, "pop_transferred"),
        (prefill.PrefillBootstrapQueue, "pop_bootstrapped"),
        (CommonKVManager, "_send_multipart_locked"),
        (tokenizer_manager.SignalHandler, "running_phase_sigquit_handler"),
        (tokenizer_manager.SignalHandler, "sigterm_handler"),
    ]
    hooked_names = (
        "get_next_batch_to_run",
        "get_next_disagg_decode_batch_to_run",
        "get_next_disagg_prefill_batch_to_run",
        "ingest_requests",
        "run_batch",
        "process_batch_result",
        "init_rank_consensus_checker",
        "init_request_dispatcher",
        "process_disagg_prefill_inflight_queue",
    )
    # Methods inherited from a mixin get shadowed on Scheduler: delete those afterwards.
    own = scheduler.Scheduler.__dict__
    owners += [(scheduler.Scheduler, name) for name in hooked_names if name in own]
    inherited = [name for name in hooked_names if name not in own]
    saved = [(owner, name, owner.__dict__[name]) for owner, name in owners]
    routes = list(http_server.app.router.routes)
    from lockstep_sglang import server_hooks

    installed = set(sglang_hooks._installed)
    module_state = (sglang_hooks._config, sglang_hooks._runtime)
    server_state = (
        server_hooks._config,
        server_hooks._route_added,
        server_hooks._gate,
        server_hooks._signals_hooked,
    )
    middleware = list(http_server.app.user_middleware)
    try:
        yield sglang_hooks
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        for name in inherited:
            with suppress(AttributeError):
                delattr(scheduler.Scheduler, name)
        http_server.app.router.routes[:] = routes
        sglang_hooks._installed.clear()
        sglang_hooks._installed.update(installed)
        sglang_hooks._config, sglang_hooks._runtime = module_state
        (
            server_hooks._config,
            server_hooks._route_added,
            server_hooks._gate,
            server_hooks._signals_hooked,
        ) = server_state
        http_server.app.user_middleware[:] = middleware


@pytest.fixture
def run_ranks() -> Iterator[Callable[..., list[subprocess.Popen[bytes]]]]:
    """``run_ranks(world, workdir, *args)`` starts ``sgl_loop_harness.py`` ranks; every
    process started is killed when the test ends."""
    started: list[subprocess.Popen[bytes]] = []

    def run(world: int, workdir: Path, *args: str) -> list[subprocess.Popen[bytes]]:
        procs = []
        for rank in range(world):
            cmd = [sys.executable, str(HERE / "sgl_loop_harness.py"), "--rank", str(rank)]
            cmd += ["--world", str(world), "--workdir", str(workdir), *args]
            with (
                open(workdir / f"rank-{rank}.out", "wb") as out,
                open(workdir / f"rank-{rank}.err", "wb") as err,
            ):
                proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
            procs.append(proc)
            started.append(proc)
        return procs

    try:
        yield run
    finally:
        for proc in started:
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory (unix socket paths must stay under ~107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ls-sgl-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

"""lockstep_sglang against the real SGLang 0.5.23 source."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from lockstep_sglang import pins
from lockstep_sglang.config import RuntimeConfig
from lockstep_sglang.consensus import DIVERGENCE_EXIT_CODE
from lockstep_sglang.rank_state import read_rank_states


def _config(tmp: Path) -> RuntimeConfig:
    return RuntimeConfig.from_env(
        {"LOCKSTEP_STATE_DIR": str(tmp / "state"), "LOCKSTEP_GLOO_TIMEOUT_S": "30"}
    )


def test_installed_sglang_matches_every_pin_and_keeps_the_seed_fixes(
    sglang_hooks: ModuleType,
) -> None:
    report = pins.check()
    assert report.ok, report.message()
    assert pins.missing_seed_fixes() == []
    # And a different version is refused before any source is looked at.
    other = pins.check(installed_version="0.5.24")
    assert not other.ok
    assert "refuses to start on SGLang 0.5.24 (supported: 0.5.21, 0.5.22, 0.5.23)" in (
        other.message()
    )


def test_seed_fix_check_fails_when_a_fix_is_lost(sglang_hooks: ModuleType) -> None:
    lost = pins.SeedFix(
        "sglang.srt.managers.scheduler:Scheduler.handle_rpc_request",
        "barrier(group=self.world_group.cpu_group)",
        "a world barrier would be the regression",
    )
    assert pins.missing_seed_fixes([lost]) == [
        "sglang.srt.managers.scheduler:Scheduler.handle_rpc_request: lost "
        "'barrier(group=self.world_group.cpu_group)' (a world barrier would be the regression)"
    ]


def test_hooks_attach_to_the_real_functions(restore_hooks: ModuleType, tmp_path: Path) -> None:
    import torch.distributed as dist
    from sglang.srt.disaggregation import decode, prefill
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.request_receiver import (
        SchedulerRequestReceiver,
    )
    from sglang.srt.utils import rank_consensus_checker as rcc

    hooks = restore_hooks
    targets: dict[str, tuple[Any, str]] = {
        "sglang.srt.managers.scheduler:Scheduler.get_next_batch_to_run": (
            Scheduler,
            "get_next_batch_to_run",
        ),
        "sglang.srt.disaggregation.decode:SchedulerDisaggregationDecodeMixin."
        "get_next_disagg_decode_batch_to_run": (Scheduler, "get_next_disagg_decode_batch_to_run"),
        "sglang.srt.disaggregation.prefill:SchedulerDisaggregationPrefillMixin."
        "get_next_disagg_prefill_batch_to_run": (
            Scheduler,
            "get_next_disagg_prefill_batch_to_run",
        ),
        "sglang.srt.disaggregation.prefill:SchedulerDisaggregationPrefillMixin."
        "process_disagg_prefill_inflight_queue": (
            Scheduler,
            "process_disagg_prefill_inflight_queue",
        ),
        "sglang.srt.managers.scheduler:Scheduler.ingest_requests": (Scheduler, "ingest_requests"),
        "sglang.srt.managers.scheduler:Scheduler.run_batch": (Scheduler, "run_batch"),
        "sglang.srt.managers.scheduler:Scheduler.process_batch_result": (
            Scheduler,
            "process_batch_result",
        ),
        "sglang.srt.managers.scheduler:Scheduler.init_rank_consensus_checker": (
            Scheduler,
            "init_rank_consensus_checker",
        ),
        "sglang.srt.managers.scheduler:Scheduler.init_request_dispatcher": (
            Scheduler,
            "init_request_dispatcher",
        ),
        "sglang.srt.disaggregation.decode:DecodePreallocQueue._update_handshake_waiters": (
            decode.DecodePreallocQueue,
            "_update_handshake_waiters",
        ),
        "sglang.srt.disaggregation.decode:DecodePreallocQueue.pop_preallocated": (
            decode.DecodePreallocQueue,
            "pop_preallocated",
        ),
        "sglang.srt.disaggregation.decode:DecodeTransferQueue.pop_transferred": (
            decode.DecodeTransferQueue,
            "pop_transferred",
        ),
        "sglang.srt.disaggregation.prefill:PrefillBootstrapQueue.pop_bootstrapped": (
            prefill.PrefillBootstrapQueue,
            "pop_bootstrapped",
        ),
        "sglang.srt.managers.scheduler_components.request_receiver:"
        "SchedulerRequestReceiver._pull_raw_reqs": (SchedulerRequestReceiver, "_pull_raw_reqs"),
    }
    originals = {target: pins.resolve(target) for target in targets}
    hooks.install_scheduler_hooks(_config(tmp_path))
    hooks.install_scheduler_hooks(_config(tmp_path))  # idempotent: no double wrapping
    for target, (owner, name) in targets.items():
        hooked = getattr(owner, name)
        assert getattr(hooked, "__lockstep_hook__", False), f"{target} is not hooked"
        # One layer of ours over SGLang's own function (decorators included).
        assert getattr(hooked.__wrapped__, "__lockstep_hook__", False) is False
        assert pins.resolve(target) is originals[target], f"{target} wraps something else"
        assert target in pins.PINNED_SOURCES, f"{target} is hooked but not pinned"
    assert rcc._check_for_consensus is hooks._check_for_consensus
    assert getattr(dist.new_group, "__lockstep_gloo_limit__", None) == timedelta(seconds=30)


def test_probe_types_cross_sglang_ipc(restore_hooks: ModuleType) -> None:
    from sglang.srt.managers.io_struct import msgpack_decode, msgpack_encode

    hooks = restore_hooks
    hooks.register_ipc_types()
    req = hooks.LockstepProbeReq(rid="p-1", deadline=123.5, sent_at=120.0)
    out = hooks.LockstepProbeOutput(
        rid="p-1", ok=True, groups_ms={"tp:cpu": 0.2, "tp:device": 0.4}, iteration=7
    )
    assert msgpack_decode(msgpack_encode(req)) == req
    assert msgpack_decode(msgpack_encode(out)) == out


def test_rank_zero_drops_expired_probes_before_the_broadcast(restore_hooks: ModuleType) -> None:
    hooks = restore_hooks
    now = time.time()
    expired = hooks.LockstepProbeReq(rid="old", deadline=now - 1, sent_at=now - 6)
    fresh = hooks.LockstepProbeReq(rid="new", deadline=now + 5, sent_at=now)
    other = SimpleNamespace(rid="generate-1")
    pulled = hooks._pull_hook(lambda self: [expired, other, fresh])
    assert pulled(None) == [other, fresh]
    assert hooks._pull_hook(lambda self: None)(None) is None  # non-pulling ranks


def _group_coordinator() -> Any:
    """SGLang's own TP GroupCoordinator on the current (CPU, gloo) world."""
    import torch.distributed as dist
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    return GroupCoordinator(
        [list(range(dist.get_world_size()))],
        0,
        "gloo",
        use_pynccl=False,
        use_mscclpp=False,
        use_custom_allreduce=False,
        use_torch_symm_mem_all_reduce=False,
        use_hpu_communicator=False,
        use_xpu_communicator=False,
        group_name="tp",
    )


def test_sglang_gloo_groups_get_the_configured_bound_instead_of_two_hours(
    restore_hooks: ModuleType, tmp_path: Path
) -> None:
    import inspect

    import torch.distributed as dist
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    from lockstep_sglang.gloo_timeout import group_timeout

    default = inspect.signature(GroupCoordinator.__init__).parameters["gloo_timeout"].default
    assert default == timedelta(hours=2)  # what SGLang 0.5.23 would use
    restore_hooks.install_scheduler_hooks(_config(tmp_path))
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        coordinator = _group_coordinator()
        assert coordinator.cpu_group.group_desc == "tp:cpu"
        assert group_timeout(coordinator.cpu_group) == timedelta(seconds=30)
    finally:
        dist.destroy_process_group()


def test_the_engine_chooses_how_its_schedulers_start_just_before_sglang_starts_them(
    restore_hooks: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After SGLang's own ``spawn`` (``_set_envs_and_config``), the hooked
    ``Engine._launch_scheduler_processes`` sets the start method its schedulers and
    detokenizer get, and records it, before SGLang's own launch runs."""
    import multiprocessing

    from sglang.srt.entrypoints import engine

    from lockstep_sglang import server_hooks, timeline

    target = "sglang.srt.entrypoints.engine:Engine._launch_scheduler_processes"
    original = pins.resolve(target)
    config = _config(tmp_path)
    assert config.subprocess_start == "fork"  # the default
    (tmp_path / "state").mkdir()
    server_hooks.install_server_hooks(config)
    server_hooks.install_server_hooks(config)  # idempotent
    hooked = engine.Engine.__dict__["_launch_scheduler_processes"]
    assert isinstance(hooked, classmethod) and getattr(hooked, "__lockstep_hook__", False)
    assert pins.resolve(target) is original and target in pins.PINNED_SOURCES
    seen: list[str] = []
    before = multiprocessing.get_start_method(allow_none=True)
    set_method = multiprocessing.set_start_method
    try:
        set_method("spawn", force=True)  # as SGLang leaves it
        # What the hook asks of multiprocessing, seen; SGLang's own launch then runs and
        # fails on the missing arguments (no scheduler is started here).
        monkeypatch.setattr(
            server_hooks.start_method.multiprocessing,
            "set_start_method",
            lambda method, force=False: seen.append(method),
        )
        with pytest.raises(TypeError):
            engine.Engine._launch_scheduler_processes()  # SGLang's needs its arguments
    finally:
        set_method(before, force=True)
    assert seen == ["fork"]
    (mark,) = [e for e in timeline.read(tmp_path / "state") if e["event"] == "subprocess_start"]
    assert mark["method"] == "fork" and mark["threads"]


def test_probe_route_runs_a_collective_through_the_real_dispatchers(
    restore_hooks: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET /lockstep/probe`` on SGLang's own app, the probe request through SGLang's
    msgpack IPC and request dispatcher, the all-reduce on a real (one-rank) gloo group."""
    import torch.distributed as dist
    from sglang.srt.entrypoints import engine, http_server
    from sglang.srt.managers.io_struct import msgpack_decode, msgpack_encode
    from sglang.srt.managers.tokenizer_manager import ServerStatus
    from sglang.utils import TypeBasedDispatcher
    from starlette.requests import Request

    hooks = restore_hooks
    from lockstep_sglang import server_hooks

    PROBE = server_hooks.PROBE_ROUTE
    config = _config(tmp_path)
    server_hooks.install_server_hooks(config)
    hooks.install_scheduler_hooks(config)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        from sglang.srt.runtime_context import get_parallel

        scheduler = SimpleNamespace(_request_dispatcher=TypeBasedDispatcher([]))
        # The scheduler side of the hooks: runtime, then the probe handler. The layout
        # comes from SGLang's own parallel context, as in a real scheduler process.
        with get_parallel().override(tp_rank=0, tp_size=1, tp_group=_group_coordinator()):
            hooks.start_runtime(scheduler, config)
        hooks._dispatcher_hook(lambda self: None)(scheduler)

        answer_probes = True

        class TokenizerManager:
            server_status = ServerStatus.Up
            _result_dispatcher = TypeBasedDispatcher([])
            rid_to_state: dict[str, Any] = {}  # noqa: RUF012 - SGLang's request states

            def _dispatch_to_scheduler(self, obj: Any) -> None:
                # Over SGLang's IPC encoding, into the scheduler's dispatcher, back out.
                if not answer_probes:
                    return
                received = msgpack_decode(msgpack_encode(obj))
                output = scheduler._request_dispatcher(received)
                self._result_dispatcher(msgpack_decode(msgpack_encode(output)))

        monkeypatch.setattr(
            engine, "init_tokenizer_manager", lambda *a, **k: (TokenizerManager(), None)
        )
        server_args = SimpleNamespace(dp_size=1, enable_dp_attention=False)
        tokenizer_manager, _ = server_hooks.init_tokenizer_manager(server_args, None)
        http_server.set_global_state(
            http_server._GlobalState(
                tokenizer_manager=tokenizer_manager, template_manager=None, scheduler_info={}
            )
        )
        route = next(r for r in http_server.app.routes if getattr(r, "path", "") == PROBE)
        assert route.methods == {"GET"}

        async def get(query: bytes) -> tuple[int, dict[str, Any]]:
            # The route's own handler on a real Starlette request. (Starlette's TestClient
            # on SGLang's app leaves the interpreter crashing at exit in sentencepiece's
            # finalizer, failing the whole pytest run.)
            scope = {"type": "http", "method": "GET", "path": PROBE, "query_string": query}
            response = await route.endpoint(Request({**scope, "headers": []}))
            return response.status_code, json.loads(response.body)

        status, body = asyncio.run(get(b"timeout=5"))
        assert status == 200, body
        assert body["status"] == "ok"
        assert set(body["replies"][0]["groups_ms"]) == {"tp:cpu", "tp:device"}
        # What the scheduler holds for requests nobody waits for (it holds none).
        assert body["kv"] == {"tokens": 0, "requests": 0, "oldest_s": 0.0, "rooms": []}

        answer_probes = False  # the scheduler is wedged: nothing comes back
        status, body = asyncio.run(get(b"timeout=0.3"))
        assert status == 504
        assert body["status"] == "timeout"
        gate = server_hooks.probe_gate()
        assert gate is not None and not gate.in_flight
        assert asyncio.run(get(b"timeout=soon"))[0] == 400
    finally:
        http_server.set_global_state(None)
        dist.destroy_process_group()


def _harness_failure(workdir: Path, world: int) -> str:
    return "\n".join((workdir / f"rank-{r}.err").read_text()[-1500:] for r in range(world))


def _wait(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    return [int(p.returncode) for p in procs]


def test_real_decode_loop_runs_clean_with_the_hooks(
    run_ranks: Callable[..., list[subprocess.Popen[bytes]]], short_tmp: Path
) -> None:
    procs = run_ranks(2, short_tmp, "--iterations", "300")
    assert _wait(procs, 100) == [0, 0], _harness_failure(short_tmp, 2)
    states = {s["rank"]: s for s in read_rank_states(short_tmp / "state")}
    for rank in (0, 1):
        # Every iteration and decision went through the hooks; none diverged.
        assert states[rank]["iteration"] == 300
        decision = states[rank]["last_decision"]
        assert decision is not None and decision["seq"] == 300
        assert states[rank]["consensus_failure"] is None


def test_real_decode_loop_divergence_is_caught_by_sglangs_consensus_checker(
    run_ranks: Callable[..., list[subprocess.Popen[bytes]]], short_tmp: Path
) -> None:
    procs = run_ranks(2, short_tmp, "--diverge-at", "60")
    assert _wait(procs, 100) == [DIVERGENCE_EXIT_CODE] * 2, _harness_failure(short_tmp, 2)
    diverged_at = float((short_tmp / "diverged").read_text())
    states = {s["rank"]: s for s in read_rank_states(short_tmp / "state")}
    for rank in (0, 1):
        failure = states[rank]["consensus_failure"]
        assert failure is not None
        assert failure["detected_at"] - diverged_at < 5.0
        first = failure["first_divergence"]
        assert first is not None
        assert first["events"]["0"] is not None
        assert first["events"]["0"].startswith("lockstep decision batch mode=DECODE")
        assert first["events"]["1"] == (
            "lockstep decision idle mode=None size=0 rids=e4a6a0577479b2b4"
        )
        err = (short_tmp / f"rank-{rank}.err").read_text()
        assert "TP ranks diverged" in err
        # SGLang's own checker was on (its startup warning), so this is its worker.
        assert "Rank consensus checker is enabled" in err


def test_real_decode_loop_without_consensus_hangs_where_the_rank_state_says(
    run_ranks: Callable[..., list[subprocess.Popen[bytes]]], short_tmp: Path
) -> None:
    procs = run_ranks(2, short_tmp, "--no-consensus", "--diverge-at", "60")
    deadline = time.monotonic() + 90
    want = {0: ("all_reduce", "tp:device"), 1: ("broadcast_pyobj", "tp:cpu")}

    def where() -> dict[int, tuple[str, str] | None]:
        states = {s["rank"]: s["collective"] for s in read_rank_states(short_tmp / "state")}
        return {r: (c["op"], c["group"]) if c else None for r, c in states.items()}

    # Rank 0 waits in the batch's device all-reduce (inside run_batch); rank 1 idled and
    # waits in SGLang's broadcast_pyobj of the next iteration's requests. (A healthy loop
    # passes through that picture for an instant too, so wait for the divergence first.)
    while not (short_tmp / "diverged").exists() or where() != want:
        assert time.monotonic() < deadline, (where(), _harness_failure(short_tmp, 2))
        assert all(p.poll() is None for p in procs), _harness_failure(short_tmp, 2)
        time.sleep(0.1)
    before = read_rank_states(short_tmp / "state")
    time.sleep(2.0)
    after = read_rank_states(short_tmp / "state")
    assert [p.poll() for p in procs] == [None, None]
    assert [s["iteration"] for s in after] == [s["iteration"] for s in before]
    assert where() == want
    assert "Rank consensus checker is enabled" not in (short_tmp / "rank-0.err").read_text()


def _tampered_sglang(dest: Path) -> Path:
    """A copy of the installed SGLang (symlinks) whose decode loop has one line changed."""
    import sglang

    real = Path(sglang.__file__).parent
    farm = dest / "sglang"
    path_to_file = ["srt", "disaggregation", "decode.py"]
    src, dst = real, farm
    for part in path_to_file:
        dst.mkdir(parents=True, exist_ok=True)
        for entry in src.iterdir():
            if entry.name != part and entry.name != "__pycache__":
                (dst / entry.name).symlink_to(entry)
        src, dst = src / part, dst / part
    text = src.read_text()
    marker = "    def event_loop_overlap_disagg_decode(self: Scheduler):\n"
    assert marker in text
    dst.write_text(text.replace(marker, marker + "        self._tampered = True\n", 1))
    return dest


def test_launcher_refuses_a_tampered_sglang_source(
    sglang_hooks: ModuleType, tmp_path: Path
) -> None:
    root = _tampered_sglang(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-m", "lockstep_sglang.launcher", "--lockstep-check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=110,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refuses to start" in done.stderr
    assert (
        "sglang.srt.disaggregation.decode:SchedulerDisaggregationDecodeMixin."
        "event_loop_overlap_disagg_decode changed" in done.stderr
    )
    assert "SGLang 0.5.23" in done.stderr
    # Only the tampered function is reported.
    assert done.stderr.count(" changed: ") == 1, done.stderr
    shutil.rmtree(root / "sglang", ignore_errors=True)


def test_launcher_refuses_a_malformed_setting_before_starting_anything() -> None:
    env = {**os.environ, "LOCKSTEP_GLOO_TIMEOUT_S": "-5", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-m", "lockstep_sglang.launcher", "--model-path", "unused"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert "LOCKSTEP_GLOO_TIMEOUT_S must be a positive number of seconds" in done.stderr


def test_settings_accept_what_the_operator_renders() -> None:
    # The operator's pod builder sets SGLang's own switch and the *_SECONDS spelling.
    cfg = RuntimeConfig.from_env(
        {"SGLANG_ENABLE_RANK_CONSENSUS_CHECKER": "0", "LOCKSTEP_GLOO_TIMEOUT_SECONDS": "90"}
    )
    assert cfg.consensus is False
    assert cfg.gloo_timeout == timedelta(seconds=90)
    assert RuntimeConfig.from_env({}).consensus is True
    assert RuntimeConfig.from_env(
        {"LOCKSTEP_CONSENSUS": "1", "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER": "0"}
    ).consensus
    with pytest.raises(ValueError, match="disagree"):
        RuntimeConfig.from_env(
            {"LOCKSTEP_GLOO_TIMEOUT_S": "60", "LOCKSTEP_GLOO_TIMEOUT_SECONDS": "90"}
        )


def test_engine_refuses_server_modes_the_probe_cannot_reach(sglang_hooks: ModuleType) -> None:
    from sglang.srt.server_args import prepare_server_args

    from lockstep_sglang.engine import unsupported_mode

    def args(*flags: str) -> Any:  # the real ServerArgs, as the engine parses them
        return prepare_server_args(["--model-path", "unused", "--device", "cpu", *flags])

    assert unsupported_mode(args(), {}) is None
    assert "grpc" in (unsupported_mode(args("--grpc-mode"), {}) or "")
    assert "tokenizer" in (unsupported_mode(args("--tokenizer-worker-num", "4"), {}) or "")
    assert "--pp-size" in (unsupported_mode(args("--pp-size", "2"), {}) or "")
    assert "RUST" in (unsupported_mode(args(), {"SGLANG_RUST_SERVER": "1"}) or "")

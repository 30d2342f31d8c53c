"""The hooks that put lockstep into SGLang 0.5.23 (see ``pins`` for the exact sources).

SGLang runs its schedulers in spawned processes, so hooks applied in the launcher's
process would not reach them. The launcher therefore passes SGLang's own extension
points — ``launch_server(run_scheduler_process_func=..., init_tokenizer_manager_func=...)``
— picklable functions from this module, which install the scheduler-side hooks first
thing in each scheduler process and the probe plumbing in the main process.

Scheduler side (every TP rank):

- decisions: the loops' ``get_next_*_batch_to_run`` report batch vs idle, forward mode,
  size and request ids; the transfer/bootstrap queues report the length they are about
  to poll (the poll all-reduce is skipped on an empty local queue) and the ids they
  released. Events go to SGLang's ``rank_consensus_checker.assert_same`` and the rank
  state. The checker's ``_check_for_consensus`` is replaced by
  :func:`lockstep_sglang.consensus.compare_and_fail`, which adds cross-rank evidence;
- rank state: ``ingest_requests`` (top of every loop) counts iterations; collectives are
  traced (``torch.distributed``, ``broadcast_pyobj``, ``point_to_point_pyobj``) and
  ``run_batch`` / ``process_batch_result`` show as device-side regions;
- probe: :class:`LockstepProbeReq` is dispatched to a handler running
  :func:`lockstep_sglang.probe.run_collective_probe` on the TP CPU and device groups;
  the rank that pulls requests drops expired probes before broadcasting them;
- gloo groups get a bounded timeout (:mod:`lockstep_sglang.gloo_timeout`).

The main process's side (the probe route, the tokenizer manager's reply routing) is
:mod:`lockstep_sglang.server_hooks`, kept apart so that scheduler processes, which
unpickle their entry from this module, do not import SGLang's HTTP server.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
from sglang.srt.disaggregation import decode as decode_mod
from sglang.srt.disaggregation import prefill as prefill_mod
from sglang.srt.managers import io_struct
from sglang.srt.managers import scheduler as scheduler_mod
from sglang.srt.managers.io_struct import BaseReq
from sglang.srt.managers.scheduler_components.request_receiver import (
    SchedulerRequestReceiver,
)
from sglang.srt.utils import common as sglang_common
from sglang.srt.utils import rank_consensus_checker as rcc
from sglang.utils import TypeBasedDispatcher

from lockstep_sglang import gloo_timeout
from lockstep_sglang.collectives import (
    CollectiveTracer,
    patch_everywhere,
    trace_torch_distributed,
)
from lockstep_sglang.config import RuntimeConfig
from lockstep_sglang.consensus import DecisionRecorder, compare_and_fail
from lockstep_sglang.probe import (
    ProbeGroup,
    drop_expired,
    run_collective_probe,
)
from lockstep_sglang.rank_state import RankStateWriter

logger = logging.getLogger(__name__)

_TRACED_MODULES = ("sglang.",)


# -- IPC types -------------------------------------------------------------------------
# SGLang is untyped for mypy (ignore_missing_imports), so BaseReq is Any here.
class LockstepProbeReq(BaseReq, kw_only=True):  # type: ignore[misc,call-arg]
    """The probe request on SGLang's IPC (a direct ``BaseReq`` subclass, as required)."""

    deadline: float = 0.0
    sent_at: float = 0.0


class LockstepProbeOutput(BaseReq, kw_only=True):  # type: ignore[misc,call-arg]
    """Rank 0's answer to a probe."""

    ok: bool = False
    groups_ms: dict[str, float] = {}  # noqa: RUF012 - msgspec copies empty defaults
    tp_rank: int = 0
    iteration: int = 0
    queued_ms: float = 0.0
    error: Optional[str] = None  # noqa: UP045


def register_ipc_types() -> None:
    """Teach this process's msgpack decoder the lockstep types (idempotent).

    SGLang builds its decoder from ``BaseReq.__subclasses__()`` at import time, before
    this module defines ours, so each process that decodes them must register them.
    """
    io_struct.hook_custom_types(LockstepProbeReq, LockstepProbeOutput)


def _probe_deadline(req: object) -> float | None:
    return req.deadline if isinstance(req, LockstepProbeReq) else None


# -- scheduler side --------------------------------------------------------------------
@dataclass
class SchedulerRuntime:
    """The lockstep pieces of one scheduler process."""

    state: RankStateWriter
    tracer: CollectiveTracer
    recorder: DecisionRecorder
    probe_groups: list[ProbeGroup]
    tp_rank: int


_config: RuntimeConfig | None = None
_runtime: SchedulerRuntime | None = None
_installed: set[str] = set()


def runtime() -> SchedulerRuntime | None:
    """This scheduler process's runtime, once the scheduler finished initialising."""
    return _runtime


def _wrap(owner: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``owner.name`` by ``make(original)``, once per (owner, name)."""
    key = f"{owner.__module__}.{owner.__qualname__}.{name}"
    if key in _installed:
        return
    original = getattr(owner, name)
    wrapper = functools.wraps(original)(make(original))
    wrapper.__lockstep_hook__ = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)
    _installed.add(key)


def _decision_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        plan = original(self, *args, **kwargs)
        rt = _runtime
        if rt is not None:
            rt.recorder.decision(plan.batch_to_run)
        return plan

    return hooked


def _iteration_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = _runtime
        if rt is not None:
            rt.state.begin_iteration()
        return original(self, *args, **kwargs)

    return hooked


def _region_hook(op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
            rt = _runtime
            if rt is None:
                return original(self, *args, **kwargs)
            with rt.tracer.region(op, "tp:device"):
                return original(self, *args, **kwargs)

        return hooked

    return make


def _queue_hook(
    queue_name: str,
    *,
    poll: bool,
    pop: Callable[[Any], Sequence[str]] | None,
    queue_of: Callable[[Any], Sequence[Any]] = lambda self: self.queue,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
            rt = _runtime
            if rt is not None and poll:
                rt.recorder.queue_poll(queue_name, len(queue_of(self)))
            result = original(self, *args, **kwargs)
            if rt is not None and pop is not None:
                rt.recorder.queue_pop(queue_name, pop(result))
            return result

        return hooked

    return make


def _reqs_rids(reqs: Sequence[Any]) -> list[str]:
    return [str(r.rid) for r in reqs]


def _init_runtime_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)  # configures SGLang's checker first
        start_runtime(self)
        return result

    return hooked


def _dispatcher_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        self._request_dispatcher += TypeBasedDispatcher(
            [(LockstepProbeReq, functools.partial(handle_probe, self))]
        )
        return result

    return hooked


def _pull_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        reqs = original(self, *args, **kwargs)
        if reqs:
            kept = drop_expired(reqs, time.time(), _probe_deadline)
            if len(kept) != len(reqs):
                logger.info("lockstep: dropped %d expired probe(s)", len(reqs) - len(kept))
            return kept
        return reqs

    return hooked


def install_loop_hooks(scheduler_cls: type) -> None:
    """Hook the loop-facing methods ``scheduler_cls`` has (the real ``Scheduler``, or a
    stand-in class in tests): decisions, iterations, device regions, runtime start and
    the probe handler."""
    for name in (
        "get_next_batch_to_run",
        "get_next_disagg_decode_batch_to_run",
        "get_next_disagg_prefill_batch_to_run",
    ):
        if hasattr(scheduler_cls, name):
            _wrap(scheduler_cls, name, _decision_hook)
    for name, make in (
        ("ingest_requests", _iteration_hook),
        ("run_batch", _region_hook("run_batch")),
        ("process_batch_result", _region_hook("process_batch_result")),
        ("init_rank_consensus_checker", _init_runtime_hook),
        ("init_request_dispatcher", _dispatcher_hook),
        (
            "process_disagg_prefill_inflight_queue",
            _queue_hook(
                "prefill.inflight",
                poll=True,
                pop=_reqs_rids,
                queue_of=lambda s: s.disagg_prefill_inflight_queue,
            ),
        ),
    ):
        if hasattr(scheduler_cls, name):
            _wrap(scheduler_cls, name, make)


def install_queue_hooks() -> None:
    """Hook the PD transfer/bootstrap queues' polls and pops."""
    _wrap(
        decode_mod.DecodePreallocQueue,
        "_update_handshake_waiters",
        _queue_hook("decode.prealloc", poll=True, pop=None),
    )
    _wrap(
        decode_mod.DecodePreallocQueue,
        "pop_preallocated",
        _queue_hook("decode.prealloc", poll=False, pop=lambda r: [str(d.req.rid) for d in r[0]]),
    )
    _wrap(
        decode_mod.DecodeTransferQueue,
        "pop_transferred",
        _queue_hook("decode.transfer", poll=True, pop=_reqs_rids),
    )
    _wrap(
        prefill_mod.PrefillBootstrapQueue,
        "pop_bootstrapped",
        _queue_hook("prefill.bootstrap", poll=True, pop=_reqs_rids),
    )


def _check_for_consensus(events: list[str]) -> None:
    """Stands in for ``rank_consensus_checker._check_for_consensus``: same comparison,
    plus cross-rank evidence in the log and the rank state before the exit."""
    rt = _runtime
    cfg = _config
    compare_and_fail(
        events,
        rcc._sync_groups,
        state=None if rt is None else rt.state,
        pause_s=0.0 if cfg is None else cfg.consensus_pause_s,
    )


def install_scheduler_hooks(config: RuntimeConfig) -> None:
    """Everything a scheduler process needs, before the ``Scheduler`` is built."""
    global _config
    _config = config
    gloo_timeout.install(config.gloo_timeout)
    register_ipc_types()
    install_loop_hooks(scheduler_mod.Scheduler)
    install_queue_hooks()
    _wrap(SchedulerRequestReceiver, "_pull_raw_reqs", _pull_hook)
    rcc._check_for_consensus = _check_for_consensus


def _device_of(coordinator: Any) -> torch.device | None:
    group = coordinator.device_group
    if group is None or dist.get_backend(group) == "gloo":
        return None
    device = getattr(coordinator, "device", None)
    return device if isinstance(device, torch.device) else None


def _consensus_sink() -> Callable[[str], None]:
    def record(event: str) -> None:
        # assert_same raises off the scheduler thread; a diagnostic must never be what
        # crashes the server, and an event from another thread has no peer to match.
        if threading.current_thread() is rcc._scheduler_thread:
            rcc.assert_same("%s", event)

    return record


def start_runtime(scheduler: Any, config: RuntimeConfig | None = None) -> SchedulerRuntime:
    """Create this rank's state, tracer and recorder (the scheduler thread must call it).

    Reads ``scheduler.tp_rank`` and ``scheduler.tp_group`` (``cpu_group``,
    ``device_group``).
    """
    global _runtime
    cfg = config or _config or RuntimeConfig.from_env()
    rank = dist.get_rank() if dist.is_initialized() else 0
    tp_rank = int(scheduler.tp_rank)
    state = RankStateWriter.create(cfg.state_dir, rank=rank, tp_rank=tp_rank)
    tracer = CollectiveTracer(state, thread=threading.current_thread())
    trace_torch_distributed(tracer, _TRACED_MODULES)
    for name in ("broadcast_pyobj", "point_to_point_pyobj"):
        original = getattr(sglang_common, name)
        if not getattr(original, "__lockstep_traced__", False):
            # Opaque: the state shows the SGLang call, not its inner broadcasts.
            patch_everywhere(original, tracer.wrap(original, name, opaque=True), _TRACED_MODULES)
    sink = _consensus_sink() if rcc.enabled() else None
    pp_size = int(getattr(scheduler, "pp_size", 1) or 1)
    if sink is not None and pp_size > 1:
        # SGLang's checker compares across the PP group too, and pipeline stages make
        # their per-micro-batch decisions at different times: only TP is covered.
        logger.warning("lockstep: decision consensus is off with --pp-size %d", pp_size)
        sink = None
    tp_group = scheduler.tp_group
    probe_groups = [ProbeGroup("tp:cpu", tp_group.cpu_group)]
    if tp_group.device_group is not None and tp_group.device_group is not tp_group.cpu_group:
        probe_groups.append(ProbeGroup("tp:device", tp_group.device_group, _device_of(tp_group)))
    _runtime = SchedulerRuntime(
        state=state,
        tracer=tracer,
        recorder=DecisionRecorder(sink, state),
        probe_groups=probe_groups,
        tp_rank=tp_rank,
    )
    logger.info(
        "lockstep: rank %d (tp %d) publishes to %s; consensus %s",
        rank,
        tp_rank,
        state.path,
        "on" if sink else "off",
    )
    return _runtime


def handle_probe(scheduler: Any, req: LockstepProbeReq) -> LockstepProbeOutput | None:
    """Every TP rank: the no-op all-reduces; TP rank 0 answers."""
    rt = _runtime
    handled_at = time.time()
    if rt is None:
        return LockstepProbeOutput(rid=req.rid, ok=False, error="lockstep runtime not started")
    ok, groups_ms, error = run_collective_probe(rt.probe_groups)
    if rt.tp_rank != 0:
        return None
    return LockstepProbeOutput(
        rid=req.rid,
        ok=ok,
        groups_ms=groups_ms,
        tp_rank=rt.tp_rank,
        iteration=rt.state.iteration,
        queued_ms=max(0.0, (handled_at - req.sent_at) * 1000.0),
        error=error,
    )


def run_scheduler_process(*args: Any, **kwargs: Any) -> Any:
    """``run_scheduler_process_func`` for SGLang: hooks first, then SGLang's own."""
    install_scheduler_hooks(RuntimeConfig.from_env())
    return scheduler_mod.run_scheduler_process(*args, **kwargs)


def run_data_parallel_controller_process(*args: Any, **kwargs: Any) -> Any:
    """The DP controller decodes requests too, so it must know the probe type."""
    from sglang.srt.managers import data_parallel_controller as dp_mod

    register_ipc_types()
    return dp_mod.run_data_parallel_controller_process(*args, **kwargs)

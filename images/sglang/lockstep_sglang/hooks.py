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
- gloo groups get a bounded timeout (:mod:`lockstep_sglang.gloo_timeout`), and so do
  the KV path's sends to a peer that left (:mod:`lockstep_sglang.kv_sends`);
- test-only faults (:mod:`lockstep_sglang.faults`), read only when
  ``LOCKSTEP_TEST_FAULT_FILE`` is set: ``desync`` makes the named rank drop the requests
  its peers run, so it idles on their batch (a real divergence in the real loop);
  ``hang`` stops it at the top of its loop inside a traced request broadcast; ``slow``
  stretches its ``run_batch``.

Everything read from SGLang objects is listed in :data:`SGLANG_READS` and checked against
the real classes by tests/sglang; the parallel layout comes from SGLang's own
``runtime_context.get_parallel()``, as its ``Scheduler`` reads it.

The main process's side (the probe route, the tokenizer manager's reply routing) is
:mod:`lockstep_sglang.server_hooks`, kept apart so that scheduler processes, which
unpickle their entry from this module, do not import SGLang's HTTP server.
"""

from __future__ import annotations

import functools
import logging
import os
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

from lockstep_sglang import gloo_timeout, kv_sends, pd_faults, timeline
from lockstep_sglang.collectives import (
    CollectiveTracer,
    patch_everywhere,
    trace_torch_distributed,
)
from lockstep_sglang.config import EPOCH_ENV, RuntimeConfig
from lockstep_sglang.consensus import DecisionRecorder, compare_and_fail
from lockstep_sglang.faults import FAULT_FILE_ENV, Fault, FaultWatcher, watcher_from_env
from lockstep_sglang.held_kv import held_requests
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
    # What the scheduler holds: request ids, the KV tokens each holds of its own, their
    # bootstrap rooms (-1: none) (`held_kv.held_requests`); the HTTP process tells from
    # them the KV of ended requests.
    held_rids: list[str] = []  # noqa: RUF012
    held_tokens: list[int] = []  # noqa: RUF012
    held_rooms: list[int] = []  # noqa: RUF012


def register_ipc_types() -> None:
    """Teach this process's msgpack decoder the lockstep types (idempotent).

    SGLang builds its decoder from ``BaseReq.__subclasses__()`` at import time, before
    this module defines ours, so each process that decodes them must register them.
    """
    io_struct.hook_custom_types(LockstepProbeReq, LockstepProbeOutput)


def _probe_deadline(req: object) -> float | None:
    return req.deadline if isinstance(req, LockstepProbeReq) else None


# -- scheduler side --------------------------------------------------------------------
# What the hooks read of SGLang's objects, by owner (tests/sglang checks every name
# against the real classes: a renamed attribute fails a test, not a server start).
SGLANG_READS: dict[str, tuple[str, ...]] = {
    "sglang.srt.runtime_context:ParallelContext": ("tp_rank", "tp_size", "tp_group"),
    "sglang.srt.distributed.parallel_state:GroupCoordinator": (
        "cpu_group",
        "device_group",
        "device",
        "ranks",
    ),
    "sglang.srt.managers.scheduler:Scheduler": (
        "_request_dispatcher",
        "disagg_prefill_inflight_queue",
        "disagg_prefill_bootstrap_queue",
        "disagg_decode_prealloc_queue",
        "disagg_decode_transfer_queue",
        "waiting_queue",
        "running_batch",
    ),
    "sglang.srt.managers.schedule_batch:NextBatchPlan": ("batch_to_run", "running_batch"),
    "sglang.srt.managers.schedule_batch:ScheduleBatch": ("reqs", "forward_mode"),
    "sglang.srt.managers.schedule_batch:Req": ("rid", "kv"),
    "sglang.srt.managers.schedule_batch:ReqKvInfo": ("kv_allocated_len", "cache_protected_len"),
    "sglang.srt.disaggregation.decode:DecodePreallocQueue": ("queue", "retracted_queue"),
    "sglang.srt.disaggregation.decode:DecodeTransferQueue": ("queue",),
    "sglang.srt.disaggregation.prefill:PrefillBootstrapQueue": ("queue",),
    "sglang.srt.disaggregation.decode:DecodeRequest": ("req",),
}


@dataclass
class SchedulerRuntime:
    """The lockstep pieces of one scheduler process."""

    state: RankStateWriter
    tracer: CollectiveTracer
    recorder: DecisionRecorder
    probe_groups: list[ProbeGroup]
    tp_rank: int
    rank: int = 0
    group_ranks: tuple[int, ...] = (0,)
    request_group_name: str = "tp:cpu"  # how the rank state names the TP CPU group
    faults: FaultWatcher | None = None
    epoch: str | None = None

    def fault(self) -> Fault | None:
        """The test-only fault aimed at this rank now (None: none, or the switch is off)."""
        if self.faults is None:
            return None
        fault = self.faults.current()
        return fault if fault.targets(self.rank, self.group_ranks, self.epoch) else None


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


_looped = False


def _iteration_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _looped
        rt = _runtime
        if rt is not None:
            if not _looped:  # the model is loaded and the KV cache allocated
                _looped = True
                timeline.mark(None if _config is None else _config.state_dir, "scheduler_loop",
                              rank=rt.rank)  # fmt: skip
            rt.state.begin_iteration()
            fault = rt.fault()
            if fault is not None and fault.kind == "hang":
                _hang(rt)
        return original(self, *args, **kwargs)

    return hooked


_GENERATE_TYPES = (io_struct.TokenizedGenerateReqInput, io_struct.BatchTokenizedGenerateReqInput)


def _fault_recv_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """The ``desync`` test fault (installed only with the switch on): the named rank
    drops the generate requests every rank received in the same broadcast, as if it
    alone had aborted them, so it idles while its peers run their batch."""

    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        reqs = original(self, *args, **kwargs)
        rt = _runtime
        fault = None if rt is None or not reqs else rt.fault()
        if rt is not None and fault is not None and fault.kind == "desync":
            kept = [r for r in reqs if not isinstance(r, _GENERATE_TYPES)]
            if len(kept) != len(reqs):
                logger.warning(
                    "lockstep test fault: rank %d drops %d request(s) its peers run",
                    rt.rank,
                    len(reqs) - len(kept),
                )
                return kept
        return reqs

    return hooked


def _hang(rt: SchedulerRuntime) -> None:
    """The ``hang`` test fault: wedge inside the request broadcast the peers wait in."""
    bound = (_config.gloo_timeout.total_seconds() if _config else 600.0) + 1.0
    logger.warning("lockstep test fault: rank %d hangs in the request broadcast", rt.rank)
    with rt.tracer.region("broadcast_pyobj", rt.request_group_name):
        time.sleep(bound)
    raise TimeoutError("lockstep test fault: hung rank released after the gloo bound")


def _region_hook(op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
            rt = _runtime
            if rt is None:
                return original(self, *args, **kwargs)
            if op != "run_batch":
                with rt.tracer.region(op, "tp:device"):
                    return original(self, *args, **kwargs)
            # A model step: timed in the rank state, so the operator can tell a long
            # legitimate step from a hang.
            with rt.tracer.region(op, "tp:device"), rt.state.step():
                fault = rt.fault()
                if fault is not None and fault.kind == "slow":
                    time.sleep(fault.step_seconds)
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


@dataclass
class _ConsensusStats:
    checks: int = 0
    events: int = 0
    decisions: int = 0
    published_at: float = 0.0


_stats = _ConsensusStats()
_STATS_EVERY_S = 1.0


def _check_for_consensus(events: list[str]) -> None:
    """Stands in for ``rank_consensus_checker._check_for_consensus``: same comparison,
    plus cross-rank evidence in the log and the rank state before the exit, and the
    statistics that show the guard is live (``consensus`` in the rank state)."""
    rt = _runtime
    cfg = _config
    compare_and_fail(
        events,
        rcc._sync_groups,
        state=None if rt is None else rt.state,
        pause_s=0.0 if cfg is None else cfg.consensus_pause_s,
    )
    _stats.checks += 1
    _stats.events += len(events)
    _stats.decisions += sum(1 for e in events if e.startswith("lockstep "))
    now = time.time()
    if rt is not None and now - _stats.published_at >= _STATS_EVERY_S:
        _stats.published_at = now
        try:
            rt.state.record_consensus(
                {
                    "checks": _stats.checks,
                    "events_checked": _stats.events,
                    "decisions_checked": _stats.decisions,
                    "updated_at": now,
                }
            )
        except OSError as exc:  # a diagnostic never ends the checker
            logger.warning("lockstep: cannot publish consensus statistics: %s", exc)


def install_scheduler_hooks(config: RuntimeConfig) -> None:
    """Everything a scheduler process needs, before the ``Scheduler`` is built."""
    global _config
    _config = config
    gloo_timeout.install(config.gloo_timeout)
    kv_sends.install(kv_sends.send_timeout_ms())
    register_ipc_types()
    install_loop_hooks(scheduler_mod.Scheduler)
    install_queue_hooks()
    _wrap(SchedulerRequestReceiver, "_pull_raw_reqs", _pull_hook)
    watcher = watcher_from_env() if os.environ.get(FAULT_FILE_ENV, "").strip() else None
    if watcher is not None:
        _wrap(SchedulerRequestReceiver, "recv_requests", _fault_recv_hook)
        pd_faults.install_sender_stall(watcher)
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


@dataclass(frozen=True)
class ParallelLayout:
    """What the runtime needs of a scheduler's parallel layout, read as SGLang reads it.

    SGLang 0.5.23 keeps ranks, sizes and groups in ``runtime_context.get_parallel()``
    (its ``Scheduler`` has no ``tp_rank`` attribute); ``tp_group`` is a
    ``GroupCoordinator`` (``cpu_group``, ``device_group``, ``device``, ``ranks``).
    """

    tp_rank: int
    tp_size: int
    tp_group: Any


def parallel_layout() -> ParallelLayout:
    """This scheduler process's layout, from SGLang's published parallel context."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    return ParallelLayout(
        tp_rank=int(parallel.tp_rank), tp_size=int(parallel.tp_size), tp_group=parallel.tp_group
    )


def start_runtime(
    scheduler: Any, config: RuntimeConfig | None = None, layout: ParallelLayout | None = None
) -> SchedulerRuntime:
    """Create this rank's state, tracer and recorder (the scheduler thread must call it).

    ``layout`` defaults to :func:`parallel_layout` (SGLang's parallel context, published
    before ``Scheduler.__init__`` configures the consensus checker); nothing is read
    from ``scheduler`` itself.
    """
    global _runtime
    del scheduler  # the layout is process-wide in SGLang 0.5.23, not the scheduler's
    cfg = config or _config or RuntimeConfig.from_env()
    layout = layout or parallel_layout()
    rank = dist.get_rank() if dist.is_initialized() else 0
    tp_rank = layout.tp_rank
    state = RankStateWriter.create(cfg.state_dir, rank=rank, tp_rank=tp_rank)
    tracer = CollectiveTracer(state, thread=threading.current_thread())
    trace_torch_distributed(tracer, _TRACED_MODULES)
    for name in ("broadcast_pyobj", "point_to_point_pyobj"):
        original = getattr(sglang_common, name)
        if not getattr(original, "__lockstep_traced__", False):
            # Opaque: the state shows the SGLang call, not its inner broadcasts.
            patch_everywhere(original, tracer.wrap(original, name, opaque=True), _TRACED_MODULES)
    sink = _consensus_sink() if rcc.enabled() else None
    tp_group = layout.tp_group
    probe_groups = [ProbeGroup("tp:cpu", tp_group.cpu_group)]
    if tp_group.device_group is not None and tp_group.device_group is not tp_group.cpu_group:
        probe_groups.append(ProbeGroup("tp:device", tp_group.device_group, _device_of(tp_group)))
    _runtime = SchedulerRuntime(
        state=state,
        tracer=tracer,
        recorder=DecisionRecorder(sink, state),
        probe_groups=probe_groups,
        tp_rank=tp_rank,
        rank=rank,
        group_ranks=tuple(int(r) for r in tp_group.ranks),
        request_group_name=tracer.group_name(tp_group.cpu_group).decode(),
        faults=watcher_from_env(),
        epoch=os.environ.get(EPOCH_ENV, "").strip() or None,
    )
    logger.info(
        "lockstep: rank %d (tp %d of %d) publishes to %s; consensus %s",
        rank,
        tp_rank,
        layout.tp_size,
        state.path,
        "on" if sink else "off",
    )
    return _runtime


def handle_probe(scheduler: Any, req: LockstepProbeReq) -> LockstepProbeOutput | None:
    """Every TP rank: the no-op all-reduces; TP rank 0 answers, with what it holds."""
    rt = _runtime
    handled_at = time.time()
    if rt is None:
        return LockstepProbeOutput(rid=req.rid, ok=False, error="lockstep runtime not started")
    ok, groups_ms, error = run_collective_probe(rt.probe_groups)
    if rt.tp_rank != 0:
        return None
    try:
        held = held_requests(scheduler)
    except Exception:  # a report, never a failed probe
        logger.exception("lockstep: reading the requests this scheduler holds failed")
        held = {}
    return LockstepProbeOutput(
        held_rids=list(held),
        held_tokens=[tokens for tokens, _ in held.values()],
        held_rooms=[-1 if room is None else room for _, room in held.values()],
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

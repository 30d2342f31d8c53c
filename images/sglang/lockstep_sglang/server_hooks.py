"""The main-process side of lockstep in SGLang 0.5.23: the probe route and its replies,
and the requests caught by an incident.

``GET /lockstep/probe`` is added to SGLang's FastAPI app; the tokenizer manager (built
through ``launch_server(init_tokenizer_manager_func=...)``) gets a
:class:`lockstep_sglang.probe.ProbeGate` whose requests go to the schedulers over
SGLang's own IPC, and whose replies its result dispatcher routes back. The scheduler side
is :mod:`lockstep_sglang.hooks`.

Failover (:mod:`lockstep_sglang.failover`): the held requests are the tokenizer manager's
``rid_to_state`` (health checks left out). Ending one does what SGLang's own paths do,
in the order that makes both happen (docs/router.md, "What SGLang 0.5.23 does with an
abort"): ``abort_request(rid)`` sends the scheduler an ``AbortReq``, which drops the
request from whichever queue holds it and frees its KV slots and metadata buffer (a
zmq push: it never waits on a wedged scheduler); then ``_handle_abort_req`` with
SGLang's ``FINISH_ABORT`` carrying ``HTTPStatus.SERVICE_UNAVAILABLE`` answers the client
at once: 503 for a plain request, SGLang's abort event and ``[DONE]`` for a stream. The
dispatcher holds a bound ``_handle_abort_req`` taken at start, so it is called, never
replaced. SGLang ends a server whose scheduler died from its SIGQUIT handler
(``kill_process_tree``, the HTTP process included, so every client would see its
connection cut): :func:`sigquit_first_end_requests` ends the held requests first and
lets their answers leave before SGLang's handler runs; on SIGTERM (a pod deleted, a
drain out of time) the held requests end the same way instead of waiting to be cut.

The KV of ended requests (:mod:`lockstep_sglang.held_kv`): every deep-probe answer lists
what the scheduler holds; the probe's body carries, under ``kv``, what of it no client
waits for any more, and ``/lockstep/kv`` and ``/lockstep/kv/free``
(:mod:`lockstep_sglang.ended_kv`) report and free it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from sglang.srt.entrypoints import engine as engine_mod
from sglang.srt.entrypoints import http_server
from sglang.srt.managers import tokenizer_manager as tokenizer_manager_mod
from sglang.srt.managers.io_struct import AbortReq
from sglang.srt.managers.utils import is_health_check_generate_req
from sglang.srt.utils import kill_process_tree
from sglang.utils import TypeBasedDispatcher

from lockstep_sglang import held_kv, hooks, pd_faults, start_method, timeline
from lockstep_sglang.config import RuntimeConfig
from lockstep_sglang.ended_kv import EndedKV
from lockstep_sglang.ended_kv import add_routes as add_ended_kv_routes
from lockstep_sglang.failover import Failover, HeldRequest, end_everything
from lockstep_sglang.failover import add_routes as add_failover_routes
from lockstep_sglang.faults import watcher_from_env
from lockstep_sglang.hooks import LockstepProbeOutput, LockstepProbeReq
from lockstep_sglang.inflight import COUNTER, INFLIGHT_ROUTE, InflightMiddleware
from lockstep_sglang.probe import ProbeGate, ProbeReply, ProbeRequest

logger = logging.getLogger("lockstep_sglang.server_hooks")

PROBE_ROUTE = "/lockstep/probe"
# How long the held requests' answers get to leave before SGLang's SIGQUIT handler kills
# the process tree (the scheduler is already dead; the server is going anyway).
FLUSH_S = 0.5

# What the failover reads of SGLang's objects (tests/sglang checks them on the real
# classes): the tokenizer manager's request states and each request's input.
SGLANG_FAILOVER_READS: dict[str, tuple[str, ...]] = {
    "sglang.srt.managers.tokenizer_manager:TokenizerManager": (
        "rid_to_state",
        "abort_request",
        "_handle_abort_req",
        "_dispatch_to_scheduler",
    ),
    "sglang.srt.managers.tokenizer_manager:ReqState": ("obj", "time_stats", "abort_sent"),
    "sglang.srt.managers.io_struct:GenerateReqInput": (
        "stream",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
    ),
    "sglang.srt.observability.req_time_stats:APIServerReqTimeStats": ("created_time",),
    "sglang.srt.managers.tokenizer_manager:SignalHandler": (
        "running_phase_sigquit_handler",
        "sigterm_handler",
    ),
}

_config: RuntimeConfig | None = None
_route_added = False

_gate: ProbeGate | None = None
_probed_ok = False  # the first deep probe that passed is a start-up milestone


def _tokenizer_manager() -> Any:
    state = http_server.get_global_state()
    return None if state is None else state.tokenizer_manager


class SGLangRequestBook:
    """The failover book over SGLang's tokenizer manager (see the module docstring)."""

    def __init__(self, manager: Callable[[], Any] = _tokenizer_manager) -> None:
        self._manager = manager

    def held(self) -> list[HeldRequest]:
        tm = self._manager()
        if tm is None:
            return []
        now = time.perf_counter()
        out: list[HeldRequest] = []
        for rid, state in list(tm.rid_to_state.items()):
            obj = state.obj
            if is_health_check_generate_req(obj):
                continue
            room = getattr(obj, "bootstrap_room", None)
            host = getattr(obj, "bootstrap_host", None)
            port = getattr(obj, "bootstrap_port", None)
            created = float(getattr(state.time_stats, "created_time", 0.0) or 0.0)
            out.append(
                HeldRequest(
                    rid=str(rid),
                    room=room if isinstance(room, int) else None,
                    bootstrap=f"{host}:{port}" if isinstance(host, str) and port else None,
                    age_s=max(0.0, now - created) if created else 0.0,
                    stream=bool(getattr(obj, "stream", False)),
                )
            )
        return out

    def end(self, rids: Sequence[str], message: str) -> None:
        tm = self._manager()
        if tm is None:
            return
        for rid in rids:
            if rid not in tm.rid_to_state:
                continue  # finished meanwhile
            try:
                with pd_faults.operator_abort():  # never a test fault's to drop
                    tm.abort_request(rid)  # the scheduler frees what it holds
            except Exception:
                logger.exception("lockstep: abort_request(%s) failed", rid)
            tm._handle_abort_req(
                AbortReq(
                    rid=rid,
                    finished_reason={
                        "type": "abort",
                        "message": message,
                        "status_code": HTTPStatus.SERVICE_UNAVAILABLE,
                        "err_type": None,
                    },
                )
            )


FAILOVER = Failover(SGLangRequestBook())


def _abort_in_scheduler(tm: Any, rid: str) -> None:
    """The scheduler's abort of one request, sent whatever the HTTP side's state of it
    (its own ``abort_request`` sends nothing twice): frees what the request holds."""
    tm._dispatch_to_scheduler(AbortReq(rid=rid))


ENDED_KV = held_kv.SGLangEndedKV(_tokenizer_manager, _abort_in_scheduler)


async def _settle_free(freed: EndedKV) -> None:
    gate = _gate
    if gate is not None:
        await held_kv.settle(ENDED_KV, gate.probe)


def failover() -> Failover:
    """This server's failover surface (its book, fence and the operator's token)."""
    return FAILOVER


_signals_hooked = False


def sigquit_first_end_requests(original: Callable[..., Any]) -> Callable[..., Any]:
    """SGLang's SIGQUIT handler (a scheduler died: the group is down), after ending every
    held request with 503 (which also fences: new work and ``/health`` get 503) and giving
    the answers :data:`FLUSH_S` to leave; SGLang's handler then runs off the event loop
    (:func:`_run_off_the_loop`), so the fenced server keeps answering until it dies."""

    def handler(self: Any, signum: Any = None, frame: Any = None) -> None:
        ended = end_everything(FAILOVER, "the TP group went down (a scheduler process ended)")
        asyncio.get_running_loop().call_later(
            FLUSH_S if ended else 0.0, _run_off_the_loop, original, self, signum, frame
        )

    return handler


def _run_off_the_loop(original: Callable[..., Any], *args: Any) -> None:
    """SGLang 0.5.21-0.5.23's SIGQUIT handler sleeps 5 s on the event loop before its
    crash diagnostics (``SGLANG_PYSPY_DUMP_BEFORE_CRASH``, on by default), then kills the
    process tree. On the loop, that sleep froze the HTTP server: the router's health
    checks and a retry it sent there got no answer, then a reset (502, the retry spent;
    a real-engine drill lost a request that way). In a thread, SGLang's handler does all
    it did, while the loop answers 503. Should it raise, the server is killed all the
    same: the group is down either way."""

    def run() -> None:
        try:
            original(*args)
        except BaseException:
            logger.exception("SGLang's SIGQUIT handler failed; killing the server")
        finally:
            # SGLang's handler ends with the same call (it kills this process too).
            kill_process_tree(os.getpid(), include_parent=True)

    threading.Thread(target=run, name="lockstep-sigquit", daemon=True).start()


def sigterm_first_end_requests(original: Callable[..., Any]) -> Callable[..., Any]:
    """SGLang's SIGTERM handler, after ending every held request with 503: the container
    is stopping (the launcher kills the server a few seconds later), so a request still
    held would be cut; ended, the router retries it elsewhere."""

    def handler(self: Any, signum: Any = None, frame: Any = None) -> None:
        end_everything(FAILOVER, "the server is stopping (SIGTERM)")
        original(self, signum, frame)

    return handler


def hook_signal_handlers() -> None:
    """Wrap SGLang's running-phase SIGQUIT and SIGTERM handlers (before the first request
    registers them on the event loop); idempotent."""
    global _signals_hooked
    if _signals_hooked:
        return
    cls = tokenizer_manager_mod.SignalHandler
    cls.running_phase_sigquit_handler = sigquit_first_end_requests(
        cls.running_phase_sigquit_handler
    )
    cls.sigterm_handler = sigterm_first_end_requests(cls.sigterm_handler)
    _signals_hooked = True


def probe_gate() -> ProbeGate | None:
    """The main process's probe gate, once the tokenizer manager exists."""
    return _gate


def probe_fan_out(server_args: Any) -> int:
    """Answers that make one probe result: one per TP group behind this server.

    Plain DP replicas each have a TP rank 0 that answers; DP attention runs a single TP
    group, so one answer.
    """
    if getattr(server_args, "enable_dp_attention", False):
        return 1
    return max(1, int(getattr(server_args, "dp_size", 1) or 1))


def init_tokenizer_manager(server_args: Any, port_args: Any, *args: Any, **kwargs: Any) -> Any:
    """``init_tokenizer_manager_func`` for SGLang: SGLang's, plus the probe gate."""
    global _gate
    tokenizer_manager, template_manager = engine_mod.init_tokenizer_manager(
        server_args, port_args, *args, **kwargs
    )
    cfg = _config or RuntimeConfig.from_env()

    def send(req: ProbeRequest) -> None:
        tokenizer_manager._dispatch_to_scheduler(
            LockstepProbeReq(rid=req.rid, deadline=req.deadline, sent_at=req.sent_at)
        )

    gate = ProbeGate(
        send, fan_out=probe_fan_out(server_args), max_timeout_s=cfg.probe_max_timeout_s
    )

    def deliver(out: LockstepProbeOutput) -> None:
        try:
            rooms = [None if room < 0 else room for room in out.held_rooms]
            held = zip(out.held_rids, zip(out.held_tokens, rooms, strict=True), strict=True)
            ENDED_KV.observe(str(out.rid), dict(held))
        except Exception:  # a report, never a lost probe answer
            logger.exception("lockstep: reading what the scheduler holds failed")
        gate.deliver(
            ProbeReply(
                rid=str(out.rid),
                ok=out.ok,
                groups_ms=dict(out.groups_ms),
                tp_rank=out.tp_rank,
                iteration=out.iteration,
                queued_ms=out.queued_ms,
                error=out.error,
            )
        )

    tokenizer_manager._result_dispatcher += TypeBasedDispatcher([(LockstepProbeOutput, deliver)])
    _gate = gate
    return tokenizer_manager, template_manager


async def probe_route(request: Request) -> JSONResponse:
    """``GET /lockstep/probe[?timeout=seconds]``: 200 ok, 504 timeout, 500 failed, 503
    not ready."""
    gate = _gate
    if gate is None:
        return JSONResponse(
            {"ok": False, "status": "unavailable", "error": "probe needs tokenizer_worker_num=1"},
            status_code=503,
        )
    state = http_server.get_global_state()
    if state is None or str(getattr(state.tokenizer_manager.server_status, "value", "")) == (
        "Starting"
    ):
        return JSONResponse(
            {"ok": False, "status": "starting", "error": "server is starting"}, status_code=503
        )
    cfg = _config or RuntimeConfig.from_env()
    try:
        timeout_s = float(request.query_params.get("timeout", cfg.probe_timeout_s))
    except ValueError:
        return JSONResponse({"ok": False, "error": "timeout must be seconds"}, status_code=400)
    outcome = await gate.probe(timeout_s)
    status = {"ok": 200, "timeout": 504}.get(outcome["status"], 500)
    global _probed_ok
    if status == 200 and not _probed_ok:
        _probed_ok = True
        timeline.mark(cfg.state_dir, "probe_ok")
    body = {**outcome, "kv": ENDED_KV.ended_kv().to_json()}
    return JSONResponse(body, status_code=status)


async def inflight_route() -> JSONResponse:
    """``GET /lockstep/inflight``: the work requests this server holds (`inflight`)."""
    return JSONResponse(COUNTER.body())


def hook_subprocess_start() -> None:
    """Just before SGLang starts its schedulers (after its own ``spawn``), choose how
    they start (:mod:`lockstep_sglang.start_method`): forked from this process, which has
    imported SGLang, where that is safe."""
    engine_cls = engine_mod.Engine
    bound = engine_cls.__dict__["_launch_scheduler_processes"]
    if getattr(bound, "__lockstep_hook__", False):
        return
    original = bound.__func__  # a classmethod

    @functools.wraps(original)
    def hooked(cls: Any, *args: Any, **kwargs: Any) -> Any:
        config = _config or RuntimeConfig.from_env()
        start_method.apply(config.state_dir, config.subprocess_start)
        return original(cls, *args, **kwargs)

    hooked.__lockstep_hook__ = True  # type: ignore[attr-defined]
    wrapped = classmethod(hooked)
    wrapped.__lockstep_hook__ = True  # type: ignore[attr-defined]
    engine_cls._launch_scheduler_processes = wrapped


def install_server_hooks(config: RuntimeConfig) -> None:
    """Main-process hooks: IPC types, the probe, in-flight and failover routes with their
    counting and fencing middleware, the signal handlers that end held requests first,
    the DP controller's entry."""
    global _config, _route_added
    _config = config
    hooks.register_ipc_types()
    if not _route_added:
        http_server.app.add_api_route(PROBE_ROUTE, probe_route, methods=["GET"])
        http_server.app.add_api_route(INFLIGHT_ROUTE, inflight_route, methods=["GET"])
        add_failover_routes(http_server.app, FAILOVER)
        add_ended_kv_routes(http_server.app, FAILOVER, ENDED_KV, settle=_settle_free)
        http_server.app.add_middleware(InflightMiddleware, fence=FAILOVER.fence)
        _route_added = True
    hook_signal_handlers()
    hook_subprocess_start()
    watcher = watcher_from_env()  # the test fault switch (None in production)
    if watcher is not None:
        pd_faults.install_bootstrap_down(watcher)
        pd_faults.install_kv_leak(watcher)
    # engine.py looks this name up when it starts the DP controller process.
    engine_mod.run_data_parallel_controller_process = hooks.run_data_parallel_controller_process


def launch(server_args: Any) -> None:
    """Run SGLang's HTTP server with the lockstep entry points (blocks until it ends)."""
    http_server.launch_server(
        server_args,
        init_tokenizer_manager_func=init_tokenizer_manager,
        run_scheduler_process_func=hooks.run_scheduler_process,
    )

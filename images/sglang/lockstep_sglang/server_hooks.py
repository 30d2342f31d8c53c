"""The main-process side of lockstep in SGLang 0.5.23: the probe route and its replies.

``GET /lockstep/probe`` is added to SGLang's FastAPI app; the tokenizer manager (built
through ``launch_server(init_tokenizer_manager_func=...)``) gets a
:class:`lockstep_sglang.probe.ProbeGate` whose requests go to the schedulers over
SGLang's own IPC, and whose replies its result dispatcher routes back. The scheduler side
is :mod:`lockstep_sglang.hooks`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from sglang.srt.entrypoints import engine as engine_mod
from sglang.srt.entrypoints import http_server
from sglang.utils import TypeBasedDispatcher

from lockstep_sglang import hooks
from lockstep_sglang.config import RuntimeConfig
from lockstep_sglang.hooks import LockstepProbeOutput, LockstepProbeReq
from lockstep_sglang.inflight import COUNTER, INFLIGHT_ROUTE, InflightMiddleware
from lockstep_sglang.probe import ProbeGate, ProbeReply, ProbeRequest

PROBE_ROUTE = "/lockstep/probe"

_config: RuntimeConfig | None = None
_route_added = False

_gate: ProbeGate | None = None


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
    return JSONResponse(dict(outcome), status_code=status)


async def inflight_route() -> JSONResponse:
    """``GET /lockstep/inflight``: the work requests this server holds (`inflight`)."""
    return JSONResponse(COUNTER.body())


def install_server_hooks(config: RuntimeConfig) -> None:
    """Main-process hooks: IPC types, the probe and in-flight routes with their counting
    middleware, the DP controller's entry."""
    global _config, _route_added
    _config = config
    hooks.register_ipc_types()
    if not _route_added:
        http_server.app.add_api_route(PROBE_ROUTE, probe_route, methods=["GET"])
        http_server.app.add_api_route(INFLIGHT_ROUTE, inflight_route, methods=["GET"])
        http_server.app.add_middleware(InflightMiddleware)
        _route_added = True
    # engine.py looks this name up when it starts the DP controller process.
    engine_mod.run_data_parallel_controller_process = hooks.run_data_parallel_controller_process


def launch(server_args: Any) -> None:
    """Run SGLang's HTTP server with the lockstep entry points (blocks until it ends)."""
    http_server.launch_server(
        server_args,
        init_tokenizer_manager_func=init_tokenizer_manager,
        run_scheduler_process_func=hooks.run_scheduler_process,
    )

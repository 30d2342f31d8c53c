"""The stand-in's HTTP server: SGLang's routes the local cluster uses, on the leader pod.

FastAPI on uvicorn, as SGLang's own server: the routes keep SGLang's shapes and status
codes, request bodies are validated by pydantic like SGLang's, and the runtime's
:class:`lockstep_sglang.probe.ProbeGate` is asyncio-native, so the probe route is the
same few lines as ``hooks.probe_route``. It runs in the pod's main process (never a
rank), on its own thread, so a wedged group cannot stop it from answering — every wait
on the ranks is bounded and ends in an error status.

Routes (see the package docstring for bodies): ``GET /health``, ``GET /health_generate``,
``GET /get_model_info`` (and ``/model_info``), ``GET /get_server_info`` (and
``/server_info``), ``GET /v1/models``, ``POST /generate``, ``POST /v1/completions``,
``GET /lockstep/probe[?timeout=s]``.

PD (what sglang-router sends): a request that carries ``bootstrap_room`` is one half of a
PD pair (:mod:`.kv`). A prefill pod runs it for one token and publishes the KV hand-off
for the room on its bootstrap server (started with the frontend); a decode pod first
fetches the hand-off from ``bootstrap_host:bootstrap_port`` (bounded by the request's
timeout; 502 when it does not come) and then generates. Requests without a room run
alone, as on a non-PD server.

Request log: every generation request is appended, when it arrives and when it is
answered, to ``<pod dir>/requests.jsonl`` (``{"event": "received"|"answered"|"failed",
"at", "route", "rid", "room", "prompt", "status"?}``): how a drill proves which pods a
router sent requests to, and when.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from lockstep_sglang import __version__
from lockstep_sglang.inflight import INFLIGHT_ROUTE, InflightCounter, InflightMiddleware
from lockstep_sglang.probe import ProbeGate, ProbeReply
from lockstep_sglang.standin.kv import (
    BootstrapServer,
    KVError,
    KVHandoff,
    KVStore,
    fetch_handoff,
    prompt_digest,
)
from lockstep_sglang.standin.protocol import GenerateRequest, GenerateResult, Ready, token_id
from lockstep_sglang.standin.settings import MAX_PENDING, PodSettings

logger = logging.getLogger("lockstep_sglang.standin.server")

PROBE_ROUTE = "/lockstep/probe"
REQUEST_LOG = "requests.jsonl"
PROMPT_LOGGED = 120  # characters of a prompt kept in the request log
LOG_MAX_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_NEW_TOKENS = 16
MAX_NEW_TOKENS_LIMIT = 4096


class GenerateError(Exception):
    """A request the group could not answer; ``status`` is the HTTP status to send."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Pending:
    future: asyncio.Future[GenerateResult]
    loop: asyncio.AbstractEventLoop


class Frontend:
    """The main process's side of rank 0: sends requests, matches answers, never blocks.

    ``inbox`` and ``outbox`` are rank 0's ends seen from here: requests go out through a
    sender thread (a wedged rank 0 stops reading its pipe; only that thread then waits),
    answers come back on a reader thread.
    """

    def __init__(
        self,
        to_rank0: Connection,
        from_rank0: Connection,
        settings: PodSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._to_rank0 = to_rank0
        self._from_rank0 = from_rank0
        self._clock = clock
        self._outgoing: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._prefix = f"standin-{os.getpid()}-{int(clock())}"
        self.ready: Ready | None = None
        self.rank0_gone = False
        self.gate = ProbeGate(
            self._outgoing.put, max_timeout_s=settings.runtime.probe_max_timeout_s
        )
        self.kv = KVStore()
        self.request_log = settings.pod_dir / REQUEST_LOG
        self._log_lock = threading.Lock()
        self._kv_client: httpx.AsyncClient | None = None

    def start(self) -> None:
        """Start the sender and reader threads and, on a prefill pod, the bootstrap server
        that hands the KV of each PD request over to its decode pod."""
        threading.Thread(target=self._send_loop, name="standin-send", daemon=True).start()
        threading.Thread(target=self._recv_loop, name="standin-recv", daemon=True).start()
        server = self.settings.server
        if server.disaggregation_mode == "prefill":
            try:
                bootstrap = BootstrapServer(self.kv, self.settings.pod_ip, server.bootstrap_port)
            except OSError as exc:  # decode pods then fail every PD request, loudly
                logger.error("cannot serve the bootstrap port %d: %s", server.bootstrap_port, exc)
            else:
                bootstrap.serve_in_thread()
                logger.info("bootstrap server on %s:%d", self.settings.pod_ip, bootstrap.port)

    def log_request(self, event: str, **fields: Any) -> None:
        """Append one line to the request log (never fails the request)."""
        line = json.dumps({"event": event, "at": round(self._clock(), 6), **fields})
        try:
            with self._log_lock:
                # Bounded for long-running local clusters: past the limit it moves to .1.
                if self.request_log.exists() and self.request_log.stat().st_size > LOG_MAX_BYTES:
                    self.request_log.replace(self.request_log.with_name(REQUEST_LOG + ".1"))
                with open(self.request_log, "a") as log:
                    log.write(line + "\n")
        except OSError as exc:
            logger.warning("request log: %s", exc)

    async def serve(
        self,
        text: str,
        max_new_tokens: int,
        *,
        rid: str | None,
        bootstrap: tuple[Any, Any, Any],
        route: str,
    ) -> GenerateResult:
        """One request as a PD server runs it (see the module docstring), logged."""
        host, port, room = bootstrap
        mode = self.settings.server.disaggregation_mode
        paired = room is not None and mode in ("prefill", "decode")
        self.log_request("received", route=route, rid=rid, room=room, prompt=text[:PROMPT_LOGGED])
        try:
            if paired and mode == "decode":
                await self._receive_kv(text, max_new_tokens, host, port, int(room))
            tokens = min(max_new_tokens, 1) if paired and mode == "prefill" else max_new_tokens
            result = await self.generate(text, tokens, rid=rid, bootstrap=bootstrap)
            if paired and mode == "prefill":
                first = result.output_ids[0] if result.output_ids else -1
                self.kv.publish(
                    KVHandoff(
                        int(room), prompt_digest(text), first, self.settings.pod_name, self._clock()
                    )
                )
        except GenerateError as exc:
            self.log_request("failed", route=route, rid=rid, room=room, status=exc.status)
            raise
        self.log_request("answered", route=route, rid=result.rid, room=room, status=200)
        return result

    async def _receive_kv(
        self, text: str, max_new_tokens: int, host: Any, port: Any, room: int
    ) -> None:
        if not host or not port:
            raise GenerateError(400, "a PD decode request needs bootstrap_host and bootstrap_port")
        if self._kv_client is None:
            self._kv_client = httpx.AsyncClient(trust_env=False)
        try:
            handoff = await fetch_handoff(
                self._kv_client, str(host), int(port), room, text, self.settings.request_timeout_s
            )
        except KVError as exc:
            raise GenerateError(502, str(exc)) from None
        if max_new_tokens > 0 and handoff.first_token != token_id(text, 0):
            raise GenerateError(502, f"KV of room {room} does not match the prompt's first token")

    def _send_loop(self) -> None:
        while True:
            msg = self._outgoing.get()
            try:
                self._to_rank0.send(msg)
            except OSError:
                return  # rank 0 is gone; the pod is ending

    def _recv_loop(self) -> None:
        while True:
            try:
                msg = self._from_rank0.recv()
            except (EOFError, OSError):
                self.rank0_gone = True
                return
            if isinstance(msg, ProbeReply):
                self.gate.deliver(msg)
            elif isinstance(msg, GenerateResult):
                with self._lock:
                    pending = self._pending.pop(msg.rid, None)
                if pending is not None:
                    pending.loop.call_soon_threadsafe(_resolve, pending.future, msg)
            elif isinstance(msg, Ready):
                self.ready = msg
                logger.info("rank 0 ready: TP group of %d formed", msg.world_size)

    def new_rid(self) -> str:
        """A request id unique to this server."""
        return f"{self._prefix}-{next(self._ids)}"

    async def generate(
        self,
        text: str,
        max_new_tokens: int,
        *,
        rid: str | None = None,
        timeout_s: float | None = None,
        bootstrap: tuple[str | None, int | None, int | None] = (None, None, None),
    ) -> GenerateResult:
        """Run one completion through the group; ``GenerateError`` when it cannot."""
        if self.ready is None:
            raise GenerateError(503, "the server is starting")
        if self.rank0_gone:
            raise GenerateError(503, "the scheduler is gone")
        rid = rid or self.new_rid()
        timeout_s = self.settings.request_timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerateResult] = loop.create_future()
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                raise GenerateError(503, f"{MAX_PENDING} requests already waiting")
            if rid in self._pending:
                raise GenerateError(400, f"request id {rid!r} is already running")
            self._pending[rid] = _Pending(future, loop)
        now = self._clock()
        host, port, room = bootstrap
        self._outgoing.put(
            GenerateRequest(rid, text, max_new_tokens, now + timeout_s, now, host, port, room)
        )
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            # Rank 0 drops it before the broadcast, or aborts it on every rank, once
            # its deadline has passed: nothing of it stays queued.
            raise GenerateError(504, f"no answer within {timeout_s:g}s") from None
        finally:
            with self._lock:
                self._pending.pop(rid, None)

    @property
    def pending(self) -> int:
        """Requests waiting for an answer."""
        with self._lock:
            return len(self._pending)


def _resolve(future: asyncio.Future[GenerateResult], result: GenerateResult) -> None:
    if not future.done():
        future.set_result(result)


# -- request bodies (SGLang's names; unknown fields are accepted and ignored) ---------


class SamplingParams(BaseModel):
    """The sampling parameters the stand-in honours (others are ignored)."""

    model_config = ConfigDict(extra="allow")
    max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=0, le=MAX_NEW_TOKENS_LIMIT)


class GenerateBody(BaseModel):
    """``POST /generate``."""

    model_config = ConfigDict(extra="allow")
    text: str | list[str] | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams = Field(default_factory=lambda: SamplingParams())
    rid: str | None = None
    stream: bool = False
    bootstrap_host: str | list[str] | None = None
    bootstrap_port: int | list[int] | None = None
    bootstrap_room: int | list[int] | None = None


class CompletionBody(BaseModel):
    """``POST /v1/completions`` (OpenAI)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | list[str] = ""
    max_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=0, le=MAX_NEW_TOKENS_LIMIT)
    stream: bool = False
    bootstrap_host: str | list[str] | None = None
    bootstrap_port: int | list[int] | None = None
    bootstrap_room: int | list[int] | None = None


def _nth(value: Any, i: int) -> Any:
    return value[i] if isinstance(value, list) else value


def _error(status: int, message: str) -> JSONResponse:
    kind = {400: "BadRequest", 503: "ServiceUnavailable", 504: "Timeout"}.get(status, "Error")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}, "object": "error"},
        status_code=status,
    )


def build_app(frontend: Frontend) -> FastAPI:
    """The FastAPI app of one leader pod."""
    settings = frontend.settings
    server = settings.server
    app = FastAPI(title="lockstep SGLang stand-in", version=__version__, docs_url=None)
    # One counter per app (a test may build several in one process).
    inflight = InflightCounter()
    app.add_middleware(InflightMiddleware, counter=inflight)

    @app.get(INFLIGHT_ROUTE)
    async def inflight_route() -> JSONResponse:
        return JSONResponse(inflight.body())

    def meta(
        result: GenerateResult, started: float, bootstrap: tuple[Any, Any, Any]
    ) -> dict[str, Any]:
        n = len(result.output_ids)
        return {
            "id": result.rid,
            "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": n,
            "cached_tokens": 0,
            "e2e_latency": round(time.time() - started, 6),
            "bootstrap_host": bootstrap[0],
            "bootstrap_port": bootstrap[1],
            "bootstrap_room": bootstrap[2],
            "disaggregation_mode": server.disaggregation_mode,
            "lockstep_standin": {
                "tp_size": server.tp_size,
                "first_iteration": result.first_iteration,
                "last_iteration": result.last_iteration,
            },
        }

    @app.get("/health")
    async def health() -> JSONResponse:
        # Like SGLang's: up once the scheduler runs, blind to a wedged group (the deep
        # probe is what sees that).
        if frontend.ready is None or frontend.rank0_gone:
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({})

    @app.get("/health_generate")
    async def health_generate() -> JSONResponse:
        try:
            await frontend.generate("health", 1, timeout_s=settings.runtime.probe_timeout_s)
        except GenerateError as exc:
            return _error(503, f"health generation failed: {exc}")
        return JSONResponse({})

    @app.get("/get_model_info")
    @app.get("/model_info")  # the newer name; sglang-router asks for it first
    async def model_info() -> JSONResponse:
        return JSONResponse(
            {
                "model_path": server.model_path,
                "tokenizer_path": server.model_path,
                "served_model_name": server.served_model_name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "lockstep-standin",
                "architectures": ["LockstepStandin"],
            }
        )

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> JSONResponse:
        return JSONResponse(
            {
                "model_path": server.model_path,
                "served_model_name": server.served_model_name,
                "disaggregation_mode": server.disaggregation_mode,
                "disaggregation_bootstrap_port": server.bootstrap_port,
                "disaggregation_transfer_backend": server.transfer_backend,
                "tp_size": server.tp_size,
                "nnodes": server.nnodes,
                "node_rank": server.node_rank,
                "dp_size": 1,
                "host": settings.pod_ip,
                "port": server.port,
                "dist_init_addr": server.dist_init_addr,
                "ignored_args": list(server.ignored),
                "version": f"lockstep-standin-{__version__}",
                "lockstep_standin": True,
                "internal_states": [{"pending_requests": frontend.pending}],
            }
        )

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": server.served_model_name,
                        "object": "model",
                        "owned_by": "lockstep-standin",
                        "root": server.model_path,
                    }
                ],
            }
        )

    async def run_many(
        prompts: list[str], max_new_tokens: int, rid: str | None, body: Any, route: str
    ) -> list[tuple[GenerateResult, tuple[Any, Any, Any]]]:
        jobs = []
        for i, prompt in enumerate(prompts):
            bootstrap = (
                _nth(body.bootstrap_host, i),
                _nth(body.bootstrap_port, i),
                _nth(body.bootstrap_room, i),
            )
            one_rid = rid if len(prompts) == 1 else (f"{rid}-{i}" if rid else None)
            jobs.append(
                frontend.serve(
                    prompt, max_new_tokens, rid=one_rid, bootstrap=bootstrap, route=route
                )
            )
        results = await asyncio.gather(*jobs, return_exceptions=True)
        out: list[tuple[GenerateResult, tuple[Any, Any, Any]]] = []
        for i, res in enumerate(results):
            if isinstance(res, BaseException):
                raise res
            bootstrap = (
                _nth(body.bootstrap_host, i),
                _nth(body.bootstrap_port, i),
                _nth(body.bootstrap_room, i),
            )
            out.append((res, bootstrap))
        return out

    @app.post("/generate")
    async def generate(body: GenerateBody) -> JSONResponse:
        if body.stream:
            return _error(400, "streaming is not supported by the stand-in")
        if body.text is not None:
            prompts = body.text if isinstance(body.text, list) else [body.text]
        elif body.input_ids is not None:
            prompts = [" ".join(map(str, body.input_ids))]
        else:
            return _error(400, "either text or input_ids is required")
        started = time.time()
        try:
            done = await run_many(
                prompts, body.sampling_params.max_new_tokens, body.rid, body, "/generate"
            )
        except GenerateError as exc:
            return _error(exc.status, str(exc))
        items = [
            {"text": r.text, "output_ids": r.output_ids, "meta_info": meta(r, started, b)}
            for r, b in done
        ]
        return JSONResponse(items if isinstance(body.text, list) else items[0])

    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> JSONResponse:
        if body.stream:
            return _error(400, "streaming is not supported by the stand-in")
        prompts = body.prompt if isinstance(body.prompt, list) else [body.prompt]
        started = time.time()
        try:
            done = await run_many(prompts, body.max_tokens, None, body, "/v1/completions")
        except GenerateError as exc:
            return _error(exc.status, str(exc))
        prompt_total = sum(r.prompt_tokens for r, _ in done)
        completion_total = sum(len(r.output_ids) for r, _ in done)
        return JSONResponse(
            {
                "id": done[0][0].rid if done else frontend.new_rid(),
                "object": "text_completion",
                "created": int(started),
                "model": body.model or server.served_model_name,
                "choices": [
                    {
                        "index": i,
                        "text": r.text,
                        "logprobs": None,
                        "finish_reason": "length",
                        "matched_stop": None,
                    }
                    for i, (r, _) in enumerate(done)
                ],
                "usage": {
                    "prompt_tokens": prompt_total,
                    "completion_tokens": completion_total,
                    "total_tokens": prompt_total + completion_total,
                },
            }
        )

    @app.get(PROBE_ROUTE)
    async def probe(request: Request) -> JSONResponse:
        # hooks.probe_route's contract: 200 ok, 504 timeout, 500 failed, 503 not ready.
        if frontend.ready is None or frontend.rank0_gone:
            return JSONResponse(
                {"ok": False, "status": "starting", "error": "server is starting"},
                status_code=503,
            )
        try:
            timeout_s = float(request.query_params.get("timeout", settings.runtime.probe_timeout_s))
        except ValueError:
            return JSONResponse({"ok": False, "error": "timeout must be seconds"}, status_code=400)
        outcome = await frontend.gate.probe(timeout_s)
        status = {"ok": 200, "timeout": 504}.get(outcome["status"], 500)
        return JSONResponse(dict(outcome), status_code=status)

    return app

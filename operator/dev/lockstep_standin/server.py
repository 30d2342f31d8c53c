"""The stand-in's HTTP server: SGLang's routes the local cluster uses, on the leader pod.

FastAPI on uvicorn, as SGLang's own server: the routes keep SGLang's shapes and status
codes, request bodies are validated by pydantic like SGLang's, and the runtime's
:class:`lockstep_sglang.probe.ProbeGate` is asyncio-native, so the probe route is the
same few lines as ``hooks.probe_route``. It runs in the pod's main process (never a
rank), on its own thread, so a wedged group cannot stop it from answering — every wait
on the ranks is bounded and ends in an error status.

Routes (see the package docstring for bodies): ``GET /health``, ``GET /health_generate``,
``GET /get_model_info`` (and ``/model_info``), ``GET /get_server_info`` (and
``/server_info``), ``GET /v1/models``, ``GET /v1/loads`` (SGLang's load figures: running
and waiting requests, the "KV" they hold), ``POST /generate`` and ``POST /v1/completions``
(both also as SSE streams, in SGLang's event shapes), ``GET /lockstep/probe[?timeout=s]``,
the runtime's failover routes (:mod:`lockstep_sglang.failover`: ``GET
/lockstep/requests``, ``POST /lockstep/abort``, with the operator's token) and its
ended-KV routes (:mod:`lockstep_sglang.ended_kv`: ``GET /lockstep/kv``, ``POST
/lockstep/kv/free``; the probe's body carries the same report as ``kv``).

PD (what sglang-router sends): a request that carries ``bootstrap_room`` is one half of a
PD pair (:mod:`.kv`). A prefill pod runs it for one token, publishes the KV hand-off for
the room on its bootstrap server (started with the frontend) and, as SGLang's prefill,
answers only once the decode took it (500 after ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT``
otherwise); a decode pod first waits for the hand-off from
``bootstrap_host:bootstrap_port`` (500 after ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``, or
once the prefill's bootstrap server failed its heartbeats) and then generates. Requests
without a room run alone, as on a non-PD server.

Requests caught by an incident end the way the real runtime ends them: a request the
server ends (the operator's ``POST /lockstep/abort``, or rank 0's pipe closing because the
group went down) is answered at once with 503 — a stream with SGLang's abort as its last
event — and dropped on every rank; once fenced, new work and ``/health`` get 503.

The KV a request holds (its prompt plus completion tokens, in ``/v1/loads``) is freed when
it ends, except under the drills' ``kv-leak`` on a decode: a PD request that ended before
it answered (its client went away, its transfer failed) then stays in the book as
``ended``, holding its KV, as a decode whose transfer queue never lets go of a room; it is
no longer a request anyone can see (``/lockstep/requests``), only KV held
(``/lockstep/kv``), and the runtime's free (``POST /lockstep/kv/free``, the abort path)
gives it back.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from lockstep_sglang import __version__, timeline
from lockstep_sglang.ended_kv import EndedKV
from lockstep_sglang.ended_kv import add_routes as add_ended_kv_routes
from lockstep_sglang.failover import (
    RETRYABLE_STATUS,
    Failover,
    HeldRequest,
    end_everything,
)
from lockstep_sglang.failover import add_routes as add_failover_routes
from lockstep_sglang.faults import FAULT_FILE, FaultKind, FaultWatcher
from lockstep_sglang.inflight import INFLIGHT_ROUTE, InflightCounter, InflightMiddleware
from lockstep_sglang.probe import ProbeGate, ProbeReply
from lockstep_standin.kv import (
    BootstrapServer,
    KVError,
    KVHandoff,
    KVStore,
    PDTimeouts,
    fetch_handoff,
    prompt_digest,
)
from lockstep_standin.protocol import (
    AbortRequest,
    GenerateRequest,
    GenerateResult,
    Ready,
    TokenChunk,
    detokenize,
    prompt_tokens,
    token_id,
)
from lockstep_standin.settings import MAX_PENDING, PodSettings

logger = logging.getLogger("lockstep_standin.server")

PROBE_ROUTE = "/lockstep/probe"
REQUEST_LOG = "requests.jsonl"
PROMPT_LOGGED = 120  # characters of a prompt kept in the request log
LOG_MAX_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_NEW_TOKENS = 16
MAX_NEW_TOKENS_LIMIT = 4096
# The "KV cache" of one stand-in server, in tokens (what /v1/loads' token_usage divides by).
KV_CAPACITY_TOKENS = 65536
TAKEN_POLL_S = 0.02  # how often a prefill request looks whether its decode took the KV
FLUSH_S = 0.3  # how long the pod lets ended requests' answers leave before it exits

T = TypeVar("T")


class GenerateError(Exception):
    """A request the group could not answer; ``status`` is the HTTP status to send."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Held:
    """One work request the server holds (the stand-in's ``rid_to_state``)."""

    rid: str
    room: int | None
    bootstrap: str | None
    started: float  # monotonic
    stream: bool
    tokens: int  # what it holds of the "KV": prompt plus completion tokens
    loop: asyncio.AbstractEventLoop
    # Set (to the message) when the server ends it: every wait of the request races it.
    ended: asyncio.Future[str]
    phase: str = "queued"  # queued | waiting_kv | running | holding_kv | ended (kv-leak)
    ended_at: float = 0.0  # monotonic, once ended with its KV kept
    future: asyncio.Future[GenerateResult] | None = None
    on_tokens: Callable[[list[int]], None] | None = None


class Frontend:
    """The main process's side of rank 0: sends requests, matches answers, never blocks.

    ``inbox`` and ``outbox`` are rank 0's ends seen from here: requests go out through a
    sender thread (a wedged rank 0 stops reading its pipe; only that thread then waits),
    answers come back on a reader thread.

    It is also the runtime's :class:`lockstep_sglang.failover.RequestBook`: every held
    request can be listed and ended at once with 503 (:meth:`end`), and when rank 0's pipe
    closes (the group went down) every held request is ended so, before the pod exits.
    """

    def __init__(
        self,
        to_rank0: Connection,
        from_rank0: Connection,
        settings: PodSettings,
        *,
        clock: Callable[[], float] = time.time,
        timeouts: PDTimeouts | None = None,
    ) -> None:
        self.settings = settings
        self._to_rank0 = to_rank0
        self._from_rank0 = from_rank0
        self._clock = clock
        self._outgoing: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._prefix = f"standin-{os.getpid()}-{int(clock())}"
        self.ready: Ready | None = None
        self.rank0_gone = False
        self.gate = ProbeGate(
            self._outgoing.put, max_timeout_s=settings.runtime.probe_max_timeout_s
        )
        self.kv = KVStore()
        self.timeouts = timeouts or PDTimeouts.from_env()
        # The PD path's drill faults (transfer-stall, bootstrap-down), read by this process.
        self._faults = FaultWatcher(settings.pod_dir / FAULT_FILE)  # one stat a check
        self._faults_lock = threading.Lock()
        self.failover = Failover(self)
        self.loop: asyncio.AbstractEventLoop | None = None  # the HTTP server's, once serving
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
                bootstrap = BootstrapServer(
                    self.kv,
                    self.settings.pod_ip,
                    server.bootstrap_port,
                    down=lambda: self.pd_fault("bootstrap-down"),
                )
            except OSError as exc:  # decode pods then fail every PD request, loudly
                logger.error("cannot serve the bootstrap port %d: %s", server.bootstrap_port, exc)
            else:
                bootstrap.serve_in_thread()
                logger.info("bootstrap server on %s:%d", self.settings.pod_ip, bootstrap.port)

    def pd_fault(self, kind: FaultKind) -> bool:
        """Whether a drill put the PD-path fault ``kind`` on this pod's epoch."""
        with self._faults_lock:
            fault = self._faults.current()
        return fault.pd_fault(kind, self.settings.epoch)

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

    # -- the failover book --------------------------------------------------------------
    def held(self) -> list[HeldRequest]:
        """Every work request this server holds (``GET /lockstep/requests``)."""
        now = time.monotonic()
        with self._lock:
            held = [h for h in self._held.values() if h.phase != "ended"]
        return [HeldRequest(h.rid, h.room, h.bootstrap, now - h.started, h.stream) for h in held]

    def end(self, rids: Sequence[str], message: str) -> None:
        """End each of ``rids`` at once with 503 and drop it on every rank (on the loop)."""
        for rid in rids:
            with self._lock:
                h = self._held.get(rid)
            if h is None:
                continue
            if h.phase == "ended":  # its HTTP side is gone: the abort frees its KV
                self._free_ended([h])
                continue
            if not h.ended.done():
                h.ended.set_result(message)
            if h.phase == "running":
                self._outgoing.put(AbortRequest(rid))  # the ranks free what it holds

    # -- KV held by ended requests (lockstep_sglang.ended_kv's book) ------------------
    def ended_kv(self) -> EndedKV:
        """What requests that ended still hold (only under ``kv-leak``: see above)."""
        now = time.monotonic()
        with self._lock:
            ended = [h for h in self._held.values() if h.phase == "ended"]
        return _report(ended, now)

    def free_ended_kv(self, reason: str) -> EndedKV:
        """Hand every ended request still holding KV to the abort, which frees it."""
        now = time.monotonic()
        with self._lock:
            ended = [h for h in self._held.values() if h.phase == "ended"]
        self._free_ended(ended)
        freed = _report(ended, now)
        if freed.requests:
            logger.warning(
                "freed the KV of %d ended request(s) (%d tokens): %s",
                freed.requests, freed.tokens, reason,
            )  # fmt: skip
        return freed

    def _free_ended(self, ended: Sequence[_Held]) -> None:
        with self._lock:
            for h in ended:
                if self._held.get(h.rid) is h:
                    del self._held[h.rid]

    def end_all_threadsafe(self, message: str, *, wait_s: float = 0.0) -> None:
        """From any thread: fence the server and end every held request (the runtime's
        own knowledge that its group went down), waiting up to ``wait_s`` for the
        answers to leave."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        done = threading.Event()

        def run() -> None:
            try:
                end_everything(self.failover, message)
            finally:
                done.set()

        loop.call_soon_threadsafe(run)
        done.wait(wait_s)
        if wait_s > 0:
            time.sleep(min(wait_s, FLUSH_S))  # let the answers leave the sockets

    def loads(self) -> dict[str, Any]:
        """``GET /v1/loads``, in SGLang's shape: what the requests hold now."""
        with self._lock:
            held = list(self._held.values())
        mode = self.settings.server.disaggregation_mode
        running = [h for h in held if h.phase == "running"]
        waiting = [h for h in held if h.phase in ("queued", "waiting_kv", "holding_kv")]
        used = sum(h.tokens for h in held if h.phase in ("running", "holding_kv", "ended"))
        load: dict[str, Any] = {
            "dp_rank": 0,
            "num_running_reqs": len(running),
            "num_waiting_reqs": len(waiting),
            "num_used_tokens": used,
            "max_total_num_tokens": KV_CAPACITY_TOKENS,
            "token_usage": round(used / KV_CAPACITY_TOKENS, 6),
            "disaggregation": {"mode": mode},
        }
        load["lockstep"] = {"ended_kv": _report([h for h in held if h.phase == "ended"],
                                                time.monotonic()).to_json()}  # fmt: skip
        if mode == "prefill":
            load["disaggregation"]["prefill_bootstrap_queue_reqs"] = sum(
                1 for h in held if h.phase == "holding_kv"
            )
        elif mode == "decode":
            load["disaggregation"]["decode_transfer_queue_reqs"] = sum(
                1 for h in held if h.phase == "waiting_kv"
            )
        return {"timestamp": self._clock(), "version": __version__, "loads": [load]}

    # -- serving ------------------------------------------------------------------------
    async def serve(
        self,
        text: str,
        max_new_tokens: int,
        *,
        rid: str | None,
        bootstrap: tuple[Any, Any, Any],
        route: str,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> GenerateResult:
        """One request as a PD server runs it (see the module docstring), logged; with
        ``on_tokens`` every token so far is reported as it is made (a stream)."""
        host, port, room = bootstrap
        mode = self.settings.server.disaggregation_mode
        paired = room is not None and mode in ("prefill", "decode")
        self.log_request("received", route=route, rid=rid, room=room, prompt=text[:PROMPT_LOGGED])
        try:
            if self.failover.fence.reason is not None:
                raise GenerateError(
                    503, f"the group is out of service: {self.failover.fence.reason}"
                )
            h = self._hold(rid, text, max_new_tokens, bootstrap, stream=on_tokens is not None)
            answered = False
            try:
                h.on_tokens = on_tokens
                if paired and mode == "decode":
                    h.phase = "waiting_kv"
                    await self._or_ended(
                        h, self._receive_kv(text, max_new_tokens, host, port, int(room))
                    )
                tokens = min(max_new_tokens, 1) if paired and mode == "prefill" else max_new_tokens
                result = await self._or_ended(h, self._generate(h, text, tokens, bootstrap))
                if paired and mode == "prefill":
                    # As SGLang's prefill: the request holds its KV until the decode took
                    # it (or the bootstrap timeout ends it), then answers.
                    first = result.output_ids[0] if result.output_ids else -1
                    if self.pd_fault("transfer-stall"):
                        # The sender stalls for this room: the KV is never handed over.
                        logger.warning("fault transfer-stall: the KV of room %s not sent", room)
                    else:
                        self.kv.publish(
                            KVHandoff(
                                int(room), prompt_digest(text), first, self.settings.pod_name,
                                self._clock(),
                            )
                        )  # fmt: skip
                    h.phase = "holding_kv"
                    await self._or_ended(h, self._until_taken(int(room)))
                answered = True
            finally:
                self._release(h, int(room) if paired and mode == "prefill" else None,
                              leak=paired and mode == "decode" and not answered)  # fmt: skip
        except GenerateError as exc:
            self.log_request("failed", route=route, rid=rid, room=room, status=exc.status)
            raise
        self.log_request("answered", route=route, rid=result.rid, room=room, status=200)
        return result

    def _hold(
        self,
        rid: str | None,
        text: str,
        max_new_tokens: int,
        bootstrap: tuple[Any, Any, Any],
        *,
        stream: bool,
    ) -> _Held:
        if self.ready is None:
            raise GenerateError(503, "the server is starting")
        if self.rank0_gone:
            raise GenerateError(503, "the scheduler is gone")
        loop = asyncio.get_running_loop()
        self.loop = loop
        rid = rid or self.new_rid()
        host, port, room = bootstrap
        h = _Held(
            rid=rid,
            room=int(room) if room is not None else None,
            bootstrap=f"{host}:{port}" if host and port else None,
            started=time.monotonic(),
            stream=stream,
            tokens=prompt_tokens(text) + max_new_tokens,
            loop=loop,
            ended=loop.create_future(),
        )
        with self._lock:
            if len(self._held) >= MAX_PENDING:
                raise GenerateError(503, f"{MAX_PENDING} requests already waiting")
            if rid in self._held:
                raise GenerateError(400, f"request id {rid!r} is already running")
            self._held[rid] = h
        return h

    def _release(self, h: _Held, room: int | None, *, leak: bool = False) -> None:
        """The request ended: what it holds is free, except that under ``kv-leak`` a
        decode's PD request that ended unanswered (``leak``) keeps its KV."""
        leak = leak and self.pd_fault("kv-leak")
        with self._lock:
            if leak and self._held.get(h.rid) is h:
                h.phase, h.ended_at = "ended", time.monotonic()
                logger.warning(
                    "fault kv-leak: the KV of room %s (%d tokens) kept", h.room, h.tokens
                )
            else:
                self._held.pop(h.rid, None)
        if room is not None:
            self.kv.discard(room)  # taken or abandoned: the prefill's KV is free
        if not h.ended.done():
            h.ended.cancel()

    async def _or_ended(self, h: _Held, aw: Awaitable[T]) -> T:
        """``aw``, unless the server ends the request first (then 503, ``aw`` cancelled)."""
        task = asyncio.ensure_future(aw)
        waits: set[asyncio.Future[Any]] = {task, h.ended}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task.done():
            return task.result()
        task.cancel()
        raise GenerateError(RETRYABLE_STATUS, h.ended.result())

    async def _until_taken(self, room: int) -> None:
        deadline = time.monotonic() + self.timeouts.bootstrap_s
        while not self.kv.taken(room):
            if time.monotonic() >= deadline:
                raise GenerateError(
                    500,
                    f"Prefill bootstrap failed for room {room}: timed out after "
                    f"{self.timeouts.bootstrap_s:g}s in KVPoll.Bootstrapping",
                )
            await asyncio.sleep(TAKEN_POLL_S)

    async def _receive_kv(
        self, text: str, max_new_tokens: int, host: Any, port: Any, room: int
    ) -> None:
        if not host or not port:
            raise GenerateError(400, "a PD decode request needs bootstrap_host and bootstrap_port")
        if self._kv_client is None:
            self._kv_client = httpx.AsyncClient(trust_env=False)
        try:
            handoff = await fetch_handoff(
                self._kv_client, str(host), int(port), room, text, self.timeouts
            )
        except KVError as exc:
            raise GenerateError(500, f"Decode transfer failed: {exc}") from None
        if max_new_tokens > 0 and handoff.first_token != token_id(text, 0):
            raise GenerateError(500, f"KV of room {room} does not match the prompt's first token")

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
                # The group went down (a consensus failure, a dead rank): the runtime
                # knows before anyone else, so nothing in flight waits for the operator.
                self.end_all_threadsafe("the TP group's scheduler ended")
                return
            if isinstance(msg, ProbeReply):
                self.gate.deliver(msg)
            elif isinstance(msg, GenerateResult | TokenChunk):
                with self._lock:
                    h = self._held.get(msg.rid)
                if h is None:
                    continue
                if isinstance(msg, TokenChunk):
                    if h.on_tokens is not None:
                        h.loop.call_soon_threadsafe(h.on_tokens, msg.output_ids)
                elif h.future is not None:
                    h.loop.call_soon_threadsafe(_resolve, h.future, msg)
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
    ) -> GenerateResult:
        """Run one completion through the group (not logged, not PD: health checks)."""
        h = self._hold(rid, text, max_new_tokens, (None, None, None), stream=False)
        try:
            return await self._or_ended(
                h, self._generate(h, text, max_new_tokens, timeout_s=timeout_s)
            )
        finally:
            self._release(h, None)

    async def _generate(
        self,
        h: _Held,
        text: str,
        max_new_tokens: int,
        bootstrap: tuple[Any, Any, Any] = (None, None, None),
        *,
        timeout_s: float | None = None,
    ) -> GenerateResult:
        """Send ``h`` to rank 0 and wait for its answer, bounded by ``timeout_s``."""
        timeout_s = self.settings.request_timeout_s if timeout_s is None else timeout_s
        h.future = h.loop.create_future()
        h.phase = "running"
        now = self._clock()
        host, port, room = bootstrap
        self._outgoing.put(
            GenerateRequest(
                h.rid, text, max_new_tokens, now + timeout_s, now, host, port, room, h.stream
            )
        )
        try:
            return await asyncio.wait_for(asyncio.shield(h.future), timeout_s)
        except TimeoutError:
            # Rank 0 drops it before the broadcast, or aborts it on every rank, once
            # its deadline has passed: nothing of it stays queued.
            raise GenerateError(504, f"no answer within {timeout_s:g}s") from None

    @property
    def pending(self) -> int:
        """Requests waiting for an answer."""
        with self._lock:
            return sum(1 for h in self._held.values() if h.phase != "ended")


def _report(ended: Sequence[_Held], now: float) -> EndedKV:
    return EndedKV(
        tokens=sum(h.tokens for h in ended),
        requests=len(ended),
        oldest_s=max((now - h.ended_at for h in ended), default=0.0),
        rooms=tuple(sorted(h.room for h in ended if h.room is not None)),
    )


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


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


async def stream_tokens(
    frontend: Frontend,
    prompt: str,
    max_new_tokens: int,
    rid: str | None,
    bootstrap: tuple[Any, Any, Any],
    route: str,
) -> AsyncIterator[tuple[list[int], GenerateResult | GenerateError | None]]:
    """Run one request as a stream: yields (tokens so far, None) as they are made, then
    (all tokens, the result) or (tokens so far, the error that ended it)."""
    chunks: asyncio.Queue[list[int]] = asyncio.Queue()
    job = asyncio.ensure_future(
        frontend.serve(
            prompt, max_new_tokens, rid=rid, bootstrap=bootstrap, route=route,
            on_tokens=chunks.put_nowait,
        )
    )  # fmt: skip
    sent: list[int] = []
    try:
        while not job.done():
            getter = asyncio.ensure_future(chunks.get())
            await asyncio.wait({getter, job}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                sent = getter.result()
                yield sent, None
            else:
                getter.cancel()
        while not chunks.empty():
            sent = chunks.get_nowait()
            yield sent, None
        try:
            result = job.result()
        except GenerateError as exc:
            yield sent, exc
        else:
            yield list(result.output_ids), result
    finally:
        if not job.done():  # the client went away: the ranks drop the request
            job.cancel()
            frontend.end([rid] if rid else [], "the client disconnected")


def build_app(frontend: Frontend) -> FastAPI:
    """The FastAPI app of one leader pod."""
    settings = frontend.settings
    server = settings.server
    app = FastAPI(title="lockstep SGLang stand-in", version=__version__, docs_url=None)
    # One counter per app (a test may build several in one process); the fence refuses
    # new work once the group is going down.
    inflight = InflightCounter()
    app.add_middleware(InflightMiddleware, counter=inflight, fence=frontend.failover.fence)
    add_failover_routes(app, frontend.failover)
    add_ended_kv_routes(app, frontend.failover, frontend)

    @app.get(INFLIGHT_ROUTE)
    async def inflight_route() -> JSONResponse:
        return JSONResponse(inflight.body())

    @app.get("/v1/loads")
    async def loads() -> JSONResponse:
        return JSONResponse(frontend.loads())

    def meta(
        rid: str,
        output_ids: list[int],
        prompt: str,
        started: float,
        bootstrap: tuple[Any, Any, Any],
        finish_reason: dict[str, Any] | None,
        result: GenerateResult | None = None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish_reason,
            "prompt_tokens": prompt_tokens(prompt),
            "completion_tokens": len(output_ids),
            "cached_tokens": 0,
            "e2e_latency": round(time.time() - started, 6),
            "bootstrap_host": bootstrap[0],
            "bootstrap_port": bootstrap[1],
            "bootstrap_room": bootstrap[2],
            "disaggregation_mode": server.disaggregation_mode,
        }
        if result is not None:
            out["lockstep_standin"] = {
                "tp_size": server.tp_size,
                "first_iteration": result.first_iteration,
                "last_iteration": result.last_iteration,
            }
        return out

    def abort_reason(exc: GenerateError) -> dict[str, Any]:
        # SGLang's FINISH_ABORT as a stream's last event carries it (schedule_batch.py).
        return {"type": "abort", "message": str(exc), "status_code": exc.status, "err_type": None}

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

    def bootstrap_of(body: Any, i: int) -> tuple[Any, Any, Any]:
        return (
            _nth(body.bootstrap_host, i),
            _nth(body.bootstrap_port, i),
            _nth(body.bootstrap_room, i),
        )

    async def run_many(
        prompts: list[str], max_new_tokens: int, rid: str | None, body: Any, route: str
    ) -> list[tuple[GenerateResult, tuple[Any, Any, Any]]]:
        jobs = []
        for i, prompt in enumerate(prompts):
            one_rid = rid if len(prompts) == 1 else (f"{rid}-{i}" if rid else None)
            jobs.append(
                frontend.serve(
                    prompt, max_new_tokens, rid=one_rid, bootstrap=bootstrap_of(body, i),
                    route=route,
                )
            )  # fmt: skip
        results = await asyncio.gather(*jobs, return_exceptions=True)
        out: list[tuple[GenerateResult, tuple[Any, Any, Any]]] = []
        for i, res in enumerate(results):
            if isinstance(res, BaseException):
                raise res
            out.append((res, bootstrap_of(body, i)))
        return out

    def one_prompt(body: Any, prompts: list[str]) -> JSONResponse | None:
        if len(prompts) != 1:
            return _error(400, "a stream carries one prompt")
        return None

    @app.post("/generate", response_model=None)
    async def generate(body: GenerateBody) -> JSONResponse | StreamingResponse:
        if body.text is not None:
            prompts = body.text if isinstance(body.text, list) else [body.text]
        elif body.input_ids is not None:
            prompts = [" ".join(map(str, body.input_ids))]
        else:
            return _error(400, "either text or input_ids is required")
        started = time.time()
        if body.stream:
            refused = one_prompt(body, prompts)
            if refused is not None:
                return refused
            rid = body.rid or frontend.new_rid()
            tokens = body.sampling_params.max_new_tokens

            async def events() -> AsyncIterator[bytes]:
                # SGLang's /generate stream: the whole text so far in every event; the
                # last carries finish_reason (an abort's with its status), then [DONE].
                boot = bootstrap_of(body, 0)
                async for ids, end in stream_tokens(
                    frontend, prompts[0], tokens, rid, boot, "/generate"
                ):
                    reason = None
                    if isinstance(end, GenerateError):
                        reason = abort_reason(end)
                    elif isinstance(end, GenerateResult):
                        reason = {"type": "length", "length": len(ids)}
                    res = end if isinstance(end, GenerateResult) else None
                    yield _sse(
                        {
                            "text": detokenize(ids),
                            "output_ids": ids,
                            "meta_info": meta(rid, ids, prompts[0], started, boot, reason, res),
                        }
                    )
                yield SSE_DONE

            return StreamingResponse(events(), media_type="text/event-stream")
        try:
            done = await run_many(
                prompts, body.sampling_params.max_new_tokens, body.rid, body, "/generate"
            )
        except GenerateError as exc:
            return _error(exc.status, str(exc))
        items = [
            {
                "text": r.text,
                "output_ids": r.output_ids,
                "meta_info": meta(
                    r.rid, r.output_ids, p, started, b,
                    {"type": "length", "length": len(r.output_ids)}, r,
                ),
            }
            for (r, b), p in zip(done, prompts, strict=True)
        ]  # fmt: skip
        return JSONResponse(items if isinstance(body.text, list) else items[0])

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionBody) -> JSONResponse | StreamingResponse:
        prompts = body.prompt if isinstance(body.prompt, list) else [body.prompt]
        started = time.time()
        model = body.model or server.served_model_name
        if body.stream:
            refused = one_prompt(body, prompts)
            if refused is not None:
                return refused
            rid = frontend.new_rid()

            async def events() -> AsyncIterator[bytes]:
                # OpenAI chunks with the text delta; an abort with a status is SGLang's
                # error event (serving_completions: create_streaming_error_response).
                sent = 0
                async for ids, end in stream_tokens(
                    frontend, prompts[0], body.max_tokens, None, bootstrap_of(body, 0),
                    "/v1/completions",
                ):  # fmt: skip
                    if isinstance(end, GenerateError):
                        status = HTTPStatus(end.status)
                        yield _sse(
                            {
                                "error": {
                                    "object": "error",
                                    "message": str(end),
                                    "type": status.name,
                                    "param": None,
                                    "code": status.value,
                                }
                            }
                        )
                        break
                    delta = detokenize(ids[sent:])
                    sent = len(ids)
                    chunk = {
                        "id": rid,
                        "object": "text_completion",
                        "created": int(started),
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "text": delta,
                                "logprobs": None,
                                "finish_reason": "length" if end is not None else None,
                            }
                        ],
                    }
                    yield _sse(chunk)
                yield SSE_DONE

            return StreamingResponse(events(), media_type="text/event-stream")
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
                "model": model,
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
        if status == 200 and not probed_ok:
            probed_ok.append(True)
            timeline.mark(settings.runtime.state_dir, "probe_ok")
        # What ended requests still hold, read with every deep probe (ended_kv).
        return JSONResponse({**outcome, "kv": frontend.ended_kv().to_json()}, status_code=status)

    probed_ok: list[bool] = []  # the first deep probe that passed is a start-up milestone
    return app

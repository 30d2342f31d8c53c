"""Pod agent: a small HTTP server in every SGLang pod, leader or not.

The operator reads it when a group's deep probe fails, to tell a desync from a hang
from a dead rank, and to capture evidence before it restarts the group:

Every route but ``GET /healthz`` is the operator's: it needs the header
``Authorization: Bearer <token>``, where the token is ``LOCKSTEP_AGENT_TOKEN`` (put in the
pod by the operator from the deployment's Secret), compared in constant time. A missing or
wrong token is answered 401 (with ``WWW-Authenticate: Bearer``); an agent without a token
answers 403 on those routes (it serves nobody rather than everybody). Each route also has
a request budget (:data:`RATE_LIMITS`, a token bucket counting every request, refused ones
too, so guessing the token is throttled): over it, 429 with ``Retry-After``.

- ``GET /ranks``: the local ranks' state (schema in :mod:`lockstep_sglang.rank_state`)::

      {"schema": "lockstep.dev/rank-state/v1", "hostname": str, "pod": str | null,
       "epoch": str | null, "agent_pid": int, "now": float,
       "ranks": [RankState, ...], "previous": [RankState, ...]}

  ``pod`` echoes ``LOCKSTEP_POD_NAME``; ``epoch`` is the group epoch the container runs
  (the effective one, :func:`lockstep_sglang.config.effective_epoch`: after an in-place
  restart, the epoch it was restarted into, not the pod's ``LOCKSTEP_GROUP_EPOCH``).

  ``previous_epoch`` is the group epoch that incarnation ran (None: unknown): after an
  in-place restart it is the old epoch, whose failure is not the new epoch's.
  ``previous`` holds the ranks of the last incarnation of this container (archived by
  the launcher at start), so a crash's evidence survives the restart it caused.
  ``engine_exit`` (``previous_engine_exit``): how the SGLang server process of this
  (the last) incarnation ended, written by the launcher (schema
  :class:`lockstep_sglang.rank_state.EngineExitJSON`); None while it runs.
- ``POST /stacks`` (optional JSON body ``{"timeout_s": float, "native": bool}``):
  ``py-spy dump`` of every live local rank, run concurrently, each bounded by
  ``timeout_s`` (default 10, at most 30; a rank in uninterruptible sleep, which py-spy
  cannot pause, is read without pausing it); one dump at a time (429 while busy)::

      {"now": float, "stacks": [{"rank": int, "pid": int, "ok": bool,
        "duration_s": float, "stack": str, "error": str | null}, ...]}

- ``GET /healthz``: ``{"ok": true}``.
- ``POST /restart`` (JSON body
  ``{"epoch": "<new group epoch, decimal string>", "reason": "<free text, optional>"}``):
  the operator's in-place group restart. Answers, checked in this order; nothing
  changes unless the answer is 202:

  - 429 ``{"error"}``: over the route's request budget;
  - 403 ``{"error"}``: restart is disabled in this pod (no token configured, or an agent
    that was not told the container's main process);
  - 401 ``{"error"}``: missing or wrong token (with ``WWW-Authenticate: Bearer``);
  - 400 ``{"error": "<field>: ..."}``: a body that is not a JSON object, a bad ``epoch``
    or a ``reason`` that is not a string;
  - 200 ``{"restarting": false, "epoch": E, "reason": "already running epoch E"}`` or
    ``"already restarting into epoch E"``: idempotent, nothing is done again;
  - 409 ``{"error", "epoch": E, "running_epoch": P, "pending_epoch": Q | null}``: ``E`` is
    older than the running epoch, or a restart into another epoch is already underway;
  - 500 ``{"error"}``: the new epoch could not be persisted;
  - 202 ``{"restarting": true, "epoch": E, "previous_epoch": P | null}``: the new epoch
    is in ``<state_dir>/epoch`` (written atomically and fsynced before the answer); once
    the answer is sent (``Connection: close``), every local rank process and the
    container's main process end at once: the ranks by ``SIGKILL`` (they may be wedged
    in a collective), the main process with exit status 75 (``EX_TEMPFAIL``,
    :data:`RESTART_EXIT_CODE`), so ``restartPolicy: Always`` restarts the container in
    place (same pod, same IP) and the next start runs epoch ``E`` on its rendezvous port
    (:func:`lockstep_sglang.config.resolve_epoch`).

  How the processes end depends on where the agent runs. As its own process (the image:
  ``lockstep-sglang`` starts it with ``--main-pid <its pid>`` and ``--epoch``), it
  stops (``SIGSTOP``) then kills (``SIGKILL``) every descendant of the main process and
  every live rank of the state dir, sends the main process :data:`RESTART_SIGNAL` (the
  launcher exits 75 on it; a signal without a handler cannot reach a container's PID 1,
  not even ``SIGKILL``), kills it after :data:`MAIN_EXIT_GRACE_S` unless it is PID 1, and
  exits 75 itself. Inside another process (the CPU stand-in runs it on a thread) that
  process passes its own ``restart`` action.

It imports neither torch nor SGLang, so it starts in well under a second, and it runs as
its own process (``python -m lockstep_sglang.agent``), so it keeps answering while the
ranks are wedged. HTTP comes from the standard library (``http.server``): the agent needs
five routes and no dependencies, and FastAPI/uvicorn would cost seconds of import and an
event loop that a wedged interpreter could not serve anyway. Routes are a table
(:meth:`PodAgent.add_route`); a handler may queue work to run after its answer is sent
(:attr:`AgentRequest.after_response`), which is how ``/restart`` answers before it ends
the processes.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import parse_qs, urlsplit

from lockstep_sglang.config import (
    AGENT_HOST_ENV,
    AGENT_PORT_ENV,
    DEFAULT_AGENT_HOST,
    DEFAULT_AGENT_PORT,
    effective_epoch,
    parse_epoch,
    write_epoch_file,
)
from lockstep_sglang.rank_state import (
    PREVIOUS_SUBDIR,
    SCHEMA,
    EngineExitJSON,
    RankStateJSON,
    previous_epoch,
    process_state,
    read_engine_exit,
    read_rank_states,
    state_dir_from_env,
)

logger = logging.getLogger(__name__)

POD_NAME_ENV = "LOCKSTEP_POD_NAME"
TOKEN_ENV = "LOCKSTEP_AGENT_TOKEN"
DEFAULT_STACK_TIMEOUT_S = 10.0
MAX_STACK_TIMEOUT_S = 30.0
MAX_BODY_BYTES = 64 * 1024
MAX_REASON_CHARS = 1000
RESTART_EXIT_CODE = 75  # EX_TEMPFAIL: "restarted in place by lockstep; start me again"
# What the agent sends the container's main process on a restart: the launcher's handler
# exits at once. SGLang handles SIGTERM, SIGQUIT and SIGCHLD; it leaves SIGUSR2 alone.
RESTART_SIGNAL = signal.SIGUSR2
MAIN_EXIT_GRACE_S = 2.0

RATE_LIMITS: dict[str, tuple[float, float]] = {
    "/ranks": (10.0, 20.0),
    "/stacks": (0.2, 2.0),
    "/restart": (2.0, 10.0),
}
"""Request budget per guarded route: (requests per second, burst). The operator reads
``/ranks`` a few times per failed probe and incident, ``/stacks`` once per incident, and
``/restart`` once per epoch; a client over the budget gets 429 with ``Retry-After``."""


class TokenBucket:
    """A token bucket: ``rate`` requests per second on average, ``burst`` at once."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = burst
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """0.0 when a request may go now (and count it), else seconds until one may."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            return (1.0 - self._tokens) / self.rate


class RanksResponse(TypedDict):
    """Body of ``GET /ranks``."""

    schema: str
    hostname: str
    pod: str | None
    epoch: str | None
    agent_pid: int
    now: float
    ranks: list[RankStateJSON]
    previous: list[RankStateJSON]
    previous_epoch: str | None
    engine_exit: EngineExitJSON | None
    previous_engine_exit: EngineExitJSON | None


class StackJSON(TypedDict):
    """One rank's stack dump."""

    rank: int
    pid: int
    ok: bool
    duration_s: float
    stack: str
    error: str | None


class StacksResponse(TypedDict):
    """Body of ``POST /stacks``."""

    now: float
    stacks: list[StackJSON]


@dataclass(frozen=True)
class RestartOrder:
    """An accepted ``POST /restart``: what the restart action gets."""

    epoch: str
    previous_epoch: str | None
    reason: str


RestartAction = Callable[[RestartOrder], None]


@dataclass(frozen=True)
class AgentRequest:
    """What a route handler gets."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]  # names in lower case
    body: bytes
    # Run, in order, once the answer is sent (``Connection: close``), even if the
    # client went away: work that must not delay or lose the answer.
    after_response: list[Callable[[], None]] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        """The body as a JSON object (empty body: ``{}``); ``ValueError`` otherwise."""
        if not self.body.strip():
            return {}
        try:
            value = json.loads(self.body)
        except ValueError:
            raise ValueError("body: not valid JSON") from None
        if not isinstance(value, dict):
            raise ValueError("body: must be a JSON object")
        return value


Handler = Callable[[AgentRequest], tuple[int, Any]]


def find_py_spy() -> str | None:
    """``py-spy`` beside an injected runtime (``<root>/bin``, see
    :mod:`lockstep_sglang.install`), next to this interpreter (a venv) or on ``PATH``."""
    for beside in (
        Path(__file__).resolve().parent.parent / "bin" / "py-spy",
        Path(sys.executable).with_name("py-spy"),
    ):
        if beside.exists():
            return str(beside)
    return shutil.which("py-spy")


class PodAgent:
    """Serves the local ranks' state and stacks, and restarts them; see the module docstring.

    ``epoch``: the group epoch the container runs (default: the effective one, from
    ``state_dir`` and ``environ``). ``restart``: what an accepted ``POST /restart`` does
    once answered (None: restart disabled, 403). ``token``: the bearer token every route
    but ``/healthz`` requires (default ``LOCKSTEP_AGENT_TOKEN`` from ``environ``; empty:
    those routes answer 403). ``rate_limits``: per-path (rate, burst), default
    :data:`RATE_LIMITS`; ``monotonic`` is their clock.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        py_spy: str | None = None,
        clock: Callable[[], float] = time.time,
        epoch: str | None = None,
        restart: RestartAction | None = None,
        token: str | None = None,
        environ: Mapping[str, str] | None = None,
        rate_limits: Mapping[str, tuple[float, float]] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        self.state_dir = state_dir
        self.py_spy = py_spy if py_spy is not None else find_py_spy()
        self._clock = clock
        self._stacks_busy = threading.Lock()
        self.pod_name = env.get(POD_NAME_ENV) or None
        self.epoch = epoch if epoch is not None else effective_epoch(state_dir, env)
        self._restart = restart
        self._token = (token if token is not None else env.get(TOKEN_ENV, "")).strip()
        self._buckets = {
            path: TokenBucket(rate, burst, monotonic)
            for path, (rate, burst) in (RATE_LIMITS if rate_limits is None else rate_limits).items()
        }
        self._restart_lock = threading.Lock()
        self.pending_epoch: int | None = None  # an accepted restart not yet carried out
        self.routes: dict[tuple[str, str], Handler] = {}
        self.add_route("GET", "/ranks", self._guarded(lambda _req: (200, self.ranks())))
        self.add_route("POST", "/stacks", self._guarded(self._handle_stacks))
        self.add_route("GET", "/healthz", lambda _req: (200, {"ok": True}))
        self.add_route("POST", "/restart", self._handle_restart)

    @property
    def restart_enabled(self) -> bool:
        """Whether ``POST /restart`` can be accepted (a token and a restart action)."""
        return bool(self._token) and self._restart is not None

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        """Register ``handler`` for ``method path`` (replaces an existing one)."""
        self.routes[(method.upper(), path)] = handler

    def ranks(self) -> RanksResponse:
        """The local ranks' state and the previous incarnation's."""
        return {
            "schema": SCHEMA,
            "hostname": socket.gethostname(),
            # Set by the operator's pod template: lets it discard an answer from a pod
            # of another group epoch.
            "pod": self.pod_name,
            "epoch": self.epoch,
            "agent_pid": os.getpid(),
            "now": self._clock(),
            "ranks": read_rank_states(self.state_dir),
            "previous": read_rank_states(self.state_dir / PREVIOUS_SUBDIR),
            "previous_epoch": previous_epoch(self.state_dir),
            "engine_exit": read_engine_exit(self.state_dir),
            "previous_engine_exit": read_engine_exit(self.state_dir / PREVIOUS_SUBDIR),
        }

    def stacks(
        self, timeout_s: float = DEFAULT_STACK_TIMEOUT_S, native: bool = False
    ) -> StacksResponse:
        """``py-spy dump`` of every live local rank, concurrently, each within ``timeout_s``."""
        timeout_s = min(max(timeout_s, 0.1), MAX_STACK_TIMEOUT_S)
        targets = [s for s in read_rank_states(self.state_dir) if s["alive"]]
        if not targets:
            return {"now": self._clock(), "stacks": []}
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            dumps = list(
                pool.map(lambda s: self._dump(s["rank"], s["pid"], timeout_s, native), targets)
            )
        return {"now": self._clock(), "stacks": dumps}

    def _dump(self, rank: int, pid: int, timeout_s: float, native: bool) -> StackJSON:
        start = time.perf_counter()
        if self.py_spy is None:
            return {"rank": rank, "pid": pid, "ok": False, "duration_s": 0.0, "stack": "",
                    "error": "py-spy not found"}  # fmt: skip
        cmd = [self.py_spy, "dump", "--pid", str(pid)]
        if native:
            cmd.append("--native")
        if process_state(pid) == "uninterruptible":
            # py-spy pauses its target first, and a process in D (inside a driver call)
            # cannot be paused: the dump would wait out its whole timeout. Read it as it
            # runs instead (it is not running anyway).
            cmd.append("--nonblocking")
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
            return {"rank": rank, "pid": pid, "ok": False,
                    "duration_s": round(time.perf_counter() - start, 3), "stack": out,
                    "error": f"py-spy took longer than {timeout_s:g}s"}  # fmt: skip
        except OSError as exc:
            return {"rank": rank, "pid": pid, "ok": False, "duration_s": 0.0, "stack": "",
                    "error": f"py-spy failed to start: {exc}"}  # fmt: skip
        ok = done.returncode == 0
        return {
            "rank": rank,
            "pid": pid,
            "ok": ok,
            "duration_s": round(time.perf_counter() - start, 3),
            "stack": done.stdout,
            "error": None if ok else (done.stderr.strip()[-2000:] or f"exit {done.returncode}"),
        }

    def _handle_stacks(self, req: AgentRequest) -> tuple[int, Any]:
        body = req.json()
        timeout_s = float(body.get("timeout_s", DEFAULT_STACK_TIMEOUT_S))
        native = bool(body.get("native", False))
        # py-spy pauses its target; overlapping dumps would only stretch the pauses.
        if not self._stacks_busy.acquire(blocking=False):
            return 429, {"error": "a stack dump is already running"}
        try:
            return 200, self.stacks(timeout_s, native)
        finally:
            self._stacks_busy.release()

    def _guarded(self, handler: Handler) -> Handler:
        """``handler`` behind the token (403 without one configured, 401 on a missing or
        wrong one)."""

        def guarded(req: AgentRequest) -> tuple[int, Any]:
            if not self._token:
                return 403, {"error": f"disabled: {TOKEN_ENV} is not set in this pod"}
            if not self._authorized(req.headers.get("authorization", "")):
                return 401, {"error": "missing or wrong bearer token"}
            return handler(req)

        return guarded

    def _authorized(self, header: str) -> bool:
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(credentials.strip().encode(), self._token.encode())

    def _handle_restart(self, req: AgentRequest) -> tuple[int, Any]:
        if not self._token:
            return 403, {"error": f"restart is disabled: {TOKEN_ENV} is not set in this pod"}
        if self._restart is None:
            return 403, {
                "error": "restart is disabled: this agent does not know the container's "
                "main process (start it with --main-pid)"
            }
        if not self._authorized(req.headers.get("authorization", "")):
            return 401, {"error": "missing or wrong bearer token"}
        body = req.json()
        try:
            epoch = parse_epoch(body.get("epoch"))
        except ValueError as exc:
            raise ValueError(f"epoch: {exc}") from None
        reason = body.get("reason", "")
        if not isinstance(reason, str):
            raise ValueError(f"reason: must be a string, got {type(reason).__name__}")
        reason = reason[:MAX_REASON_CHARS]
        running = self.epoch
        try:
            running_n = None if running is None else parse_epoch(running)
        except ValueError:  # a malformed env epoch: nothing to compare with
            running_n = None
        with self._restart_lock:
            if running_n == epoch:
                return 200, {"restarting": False, "epoch": str(epoch),
                             "reason": f"already running epoch {epoch}"}  # fmt: skip
            if self.pending_epoch == epoch:
                return 200, {"restarting": False, "epoch": str(epoch),
                             "reason": f"already restarting into epoch {epoch}"}  # fmt: skip
            conflict = None
            if self.pending_epoch is not None:
                conflict = f"a restart into epoch {self.pending_epoch} is already underway"
            elif running_n is not None and epoch < running_n:
                conflict = f"epoch {epoch} is older than the running epoch {running}"
            if conflict is not None:
                pending = None if self.pending_epoch is None else str(self.pending_epoch)
                return 409, {"error": conflict, "epoch": str(epoch), "running_epoch": running,
                             "pending_epoch": pending}  # fmt: skip
            try:
                write_epoch_file(self.state_dir, epoch)
            except OSError as exc:
                logger.error("lockstep agent: cannot persist epoch %d: %s", epoch, exc)
                return 500, {"error": f"cannot persist epoch {epoch}: {exc}"}
            self.pending_epoch = epoch
        order = RestartOrder(epoch=str(epoch), previous_epoch=running, reason=reason)
        logger.warning(
            "restart in place accepted: epoch %s -> %d (%s)", running, epoch, reason or "-"
        )
        restart = self._restart
        req.after_response.append(lambda: restart(order))
        return 202, {"restarting": True, "epoch": str(epoch), "previous_epoch": running}

    def handle(self, req: AgentRequest) -> tuple[int, Any]:
        """Route one request; errors become JSON bodies with a status."""
        handler = self.routes.get((req.method, req.path))
        if handler is None:
            if any(path == req.path for _, path in self.routes):
                return 405, {"error": f"{req.method} not allowed on {req.path}"}
            return 404, {"error": f"no route {req.path}"}
        bucket = self._buckets.get(req.path)
        wait = bucket.take() if bucket is not None else 0.0
        if wait > 0:
            return 429, {
                "error": f"too many requests to {req.path}: try again in {wait:.1f}s",
                "retry_after_s": round(wait, 3),
            }
        try:
            return handler(req)
        except ValueError as exc:
            return 400, {"error": str(exc)}

    def make_server(
        self, host: str = DEFAULT_AGENT_HOST, port: int = DEFAULT_AGENT_PORT
    ) -> ThreadingHTTPServer:
        """An HTTP server bound to ``host:port`` (port 0: any free port)."""
        agent = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    self._reply(413, {"error": "body too large"})
                    return
                body = self.rfile.read(length) if length else b""
                req = AgentRequest(
                    method=self.command,
                    path=url.path,
                    query=parse_qs(url.query),
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                )
                try:
                    status, payload = agent.handle(req)
                except Exception as exc:  # never let one request kill the agent
                    logger.exception("lockstep agent: %s %s failed", self.command, url.path)
                    status, payload = 500, {"error": f"{type(exc).__name__}: {exc}"}
                if not req.after_response:
                    self._reply(status, payload)
                    return
                try:
                    self._reply(status, payload, close=True)
                    self.wfile.flush()
                    # FIN now: the answer reaches the client even if the process ends.
                    self.connection.shutdown(socket.SHUT_WR)
                except OSError as exc:
                    logger.warning("lockstep agent: answer to %s not delivered: %s", url.path, exc)
                for work in req.after_response:
                    try:
                        work()
                    except Exception:
                        logger.exception("lockstep agent: work after %s failed", url.path)

            def _reply(self, status: int, payload: Any, *, close: bool = False) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status, HTTPStatus(status).phrase)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == HTTPStatus.UNAUTHORIZED:
                    self.send_header("WWW-Authenticate", 'Bearer realm="lockstep-agent"')
                if status == HTTPStatus.TOO_MANY_REQUESTS and isinstance(payload, dict):
                    wait = float(payload.get("retry_after_s", 1.0))
                    self.send_header("Retry-After", str(max(1, math.ceil(wait))))
                if close:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(data)

            do_GET = _serve
            do_POST = _serve

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("lockstep agent: " + format, *args)

        server = ThreadingHTTPServer((host, port), _Handler)
        server.daemon_threads = True
        return server

    def serve_in_thread(
        self, host: str = DEFAULT_AGENT_HOST, port: int = DEFAULT_AGENT_PORT
    ) -> tuple[ThreadingHTTPServer, threading.Thread]:
        """Start serving on a daemon thread; ``server.shutdown()`` stops it."""
        server = self.make_server(host, port)
        thread = threading.Thread(target=server.serve_forever, name="lockstep-agent", daemon=True)
        thread.start()
        return server, thread


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    fields = stat.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 else None


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (from ``/proc``; empty when ``root`` is gone)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = _parent_pid(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _gone(pid: int) -> bool:
    """The process ended (absent, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def kill_pod_processes(
    main_pid: int, rank_pids: Sequence[int], *, spare: Collection[int]
) -> list[int]:
    """``SIGKILL`` every descendant of ``main_pid`` and every pid of ``rank_pids``.

    They are stopped (``SIGSTOP``) first, walking the tree again until it holds no new
    process, so none can fork a survivor between the walk and the kill. ``spare`` (the
    caller, the agent) and ``main_pid`` are left alone. Returns the pids killed.
    """
    stopped: set[int] = set()
    for _ in range(5):
        fresh = (descendants(main_pid) | set(rank_pids)) - stopped - {*spare, main_pid}
        if not fresh:
            break
        for pid in fresh:
            _signal(pid, signal.SIGSTOP)
        stopped |= fresh
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    return sorted(stopped)


def process_restart(main_pid: int, state_dir: Path) -> RestartAction:
    """The restart action of an agent that runs as its own process (the image's).

    Ends the ranks and the rest of the main process's tree at once, then the main
    process (:data:`RESTART_SIGNAL`, then ``SIGKILL`` unless it is PID 1), then itself.
    """

    def restart(order: RestartOrder) -> None:
        try:
            ranks = [s["pid"] for s in read_rank_states(state_dir) if s["alive"]]
            killed = kill_pod_processes(main_pid, ranks, spare=[os.getpid()])
            logger.warning(
                "restart into epoch %s: killed %s; ending main process %d",
                order.epoch, killed, main_pid,
            )  # fmt: skip
            _signal(main_pid, RESTART_SIGNAL)
            deadline = time.monotonic() + MAIN_EXIT_GRACE_S
            while not _gone(main_pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if not _gone(main_pid):
                # PID 1 of a container ignores SIGKILL from inside it: nothing more to do
                # here; the operator sees the container not return and recreates the pod.
                logger.error("main process %d did not exit on %s", main_pid, RESTART_SIGNAL.name)
                if main_pid != 1:
                    _signal(main_pid, signal.SIGKILL)
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(RESTART_EXIT_CODE)

    return restart


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lockstep_sglang.agent``: serve until killed."""
    parser = argparse.ArgumentParser(prog="lockstep-agent", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=os.environ.get(AGENT_HOST_ENV, DEFAULT_AGENT_HOST))
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get(AGENT_PORT_ENV, DEFAULT_AGENT_PORT))
    )
    parser.add_argument("--state-dir", type=Path, default=state_dir_from_env())
    parser.add_argument(
        "--py-spy", default=None, help="path of py-spy (default: beside python, or PATH)"
    )
    parser.add_argument(
        "--epoch", default=None, help="the group epoch the container runs (default: effective)"
    )
    parser.add_argument(
        "--main-pid",
        type=int,
        default=None,
        help="the container's main process, ended with its tree by POST /restart "
        "(default: none, restart disabled)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s lockstep-agent %(levelname)s %(message)s"
    )
    restart = None if args.main_pid is None else process_restart(args.main_pid, args.state_dir)
    agent = PodAgent(args.state_dir, py_spy=args.py_spy, epoch=args.epoch, restart=restart)
    server = agent.make_server(args.host, args.port)
    logger.info(
        "serving rank state of %s on %s:%d (epoch %s, restart %s)",
        args.state_dir, args.host, server.server_address[1], agent.epoch,
        "on" if agent.restart_enabled else "off",
    )  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

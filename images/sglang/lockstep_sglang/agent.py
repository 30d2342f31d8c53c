"""Pod agent: a small HTTP server in every SGLang pod, leader or not.

The operator reads it when a group's deep probe fails, to tell a desync from a hang
from a dead rank, and to capture evidence before it restarts the group:

- ``GET /ranks``: the local ranks' state (schema in :mod:`lockstep_sglang.rank_state`)::

      {"schema": "lockstep.dev/rank-state/v1", "hostname": str, "pod": str | null,
       "epoch": str | null, "agent_pid": int, "now": float,
       "ranks": [RankState, ...], "previous": [RankState, ...]}

  ``pod`` and ``epoch`` echo ``LOCKSTEP_POD_NAME`` and ``LOCKSTEP_GROUP_EPOCH``.

  ``previous`` holds the ranks of the last incarnation of this container (archived by
  the launcher at start), so a crash's evidence survives the restart it caused.
- ``POST /stacks`` (optional JSON body ``{"timeout_s": float, "native": bool}``):
  ``py-spy dump`` of every live local rank, run concurrently, each bounded by
  ``timeout_s`` (default 10, at most 30); one dump at a time (429 while busy)::

      {"now": float, "stacks": [{"rank": int, "pid": int, "ok": bool,
        "duration_s": float, "stack": str, "error": str | null}, ...]}

- ``GET /healthz``: ``{"ok": true}``.

It imports neither torch nor SGLang, so it starts in well under a second, and it runs as
its own process (``python -m lockstep_sglang.agent``), so it keeps answering while the
ranks are wedged. HTTP comes from the standard library (``http.server``): the agent needs
four routes and no dependencies, and FastAPI/uvicorn would cost seconds of import and an
event loop that a wedged interpreter could not serve anyway. Routes are a table
(:meth:`PodAgent.add_route`) so that later ones (an authenticated restart) plug in.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import parse_qs, urlsplit

from lockstep_sglang.rank_state import (
    PREVIOUS_SUBDIR,
    SCHEMA,
    RankStateJSON,
    read_rank_states,
    state_dir_from_env,
)

logger = logging.getLogger(__name__)

PORT_ENV = "LOCKSTEP_AGENT_PORT"
POD_NAME_ENV = "LOCKSTEP_POD_NAME"
EPOCH_ENV = "LOCKSTEP_GROUP_EPOCH"
HOST_ENV = "LOCKSTEP_AGENT_HOST"
DEFAULT_PORT = 8790
DEFAULT_HOST = "0.0.0.0"
DEFAULT_STACK_TIMEOUT_S = 10.0
MAX_STACK_TIMEOUT_S = 30.0
MAX_BODY_BYTES = 64 * 1024


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
class AgentRequest:
    """What a route handler gets."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        """The body as a JSON object (empty body: ``{}``)."""
        if not self.body.strip():
            return {}
        value = json.loads(self.body)
        if not isinstance(value, dict):
            raise ValueError("body must be a JSON object")
        return value


Handler = Callable[[AgentRequest], tuple[int, Any]]


def find_py_spy() -> str | None:
    """``py-spy`` next to this interpreter (a venv) or on ``PATH``."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


class PodAgent:
    """Serves the local ranks' state and stacks; see the module docstring."""

    def __init__(
        self,
        state_dir: Path,
        *,
        py_spy: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state_dir = state_dir
        self.py_spy = py_spy if py_spy is not None else find_py_spy()
        self._clock = clock
        self._stacks_busy = threading.Lock()
        self.routes: dict[tuple[str, str], Handler] = {}
        self.add_route("GET", "/ranks", lambda _req: (200, self.ranks()))
        self.add_route("POST", "/stacks", self._handle_stacks)
        self.add_route("GET", "/healthz", lambda _req: (200, {"ok": True}))

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
            "pod": os.environ.get(POD_NAME_ENV) or None,
            "epoch": os.environ.get(EPOCH_ENV) or None,
            "agent_pid": os.getpid(),
            "now": self._clock(),
            "ranks": read_rank_states(self.state_dir),
            "previous": read_rank_states(self.state_dir / PREVIOUS_SUBDIR),
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

    def handle(self, req: AgentRequest) -> tuple[int, Any]:
        """Route one request; errors become JSON bodies with a status."""
        handler = self.routes.get((req.method, req.path))
        if handler is None:
            if any(path == req.path for _, path in self.routes):
                return 405, {"error": f"{req.method} not allowed on {req.path}"}
            return 404, {"error": f"no route {req.path}"}
        try:
            return handler(req)
        except ValueError as exc:
            return 400, {"error": str(exc)}

    def make_server(
        self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT
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
                self._reply(status, payload)

            def _reply(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status, HTTPStatus(status).phrase)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
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
        self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT
    ) -> tuple[ThreadingHTTPServer, threading.Thread]:
        """Start serving on a daemon thread; ``server.shutdown()`` stops it."""
        server = self.make_server(host, port)
        thread = threading.Thread(target=server.serve_forever, name="lockstep-agent", daemon=True)
        thread.start()
        return server, thread


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lockstep_sglang.agent``: serve until killed."""
    parser = argparse.ArgumentParser(prog="lockstep-agent", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=os.environ.get(HOST_ENV, DEFAULT_HOST))
    parser.add_argument("--port", type=int, default=int(os.environ.get(PORT_ENV, DEFAULT_PORT)))
    parser.add_argument("--state-dir", type=Path, default=state_dir_from_env())
    parser.add_argument(
        "--py-spy", default=None, help="path of py-spy (default: beside python, or PATH)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s lockstep-agent %(levelname)s %(message)s"
    )
    agent = PodAgent(args.state_dir, py_spy=args.py_spy)
    server = agent.make_server(args.host, args.port)
    logger.info(
        "serving rank state of %s on %s:%d", args.state_dir, args.host, server.server_address[1]
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The stand-in's prefill -> decode KV hand-off, shaped like SGLang's PD transfer.

In SGLang's PD mode the router sends one request to a prefill and a decode server at
once, both carrying ``bootstrap_host``/``bootstrap_port`` (the prefill server's bootstrap
endpoint) and ``bootstrap_room`` (a random id of this request). The prefill server runs
the prompt and hands the KV cache over for that room; the decode server waits for it and
then generates. So a request succeeds only when both sides are healthy.

Here the "KV cache" is a small record (:class:`KVHandoff`: a digest of the prompt and
the first token, which the prefill group computed); the prefill pod's main process
publishes it in a :class:`KVStore` served by :class:`BootstrapServer` on
``<pod IP>:--disaggregation-bootstrap-port``, and the decode pod fetches it with
:func:`fetch_handoff` (a long poll, bounded by the request's deadline) and checks that
it belongs to its prompt before decoding. The server is the standard library's
threading HTTP server: one GET route, nothing to gain from more.

As in SGLang, each side waits for the other (the prefill's request holds its KV until the
decode took it, up to ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT``; the decode's waits for
the KV up to ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``, and gives up on a prefill whose
bootstrap server stopped answering after ``SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE``
failed checks ``SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL`` apart): :class:`PDTimeouts`
reads SGLang's variables with SGLang 0.5.23's defaults, so a half whose peer broke waits
here exactly as long as it would on the real engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx

logger = logging.getLogger("lockstep_standin.kv")

KV_ROUTE = "/lockstep/kv/"
BOOTSTRAP_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
WAITING_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"
HEARTBEAT_INTERVAL_ENV = "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"
HEARTBEAT_MAX_FAILURE_ENV = "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"
# One long poll of the decode for its KV (the prefill's bootstrap server answers 404
# after it; the decode then polls again until its waiting timeout).
POLL_SLICE_S = 5.0
MAX_ROOMS = 4096  # hand-offs kept for decode servers that have not fetched them yet
ROOM_TTL_S = 120.0
MAX_WAIT_S = 60.0


def prompt_digest(prompt: str) -> str:
    """What ties a hand-off to its prompt."""
    return hashlib.blake2b(prompt.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class KVHandoff:
    """What a prefill pod hands over for one bootstrap room."""

    room: int
    digest: str
    first_token: int
    prefill_pod: str | None
    made_at: float


@dataclass(frozen=True)
class PDTimeouts:
    """SGLang 0.5.23's PD waits (``sglang.srt.environ``), read from the same variables."""

    bootstrap_s: float = 300.0
    waiting_s: float = 300.0
    heartbeat_interval_s: float = 5.0
    heartbeat_max_failures: int = 2

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> PDTimeouts:
        import os

        e = dict(os.environ) if env is None else env

        def num(name: str, default: float) -> float:
            raw = e.get(name, "").strip()
            try:
                return float(raw) if raw else default
            except ValueError:
                raise ValueError(f"{name} must be a number, got {raw!r}") from None

        # SGLang floors the heartbeat at 2 s and the failures at 1 (mooncake/conn.py).
        return cls(
            bootstrap_s=num(BOOTSTRAP_TIMEOUT_ENV, cls.bootstrap_s),
            waiting_s=num(WAITING_TIMEOUT_ENV, cls.waiting_s),
            heartbeat_interval_s=max(num(HEARTBEAT_INTERVAL_ENV, cls.heartbeat_interval_s), 2.0),
            heartbeat_max_failures=max(
                int(num(HEARTBEAT_MAX_FAILURE_ENV, cls.heartbeat_max_failures)), 1
            ),
        )


class KVError(Exception):
    """The hand-off did not arrive (the prefill side is down, wedged or too slow)."""


class KVStore:
    """Hand-offs by room, bounded in number and age; `wait` blocks until one arrives and
    marks it taken (the prefill side holds it until then: :meth:`taken`)."""

    def __init__(self) -> None:
        self._rooms: OrderedDict[int, KVHandoff] = OrderedDict()
        self._taken: set[int] = set()
        self._changed = threading.Condition()

    def publish(self, handoff: KVHandoff) -> None:
        with self._changed:
            self._rooms[handoff.room] = handoff
            self._rooms.move_to_end(handoff.room)
            horizon = time.time() - ROOM_TTL_S
            while self._rooms and (
                len(self._rooms) > MAX_ROOMS or next(iter(self._rooms.values())).made_at < horizon
            ):
                gone, _ = self._rooms.popitem(last=False)
                self._taken.discard(gone)
            self._changed.notify_all()

    def taken(self, room: int) -> bool:
        """Whether the decode side fetched the hand-off of ``room``."""
        with self._changed:
            return room in self._taken

    def discard(self, room: int) -> None:
        """Forget ``room`` (its prefill request ended): the KV it held is free."""
        with self._changed:
            self._rooms.pop(room, None)
            self._taken.discard(room)
            self._changed.notify_all()

    def wait(self, room: int, timeout_s: float) -> KVHandoff | None:
        """The hand-off of ``room``, waiting up to ``timeout_s`` for it."""
        deadline = time.monotonic() + min(timeout_s, MAX_WAIT_S)
        with self._changed:
            while True:
                found = self._rooms.get(room)
                left = deadline - time.monotonic()
                if found is not None:
                    self._taken.add(room)
                    self._changed.notify_all()
                    return found
                if left <= 0:
                    return None
                self._changed.wait(left)


class BootstrapServer:
    """``GET /lockstep/kv/<room>?timeout=s`` on the prefill pod's bootstrap port: 200 with
    the hand-off, 404 when none arrived in time; ``GET /health`` 200. While ``down()``
    (the drills' ``bootstrap-down``) it closes every connection without an answer."""

    def __init__(
        self, store: KVStore, host: str, port: int, down: Callable[[], bool] = lambda: False
    ) -> None:
        self.store = store

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if down():
                    self.close_connection = True
                    return
                url = urlsplit(self.path)
                if url.path == "/health":
                    self._send(200, {})
                    return
                if not url.path.startswith(KV_ROUTE):
                    self._send(404, {"error": "no such route"})
                    return
                try:
                    room = int(url.path[len(KV_ROUTE) :])
                    timeout_s = float(parse_qs(url.query).get("timeout", ["5"])[0])
                except ValueError:
                    self._send(400, {"error": "room must be an integer, timeout seconds"})
                    return
                found = store.wait(room, timeout_s)
                if found is None:
                    self._send(404, {"error": f"no KV for room {room} within {timeout_s:g}s"})
                else:
                    self._send(200, asdict(found))

            def _send(self, status: int, body: object) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def serve_in_thread(self) -> None:
        threading.Thread(
            target=self._server.serve_forever, name="standin-bootstrap", daemon=True
        ).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


async def fetch_handoff(
    client: httpx.AsyncClient,
    host: str,
    port: int,
    room: int,
    prompt: str,
    timeouts: PDTimeouts,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> KVHandoff:
    """The prefill side's hand-off for ``room``, checked against ``prompt``, as an SGLang
    decode waits for its KV: up to ``timeouts.waiting_s``, giving up early on a prefill
    whose bootstrap server failed ``heartbeat_max_failures`` checks in a row
    (``heartbeat_interval_s`` apart). ``KVError`` otherwise."""
    url = f"http://{host}:{port}{KV_ROUTE}{room}"
    deadline = time.monotonic() + timeouts.waiting_s
    failures = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise KVError(
                f"KV of room {room} from {host}:{port} timed out after "
                f"{timeouts.waiting_s:g}s in WaitingForInput"
            )
        wait_s = min(left, POLL_SLICE_S)
        try:
            response = await client.get(
                url, params={"timeout": f"{wait_s:g}"}, timeout=wait_s + 2.0
            )
        except httpx.HTTPError as exc:
            failures += 1
            if failures >= timeouts.heartbeat_max_failures:
                raise KVError(
                    f"Lost connection with prefill instance (bootstrap_addr: {host}:{port}) "
                    f"for room {room}: {type(exc).__name__} {exc}".rstrip()
                ) from exc
            await sleep(min(timeouts.heartbeat_interval_s, max(0.0, left)))
            continue
        failures = 0
        if response.status_code == 404:
            continue  # not handed over yet: poll again
        if response.status_code != 200:
            raise KVError(f"KV of room {room} from {host}:{port}: HTTP {response.status_code}")
        try:
            handoff = KVHandoff(**response.json())
        except (TypeError, ValueError) as exc:
            raise KVError(f"KV of room {room} from {host}:{port} is malformed") from exc
        if handoff.digest != prompt_digest(prompt):
            raise KVError(f"KV of room {room} belongs to another prompt")
        return handoff

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
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx

logger = logging.getLogger("lockstep_sglang.standin.kv")

KV_ROUTE = "/lockstep/kv/"
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


class KVError(Exception):
    """The hand-off did not arrive (the prefill side is down, wedged or too slow)."""


class KVStore:
    """Hand-offs by room, bounded in number and age; `wait` blocks until one arrives."""

    def __init__(self) -> None:
        self._rooms: OrderedDict[int, KVHandoff] = OrderedDict()
        self._changed = threading.Condition()

    def publish(self, handoff: KVHandoff) -> None:
        with self._changed:
            self._rooms[handoff.room] = handoff
            self._rooms.move_to_end(handoff.room)
            horizon = time.time() - ROOM_TTL_S
            while self._rooms and (
                len(self._rooms) > MAX_ROOMS or next(iter(self._rooms.values())).made_at < horizon
            ):
                self._rooms.popitem(last=False)
            self._changed.notify_all()

    def wait(self, room: int, timeout_s: float) -> KVHandoff | None:
        """The hand-off of ``room``, waiting up to ``timeout_s`` for it."""
        deadline = time.monotonic() + min(timeout_s, MAX_WAIT_S)
        with self._changed:
            while True:
                found = self._rooms.get(room)
                left = deadline - time.monotonic()
                if found is not None or left <= 0:
                    return found
                self._changed.wait(left)


class BootstrapServer:
    """``GET /lockstep/kv/<room>?timeout=s`` on the prefill pod's bootstrap port: 200 with
    the hand-off, 404 when none arrived in time; ``GET /health`` 200."""

    def __init__(self, store: KVStore, host: str, port: int) -> None:
        self.store = store

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
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
    client: httpx.AsyncClient, host: str, port: int, room: int, prompt: str, timeout_s: float
) -> KVHandoff:
    """The prefill side's hand-off for ``room``, checked against ``prompt``; ``KVError``
    when it does not arrive within ``timeout_s`` or belongs to another prompt."""
    url = f"http://{host}:{port}{KV_ROUTE}{room}"
    try:
        response = await client.get(
            url, params={"timeout": f"{timeout_s:g}"}, timeout=timeout_s + 2.0
        )
    except httpx.HTTPError as exc:
        raise KVError(
            f"KV of room {room} from {host}:{port}: {type(exc).__name__} {exc}".rstrip()
        ) from exc
    if response.status_code != 200:
        raise KVError(f"KV of room {room} from {host}:{port}: HTTP {response.status_code}")
    try:
        handoff = KVHandoff(**response.json())
    except (TypeError, ValueError) as exc:
        raise KVError(f"KV of room {room} from {host}:{port} is malformed") from exc
    if handoff.digest != prompt_digest(prompt):
        raise KVError(f"KV of room {room} belongs to another prompt")
    return handoff

"""Local-cluster patches for the real SGLang server: what one machine must fake of many.

On a cluster every pod has its own network namespace; on the local cluster every pod is
a set of processes on its own loopback address of one shared network. Two patches make
the real server behave there as it would in its own pod; ``sitecustomize`` applies them
when the module is first imported, only with ``SGLANG_USE_CPU_ENGINE=1`` and
``LOCKSTEP_LOCAL_POD=1`` (set by the process kubelet's real engine, never in an image):

``torch.distributed.rendezvous``: the TCPStore of a group's rank 0 listens on the
    rendezvous host only. torch binds it to every address (``*:PORT``); two groups in
    the same epoch share the port (``20000 + epoch``), so the second group's store would
    fail with "address in use" although its pod address differs. The socket is bound
    here and handed to the store (``master_listen_fd``), as the CPU stand-in does.

``sglang.srt.entrypoints.http_server``: a request log, ``$LOCKSTEP_REQUEST_LOG`` (one
    JSON line per request received: ``{"event": "received", "at": unix seconds, "route",
    "room"}``), the format of the stand-in's, so a drill can tell which pods the router
    sent requests to, and when. SGLang's own PD warm-up request is not logged.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

REQUEST_LOG_ENV = "LOCKSTEP_REQUEST_LOG"
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang.srt.disaggregation.utils: the warm-up's peer
_LISTENERS: list[socket.socket] = []  # kept open for the store's lifetime
_LOGGED_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")


def bind_store_to_host(module: Any) -> None:
    """Wrap ``_create_c10d_store`` so rank 0's store listens on its host only."""
    original = module._create_c10d_store

    def create(hostname: str, port: int, rank: int, world_size: int, timeout: Any,
               use_libuv: bool = True) -> Any:  # fmt: skip
        if (
            rank != 0
            or hostname in ("", "0.0.0.0", "::")
            or module._agent_store_serves(hostname, port)
        ):
            return original(hostname, port, rank, world_size, timeout, use_libuv)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((hostname, port))
        listener.listen(256)
        _LISTENERS.append(listener)
        return module.TCPStore(
            host_name=hostname,
            port=port,
            world_size=world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            use_libuv=use_libuv,
            master_listen_fd=listener.fileno(),
        )

    module._create_c10d_store = create


def log_requests(module: Any) -> None:
    """Add the request log to SGLang's FastAPI app (before it starts serving)."""
    path = os.environ.get(REQUEST_LOG_ENV, "").strip()
    if path:
        module.app.add_middleware(_RequestLog, path=path)


class _RequestLog:
    """A pure ASGI middleware: it reads the body as it passes to the app (a
    ``BaseHTTPMiddleware`` that awaited ``request.body()`` first left SGLang's own
    warm-up ``/generate`` waiting for a body already consumed)."""

    def __init__(self, app: Any, path: str) -> None:
        self.app = app
        self.path = path
        self.lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        route = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or route not in _LOGGED_ROUTES:
            await self.app(scope, receive, send)
            return
        at = time.time()
        chunks: list[bytes] = []
        done = False

        async def tap() -> Any:
            nonlocal done
            message = await receive()
            if message["type"] == "http.request" and not done:
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done = True
                    self.write(at, route, b"".join(chunks))
            return message

        await self.app(scope, tap, send)

    def write(self, at: float, route: str, body: bytes) -> None:
        room = None
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict):
            if data.get("bootstrap_host") == FAKE_BOOTSTRAP_HOST:
                return  # SGLang's own PD warm-up, sent to itself at start: not traffic
            room = data.get("bootstrap_room")
        line = json.dumps({"event": "received", "at": at, "route": route, "room": room})
        with self.lock, open(self.path, "a") as log:
            log.write(line + "\n")

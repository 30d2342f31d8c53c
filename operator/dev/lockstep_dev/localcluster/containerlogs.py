"""The process kubelet's log endpoint: `kubectl logs` and pods/log through the API server
(the operator's incident evidence reads it) for pods that run as local processes.

The API server reaches a kubelet at the Node's InternalIP and
`status.daemonEndpoints.kubeletEndpoint.Port` and asks for
`GET /containerLogs/<namespace>/<pod>/<container>?tailLines=&limitBytes=&previous=&follow=`.
Without `--kubelet-certificate-authority` (the local control plane sets none) it does not
verify the kubelet's serving certificate, so a fresh self-signed one is enough; callers
are not authenticated (the endpoint listens on 127.0.0.1 and serves logs only).

A container's log file holds every run of the container, each after one header line
(`--- <time> start #<n>: <argv>`, written by the kubelet); the current run is what
follows the last header and `previous=true` is the run before it, as with a kubelet.
"""

from __future__ import annotations

import contextlib
import http.server
import re
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

RUN_HEADER = re.compile(rb"^--- \S+ start #\d+: .*\n", re.MULTILINE)
"""The line the kubelet writes before each run of a container."""

LogLocator = Callable[[str, str, str], Path | None]
"""`(namespace, pod, container)` -> that container's log file, or None when unknown."""

_FOLLOW_POLL_SECONDS = 0.2


def run_header(started: str, restart: int, argv: list[str]) -> bytes:
    """The header line before one run of a container in its log."""
    return f"--- {started} start #{restart}: {argv!r}\n".encode()


def runs(data: bytes) -> list[bytes]:
    """The output of each run, oldest first (text before the first header is dropped)."""
    headers = list(RUN_HEADER.finditer(data))
    ends = [h.start() for h in headers[1:]]
    ends.append(len(data))
    return [data[h.end() : end] for h, end in zip(headers, ends, strict=False)]


def select(
    data: bytes, *, previous: bool, tail_lines: int | None, limit_bytes: int | None
) -> bytes | None:
    """The part of a log a request asks for; None when there is no such run."""
    all_runs = runs(data)
    index = -2 if previous else -1
    if len(all_runs) < (2 if previous else 1):
        return None
    out = all_runs[index]
    if tail_lines is not None:
        lines = out.splitlines(keepends=True)
        out = b"".join(lines[-tail_lines:]) if tail_lines > 0 else b""
    if limit_bytes is not None:
        out = out[:limit_bytes]
    return out


class ContainerLogServer:
    """A TLS HTTP server on `host` answering the API server's container log requests."""

    def __init__(self, locate: LogLocator, *, host: str = "127.0.0.1") -> None:
        self._locate = locate
        self._host = host
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the container log server is not running")
        return int(self._server.server_address[1])

    def start(self) -> int:
        """Listen on a free port and serve in a thread; returns the port."""
        from lockstep.core.webhook import self_signed_certificate

        pair = self_signed_certificate(["localhost"], [self._host])
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory(prefix="lockstep-kubelet-tls-") as tmp:
            cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert.write_bytes(pair.cert_pem)
            key.write_bytes(pair.key_pem)
            context.load_cert_chain(cert, key)
        server = http.server.ThreadingHTTPServer((self._host, 0), self._handler())
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="kubelet-container-logs", daemon=True
        )
        self._thread.start()
        return self.port

    def stop(self) -> None:
        self._stopping.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        locate, stopping = self._locate, self._stopping

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self._fail(404, "only /containerLogs/<namespace>/<pod>/<container>")
                    return
                path = locate(parts[1], parts[2], parts[3])
                if path is None:
                    self._fail(404, f"no container {parts[3]} of pod {parts[1]}/{parts[2]} here")
                    return
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                try:
                    tail = int(query["tailLines"]) if "tailLines" in query else None
                    limit = int(query["limitBytes"]) if "limitBytes" in query else None
                except ValueError:
                    self._fail(400, "tailLines and limitBytes are integers")
                    return
                previous = query.get("previous") == "true"
                data = path.read_bytes() if path.exists() else b""
                out = select(data, previous=previous, tail_lines=tail, limit_bytes=limit)
                if out is None:
                    which = "previous terminated" if previous else "current"
                    self._fail(400, f"no {which} run of container {parts[3]}")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(out)
                if query.get("follow") == "true" and not previous:
                    self._follow(path, len(data), locate, parts[1:])

            def _follow(
                self, path: Path, offset: int, locate: LogLocator, where: list[str]
            ) -> None:
                # Until the client goes, the pod goes, the container restarts or we stop.
                with contextlib.suppress(OSError):
                    while not stopping.is_set() and locate(where[0], where[1], where[2]):
                        with open(path, "rb") as log:
                            log.seek(offset)
                            fresh = log.read()
                        if RUN_HEADER.search(fresh):
                            return
                        if fresh:
                            self.wfile.write(fresh)
                            self.wfile.flush()
                            offset += len(fresh)
                        time.sleep(_FOLLOW_POLL_SECONDS)

            def _fail(self, code: int, message: str) -> None:
                body = message.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

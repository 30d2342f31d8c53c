"""A fake SGLang pod on a loopback address: the probe route and the pod agent, scriptable.

Operator integration tests need a group to answer the deep probe and `GET /ranks` the
way a healthy, desynced, hung or slow group would, without torch: each `FakePod` binds
real HTTP servers on its own 127.0.0.x address (port 30000 for the SGLang server, 8999
for the pod agent), so the operator's prober talks real HTTP to real sockets. The rank
states follow the runtime's schema (`lockstep.dev/rank-state/v1`).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Mode = Literal["healthy", "desync", "hang", "slow"]

HTTP_PORT = 30000
AGENT_PORT = 8999


class FakePod:
    """One pod: `ranks` local ranks starting at `first_rank`, behaving per `mode`."""

    def __init__(self, ip: str, first_rank: int = 0, ranks: int = 1, leader: bool = True) -> None:
        self.ip = ip
        self.first_rank = first_rank
        self.nranks = ranks
        self.leader = leader
        self.mode: Mode = "healthy"
        self.iteration = 100
        self.requests: list[str] = []
        # `POST /restart` as the runtime's agent answers it: the token the pod was given
        # (None: restart disabled), the epoch it runs, and restarts accepted but not yet
        # carried out (the fake kubelet restarts the container and clears it).
        self.token: str | None = None
        self.epoch = 0
        self.pending_epoch: int | None = None
        self.refuse_restart = False  # answer 503, as an agent that cannot act
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ behaviour

    def set_mode(self, mode: Mode) -> None:
        with self._lock:
            self.mode = mode

    def take_restart(self) -> int | None:
        """The epoch of an accepted restart, now carried out: the container starts over
        healthy in that epoch (None: none pending)."""
        with self._lock:
            epoch, self.pending_epoch = self.pending_epoch, None
            if epoch is not None:
                self.epoch, self.mode = epoch, "healthy"
            return epoch

    def rank_states(self) -> list[dict[str, Any]]:
        with self._lock:
            mode = self.mode
            if mode in ("healthy", "slow"):
                self.iteration += 3  # progress between two reads
        now = time.time()
        out = []
        for i in range(self.nranks):
            rank = self.first_rank + i
            collective: dict[str, Any] | None = None
            failure: Any = None
            decision = {
                "kind": "batch",
                "forward_mode": "decode",
                "batch_size": 4,
                "rids_hash": "ab12",
                "seq": self.iteration,
            }
            if mode == "hang":
                collective = {
                    "op": "all_reduce",
                    "group": "tp_device",
                    "seq": 4242,
                    "since": now - 30,
                }
            elif mode == "desync":
                # Rank 0 waits in a device all-reduce, its peers in the next broadcast.
                collective = (
                    {"op": "all_reduce", "group": "tp_device", "seq": 4242, "since": now - 30}
                    if rank == 0
                    else {"op": "broadcast", "group": "tp_cpu", "seq": 977, "since": now - 30}
                )
                decision = {**decision, "kind": "batch" if rank == 0 else "idle"}
                failure = {
                    "detected_at": now - 29,
                    "rank": rank,
                    "first_divergence": "decision seq 4001: batch vs idle",
                }
            elif mode == "slow":
                collective = {
                    "op": "all_reduce",
                    "group": "tp_device",
                    "seq": self.iteration,
                    "since": now - 1,
                }
            out.append(
                {
                    "rank": rank,
                    "tp_rank": rank,
                    "pid": 1000 + rank,
                    "alive": True,
                    "iteration": self.iteration,
                    "updated_at": now,
                    "last_decision": decision,
                    "collective": collective,
                    "consensus_failure": failure,
                }
            )
        return out

    # ---------------------------------------------------------------- HTTP

    def _handler(self, port: int) -> type[BaseHTTPRequestHandler]:
        pod = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                pod.requests.append(f"GET {port}{self.path}")
                if port == HTTP_PORT and self.path.startswith("/lockstep/probe"):
                    if pod.mode != "healthy":
                        time.sleep(3.0)  # the collective never completes: client times out
                        self._send(504, {"ok": False, "error": "collective timed out"})
                        return
                    self._send(200, {"ok": True, "groups": {"tp_cpu": {"latency_ms": 0.4}}})
                elif port == HTTP_PORT and self.path == "/health":
                    self._send(200, {})
                elif port == HTTP_PORT and self.path == "/lockstep/inflight":
                    # As the runtime's counter (lockstep_sglang.inflight): a fake serves
                    # no work requests, so none is ever in flight.
                    self._send(200, {"inflight": 0})
                elif port == AGENT_PORT and self.path == "/ranks":
                    # Guarded as the runtime's agent guards it (403 with no token set).
                    if pod.token is None:
                        self._send(403, {"error": "disabled: no token"})
                        return
                    if self.headers.get("Authorization") != f"Bearer {pod.token}":
                        self._send(401, {"error": "bad token"})
                        return
                    self._send(
                        200,
                        {
                            "schema": "lockstep.dev/rank-state/v1",
                            "ranks": pod.rank_states(),
                            "previous": [],
                        },
                    )
                else:
                    self._send(404, {"error": "no route"})

            def do_POST(self) -> None:
                pod.requests.append(f"POST {port}{self.path}")
                if port == AGENT_PORT and self.path == "/restart":
                    self._restart()
                elif port == AGENT_PORT and self.path == "/stacks":
                    stacks = [
                        {
                            "rank": r["rank"],
                            "pid": r["pid"],
                            "ok": True,
                            "duration_s": 0.1,
                            "stack": "Thread 1 (active): all_reduce (distributed_c10d.py)",
                            "error": None,
                        }
                        for r in pod.rank_states()
                    ]
                    self._send(200, {"now": time.time(), "stacks": stacks})
                else:
                    self._send(404, {"error": "no route"})

            def _restart(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if pod.token is None:
                    self._send(403, {"error": "restart disabled: no token"})
                elif self.headers.get("Authorization") != f"Bearer {pod.token}":
                    self._send(401, {"error": "bad token"})
                elif pod.refuse_restart:
                    self._send(503, {"error": "cannot restart"})
                else:
                    epoch = int(body["epoch"])
                    with pod._lock:
                        if epoch in (pod.epoch, pod.pending_epoch):
                            self._send(200, {"restarting": False, "epoch": str(epoch)})
                            return
                        pod.pending_epoch = epoch
                    self._send(202, {"restarting": True, "epoch": str(epoch)})

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def start(self) -> FakePod:
        ports = [AGENT_PORT] + ([HTTP_PORT] if self.leader else [])
        for port in ports:
            server = ThreadingHTTPServer((self.ip, port), self._handler(port))
            server.daemon_threads = True
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            self._servers.append(server)
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers.clear()
        self._threads.clear()

"""The stand-in pod's main process: start the local ranks, serve, and end with them.

It never runs a collective and never waits without a bound, so it cannot wedge: the
main thread only waits for a rank process to end (``pidfd``) or a signal; HTTP, the pod
agent and the pipe to rank 0 run on their own threads. When any local rank ends, for
whatever reason, it kills the other local ranks, closes the HTTP port and, as the real
launcher does once its SGLang server ended, keeps the pod agent serving the evidence for
``LOCKSTEP_EXIT_HOLD_S`` (the operator restarts the group in place within it), then exits
non-zero. ``SIGTERM``/``SIGINT`` stop the ranks
(``SIGTERM``, then ``SIGKILL`` after a short grace) and exit 0.

The pod agent runs on a thread here, so its ``POST /restart`` (see
:mod:`lockstep_sglang.agent`) ends this process itself: ``SIGKILL`` to every local rank,
then exit 75 (:data:`~lockstep_sglang.agent.RESTART_EXIT_CODE`). At start the group epoch
is the effective one (:func:`lockstep_sglang.config.resolve_epoch`): after such a
restart, the epoch in the state dir, with the ``--dist-init-addr`` port moved to it; the
ranks get it (their store keys carry it), and so do ``ranks.json`` and ``/ranks``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any

from lockstep_sglang import timeline
from lockstep_sglang.agent import RESTART_EXIT_CODE, PodAgent, RestartOrder
from lockstep_sglang.config import resolve_epoch
from lockstep_sglang.launcher import engine_exit
from lockstep_sglang.rank_state import archive_previous, mark_incarnation, write_engine_exit
from lockstep_standin.settings import (
    RANK_SPEC_ENV,
    PodSettings,
    RankSpec,
    parse_server_args,
)

logger = logging.getLogger("lockstep_standin.pod")

RANKS_FILE = "ranks.json"
EXIT_REFUSED = 2
STOP_GRACE_S = 3.0
END_REQUESTS_WAIT_S = 1.0  # bound on ending the held requests before the port closes


class _Stop(Exception):
    """A stop signal arrived."""


def exit_code_for(rank_code: int) -> int:
    """The pod's exit status when a rank ended with ``rank_code`` (never 0)."""
    if rank_code > 0:
        return rank_code
    if rank_code < 0:
        return 128 - rank_code  # killed by a signal, as a shell reports it
    return 1  # a rank loop never ends cleanly


def write_ranks_file(path: Path, payload: dict[str, Any]) -> None:
    """Atomically write ``ranks.json``."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


class Pod:
    """One pod incarnation (see the module docstring)."""

    def __init__(self, settings: PodSettings) -> None:
        self.settings = settings
        self.server = settings.server
        self.leader = self.server.node_rank == 0
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.http_thread: threading.Thread | None = None
        self.http_server: Any = None  # uvicorn.Server, once started
        self.frontend: Any = None  # server.Frontend, once started
        self.restarting: RestartOrder | None = None

    # -- start ---------------------------------------------------------------------------
    def start_ranks(self) -> tuple[Connection, Connection] | None:
        """Spawn every local rank; on the leader, return the pipe ends to rank 0."""
        s, srv = self.settings, self.server
        store_sock: socket.socket | None = None
        rank0_pipes: tuple[Connection, Connection] | None = None
        child_fds: list[int] = []
        if self.leader:
            # Bound here, on the given address only: torch's own store would listen on
            # every address, and all local-cluster pods share one network namespace.
            host, port = s.store_addr() or (s.pod_ip, 0)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            store_sock = socket.create_server((host, port), family=family, backlog=256)
            store_host, store_port = store_sock.getsockname()[:2]
        else:
            addr = s.store_addr()
            assert addr is not None  # parse_server_args requires it on nnodes > 1
            store_host, store_port = addr
        try:
            for local, rank in enumerate(srv.local_ranks):
                fds: list[int] = []
                store_fd = inbox_fd = outbox_fd = -1
                if rank == 0:
                    assert store_sock is not None
                    store_fd = store_sock.fileno()
                    in_r, in_w = os.pipe()
                    out_r, out_w = os.pipe()
                    inbox_fd, outbox_fd = in_r, out_w
                    fds = [store_fd, in_r, out_w]
                    child_fds += [in_r, out_w]
                    rank0_pipes = (
                        Connection(in_w, readable=False),
                        Connection(out_r, writable=False),
                    )
                spec = RankSpec(
                    rank=rank,
                    local_rank=local,
                    world_size=srv.tp_size,
                    node_rank=srv.node_rank,
                    store_host=store_host,
                    store_port=store_port,
                    store_fd=store_fd,
                    inbox_fd=inbox_fd,
                    outbox_fd=outbox_fd,
                    pod_dir=str(s.pod_dir),
                    state_dir=str(s.runtime.state_dir),
                    local_ranks=list(srv.local_ranks),
                    consensus=s.runtime.consensus,
                    consensus_pause_s=s.runtime.consensus_pause_s,
                    gloo_timeout_s=s.runtime.gloo_timeout.total_seconds(),
                    rendezvous_timeout_s=s.rendezvous_timeout_s,
                    idle_s=s.idle_s,
                    step_s=s.step_s,
                    epoch=s.epoch,
                    disaggregation_mode=srv.disaggregation_mode,
                )
                cmd = [
                    sys.executable,
                    "-m",
                    "lockstep_standin.scheduler",
                    "--rank",
                    str(rank),
                ]
                env = {**os.environ, RANK_SPEC_ENV: spec.to_json()}
                self.procs[rank] = subprocess.Popen(cmd, env=env, pass_fds=fds)
        finally:
            for fd in child_fds:
                os.close(fd)
            if store_sock is not None:
                store_sock.close()
        write_ranks_file(
            s.pod_dir / RANKS_FILE,
            {
                "pod": s.pod_name,
                "epoch": s.epoch,
                "pid": os.getpid(),
                "node_rank": srv.node_rank,
                "ranks": [{"rank": r, "pid": p.pid} for r, p in self.procs.items()],
            },
        )
        return rank0_pipes

    def start_http(self, pipes: tuple[Connection, Connection]) -> None:
        """The leader's HTTP server, on its own thread (imports FastAPI only here)."""
        import uvicorn

        from lockstep_standin.server import Frontend, build_app

        frontend = Frontend(pipes[0], pipes[1], self.settings)
        frontend.start()
        self.frontend = frontend
        config = uvicorn.Config(
            build_app(frontend),
            host=self.settings.pod_ip,
            port=self.server.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        http = uvicorn.Server(config)
        self.http_server = http
        self.http_thread = threading.Thread(target=http.run, name="standin-http", daemon=True)
        self.http_thread.start()

    # -- run -----------------------------------------------------------------------------
    def run(self) -> int:
        """Start everything and supervise; returns the pod's exit status."""
        s = self.settings
        s.pod_dir.mkdir(parents=True, exist_ok=True)
        s.runtime.state_dir.mkdir(parents=True, exist_ok=True)
        timeline.mark(s.runtime.state_dir, "container_start")
        # The last incarnation's evidence (a consensus failure) survives this restart.
        archive_previous(s.runtime.state_dir)
        mark_incarnation(s.runtime.state_dir, s.epoch)
        (s.pod_dir / RANKS_FILE).unlink(missing_ok=True)
        try:
            pipes = self.start_ranks()
        except OSError as exc:
            logger.error("cannot start the ranks: %s", exc)
            return self.end(1)
        logger.info(
            "pod %s (node rank %d of %d) on %s: ranks %s (pids %s), TP %d, mode %s",
            s.pod_name or "-",
            self.server.node_rank,
            self.server.nnodes,
            s.pod_ip,
            list(self.procs),
            [p.pid for p in self.procs.values()],
            self.server.tp_size,
            self.server.disaggregation_mode,
        )
        try:
            if s.runtime.agent:
                agent = PodAgent(s.runtime.state_dir, epoch=s.epoch, restart=self.restart)
                agent.serve_in_thread(s.pod_ip, s.runtime.agent_port)
            if pipes is not None:
                self.start_http(pipes)
        except OSError as exc:
            logger.error("cannot serve on %s: %s", s.pod_ip, exc)
            return self.end(1)
        return self.supervise()

    def supervise(self) -> int:
        """Wait for a rank to end, a signal, or the HTTP server to fail."""
        sel = selectors.DefaultSelector()
        for rank, proc in self.procs.items():
            sel.register(os.pidfd_open(proc.pid), selectors.EVENT_READ, rank)

        def stop(signum: int, _frame: FrameType | None) -> None:
            raise _Stop(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            while True:
                for key, _ in sel.select(timeout=1.0):
                    rank = int(key.data)
                    code = self.procs[rank].wait()
                    if self.restarting is not None:
                        # The agent thread killed it and is ending the process: same exit.
                        return self.end(RESTART_EXIT_CODE)
                    logger.error(
                        "rank %d (pid %d) ended with status %d; ending the other ranks",
                        rank,
                        self.procs[rank].pid,
                        code,
                    )
                    return self.hold(rank, code)
                if self.http_thread is not None and not self.http_thread.is_alive():
                    logger.error("the HTTP server stopped (port %d in use?)", self.server.port)
                    return self.end(1)
        except _Stop as sig:
            logger.info("%s: stopping the ranks", sig)
            # Requests still held (a drain that ran out of time) end retryable, not cut.
            self.end_requests(f"the server is stopping ({sig})")
            return self.end(0, grace_s=STOP_GRACE_S)

    def hold(self, rank: int, code: int) -> int:
        """As the real launcher after its SGLang server ended: end every local rank,
        record how the ranks ended (the agent serves it), keep the pod agent serving the
        evidence for ``LOCKSTEP_EXIT_HOLD_S`` (the operator restarts the group in place
        within it: one container restart per group restart), then exit non-zero."""
        self.end(0)
        # Nothing in flight waits for the operator: the group is down, every held request
        # ends now with a retryable error; then, as the real server's, the port closes.
        self.end_requests(f"the TP group went down (rank {rank} ended with status {code})")
        if self.http_server is not None:
            self.http_server.should_exit = True

        def stop(signum: int, _frame: FrameType | None) -> None:
            raise _Stop(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, stop)
        hold_s = self.settings.runtime.exit_hold_s
        timeline.mark(self.settings.runtime.state_dir, "engine_ended", code=code)
        write_engine_exit(
            self.settings.runtime.state_dir,
            engine_exit(self.procs[rank].pid, code, hold_s=hold_s, now=time.time()),
        )
        logger.error("the ranks ended; the pod agent keeps serving the evidence for %.0f s", hold_s)
        deadline = time.monotonic() + hold_s
        try:
            while time.monotonic() < deadline and self.restarting is None:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        except _Stop as sig:
            logger.info("%s during the hold", sig)
            return 0
        if self.restarting is not None:
            return RESTART_EXIT_CODE  # the agent thread is ending the process itself
        return exit_code_for(code)

    def end_requests(self, reason: str) -> None:
        """End every request the leader holds with 503 and let the answers leave."""
        if self.frontend is not None:
            self.frontend.end_all_threadsafe(reason, wait_s=END_REQUESTS_WAIT_S)

    def restart(self, order: RestartOrder) -> None:
        """The agent's restart action (its thread): kill every local rank, exit 75 now."""
        self.restarting = order
        timeline.mark(self.settings.runtime.state_dir, "restarted")
        try:
            logger.warning(
                "restart in place into epoch %s (from %s): %s; killing ranks %s",
                order.epoch, order.previous_epoch, order.reason or "-", list(self.procs),
            )  # fmt: skip
            for proc in self.procs.values():
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            deadline = time.monotonic() + STOP_GRACE_S
            for proc in self.procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(RESTART_EXIT_CODE)

    def end(self, code: int, *, grace_s: float = 0.0) -> int:
        """Stop every local rank (``SIGKILL`` after ``grace_s``) and return ``code``."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        first = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(first)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2.0)
        return code


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lockstep_standin <SGLang server argv>``; the process exits here."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s standin pod %(levelname)s %(name)s: %(message)s",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        server = parse_server_args(argv)
        settings = PodSettings.from_env(server, os.environ)
        # After an in-place restart: the new epoch, on its own rendezvous port.
        epoch, argv = resolve_epoch(settings.runtime.state_dir, argv, os.environ)
        if epoch != settings.epoch:
            server = parse_server_args(argv)
            settings = dataclasses.replace(settings, server=server, epoch=epoch)
    except ValueError as exc:
        print(f"lockstep-standin refuses to start: {exc}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    if server.ignored:
        logger.warning(
            "ignoring SGLang flags the stand-in does not model: %s", " ".join(server.ignored)
        )
    if server.dp_size > 1:
        logger.warning("--dp-size %d ignored: the stand-in runs one TP group", server.dp_size)
    if server.host not in {settings.pod_ip, "0.0.0.0", "::"}:
        logger.warning(
            "--host %s ignored: serving on LOCKSTEP_POD_IP %s", server.host, settings.pod_ip
        )
    code = Pod(settings).run()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # os._exit: daemon threads (HTTP, agent, pipes) must not delay or block the exit.
    os._exit(code)

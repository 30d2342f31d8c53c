"""``lockstep-sglang``: the image's entrypoint, a small supervisor around the SGLang server.

The container's main process. It never imports SGLang or torch, so it starts at once and
outlives whatever happens to the server. In order:

1. read the ``LOCKSTEP_*`` settings (:mod:`lockstep_sglang.config`); refuse (exit 2) on a
   malformed one;
2. archive the previous incarnation's rank state (a crash's evidence outlives the
   restart), resolve the group epoch (after an in-place restart the one in the state
   dir, with ``--dist-init-addr`` moved to its port:
   :func:`lockstep_sglang.config.resolve_epoch`), and start the pod agent with this
   process's pid, which ``POST /restart`` ends: :data:`~lockstep_sglang.agent.RESTART_SIGNAL`
   makes it exit 75 at once, even as the container's PID 1;
3. start the engine, ``python -m lockstep_sglang.engine`` (:mod:`lockstep_sglang.engine`:
   pin check, hooks, SGLang's HTTP server) as its child, with SGLang's rank consensus
   checker switched on in its environment;
4. supervise: when the engine ends on its own it records how
   (``<state dir>/rank-engine-exit.json``, served by the agent), and unless the engine
   stopped cleanly or refused to start, it keeps the pod agent serving the evidence for
   ``LOCKSTEP_EXIT_HOLD_S`` seconds (the operator reads the ranks, captures the
   evidence and restarts the group in place within that window), then exits 1 so the
   container restarts on its own when nobody did.

Why the engine is a child: SGLang ends a failed server with
``kill_process_tree(include_parent=True)`` from its SIGQUIT handler, which kills every
process below the server and the server itself with ``SIGKILL``. Were the server the
container's main process, the pod agent (its child) would die with it and the container
would exit 137 before the operator could read anything.

Every other argument is SGLang's, passed through untouched. ``--lockstep-check`` runs the
settings and pin check in this process and exits (0 when the runtime matches): the image
build and CI use it.

Exit codes: 0 the server stopped normally (or ``SIGTERM``), 1 the server ended otherwise
(a consensus divergence, a dead rank, a crash: the real status is in the log and in
``rank-engine-exit.json``), 2 refused to start, 75 restarted in place by the operator.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Sequence
from types import FrameType

from lockstep_sglang import termination, timeline
from lockstep_sglang.agent import RESTART_EXIT_CODE, RESTART_SIGNAL, kill_pod_processes
from lockstep_sglang.config import EPOCH_ENV, RuntimeConfig, resolve_epoch
from lockstep_sglang.rank_state import (
    EngineExitJSON,
    archive_previous,
    mark_incarnation,
    write_engine_exit,
)

logger = logging.getLogger("lockstep_sglang.launcher")

EXIT_REFUSED = 2
EXIT_ENGINE_ENDED = 1
CONSENSUS_SGLANG_ENV = "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"
STOP_GRACE_S = 3.0
_PR_SET_CHILD_SUBREAPER = 36


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split lockstep's own ``--lockstep-*`` options from SGLang's argv."""
    parser = argparse.ArgumentParser(prog="lockstep-sglang", add_help=False)
    parser.add_argument("--lockstep-check", action="store_true")
    parser.add_argument("--lockstep-help", action="store_true")
    return parser.parse_known_args(list(argv))


def refuse(message: str) -> int:
    """Print why the launcher will not start and return its exit code."""
    print(message, file=sys.stderr, flush=True)
    termination.refused(message)  # the pod's status says it, not only the log
    return EXIT_REFUSED


def start_agent(
    config: RuntimeConfig, *, epoch: str | None, main_pid: int | None = None
) -> subprocess.Popen[bytes]:
    """The pod agent as its own process: it must answer while the ranks are wedged.

    ``main_pid`` (default: this process) is what its ``POST /restart`` ends, with every
    process below it; install :func:`install_restart_handler` first.
    """
    cmd = [sys.executable, "-m", "lockstep_sglang.agent", "--host", config.agent_host]
    cmd += ["--port", str(config.agent_port), "--state-dir", str(config.state_dir)]
    cmd += ["--main-pid", str(os.getpid() if main_pid is None else main_pid)]
    if epoch is not None:
        cmd += ["--epoch", epoch]
    return subprocess.Popen(cmd)


def _restarted(signum: int, _frame: FrameType | None) -> None:
    # The agent has already killed every other process of the container; exit now,
    # without cleanup that could wait on them (os._exit: no atexit, no joins).
    with contextlib.suppress(Exception):
        timeline.mark(None, "restarted")
        sys.stdout.flush()
        print(f"lockstep: {signal.Signals(signum).name}: restarted in place", file=sys.stderr)
        sys.stderr.flush()
    os._exit(RESTART_EXIT_CODE)


def install_restart_handler() -> None:
    """Exit 75 on the agent's :data:`~lockstep_sglang.agent.RESTART_SIGNAL` (main thread).

    A handler, not the default action: as a container's PID 1 this process ignores
    every signal it has no handler for, ``SIGKILL`` included.
    """
    signal.signal(RESTART_SIGNAL, _restarted)


def engine_exit(pid: int, returncode: int, *, hold_s: float, now: float) -> EngineExitJSON:
    """The record of an engine that ended with ``returncode`` (``Popen`` convention)."""
    if returncode < 0:
        return {"pid": pid, "exit_code": None, "signal": signal.Signals(-returncode).name,
                "ended_at": now, "hold_s": hold_s}  # fmt: skip
    return {"pid": pid, "exit_code": returncode, "signal": None, "ended_at": now,
            "hold_s": hold_s}  # fmt: skip


def _describe(record: EngineExitJSON) -> str:
    if record["signal"] is not None:
        return f"signal {record['signal']}"
    return f"exit status {record['exit_code']}"


class _Stop(Exception):
    """SIGTERM or SIGINT arrived."""


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def become_subreaper() -> None:
    """Adopt every orphan of this container's processes (``PR_SET_CHILD_SUBREAPER``).

    A container's PID 1 is one already; elsewhere (the local cluster, tests) an orphaned
    scheduler would otherwise escape to the system's init, out of reach of the cleanup.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans(keep: Collection[int]) -> None:
    """Collect adopted processes that ended (never the ``keep`` children: their
    ``Popen`` objects wait for them)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in keep:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def supervise(
    engine: subprocess.Popen[bytes], config: RuntimeConfig, *, spare: Collection[int] = ()
) -> int:
    """Wait for the engine to end (or a stop signal); see the module docstring.

    ``spare``: processes of this container that outlive the engine (the pod agent).
    """
    keep = {os.getpid(), *spare}
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        code = engine.wait()
        if code in (0, EXIT_REFUSED):
            return code
        record = engine_exit(engine.pid, code, hold_s=config.exit_hold_s, now=time.time())
        write_engine_exit(config.state_dir, record)
        timeline.mark(config.state_dir, "engine_ended", code=code)
        # SGLang's own teardown may leave a scheduler behind (a wedged rank ignores
        # SIGTERM); nothing of this incarnation may keep running.
        stray = kill_pod_processes(os.getpid(), [], spare=keep)
        logger.error(
            "lockstep: the SGLang server ended (%s)%s; the pod agent keeps serving its "
            "evidence for %.0f s, then the container exits %d",
            _describe(record),
            f", killed {len(stray)} leftover process(es)" if stray else "",
            config.exit_hold_s,
            EXIT_ENGINE_ENDED,
        )
        _hold(config.exit_hold_s, lambda: reap_orphans(keep))
        return EXIT_ENGINE_ENDED
    except _Stop as why:
        logger.info("lockstep: %s: stopping the SGLang server", why)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with contextlib.suppress(ProcessLookupError):
            engine.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            engine.wait(timeout=STOP_GRACE_S)
        kill_pod_processes(os.getpid(), [], spare=keep)
        return 0


def _hold(seconds: float, every_second: Callable[[], None]) -> None:
    """Wait ``seconds`` (signal handlers may end the process meanwhile)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        every_second()
        time.sleep(min(left, 1.0))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lockstep-sglang`` (see the module docstring)."""
    args, sglang_argv = parse_args(sys.argv[1:] if argv is None else argv)
    if args.lockstep_help:
        print(__doc__)
        return 0
    try:
        config = RuntimeConfig.from_env()
    except ValueError as exc:
        return refuse(f"lockstep-sglang refuses to start: {exc}")
    # Before any SGLang import (the engine's): its @rank_consensus decorators read it.
    os.environ[CONSENSUS_SGLANG_ENV] = "1" if config.consensus else "0"
    if args.lockstep_check:
        from lockstep_sglang.engine import check_pins
        from lockstep_sglang.pins import SUPPORTED

        report = check_pins(config.sglang_version)
        if not report.ok:
            return refuse(report.message())
        pinned = SUPPORTED[str(report.installed_version)].sources
        print(
            f"lockstep-sglang: SGLang {report.installed_version} matches "
            f"{len(pinned)} pinned sources"
        )
        return 0
    return run_server(config, sglang_argv)


def run_server(config: RuntimeConfig, sglang_argv: list[str]) -> int:
    """Start the agent and the engine; supervise; return the container's exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s lockstep %(message)s")
    config.state_dir.mkdir(parents=True, exist_ok=True)
    timeline.mark(config.state_dir, "container_start")
    archive_previous(config.state_dir)
    try:
        epoch, sglang_argv = resolve_epoch(config.state_dir, sglang_argv)
    except ValueError as exc:
        return refuse(f"lockstep-sglang refuses to start: {exc}")
    mark_incarnation(config.state_dir, epoch)
    install_restart_handler()
    become_subreaper()
    agent = start_agent(config, epoch=epoch) if config.agent else None
    try:
        # The engine's ranks run (and aim test faults at) the effective epoch.
        env = dict(os.environ)
        if epoch is not None:
            env[EPOCH_ENV] = epoch
        engine = subprocess.Popen(
            [sys.executable, "-m", "lockstep_sglang.engine", *sglang_argv], env=env
        )
        return supervise(engine, config, spare=[] if agent is None else [agent.pid])
    finally:
        if agent is not None:
            agent.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.wait(timeout=2)


if __name__ == "__main__":
    sys.exit(main())

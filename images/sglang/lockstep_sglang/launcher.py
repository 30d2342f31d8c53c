"""``lockstep-sglang``: the image's entrypoint, a guarded ``sglang.launch_server``.

Order matters, and each step fails fast with a message an operator can act on:

1. read the ``LOCKSTEP_*`` settings (:mod:`lockstep_sglang.config`);
2. check the installed SGLang version and every pinned source (:mod:`lockstep_sglang.pins`);
   refuse to start (exit 2) naming the function and versions otherwise;
3. switch on SGLang's rank consensus checker for the spawned schedulers, archive the
   previous incarnation's rank state, resolve the group epoch (after an in-place restart
   the one in the state dir, with ``--dist-init-addr`` moved to its port:
   :func:`lockstep_sglang.config.resolve_epoch`), start the pod agent (with this
   process's pid, which ``POST /restart`` ends: :data:`~lockstep_sglang.agent.RESTART_SIGNAL`
   makes it exit 75 at once, even as the container's PID 1);
4. install the main-process hooks and run SGLang's HTTP server with lockstep's
   scheduler entry (:mod:`lockstep_sglang.server_hooks`, :mod:`lockstep_sglang.hooks`).

Every other argument is SGLang's, passed through untouched. ``--lockstep-check`` runs
steps 1-2 and exits (0 when the runtime matches): the image build and CI use it.

Exit codes: 0 the server stopped normally, 1 the schedulers ended (non-leader node) or
SGLang failed, 2 refused to start, 75 restarted in place by the operator (pod agent).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import FrameType

from lockstep_sglang import pins
from lockstep_sglang.agent import RESTART_EXIT_CODE, RESTART_SIGNAL
from lockstep_sglang.config import RuntimeConfig, resolve_epoch
from lockstep_sglang.rank_state import archive_previous, mark_incarnation

logger = logging.getLogger("lockstep_sglang.launcher")

EXIT_REFUSED = 2
CONSENSUS_SGLANG_ENV = "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split lockstep's own ``--lockstep-*`` options from SGLang's argv."""
    parser = argparse.ArgumentParser(prog="lockstep-sglang", add_help=False)
    parser.add_argument("--lockstep-check", action="store_true")
    parser.add_argument("--lockstep-help", action="store_true")
    return parser.parse_known_args(list(argv))


def refuse(message: str) -> int:
    """Print why the launcher will not start and return its exit code."""
    print(message, file=sys.stderr, flush=True)
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


def unsupported_mode(server_args: object, environ: Mapping[str, str] | None = None) -> str | None:
    """Why lockstep cannot guard this server mode, or None when it can.

    The probe route lives in SGLang's Python HTTP server and its answer comes back
    through the single tokenizer manager; a server without them would fail every deep
    probe and be restarted forever, so it is refused up front.
    """
    for flag in ("encoder_only", "smg_grpc_mode", "grpc_mode", "use_ray"):
        if getattr(server_args, flag, False):
            return f"--{flag.replace('_', '-')} is not supported (lockstep guards the HTTP server)"
    if int(getattr(server_args, "tokenizer_worker_num", 1) or 1) > 1:
        return "--tokenizer-worker-num above 1 is not supported (the probe needs one tokenizer)"
    env = os.environ if environ is None else environ
    if env.get("SGLANG_RUST_SERVER", "").strip().lower() in {"1", "true", "yes", "on"}:
        return "SGLANG_RUST_SERVER is not supported (the probe route is in the Python server)"
    return None


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
    # Before any SGLang import: its @rank_consensus decorators read it at import.
    os.environ[CONSENSUS_SGLANG_ENV] = "1" if config.consensus else "0"
    with warnings.catch_warnings():
        # SGLang's import prints CUDA-only warnings (GGUF, AWQ) on CPU machines.
        warnings.simplefilter("ignore")
        report = pins.check()
    if not report.ok:
        return refuse(report.message())
    if args.lockstep_check:
        print(
            f"lockstep-sglang: SGLang {report.installed_version} matches "
            f"{len(pins.PINNED_SOURCES)} pinned sources"
        )
        return 0
    return run_server(config, sglang_argv)


def run_server(config: RuntimeConfig, sglang_argv: list[str]) -> int:
    """Start the agent and SGLang with the hooks; return the process exit code."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    from lockstep_sglang import server_hooks

    logging.basicConfig(level=logging.INFO, format="%(asctime)s lockstep %(message)s")
    config.state_dir.mkdir(parents=True, exist_ok=True)
    archive_previous(config.state_dir)
    try:
        epoch, sglang_argv = resolve_epoch(config.state_dir, sglang_argv)
    except ValueError as exc:
        return refuse(f"lockstep-sglang refuses to start: {exc}")
    mark_incarnation(config.state_dir, epoch)
    install_restart_handler()
    agent = start_agent(config, epoch=epoch) if config.agent else None
    try:
        load_plugins()  # as sglang.launch_server does
        server_args = prepare_server_args(sglang_argv)
        reason = unsupported_mode(server_args)
        if reason is not None:
            return refuse(f"lockstep-sglang refuses to start: {reason}")
        server_hooks.install_server_hooks(config)
        server_hooks.launch(server_args)
        if int(getattr(server_args, "node_rank", 0) or 0) >= 1:
            # A non-leader node returns when its schedulers end: never a clean stop.
            logger.error("lockstep: the schedulers of this node ended")
            return 1
        return 0
    finally:
        if agent is not None:
            agent.terminate()
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    sys.exit(main())

"""The SGLang server process with lockstep's hooks: ``python -m lockstep_sglang.engine``.

The launcher (:mod:`lockstep_sglang.launcher`, the container's main process) starts this
as its child with SGLang's argv untouched. Here, in order, each step failing fast with a
message an operator can act on:

1. check the installed SGLang version and every pinned source (:mod:`lockstep_sglang.pins`);
   refuse (exit 2) naming the function and versions otherwise;
2. parse the server arguments as ``sglang.launch_server`` does and refuse the modes the
   deep probe cannot reach (:func:`unsupported_mode`, exit 2);
3. install the main-process hooks and run SGLang's HTTP server with lockstep's scheduler
   entry (:mod:`lockstep_sglang.server_hooks`, :mod:`lockstep_sglang.hooks`).

Why a child and not the launcher itself: when a scheduler dies (a consensus divergence
ends it on purpose), SGLang's SIGQUIT handler kills its own process tree *including its
parent*, which would take the pod agent and its evidence with it. As a child, only this
process and its schedulers go; the launcher and the agent stay.

Exit codes: 0 the server stopped normally, 1 the schedulers of a non-leader node ended
or SGLang failed, 2 refused to start. When SGLang kills itself after a failed child the
status is that of ``SIGKILL`` (137); the launcher reports it.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Mapping, Sequence

from lockstep_sglang import pins, termination, timeline
from lockstep_sglang.config import RuntimeConfig

logger = logging.getLogger("lockstep_sglang.engine")

EXIT_REFUSED = 2
EXIT_FAILED = 1


def refuse(message: str) -> int:
    """Print why the server will not start and return its exit code."""
    print(message, file=sys.stderr, flush=True)
    termination.refused(message)  # the pod's status says it, not only the log
    return EXIT_REFUSED


def check_pins(declared: str | None = None) -> pins.PinReport:
    """The pin check of the installed SGLang against its release's pins (and against the
    release the deployment `declared`), with SGLang's CUDA-only import warnings silenced
    on CPU machines."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pins.check(expected_version=declared)


def unsupported_mode(server_args: object, environ: Mapping[str, str] | None = None) -> str | None:
    """Why lockstep cannot guard this server mode, or None when it can.

    The probe route lives in SGLang's Python HTTP server and its answer comes back
    through the single tokenizer manager; a server without them would fail every deep
    probe and be restarted forever, so it is refused up front. Every field read here
    exists on the real ``ServerArgs`` (tests/sglang checks the list against it).
    """
    for flag in UNSUPPORTED_FLAGS:
        if getattr(server_args, flag):
            return f"--{flag.replace('_', '-')} is not supported (lockstep guards the HTTP server)"
    if int(server_args.tokenizer_worker_num or 1) > 1:  # type: ignore[attr-defined]
        return "--tokenizer-worker-num above 1 is not supported (the probe needs one tokenizer)"
    if int(server_args.pp_size or 1) > 1:  # type: ignore[attr-defined]
        # As the operator's policy (operator-owned flag pp_size): the consensus and the
        # deep probe cover one TP group, not pipeline stages that decide at other times.
        return (
            "--pp-size above 1 is not supported (lockstep guards tensor-parallel groups; "
            "run without pipeline parallelism)"
        )
    env = os.environ if environ is None else environ
    if env.get("SGLANG_RUST_SERVER", "").strip().lower() in {"1", "true", "yes", "on"}:
        return "SGLANG_RUST_SERVER is not supported (the probe route is in the Python server)"
    return None


UNSUPPORTED_FLAGS = ("encoder_only", "smg_grpc_mode", "grpc_mode", "use_ray")
# The ServerArgs fields the runtime reads (checked against the real class by a test).
SERVER_ARGS_READ = (*UNSUPPORTED_FLAGS, "tokenizer_worker_num", "pp_size", "node_rank")


def run(config: RuntimeConfig, sglang_argv: list[str]) -> int:
    """Check, then serve until SGLang stops; returns the exit code."""
    timeline.mark(config.state_dir, "engine_start")
    report = check_pins(config.sglang_version)
    if not report.ok:
        return refuse(report.message())
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    from lockstep_sglang import server_hooks

    timeline.mark(config.state_dir, "sglang_imported")

    load_plugins()  # as sglang.launch_server does
    server_args = prepare_server_args(sglang_argv)
    reason = unsupported_mode(server_args)
    if reason is not None:
        return refuse(f"lockstep-sglang refuses to start: {reason}")
    server_hooks.install_server_hooks(config)
    server_hooks.launch(server_args)
    if int(server_args.node_rank or 0) >= 1:
        # A non-leader node returns when its schedulers end: never a clean stop.
        logger.error("lockstep: the schedulers of this node ended")
        return EXIT_FAILED
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lockstep_sglang.engine <SGLang server argv>``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s lockstep %(message)s")
    try:
        config = RuntimeConfig.from_env()
    except ValueError as exc:
        return refuse(f"lockstep-sglang refuses to start: {exc}")
    return run(config, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())

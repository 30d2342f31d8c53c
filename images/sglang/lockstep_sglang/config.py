"""Runtime settings, from ``LOCKSTEP_*`` environment variables.

Environment, not argv: SGLang's argv stays exactly what the operator rendered (and what
SGLang validates), and every process of the server (main, schedulers, DP controller,
pod agent) inherits the same settings without extra plumbing.

| variable | default | meaning |
| --- | --- | --- |
| ``LOCKSTEP_STATE_DIR`` | ``/dev/shm/lockstep`` | rank-state files (shared with the agent) |
| ``LOCKSTEP_CONSENSUS`` | ``1`` | decision consensus on (``0``: rank state only); when unset, an explicit ``SGLANG_ENABLE_RANK_CONSENSUS_CHECKER`` decides |
| ``LOCKSTEP_CONSENSUS_PAUSE_S`` | ``0.05`` | pause between two cross-rank comparisons |
| ``LOCKSTEP_GLOO_TIMEOUT_S`` | ``600`` | cap on every gloo group's timeout (alias ``LOCKSTEP_GLOO_TIMEOUT_SECONDS``) |
| ``LOCKSTEP_AGENT`` | ``1`` | start the pod agent |
| ``LOCKSTEP_AGENT_HOST`` / ``_PORT`` | ``0.0.0.0`` / ``8790`` | pod agent address |
| ``LOCKSTEP_PROBE_TIMEOUT_S`` | ``5`` | ``/lockstep/probe`` default timeout |
| ``LOCKSTEP_PROBE_MAX_TIMEOUT_S`` | ``60`` | largest ``?timeout=`` accepted |
| ``LOCKSTEP_EXIT_HOLD_S`` | ``30`` | after the server ends on its own, how long the pod agent keeps serving its evidence before the container exits |
| ``LOCKSTEP_GROUP_EPOCH`` | unset | the group epoch the operator created the pod in (decimal) |
| ``LOCKSTEP_AGENT_TOKEN`` | unset | bearer token of the agent's ``/ranks``, ``/stacks`` and ``/restart`` (unset: they answer 403) |
| ``LOCKSTEP_POD_NAME`` | unset | echoed by the agent's ``/ranks`` |
| ``LOCKSTEP_SUBPROCESS_START`` | ``fork`` | how SGLang's scheduler and detokenizer processes start: ``fork`` (from the engine process, SGLang already imported, where no device context makes it unsafe: :mod:`lockstep_sglang.start_method`) or ``spawn`` (SGLang's own way) |
| ``LOCKSTEP_SGLANG_VERSION`` | unset | the SGLang release the deployment declares (``spec.sglangVersion``): the launcher refuses an image that runs another (unset: any supported release) |

The group epoch: the operator renders it into the pod (``LOCKSTEP_GROUP_EPOCH``, and the
port of ``--dist-init-addr``: ``20000 + epoch % 1000``). An in-place restart
(``POST /restart`` on the pod agent) moves a running container to a newer epoch without
recreating the pod, so its env and argv keep the old one: the agent writes the new epoch
to ``<state_dir>/epoch`` (which outlives the container) before it ends the ranks, and at
the next start :func:`effective_epoch` prefers that file, and :func:`resolve_epoch` moves
the rendezvous port to it, so ranks of the old epoch can never join the new rendezvous.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from lockstep_sglang import consensus, gloo_timeout, probe, rank_state, start_method

CONSENSUS_ENV = "LOCKSTEP_CONSENSUS"
CONSENSUS_PAUSE_ENV = "LOCKSTEP_CONSENSUS_PAUSE_S"
SGLANG_CONSENSUS_ENV = "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"
AGENT_ENV = "LOCKSTEP_AGENT"
# Here, not in lockstep_sglang.agent: the agent reads its address and the group epoch from
# this module, so this module never imports the agent (pyproject.toml's import contracts
# keep the runtime acyclic).
AGENT_HOST_ENV = "LOCKSTEP_AGENT_HOST"
AGENT_PORT_ENV = "LOCKSTEP_AGENT_PORT"
DEFAULT_AGENT_HOST = "0.0.0.0"
DEFAULT_AGENT_PORT = 8790
PROBE_TIMEOUT_ENV = "LOCKSTEP_PROBE_TIMEOUT_S"
PROBE_MAX_TIMEOUT_ENV = "LOCKSTEP_PROBE_MAX_TIMEOUT_S"
EXIT_HOLD_ENV = "LOCKSTEP_EXIT_HOLD_S"
DEFAULT_EXIT_HOLD_S = 30.0
EPOCH_ENV = "LOCKSTEP_GROUP_EPOCH"
SGLANG_VERSION_ENV = "LOCKSTEP_SGLANG_VERSION"  # the deployment's spec.sglangVersion
EPOCH_FILE = "epoch"
# Must equal the operator's DIST_PORT_BASE / DIST_PORT_SPAN (lockstep.api.constants); a unit
# test checks dist_port against lockstep.core.builders.dist_port (this package cannot import it).
DIST_PORT_BASE = 20000
DIST_PORT_SPAN = 1000
DIST_INIT_FLAGS = ("--dist-init-addr", "--nccl-init-addr")  # SGLang's flag and its alias

logger = logging.getLogger(__name__)
_DECIMAL = re.compile(r"[0-9]+")


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name} must be 0 or 1, got {raw!r}")


def _seconds(env: Mapping[str, str], name: str, default: float, *, zero_ok: bool = False) -> float:
    raw = env.get(name, "").strip()
    value = float(raw) if raw else default
    if not (value >= 0 if zero_ok else value > 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {raw!r}")
    return value


@dataclass(frozen=True)
class RuntimeConfig:
    """Every lockstep setting of one SGLang server process tree."""

    state_dir: Path
    consensus: bool
    consensus_pause_s: float
    gloo_timeout: timedelta
    agent: bool
    agent_host: str
    agent_port: int
    probe_timeout_s: float
    probe_max_timeout_s: float
    exit_hold_s: float = DEFAULT_EXIT_HOLD_S
    # The SGLang release the deployment declares (the operator renders it): the launcher
    # refuses an image that runs another one. None: whatever supported release it finds.
    sglang_version: str | None = None
    # How SGLang's subprocesses start (lockstep_sglang.start_method): "fork" or "spawn".
    subprocess_start: str = start_method.DEFAULT

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RuntimeConfig:
        """Read the settings; a malformed value raises ``ValueError`` naming the variable."""
        env = os.environ if environ is None else environ
        return cls(
            state_dir=Path(env.get(rank_state.STATE_DIR_ENV) or rank_state.DEFAULT_STATE_DIR),
            # An explicit SGLang switch (the operator may render it) is the default.
            consensus=_flag(env, CONSENSUS_ENV, _flag(env, SGLANG_CONSENSUS_ENV, True)),
            consensus_pause_s=_seconds(
                env, CONSENSUS_PAUSE_ENV, consensus.DEFAULT_PAUSE_S, zero_ok=True
            ),
            gloo_timeout=gloo_timeout.timeout_from_env(env),
            agent=_flag(env, AGENT_ENV, True),
            agent_host=env.get(AGENT_HOST_ENV) or DEFAULT_AGENT_HOST,
            agent_port=int(env.get(AGENT_PORT_ENV) or DEFAULT_AGENT_PORT),
            probe_timeout_s=_seconds(env, PROBE_TIMEOUT_ENV, probe.DEFAULT_TIMEOUT_S),
            probe_max_timeout_s=_seconds(env, PROBE_MAX_TIMEOUT_ENV, probe.MAX_TIMEOUT_S),
            exit_hold_s=_seconds(env, EXIT_HOLD_ENV, DEFAULT_EXIT_HOLD_S, zero_ok=True),
            sglang_version=env.get(SGLANG_VERSION_ENV, "").strip() or None,
            subprocess_start=start_method.requested(env),
        )


def parse_epoch(raw: object) -> int:
    """A group epoch: a decimal string (or a non-negative int); ``ValueError`` otherwise."""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return raw
    if isinstance(raw, str) and _DECIMAL.fullmatch(raw.strip()):
        return int(raw.strip())
    raise ValueError(f"must be a decimal string, got {raw!r}")


def epoch_file(state_dir: Path) -> Path:
    """Where an accepted in-place restart leaves the new epoch."""
    return state_dir / EPOCH_FILE


def read_epoch_file(state_dir: Path) -> int | None:
    """The epoch in ``<state_dir>/epoch``; None when absent or unreadable (logged)."""
    path = epoch_file(state_dir)
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("lockstep: cannot read %s: %s", path, exc)
        return None
    try:
        return parse_epoch(raw)
    except ValueError as exc:
        # Written atomically, so only a hand edit gets here; the env epoch still works.
        logger.warning("lockstep: ignoring %s: %s", path, exc)
        return None


def write_epoch_file(state_dir: Path, epoch: int) -> None:
    """Durably replace ``<state_dir>/epoch``: temp file, fsync, rename, fsync the dir."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = epoch_file(state_dir)
    tmp = path.with_name(f".{EPOCH_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, f"{epoch}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def effective_epoch(state_dir: Path, environ: Mapping[str, str] | None = None) -> str | None:
    """The group epoch this container runs in: ``<state_dir>/epoch``, else the env's.

    A file older than ``LOCKSTEP_GROUP_EPOCH`` is stale (a state dir that outlived its
    pod, with a newer pod created in its place) and is ignored. None: no epoch at all.
    """
    env = os.environ if environ is None else environ
    from_env = env.get(EPOCH_ENV, "").strip() or None
    from_file = read_epoch_file(state_dir)
    if from_file is None:
        return from_env
    if from_env is not None:
        try:
            if parse_epoch(from_env) > from_file:
                logger.warning(
                    "lockstep: %s (epoch %d) is older than %s=%s; ignoring it",
                    epoch_file(state_dir), from_file, EPOCH_ENV, from_env,
                )  # fmt: skip
                return from_env
        except ValueError:
            pass
    return str(from_file)


def dist_port(epoch: int) -> int:
    """The torch.distributed rendezvous port of a group epoch (as the operator renders it)."""
    return DIST_PORT_BASE + epoch % DIST_PORT_SPAN


def move_dist_port(addr: str, epoch: int) -> str:
    """``HOST:PORT`` with PORT replaced by ``dist_port(epoch)`` (IPv6 hosts in brackets)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--dist-init-addr must be HOST:PORT, got {addr!r}")
    return f"{host}:{dist_port(epoch)}"


def move_dist_init_addr(argv: Sequence[str], epoch: int) -> list[str]:
    """SGLang's argv with the port of ``--dist-init-addr`` (either form) moved to ``epoch``."""
    out = list(argv)
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if flag not in DIST_INIT_FLAGS:
            continue
        if eq:
            out[i] = f"{flag}={move_dist_port(value, epoch)}"
        elif i + 1 < len(out):
            out[i + 1] = move_dist_port(out[i + 1], epoch)
    return out


def resolve_epoch(
    state_dir: Path, argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[str | None, list[str]]:
    """The effective epoch, and SGLang's argv with the rendezvous port moved to it.

    The argv is rewritten only when the effective epoch is not the env's (the container
    was restarted in place into a newer epoch); otherwise it is what the operator rendered.
    """
    env = os.environ if environ is None else environ
    epoch = effective_epoch(state_dir, env)
    if epoch is None or epoch == (env.get(EPOCH_ENV, "").strip() or None):
        return epoch, list(argv)
    moved = move_dist_init_addr(argv, int(epoch))
    logger.info(
        "lockstep: restarted in place into epoch %s (env %s): rendezvous port %d",
        epoch, env.get(EPOCH_ENV), dist_port(int(epoch)),
    )  # fmt: skip
    return epoch, moved

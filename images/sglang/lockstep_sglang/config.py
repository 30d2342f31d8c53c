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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from lockstep_sglang import agent, consensus, gloo_timeout, probe, rank_state

CONSENSUS_ENV = "LOCKSTEP_CONSENSUS"
CONSENSUS_PAUSE_ENV = "LOCKSTEP_CONSENSUS_PAUSE_S"
SGLANG_CONSENSUS_ENV = "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"
AGENT_ENV = "LOCKSTEP_AGENT"
PROBE_TIMEOUT_ENV = "LOCKSTEP_PROBE_TIMEOUT_S"
PROBE_MAX_TIMEOUT_ENV = "LOCKSTEP_PROBE_MAX_TIMEOUT_S"


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
            agent_host=env.get(agent.HOST_ENV) or agent.DEFAULT_HOST,
            agent_port=int(env.get(agent.PORT_ENV) or agent.DEFAULT_PORT),
            probe_timeout_s=_seconds(env, PROBE_TIMEOUT_ENV, probe.DEFAULT_TIMEOUT_S),
            probe_max_timeout_s=_seconds(env, PROBE_MAX_TIMEOUT_ENV, probe.MAX_TIMEOUT_S),
        )

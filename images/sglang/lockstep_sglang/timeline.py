"""Where a (re)start's time goes: the milestones of each incarnation of a pod's SGLang
container, one JSON line each, appended to ``<state dir>/timeline.jsonl``.

A restart of a group is, per pod: the container ends (``restarted``: the pod agent was
told to restart it, or ``engine_ended``), the kubelet starts it again
(``container_start``: the launcher's first line), the engine process starts
(``engine_start``) and imports SGLang (``sglang_imported``), starts SGLang's
subprocesses (``subprocess_start``: forked or spawned, :mod:`lockstep_sglang.start_method`),
each scheduler loads the
model and allocates its KV cache and enters its loop (``scheduler_loop``, per TP rank),
the HTTP server warms up, and the first deep probe passes (``probe_ok``). The operator's
own steps (drain, evidence, restart slot, re-admission) are in its records. The file
survives the container (it lives in the state dir, a pod volume) and is bounded
(``MAX_LINES``: the oldest half is dropped beyond it).

Appending a line costs one ``open``/``write``; a failure to write is logged once and
never raised: a milestone must not be what stops a server.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from lockstep_sglang import rank_state

logger = logging.getLogger("lockstep_sglang.timeline")

FILE = "timeline.jsonl"
MAX_LINES = 2000
EVENTS = (
    "container_start",
    "engine_start",
    "sglang_imported",
    "subprocess_start",
    "scheduler_loop",
    "probe_ok",
    "restarted",
    "engine_ended",
)
_warned = False


def mark(state_dir: Path | str | None, event: str, **extra: Any) -> None:
    """Append ``event`` (one of :data:`EVENTS`) with the wall-clock time to the state
    dir's timeline (the runtime's state dir, as its config reads it, when ``state_dir``
    is None)."""
    global _warned
    if event not in EVENTS:
        raise ValueError(f"unknown timeline event {event!r}; one of {', '.join(EVENTS)}")
    base = state_dir
    if base is None:
        base = os.environ.get(rank_state.STATE_DIR_ENV) or rank_state.DEFAULT_STATE_DIR
    line = json.dumps({"event": event, "at": time.time(), "pid": os.getpid(), **extra})
    path = Path(base) / FILE
    try:
        with path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
        if path.stat().st_size > MAX_LINES * 40:  # a line is longer: a cheap first check
            _trim(path)
    except OSError as exc:
        if not _warned:
            _warned = True
            logger.warning("lockstep: cannot write the start-up timeline %s: %s", path, exc)


def _trim(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) > MAX_LINES:
        path.write_text("\n".join(lines[-(MAX_LINES // 2) :]) + "\n", encoding="utf-8")


def read(state_dir: Path | str) -> list[dict[str, Any]]:
    """Every milestone recorded in the state dir, oldest first (a line cut short by a
    kill is skipped)."""
    path = Path(state_dir) / FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("at"), int | float):
            out.append(item)
    return out

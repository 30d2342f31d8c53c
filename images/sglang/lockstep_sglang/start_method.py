"""How SGLang's subprocesses start: forked from the engine process, which has imported
SGLang already, instead of spawned into fresh interpreters that import it again.

SGLang sets ``multiprocessing``'s start method to ``spawn`` (``_set_envs_and_config``)
before it starts its scheduler and detokenizer processes, so every start, and every
in-place restart, pays SGLang's imports once in the engine process and again in each of
its subprocesses, all at once on the pod's cores (on this project's 2-core machine, more
than half of a real-engine restart). The engine process (:mod:`lockstep_sglang.engine`)
has imported SGLang's scheduler by then (the hooks live there), so a forked child starts
in the loaded interpreter and goes straight to its distributed init and weights.

It is the default (``LOCKSTEP_SUBPROCESS_START=spawn`` keeps SGLang's own way): on this
project's 2-core machine it took a real-engine restart's "every scheduler in its loop"
from 92.3 s to 8.4 s, and the real-engine sequence drill (desync, then a stopped rank,
through the router) from 653.8 s to 368.6 s. It was opted into for a while because that
drill once failed with it on (a healthy decode group's pair tries failed while it ran
three long streams, and it was restarted; cause not found, not seen again since the
drills' streams were sized to end: the runtime's README says what was run).

A fork is only safe from a parent that holds no device context: a CUDA context does not
survive ``fork`` (the child's first CUDA call fails), so the engine process decides
just before SGLang starts its schedulers (:func:`decide`), from what is true at that
moment, and keeps ``spawn`` where:

- ``torch.cuda.is_initialized()`` is true in the engine process (something touched the
  GPU; on a GPU node SGLang's own argument checks may do so), or
- the pod sets ``LOCKSTEP_SUBPROCESS_START=spawn``, or
- the platform has no ``fork`` (not Linux).

The choice and its reason are a milestone of the pod's start-up timeline
(``subprocess_start``: ``method``, ``why``, the engine process's threads at that moment),
so a restart's record says which path ran. Nothing else changes: the scheduler entry,
its hooks and SGLang's own code run as they do when spawned.
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lockstep_sglang import timeline

logger = logging.getLogger("lockstep_sglang.start_method")

START_ENV = "LOCKSTEP_SUBPROCESS_START"
METHODS = ("fork", "spawn")
DEFAULT = "fork"  # see the module docstring


@dataclass(frozen=True)
class Choice:
    """How this engine's subprocesses start, and why."""

    method: str
    why: str


def requested(environ: Mapping[str, str]) -> str:
    """The pod's ``LOCKSTEP_SUBPROCESS_START`` (default ``fork``); ``ValueError`` names
    the variable and the values it takes."""
    raw = environ.get(START_ENV, "").strip().lower() or DEFAULT
    if raw not in METHODS:
        raise ValueError(f"{START_ENV} must be one of {', '.join(METHODS)}, got {raw!r}")
    return raw


def decide(wanted: str, *, cuda_initialized: bool, available: tuple[str, ...]) -> Choice:
    """Fork, unless something makes it unsafe or the pod asked for spawn (pure)."""
    if wanted == "spawn":
        return Choice("spawn", f"SGLang's own spawn, as the pod asks ({START_ENV}=spawn)")
    if "fork" not in available:
        return Choice("spawn", f"this platform ({sys.platform}) cannot fork")
    if cuda_initialized:
        return Choice(
            "spawn",
            "the engine process holds a CUDA context (torch.cuda.is_initialized()): a "
            "forked scheduler could not use the GPU",
        )
    return Choice("fork", "the engine process has SGLang imported and no device context")


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")  # never imported here for the check alone
    if torch is None:
        return False
    return bool(torch.cuda.is_initialized())


def apply(
    state_dir: Path | None,
    wanted: str,
    *,
    cuda_initialized: Callable[[], bool] = _cuda_initialized,
) -> Choice:
    """Decide and set the start method of this process's next ``multiprocessing``
    children (called just before SGLang starts its schedulers); mark it in the timeline.
    ``wanted``: the pod's :func:`requested` method."""
    choice = decide(
        wanted,
        cuda_initialized=cuda_initialized(),
        available=tuple(multiprocessing.get_all_start_methods()),
    )
    multiprocessing.set_start_method(choice.method, force=True)
    threads = sorted(t.name for t in threading.enumerate())
    timeline.mark(
        state_dir, "subprocess_start", method=choice.method, why=choice.why, threads=threads
    )
    logger.info("lockstep: SGLang's subprocesses start by %s: %s", choice.method, choice.why)
    return choice

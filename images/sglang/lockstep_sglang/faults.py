"""Test-only faults on command: a ``fault.json`` every rank reads once per iteration.

Two engines read it: the CPU stand-in (always, ``$LOCKSTEP_POD_DIR/fault.json``) and the
real SGLang runtime, where it is a **test-only switch, off unless**
``LOCKSTEP_TEST_FAULT_FILE`` names the file (:func:`watcher_from_env`). The operator
refuses to render that variable (policy rule ``operator-owned-env``); only the local
cluster's process kubelet and the test tiers set it, to force a real divergence or hang
into the real scheduler loop (:mod:`lockstep_sglang.hooks`).

Format (every field optional)::

    {"kind": "none" | "desync" | "hang" | "slow" | "stuck-in-kernel" | "transfer-stall"
             | "bootstrap-down" | "kv-leak",
     "ranks": [global ranks] | null,
     "step_seconds": float,          # slow: added to every iteration that runs a batch
     "epoch": str | null}            # only while LOCKSTEP_GROUP_EPOCH equals it

``ranks: null`` names every rank of this pod, except for ``desync``, where it names only
the pod's highest global rank (every rank deciding differently would be no divergence).
The PD path's faults belong to the pod's HTTP process, not to a rank (``ranks`` is
ignored, :meth:`Fault.pd_fault`): ``transfer-stall``, a prefill whose KV sender stops
sending for new bootstrap rooms (its collectives, HTTP server and deep probe stay fine);
``bootstrap-down``, a prefill whose bootstrap server stops answering; ``kv-leak``, a
decode that keeps the KV of PD requests that ended before their hand-off completed
(cancelled, failed) instead of freeing it (:mod:`lockstep_sglang.ended_kv`).

``stuck-in-kernel`` is the CPU stand-in's only (the real runtime ignores it): the named
ranks, inside their next model step, wait in the kernel (uninterruptible sleep, as a GPU
driver call that never returns) until killed (``lockstep_standin.kernel_wait``).

``epoch`` lets an injector aim at one incarnation of a group: after the operator restarts
the group in a new epoch, the fault no longer applies even if the file stays.

A rank stats the file at most once per ``min_interval_s`` (one syscall; SGLang's idle
loop spins far faster than the stand-in's) and parses it only when its mtime, size or
inode changed; an unreadable or malformed file counts as no fault and is logged once,
so a half-written file never crashes a rank.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

logger = logging.getLogger(__name__)

FAULT_FILE = "fault.json"
FAULT_FILE_ENV = "LOCKSTEP_TEST_FAULT_FILE"
FaultKind = Literal[
    "none", "desync", "hang", "slow", "stuck-in-kernel", "transfer-stall", "bootstrap-down",
    "kv-leak",
]  # fmt: skip
KINDS: tuple[FaultKind, ...] = (
    "none", "desync", "hang", "slow", "stuck-in-kernel", "transfer-stall", "bootstrap-down",
    "kv-leak",
)  # fmt: skip
# Faults of the pod's PD path (its HTTP process), not of its ranks' loops.
PD_KINDS: frozenset[FaultKind] = frozenset({"transfer-stall", "bootstrap-down", "kv-leak"})


@dataclass(frozen=True)
class Fault:
    """One fault instruction (see the module docstring)."""

    kind: FaultKind = "none"
    ranks: frozenset[int] | None = None
    step_seconds: float = 0.0
    epoch: str | None = None

    def targets(self, rank: int, local_ranks: Sequence[int], epoch: str | None) -> bool:
        """Whether this fault applies to global ``rank`` of a pod holding ``local_ranks``."""
        if self.kind == "none" or self.kind in PD_KINDS:
            return False
        if self.epoch is not None and self.epoch != epoch:
            return False
        if self.ranks is not None:
            return rank in self.ranks
        if self.kind == "desync":
            return rank == max(local_ranks)
        return True

    def pd_fault(self, kind: FaultKind, epoch: str | None) -> bool:
        """Whether the PD-path fault ``kind`` is in force in this pod's ``epoch``."""
        return self.kind == kind and kind in PD_KINDS and self.epoch in (None, epoch)


NO_FAULT = Fault()


def parse_fault(data: object) -> Fault:
    """A :class:`Fault` from the decoded JSON; ``ValueError`` naming the bad field."""
    if not isinstance(data, dict):
        raise ValueError("fault must be a JSON object")
    kind = data.get("kind", "none")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    raw_ranks = data.get("ranks")
    ranks: frozenset[int] | None = None
    if raw_ranks is not None:
        if not isinstance(raw_ranks, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in raw_ranks
        ):
            raise ValueError("ranks must be a list of integers or null")
        ranks = frozenset(raw_ranks)
    step = data.get("step_seconds", 0.0)
    if not isinstance(step, int | float) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step_seconds must be a non-negative number, got {step!r}")
    epoch = data.get("epoch")
    return Fault(
        kind=cast(FaultKind, kind),
        ranks=ranks,
        step_seconds=float(step),
        epoch=None if epoch is None else str(epoch),
    )


class FaultWatcher:
    """The current fault of one rank, re-read only when the file changes."""

    def __init__(self, path: Path, *, min_interval_s: float = 0.0) -> None:
        self.path = path
        self.min_interval_s = min_interval_s
        self._key: tuple[int, int, int] | None = None
        self._fault = NO_FAULT
        self._warned: tuple[int, int, int] | None = None
        self._next_check = 0.0

    def current(self) -> Fault:
        """The fault in force now (one ``stat`` when the file did not change)."""
        if self.min_interval_s > 0:
            now = time.monotonic()
            if now < self._next_check:
                return self._fault
            self._next_check = now + self.min_interval_s
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._key is not None:
                logger.warning("fault cleared (%s removed)", self.path)
            self._key, self._fault = None, NO_FAULT
            return NO_FAULT
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self._key:
            return self._fault
        try:
            fault = parse_fault(json.loads(self.path.read_text()))
        except (OSError, ValueError) as exc:
            # Not cached: a file caught half-written is read again next iteration.
            if self._warned != key:
                logger.warning("ignoring fault file %s: %s", self.path, exc)
                self._warned = key
            self._fault = NO_FAULT
            return NO_FAULT
        if fault != self._fault:
            logger.warning("fault now in force: %s", fault)
        self._key, self._fault = key, fault
        return fault


def watcher_from_env(
    environ: Mapping[str, str] | None = None, *, min_interval_s: float = 0.05
) -> FaultWatcher | None:
    """The real runtime's fault switch: a watcher when ``LOCKSTEP_TEST_FAULT_FILE`` is
    set, else None (the production path: no fault is ever read)."""
    env = os.environ if environ is None else environ
    raw = env.get(FAULT_FILE_ENV, "").strip()
    if not raw:
        return None
    logger.warning(
        "lockstep: TEST FAULT SWITCH ON (%s=%s): faults written there are injected into "
        "this rank; never set it in production",
        FAULT_FILE_ENV,
        raw,
    )
    return FaultWatcher(Path(raw), min_interval_s=min_interval_s)

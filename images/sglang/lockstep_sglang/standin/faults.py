"""Faults on command: ``$LOCKSTEP_POD_DIR/fault.json``, read by every rank once per iteration.

Format (every field optional)::

    {"kind": "none" | "desync" | "hang" | "slow",
     "ranks": [global ranks] | null,
     "step_seconds": float,          # slow: added to every iteration that runs a batch
     "epoch": str | null}            # only while LOCKSTEP_GROUP_EPOCH equals it

``ranks: null`` names every rank of this pod, except for ``desync``, where it names only
the pod's highest global rank (every rank deciding differently would be no divergence).
``epoch`` lets an injector aim at one incarnation of a group: after the operator restarts
the group in a new epoch, the fault no longer applies even if the file stays.

A rank stats the file once per iteration (one syscall) and parses it only when its
mtime, size or inode changed; an unreadable or malformed file counts as no fault and is
logged once, so a half-written file never crashes a rank.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

logger = logging.getLogger(__name__)

FAULT_FILE = "fault.json"
FaultKind = Literal["none", "desync", "hang", "slow"]
KINDS: tuple[FaultKind, ...] = ("none", "desync", "hang", "slow")


@dataclass(frozen=True)
class Fault:
    """One fault instruction (see the module docstring)."""

    kind: FaultKind = "none"
    ranks: frozenset[int] | None = None
    step_seconds: float = 0.0
    epoch: str | None = None

    def targets(self, rank: int, local_ranks: Sequence[int], epoch: str | None) -> bool:
        """Whether this fault applies to global ``rank`` of a pod holding ``local_ranks``."""
        if self.kind == "none":
            return False
        if self.epoch is not None and self.epoch != epoch:
            return False
        if self.ranks is not None:
            return rank in self.ranks
        if self.kind == "desync":
            return rank == max(local_ranks)
        return True


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

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: tuple[int, int, int] | None = None
        self._fault = NO_FAULT
        self._warned: tuple[int, int, int] | None = None

    def current(self) -> Fault:
        """The fault in force now (one ``stat`` when the file did not change)."""
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

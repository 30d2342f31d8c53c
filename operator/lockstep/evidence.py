"""The evidence store: what was captured about each incident, kept outside status.

An incident has two kinds of evidence: what the verdict rested on (the planner's summary,
small) and what was captured before the restart (every pod agent's rank states, py-spy
stacks, the last log lines: up to `recovery.diagnostics.maxEvidenceBytes`). Both are
kept here, per incident id, and status shows them (`lockstep.status`); status itself is
never read back.

Persisted in one ConfigMap per PDDeployment, `<name>-evidence` (owned by it, so it goes
with it), one key per incident of the history; so an operator restarted mid-incident
still has, and shows, the evidence it captured. Bounded: the history's incidents only,
each at most `maxEvidenceBytes` (a ConfigMap holds up to 1 MiB: 20 incidents x 16 KiB by
default). The pure part (entries, rendering, the ConfigMap's data) is separate from the
small I/O class at the end.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

log = logging.getLogger(__name__)

EVIDENCE_MARK = "\n--- captured before restart ---\n"
COMPONENT = "evidence"  # the ConfigMap's lockstep.dev/component label


@dataclass(frozen=True)
class EvidenceEntry:
    """One incident's evidence: the verdict's summary, and the capture (once done)."""

    verdict: str = ""
    captured: str | None = None  # None: not captured (yet)
    # A consensus divergence found in the captured rank states: the incident's cause.
    cause: str | None = None

    def render(self, max_bytes: int) -> str:
        """The text status shows: the summary, then the capture, bounded."""
        if self.captured is None:
            return self.verdict[:max_bytes]
        room = max(0, max_bytes - len(self.verdict) - len(EVIDENCE_MARK))
        return self.verdict + EVIDENCE_MARK + self.captured[:room]


def configmap_name(deployment: str) -> str:
    """The evidence ConfigMap of a PDDeployment."""
    return f"{deployment}-evidence"


def to_data(entries: Mapping[str, EvidenceEntry]) -> dict[str, str]:
    """The ConfigMap's data: one JSON document per incident id."""
    return {
        key: json.dumps({"verdict": e.verdict, "captured": e.captured, "cause": e.cause})
        for key, e in entries.items()
    }


def from_data(data: Mapping[str, str] | None) -> dict[str, EvidenceEntry]:
    """Entries from a ConfigMap's data (unreadable keys are skipped, loudly)."""
    out: dict[str, EvidenceEntry] = {}
    for key, raw in (data or {}).items():
        try:
            obj = json.loads(raw)
            out[key] = EvidenceEntry(
                verdict=str(obj.get("verdict") or ""),
                captured=None if obj.get("captured") is None else str(obj["captured"]),
                cause=None if obj.get("cause") is None else str(obj["cause"]),
            )
        except (ValueError, AttributeError) as err:
            log.error("evidence %s unreadable, skipped: %s", key, err)
    return out


class ConfigMapIO(Protocol):
    """The two calls the store makes (`lockstep.kube.Kube` has them)."""

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def apply_configmap(self, obj: dict[str, Any]) -> None: ...


class EvidenceStore:
    """The evidence of every deployment this operator runs, in memory and persisted.

    A deployment's entries are loaded from its ConfigMap on first use (an operator
    restart), then kept in memory; every change is written back at once.
    """

    def __init__(self, io: ConfigMapIO) -> None:
        self.io = io
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str], dict[str, EvidenceEntry]] = {}

    def entries(self, namespace: str, name: str, uid: str) -> dict[str, EvidenceEntry]:
        """A copy of one deployment's entries (loaded from its ConfigMap the first time)."""
        key = (namespace, name, uid)
        with self._lock:
            cached = self._entries.get(key)
        if cached is None:
            found = self.io.read_configmap(namespace, configmap_name(name))
            cached = from_data((found or {}).get("data"))
            with self._lock:
                self._entries.setdefault(key, cached)
        return dict(cached)

    def update(
        self,
        namespace: str,
        name: str,
        uid: str,
        changes: Mapping[str, EvidenceEntry],
        keep: Collection[str],
        build: Callable[[dict[str, str]], dict[str, Any]],
    ) -> None:
        """Apply `changes` (by incident id), drop entries not in `keep` (the history), and
        write the ConfigMap `build` makes from the data when anything changed."""
        current = self.entries(namespace, name, uid)
        updated = {k: v for k, v in {**current, **changes}.items() if k in keep}
        if updated == current:
            return
        self.io.apply_configmap(build(to_data(updated)))
        with self._lock:
            self._entries[(namespace, name, uid)] = updated

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deployment's entries from memory (its ConfigMap goes with it)."""
        with self._lock:
            for key in [k for k in self._entries if k[:2] == (namespace, name)]:
                del self._entries[key]


def with_verdict(entry: EvidenceEntry | None, verdict: str) -> EvidenceEntry:
    """`entry` with the planner's (possibly refined) summary."""
    return replace(entry or EvidenceEntry(), verdict=verdict)

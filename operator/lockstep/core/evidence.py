"""The evidence store: what was captured about each incident, kept outside status.

An incident has two kinds of evidence: what the verdict rested on (the planner's summary,
small) and what was captured before the restart (every pod agent's rank states, py-spy
stacks, the last log lines: up to `recovery.diagnostics.maxEvidenceBytes`). Both are
kept here, per incident id, and status shows them (`lockstep.core.status`); status itself is
never read back.

Persisted in one ConfigMap per PDDeployment, `<name>-evidence` (owned by it, so it goes
with it), one key per incident of the history; so an operator restarted mid-incident
still has, and shows, the evidence it captured. Bounded: the history's incidents only,
each at most `maxEvidenceBytes` (a ConfigMap holds up to 1 MiB: 20 incidents x 16 KiB by
default). The pure part (entries, rendering, the ConfigMap's data) is separate from the
small I/O class at the end.

A capture larger than that bound (a wide group: TP8 over two pods, TP16) is also kept
whole, in a ConfigMap of its own (`<name>-evidence-<slot>`, at most
`recovery.diagnostics.fullCaptures` of them, the oldest incident's slot reused), and the
entry names it (`full`): status keeps the fitted capture and says where the whole one is.
A ring of slots, not one ConfigMap per incident id, so the count stays bounded without
the operator listing or deleting ConfigMaps (its grant on them is get, create, patch).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

log = logging.getLogger(__name__)

EVIDENCE_MARK = "\n--- captured before restart ---\n"
COMPONENT = "evidence"  # the ConfigMap's lockstep.dev/component label
FULL_COMPONENT = "evidence-capture"  # a whole capture's ConfigMap's label
# A whole capture's bound: a ConfigMap holds 1 MiB in all (metadata, the other key).
FULL_CAPTURE_MAX_BYTES = 786432
FULL_NOTE = "[evidence] the whole capture: ConfigMap "
MISSED_NOTE = "[evidence] the whole capture was not kept: "


@dataclass(frozen=True)
class EvidenceEntry:
    """One incident's evidence: the verdict's summary, and the capture (once done)."""

    verdict: str = ""
    captured: str | None = None  # None: not captured (yet)
    # A consensus divergence found in the captured rank states: the incident's cause.
    cause: str | None = None
    # The ConfigMap that holds the whole capture (it did not fit the bound), or None.
    full: str | None = None
    # Why a capture that did not fit the bound was not kept whole (None: it was, or fit).
    full_missed: str | None = None

    def render(self, max_bytes: int) -> str:
        """The text status shows: the summary, then the capture, bounded (the capture
        fitted to the room left with every pod's share kept, `fit_capture`), then where
        the whole capture is when it did not fit."""
        if self.captured is None:
            return self.verdict[:max_bytes]
        note = "" if self.full is None else f"\n{FULL_NOTE}{self.full}"
        if self.full_missed is not None:
            note += f"\n{MISSED_NOTE}{self.full_missed}"
        room = max(0, max_bytes - len(self.verdict) - len(EVIDENCE_MARK) - len(note))
        fitted = fit_capture(split_capture(self.captured), room)
        return (self.verdict + EVIDENCE_MARK + fitted + note)[:max_bytes]


# ------------------------------------------------------------- the capture's budget
#
# A capture is sections, one per pod and kind, in pod order: `[<pod>] ranks: <the agent's
# /ranks answer>`, `[<pod>] stacks: <its /stacks answer>`, `[<pod>] log:\n<log tail>`.
# Bounded first come first served, the first pod's sections filled the cap and the last
# pod's rank states (often the rank that matters) were cut. `fit_capture` shares the cap
# fairly instead: every pod an equal share (what a small pod leaves goes to the others),
# and inside a pod its rank states first (they are parsed back, a cut one is not), then
# stacks and log an equal share of the rest; a stack keeps its head (the innermost
# frames and the first threads), a log its tail (the last lines). What was trimmed is
# said where it was cut and in a last line.

SECTION = re.compile(r"^\[(?P<pod>[a-z0-9][a-z0-9.-]*)\] (?P<kind>ranks|stacks|log):(?: |\n|$)")
TRIMMED_LINE = "[evidence] trimmed to fit {limit} bytes: "


@dataclass(frozen=True)
class CapturePart:
    """One section of a capture: `text` is what follows its header."""

    pod: str
    kind: str  # "ranks" | "stacks" | "log"
    text: str
    # The text starts on the header's line (a log's lines start on the next one, a log
    # that could not be read says so on it).
    inline: bool = True

    @property
    def header(self) -> str:
        return f"[{self.pod}] {self.kind}:" + (" " if self.inline else "\n")


def split_capture(captured: str) -> list[CapturePart]:
    """The sections of a capture (`fit_capture`'s output or an older operator's); text
    before the first section, and a trimmed-summary line, are dropped."""
    parts: list[CapturePart] = []
    pod = kind = ""
    inline = True
    lines: list[str] = []

    def close() -> None:
        if kind:
            parts.append(CapturePart(pod, kind, "\n".join(lines), inline))

    for line in captured.split("\n"):
        m = SECTION.match(line + "\n")
        if m is not None:
            close()
            pod, kind = m["pod"], m["kind"]
            rest = line[m.end() :] if len(line) >= m.end() else ""
            inline = not (kind == "log" and not rest)
            lines = [rest] if inline else []
        elif line.startswith(TRIMMED_LINE.split("{", 1)[0]):
            continue
        else:
            lines.append(line)
    close()
    return parts


def fair_shares(sizes: Sequence[int], budget: int) -> list[int]:
    """Water-filling: each size gets min(size, level), the level set so the shares sum
    to at most `budget` (what a small one leaves is shared by the others)."""
    shares = [0] * len(sizes)
    left, remaining = max(0, budget), len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: sizes[i]):
        shares[i] = min(sizes[i], left // remaining)
        left -= shares[i]
        remaining -= 1
    return shares


def _trim(part: CapturePart, room: int) -> tuple[str, int]:
    """`part`'s text in `room` characters, the note of what was cut included (a stack or
    rank states keep their head, a log its tail), and how many characters were cut."""
    text = part.text
    if len(text) <= room:
        return text, 0
    keep = max(0, room - len(f" [... {len(text)} chars trimmed]"))
    cut = len(text) - keep
    if part.kind == "log":
        return f"[... {cut} chars trimmed]\n" + text[cut:], cut
    return text[:keep] + f" [... {cut} chars trimmed]", cut


def fit_capture(parts: Sequence[CapturePart], max_bytes: int) -> str:
    """The capture of `parts` in at most `max_bytes` characters, shared fairly (see
    above); the last line lists what was trimmed, by pod and kind."""
    whole = "\n".join(p.header + p.text for p in parts)
    if len(whole) <= max_bytes:
        return whole
    summary_room = 40 + 24 * len(parts)
    headers = sum(len(p.header) + 1 for p in parts)
    budget = max(0, max_bytes - headers - summary_room)
    pods = list(dict.fromkeys(p.pod for p in parts))
    of_pod = {pod: [p for p in parts if p.pod == pod] for pod in pods}
    pod_share = dict(
        zip(pods, fair_shares([sum(len(p.text) for p in of_pod[q]) for q in pods], budget),
            strict=True)
    )  # fmt: skip
    rooms: dict[int, int] = {}
    for pod in pods:
        share = pod_share[pod]
        ranks = [p for p in of_pod[pod] if p.kind == "ranks"]
        rest = [p for p in of_pod[pod] if p.kind != "ranks"]
        for p in ranks:
            rooms[id(p)] = min(len(p.text), share)
            share -= rooms[id(p)]
        for p, room in zip(rest, fair_shares([len(p.text) for p in rest], share), strict=True):
            rooms[id(p)] = room
    out, trimmed = [], []
    for p in parts:
        text, cut = _trim(p, rooms[id(p)])
        out.append(p.header + text)
        if cut:
            trimmed.append(f"{p.pod} {p.kind} -{cut}")
    out.append(TRIMMED_LINE.format(limit=max_bytes) + ", ".join(trimmed))
    return "\n".join(out)[:max_bytes]


def configmap_name(deployment: str) -> str:
    """The evidence ConfigMap of a PDDeployment."""
    return f"{deployment}-evidence"


def full_capture_name(deployment: str, slot: int) -> str:
    """The ConfigMap of a PDDeployment's whole-capture slot `slot`."""
    return f"{deployment}-evidence-{slot}"


def fit_capture_bytes(parts: Sequence[CapturePart], max_bytes: int) -> str:
    """`fit_capture` bounded in UTF-8 bytes, not characters (a ConfigMap's limit is in
    bytes; a log tail may not be ASCII): refitted smaller until it fits."""
    room = max_bytes
    while True:
        text = fit_capture(parts, room)
        size = len(text.encode())
        if size <= max_bytes or room <= 0:
            return text
        room = max(0, min(room - 1, room * max_bytes // size))


def whole_length(parts: Sequence[CapturePart]) -> int:
    """How long `parts` are untrimmed (what `fit_capture` returns when they fit)."""
    return len("\n".join(p.header + p.text for p in parts))


def choose_full_slot(
    deployment: str,
    incident_id: str,
    entries: Mapping[str, EvidenceEntry],
    oldest_first: Sequence[str],
    slots: int,
    taken: Collection[str] = (),
) -> tuple[str, tuple[str, ...]] | None:
    """The ConfigMap for `incident_id`'s whole capture, and the other incidents whose
    whole capture it held (their entries must drop it): the slot the incident already
    holds, else a slot of `slots` no entry holds, else the slot of the oldest incident
    (`oldest_first`: incident ids; one not listed counts as oldest). `taken`: slots
    already given this round. None when `slots` is 0 or all are taken. (Slots at or above
    `slots`, left by a larger setting, are never given again; their ConfigMaps go with
    the deployment.)"""
    names = [full_capture_name(deployment, i) for i in range(max(0, slots))]
    free = [n for n in names if n not in taken]
    if not free:
        return None
    own = entries.get(incident_id)
    held: dict[str, list[str]] = {}
    for other, entry in entries.items():
        if entry.full is not None and other != incident_id:
            held.setdefault(entry.full, []).append(other)
    if own is not None and own.full in free and own.full not in held:
        return own.full, ()
    for name in free:
        if name not in held:
            return name, ()
    age = {incident_id: i for i, incident_id in enumerate(oldest_first)}

    def oldest(name: str) -> tuple[int, str]:
        return (min(age.get(i, -1) for i in held[name]), name)

    chosen = min(free, key=oldest)
    return chosen, tuple(sorted(held[chosen]))


def to_data(entries: Mapping[str, EvidenceEntry]) -> dict[str, str]:
    """The ConfigMap's data: one JSON document per incident id."""
    return {
        key: json.dumps(
            {"verdict": e.verdict, "captured": e.captured, "cause": e.cause}
            | ({} if e.full is None else {"full": e.full})
            | ({} if e.full_missed is None else {"fullMissed": e.full_missed})
        )
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
                full=None if obj.get("full") is None else str(obj["full"]),
                full_missed=None if obj.get("fullMissed") is None else str(obj["fullMissed"]),
            )
        except (ValueError, AttributeError) as err:
            log.error("evidence %s unreadable, skipped: %s", key, err)
    return out


# ---------------------------------------------------------------- captures in flight


@dataclass(frozen=True)
class Capture:
    """What one incident's capture read (`CaptureEvidence`): each pod agent's
    `GET /ranks` answer as it came, judged with the group's next observation (its rank
    states are read against the incident's `epoch`), and the capture as the evidence
    store keeps it (fitted to the bound; `full`: the slot ConfigMap that holds it whole;
    `full_missed`: why it could not be kept whole)."""

    incident_id: str
    epoch: int
    answers: tuple[tuple[str, str], ...]  # (pod, the agent's /ranks answer or why none)
    captured: str
    full: str | None = None
    full_missed: str | None = None


class CaptureBook:
    """The captures of one deployment's open incidents: the one store of a capture from
    the round that read it (the executor's capture manager puts it) until its group has
    left CapturingEvidence (the round's record step settles the book). The record step
    writes each new capture's text to the evidence store; the judge reads the answers.

    A round that fails before its record step leaves nothing behind: `begin` drops what
    it put (the planner asks for the capture again), as a round's own state would be.
    """

    def __init__(self) -> None:
        self._captures: dict[str, Capture] = {}
        self._fresh: set[str] = set()
        # Incidents whose whole capture's slot a newer capture took this round.
        self.evicted: set[str] = set()

    def begin(self) -> None:
        """A round starts: what an unfinished round put is forgotten."""
        for incident_id in self._fresh:
            self._captures.pop(incident_id, None)
        self._fresh.clear()
        self.evicted.clear()

    def put(self, capture: Capture, evicted: Collection[str] = ()) -> None:
        """This round's capture of an incident (and the incidents whose slot it took)."""
        self._captures[capture.incident_id] = capture
        self._fresh.add(capture.incident_id)
        self.evicted.update(evicted)

    def get(self, incident_id: str) -> Capture | None:
        """The capture of an incident, if one was read and its group still waits on it."""
        return self._captures.get(incident_id)

    def fresh(self) -> dict[str, Capture]:
        """The captures this round read, by incident id."""
        return {i: self._captures[i] for i in sorted(self._fresh)}

    def settle(self, waiting: Collection[str]) -> None:
        """The round is recorded: keep the captures of the incidents still waiting in
        CapturingEvidence (the next judgement reads them), drop the others."""
        self._captures = {i: c for i, c in self._captures.items() if i in waiting}
        self._fresh.clear()
        self.evicted.clear()


class ConfigMapIO(Protocol):
    """The two calls the store makes (`lockstep.clients.kube.Kube` has them)."""

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

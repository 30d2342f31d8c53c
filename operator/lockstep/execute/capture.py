"""Manager: the evidence capture (`CaptureEvidence`).

Every pod of the group at once (one silent agent must not hold up the others' evidence):
its agent's rank states and py-spy stacks and its container's log tail, bounded by the
deployment's `maxEvidenceBytes` with every pod's fair share (`evidence.fit_capture`); a
capture larger than the bound is also kept whole in a slot ConfigMap. What was read goes
into the deployment's `CaptureBook` as it came: the judge reads the rank states back
with the agent client's parser, the round's record step writes the text to the evidence
store. Nothing is parsed or judged here."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lockstep.clients.agent_client import UNREACHABLE
from lockstep.core.builders import build_full_capture_configmap
from lockstep.core.evidence import (
    FULL_CAPTURE_MAX_BYTES,
    Capture,
    CaptureBook,
    CapturePart,
    EvidenceEntry,
    choose_full_slot,
    fit_capture,
    fit_capture_bytes,
    whole_length,
)
from lockstep.core.recovery import CaptureEvidence
from lockstep.execute.scene import Scene, short

log = logging.getLogger(__name__)


@dataclass
class CaptureManager:
    """`book`: the deployment's captures; `entries`: the evidence store's entries before
    this round and `incidents_oldest_first` the history's order (a capture too large for
    the bound takes a whole-capture slot, `choose_full_slot`); `incident_epochs`: each
    open incident's epoch (its rank states are read against it)."""

    scene: Scene
    book: CaptureBook
    entries: Mapping[str, EvidenceEntry] = field(default_factory=dict)
    incidents_oldest_first: Sequence[str] = ()
    incident_epochs: Mapping[str, int] = field(default_factory=dict)

    def capture(self, action: CaptureEvidence) -> None:
        """Rank states, stacks and log tails of every pod, into the book."""
        scene = self.scene
        ips = scene.pod_ips()
        agents, kube = scene.deps.agents, scene.deps.kube
        token = scene.token()

        def one(name: str) -> tuple[list[CapturePart], str | None]:
            parts: list[CapturePart] = []
            ranks_text: str | None = None
            ip = ips.get(name)
            if ip:
                ranks_text = agents.evidence(ip, "/ranks", token)
                parts.append(CapturePart(name, "ranks", ranks_text))
                # An agent that did not answer /ranks will not dump stacks either.
                if action.stacks and not ranks_text.startswith(UNREACHABLE):
                    parts.append(CapturePart(name, "stacks", agents.evidence(ip, "/stacks", token)))
            if action.log_lines:
                try:
                    logs = kube.read_pod_log(scene.namespace, name, action.log_lines)
                    parts.append(CapturePart(name, "log", logs, inline=False))
                except Exception as err:
                    parts.append(CapturePart(name, "log", f"unavailable ({type(err).__name__})"))
            return parts, ranks_text

        with ThreadPoolExecutor(max_workers=min(len(action.pods), 16) or 1) as pool:
            results = list(pool.map(one, [ref.name for ref in action.pods]))
        parts = [part for found, _ in results for part in found]
        full, missed, evicted = self._keep_whole(action, parts)
        answers = tuple(
            (ref.name, text)
            for ref, (_, text) in zip(action.pods, results, strict=True)
            if text is not None
        )
        self.book.put(
            Capture(
                action.incident_id,
                self.incident_epochs.get(action.incident_id, 0),
                answers,
                # Every pod's share of the bound, not first come first served.
                fit_capture(parts, action.max_bytes),
                full,
                missed,
            ),
            evicted,
        )

    def _keep_whole(
        self, action: CaptureEvidence, parts: Sequence[CapturePart]
    ) -> tuple[str | None, str | None, tuple[str, ...]]:
        """A capture larger than its bound, kept whole in a slot ConfigMap: the slot's
        name (None: it fit, or it could not be kept), why it could not be kept, and the
        incidents whose slot it took."""
        size = whole_length(parts)
        if size <= action.max_bytes or action.full_captures <= 0:
            return None, None, ()
        fresh = self.book.fresh()
        taken = {c.full for c in fresh.values() if c.full is not None}
        known = {
            **self.entries,
            **{i: EvidenceEntry(captured=c.captured, full=c.full) for i, c in fresh.items()},
        }
        pdd = self.scene.pdd
        chosen = choose_full_slot(
            pdd.metadata.name,
            action.incident_id,
            known,
            self.incidents_oldest_first,
            action.full_captures,
            taken,
        )
        if chosen is None:
            return None, f"{size} chars, no free slot", ()
        name, evicted = chosen
        whole = fit_capture_bytes(parts, FULL_CAPTURE_MAX_BYTES)
        try:
            self.scene.deps.kube.apply_configmap(
                build_full_capture_configmap(pdd, name, action.incident_id, whole)
            )
        except Exception as err:
            log.error("%s: whole capture not kept in %s: %s", action.incident_id, name, err)
            return None, f"{size} chars, ConfigMap {name}: {short(err)}", ()
        return name, None, tuple(evicted)

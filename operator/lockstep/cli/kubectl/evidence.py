"""`kubectl lockstep evidence`: what an incident's capture kept (every pod's rank states
as a table, the stacks, the log tails), from the evidence ConfigMaps."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import RenderableType
from rich.table import Table

from lockstep.api import objects
from lockstep.cli.kubectl.common import (
    _SECTION,
    Obj,
    PluginError,
    _indented,
    _plural,
    _render,
    _table,
)
from lockstep.clients.agent_client import AgentDataError, captured_ranks, captured_stacks
from lockstep.core.evidence import EVIDENCE_MARK, EvidenceEntry, configmap_name, from_data
from lockstep.core.verdicts import RankState

# ---------------------------------------------------------------------------- evidence


def split_captured(text: str) -> list[Obj]:
    """Captured evidence (`lockstep.execute`'s `[<pod>] ranks|stacks|log: ...` sections)
    as sections, in order: `{"pod", "kind", "text"}`. Text before the first section (a
    capture from a newer operator, say) is kept as a section of pod `-`."""
    sections: list[Obj] = []
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m is not None:
            rest = line[m.end() :]
            sections.append({"pod": m["pod"], "kind": m["kind"], "text": rest})
        elif sections:
            sections[-1]["text"] += "\n" + line
        elif line.strip():
            sections.append({"pod": "-", "kind": "text", "text": line})
    return sections


def _rank_row(r: RankState, now: float | None) -> list[str]:
    d = r.last_decision
    decision = "-"
    if d is not None:
        decision = f"{d.kind} {d.forward_mode or ''} x{d.batch_size} #{d.seq}".replace("  ", " ")
    coll = r.collective
    collective = "-"
    if coll is not None:
        collective = f"{coll.op} {coll.group} #{coll.seq}"
        if now is not None:
            collective += f" for {now - coll.since:.1f}s"
    if r.step_age_s is not None:
        step = f"in a step for {r.step_age_s:.1f}s"
    elif r.recent_steps_s:
        step = f"idle, last step {r.recent_steps_s[-1]:.2f}s"
    else:
        step = "-"
    return [
        str(r.rank),
        "-" if r.tp_rank is None else str(r.tp_rank),
        "-" if r.pid is None else str(r.pid),
        "yes" if r.alive else "NO",
        str(r.iteration),
        decision,
        collective,
        step,
        "FAILED" if r.consensus_failure else "-",
    ]


def _ranks_table(ranks: Sequence[RankState], now: float | None) -> Table:
    table = _table(
        "RANK",
        "TP",
        "PID",
        "ALIVE",
        "ITERATION",
        "DECISION",
        "COLLECTIVE",
        "STEP",
        "CONSENSUS",
    )
    for r in ranks:
        table.add_row(*_rank_row(r, now))
    return table


def evidence_view(
    pdd: Mapping[str, Any],
    configmap: Mapping[str, Any] | None,
    incident_id: str,
    whole: Callable[[str], Mapping[str, Any] | None] = lambda name: None,
) -> Obj:
    """What `evidence` shows, as a plain dict (`-o json`). PluginError listing the
    incidents there are when `incident_id` is none of them. `whole(name)` reads the
    ConfigMap an entry names for its whole capture (it did not fit the bound): its
    sections are shown instead of the fitted ones while it still holds this incident."""
    meta, status = objects.meta(pdd), pdd.get("status") or {}
    entries = from_data((configmap or {}).get("data"))
    incidents = {str(i.get("id")): i for i in status.get("incidents") or []}
    known = sorted(set(incidents) | set(entries))
    if incident_id not in known:
        listed = ", ".join(known) if known else "none"
        raise PluginError(
            f"no incident {incident_id!r} in PDDeployment {meta.get('name')} "
            f"(namespace {meta.get('namespace')}); its incidents: {listed}"
        )
    entry = entries.get(incident_id)
    source = "configmap"
    if entry is None:  # not in the store (an older operator): what status shows
        summary, mark, captured = str(incidents[incident_id].get("evidence") or "").partition(
            EVIDENCE_MARK
        )
        entry = EvidenceEntry(summary, captured if mark else None)
        source = "status"
    inc = incidents.get(incident_id, {})
    shown: str | None = entry.captured
    whole_from: str | None = None
    if entry.full is not None:
        data = (whole(entry.full) or {}).get("data") or {}
        if data.get("incident") == incident_id and data.get("capture") is not None:
            shown, whole_from = str(data["capture"]), entry.full
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "incident": incident_id,
        "role": inc.get("role"),
        "group": inc.get("group"),
        "epoch": inc.get("epoch"),
        "verdict": inc.get("verdict"),
        "state": inc.get("state"),
        "source": source,
        "summary": entry.verdict,
        "cause": entry.cause,
        "captured": entry.captured is not None,
        "wholeCapture": whole_from,
        "wholeCaptureMissed": entry.full_missed,
        "sections": split_captured(shown or ""),
    }


def format_evidence(view: Mapping[str, Any], *, logs: bool) -> str:
    """`evidence` as text: the verdict's summary, the cause, then per pod its rank states
    (a table, ages by the pod agent's clock), its stacks and (with `logs`) its log tail."""
    title = f"Incident {view['incident']} of {view['name']}"
    if view["role"] is None:
        title += ": not in status (only its evidence is kept)"
    else:
        title += (
            f" ({view['role']}/{view['group']}, epoch {view['epoch']}): "
            f"{view['verdict']}, {view['state']}"
        )
    parts: list[RenderableType] = [title]
    if view["source"] == "status":
        parts.append(f"(no entry in ConfigMap {configmap_name(str(view['name']))}: from status)")
    if view.get("wholeCapture"):
        parts.append(f"(the whole capture, from ConfigMap {view['wholeCapture']})")
    if view.get("wholeCaptureMissed"):
        parts.append(f"(the whole capture was not kept: {view['wholeCaptureMissed']})")
    parts += ["", "Verdict", *(f"  {line}" for line in (view["summary"] or "-").splitlines())]
    if view["cause"]:
        parts += ["", f"Cause: {view['cause']}"]
    if not view["captured"]:
        parts += ["", "Nothing captured (the capture had not run, or diagnostics are off)"]
        return _render(*parts)
    for section in view["sections"]:
        pod, kind, text = section["pod"], section["kind"], section["text"]
        if kind == "ranks":
            parts += ["", f"Pod {pod}: rank states"]
            try:
                ans = captured_ranks(text, pod)
            except AgentDataError:
                parts.append(f"  (not readable as rank states) {text}")
                continue
            if ans.hostname or ans.epoch is not None:
                parts.append(f"  host {ans.hostname or '?'}, epoch {ans.epoch or '?'}")
            parts.append(_indented(_ranks_table(ans.ranks, ans.now)))
            parts += [
                f"  rank {r.rank} consensus failure: {r.consensus_failure}"
                for r in ans.ranks
                if r.consensus_failure
            ]
            if ans.previous:
                parts.append(f"  previous incarnation (epoch {ans.previous_epoch or '?'}):")
                parts.append(_indented(_ranks_table(ans.previous, None)))
                parts += [
                    f"  rank {r.rank} consensus failure: {r.consensus_failure}"
                    for r in ans.previous
                    if r.consensus_failure
                ]
            for label, exit_text in (
                ("engine exit", ans.engine_exit),
                ("previous engine exit", ans.previous_engine_exit),
            ):
                if exit_text:
                    parts.append(f"  {label}: {exit_text}")
        elif kind == "stacks":
            parts += ["", f"Pod {pod}: stacks"]
            try:
                dumps = captured_stacks(text, pod)
            except AgentDataError:
                parts.append(f"  (not readable as stacks) {text}")
                continue
            for d in dumps:
                took = "" if d.duration_s is None else f", {d.duration_s:.2f}s"
                parts.append(f"  rank {d.rank} (pid {d.pid if d.pid is not None else '?'}{took})")
                body = d.stack if d.ok else f"dump failed: {d.error or 'no reason given'}"
                parts += [f"    {line}" for line in body.splitlines()]
        elif kind == "log":
            if not text.startswith("\n"):  # `unavailable (...)`: the pod's log was not read
                parts += ["", f"Pod {pod}: log: {text or 'empty'}"]
            elif logs:
                parts += ["", f"Pod {pod}: log", *(f"  {line}" for line in text[1:].splitlines())]
            else:
                kept = len(text[1:].splitlines())
                parts += ["", f"Pod {pod}: log: {_plural(kept, 'line')} kept (--logs shows them)"]
        else:
            parts += ["", text]
    return _render(*parts)

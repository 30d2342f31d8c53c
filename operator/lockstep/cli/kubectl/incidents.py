"""`kubectl lockstep incidents`: each incident with its steps (the deployment's Events
from the first failure to the re-admission) and its outliers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType

from lockstep.api import objects
from lockstep.api.objects import parse_time
from lockstep.cli.kubectl.common import (
    _SECTION,
    SUMMARY_LINES,
    Obj,
    _indented,
    _render,
    _seconds,
    _table,
    human_duration,
)
from lockstep.core.evidence import EVIDENCE_MARK
from lockstep.core.records import load_records
from lockstep.core.recovery import GroupRecord

# --------------------------------------------------------------------------- incidents


def event_time(event: Mapping[str, Any]) -> float | None:
    """When an Event happened: its eventTime, else its last or first timestamp, else
    when it was created."""
    for key in ("eventTime", "lastTimestamp", "firstTimestamp"):
        ts = parse_time(event.get(key))
        if ts is not None:
            return ts
    return parse_time(objects.meta(event).get("creationTimestamp"))


def incident_steps(incident: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[Obj]:
    """The Events of an incident's group from its first failure until its recovery (the
    operator posts one per step, `<role>/<group>: ...`), oldest first, each with its
    offset from the first (Event times are to the microsecond, status times to the
    second: the window opens at the first failure's second and closes a second after
    the recovery's)."""
    prefix = f"{incident.get('role')}/{incident.get('group')}: "
    start = parse_time(incident.get("firstFailureTime")) or parse_time(incident.get("detectedTime"))
    if start is None:
        return []
    recovered = parse_time(incident.get("recoveredTime"))
    end = None if recovered is None else recovered + 1.0
    found = []
    for event in events:
        message = str(event.get("message") or "")
        ts = event_time(event)
        if not message.startswith(prefix) or ts is None or ts < start:
            continue
        if end is not None and ts >= end:
            continue
        found.append((ts, event, message[len(prefix) :]))
    found.sort(key=lambda x: x[0])
    return [
        {
            "time": objects.rfc3339(ts, "milliseconds"),
            "offsetSeconds": round(ts - found[0][0], 3),
            "type": event.get("type"),
            "reason": event.get("reason"),
            "message": message,
        }
        for ts, event, message in found
    ]


def _outlier(
    incident: Mapping[str, Any],
    records: Mapping[str, GroupRecord],
    pods: Sequence[Mapping[str, Any]],
) -> list[Obj]:
    """The ranks (or pods) that differed from the rest, with their nodes: from status
    (`outliers`, as the verdict named them), else the pods the verdict implicated, from
    the group's record while the incident is open (a hang implicates none in particular)."""
    named = incident.get("outliers")
    if isinstance(named, list) and named and all(isinstance(o, dict) for o in named):
        return [
            {"pod": str(o.get("pod")), "rank": o.get("rank"), "node": o.get("node"),
             "why": o.get("why") or ""}
            for o in named
        ]  # fmt: skip
    named = incident.get("culprits")
    if not isinstance(named, list):
        rec = records.get(f"{incident.get('role')}/{incident.get('group')}")
        open_incident = None if rec is None else rec.incident
        named = (
            list(open_incident.culprits)
            if open_incident is not None and open_incident.id == incident.get("id")
            else []
        )
    nodes = {objects.meta(p).get("name"): (p.get("spec") or {}).get("nodeName") for p in pods}
    return [{"pod": str(name), "node": nodes.get(str(name))} for name in named]


def _outlier_text(outlier: Sequence[Mapping[str, Any]]) -> str:
    def one(o: Mapping[str, Any]) -> str:
        where = o["pod"] if o.get("rank") is None else f"{o['pod']}/r{o['rank']}"
        why = f", {o['why']}" if o.get("why") else ""
        return f"{where} (node {o['node'] or '?'}{why})"

    return ", ".join(one(o) for o in outlier) if outlier else "-"


def incidents_view(
    pdd: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    now: float,
) -> Obj:
    """What `incidents` shows, as a plain dict (`-o json`), oldest incident first."""
    meta, status = objects.meta(pdd), pdd.get("status") or {}
    records = load_records(pdd)
    out = []
    for inc in status.get("incidents") or []:
        text = str(inc.get("evidence") or "")
        summary, mark, captured = text.partition(EVIDENCE_MARK)
        rec = records.get(f"{inc.get('role')}/{inc.get('group')}")
        step = None
        if rec is not None and rec.incident is not None and rec.incident.id == inc.get("id"):
            step = {
                "step": rec.step.value,
                "since": objects.rfc3339(rec.step_since),
                "ageSeconds": round(now - rec.step_since, 1),
            }
        out.append(
            {
                **{k: v for k, v in inc.items() if k != "evidence"},
                "evidenceSummary": summary,
                "evidenceCaptured": bool(mark),
                "capturedPods": sorted(
                    {m["pod"] for line in captured.splitlines() if (m := _SECTION.match(line))}
                ),
                "currentStep": step,
                "outlier": _outlier(inc, records, pods),
                "steps": incident_steps(inc, events),
            }
        )
    return {"name": meta.get("name"), "namespace": meta.get("namespace"), "incidents": out}


def _when(text: Any, now: float) -> str:
    ts = parse_time(text)
    return "-" if ts is None else f"{text} ({human_duration(now - ts)} ago)"


def format_incidents(view: Mapping[str, Any], now: float) -> str:
    """`incidents` as text: a summary row per incident, then each one's timeline."""
    name = view["name"]
    if not view["incidents"]:
        return _render(f"PDDeployment {name} in {view['namespace']}: no incidents recorded")
    table = _table(
        "INCIDENT",
        "GROUP",
        "EPOCH",
        "VERDICT",
        "STATE",
        "DETECTED",
        "TO DETECT",
        "TO RECOVER",
        "RESTART",
        "OUTLIER",
    )
    for inc in view["incidents"]:
        detected = parse_time(inc.get("detectedTime"))
        table.add_row(
            str(inc["id"]),
            f"{inc['role']}/{inc['group']}",
            str(inc["epoch"]),
            str(inc["verdict"]),
            str(inc.get("state", "Open")),
            "-" if detected is None else f"{human_duration(now - detected)} ago",
            _seconds(inc.get("timeToDetectSeconds")),
            _seconds(inc.get("timeToRecoverSeconds")),
            inc.get("restartMode") or "-",
            _outlier_text(inc["outlier"]),
        )
    parts: list[RenderableType] = [table]
    for inc in view["incidents"]:
        detail = _table("", "")
        detail.show_header = False
        detail.add_row("first failure", _when(inc.get("firstFailureTime"), now))
        ttd = inc.get("timeToDetectSeconds")
        detected_at = _when(inc.get("detectedTime"), now)
        detail.add_row(
            "detected", detected_at + (f", {_seconds(ttd)} after the first failure" if ttd else "")
        )
        ttr = inc.get("timeToRecoverSeconds")
        recovered = _when(inc.get("recoveredTime"), now)
        detail.add_row(
            "recovered", recovered + (f", {_seconds(ttr)} after the verdict" if ttr else "")
        )
        if inc["currentStep"] is not None:
            cur = inc["currentStep"]
            detail.add_row(
                "now",
                f"{cur['step']} for {human_duration(cur['ageSeconds'])} (since {cur['since']})",
            )
        detail.add_row("action", inc.get("action") or "-")
        detail.add_row("restart", inc.get("restartMode") or "-")
        detail.add_row("escalation", inc.get("escalation") or "-")
        detail.add_row("outlier", _outlier_text(inc["outlier"]))
        parts += [
            "",
            f"{inc['id']}: {inc['role']}/{inc['group']} epoch {inc['epoch']}, "
            f"{inc['verdict']}, {inc.get('state', 'Open')}",
            _indented(detail),
        ]
        if inc["steps"]:
            steps = _table("", "", "", "")
            steps.show_header = False
            for s in inc["steps"]:
                steps.add_row(
                    s["time"][11:], f"+{s['offsetSeconds']:.1f}s", str(s["reason"]), s["message"]
                )
            parts += ["  steps (Events)", _indented(steps, 4)]
        else:
            parts.append("  steps (Events): none kept (the API server drops Events after an hour)")
        lines = inc["evidenceSummary"].splitlines() or ["-"]
        shown = lines[:SUMMARY_LINES]
        if len(lines) > SUMMARY_LINES:
            shown.append(f"... {len(lines) - SUMMARY_LINES} more lines")
        if inc["evidenceCaptured"]:
            pods = ", ".join(inc["capturedPods"]) or "no pod"
            shown.append(
                f"captured before the restart from {pods}: "
                f"kubectl lockstep evidence {name} {inc['id']} -n {view['namespace']}"
            )
        parts.append("  evidence")
        parts += [f"    {line}" for line in shown]
    return _render(*parts)

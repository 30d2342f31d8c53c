"""`kubectl lockstep`: what on-call reads and does during an incident, as a kubectl plugin.

    kubectl lockstep status NAME [-o json]      every group: state, epoch, restarts, ready
                                                pods, last deep probe, runtime; conditions
    kubectl lockstep incidents NAME [-o json]   every incident status keeps: verdict, times,
                                                steps (Events), evidence summary, outlier
    kubectl lockstep evidence NAME INCIDENT [--logs] [-o json]
                                                the rank states and stacks captured for one
    kubectl lockstep restart NAME ROLE/GROUP --reason TEXT
                                                the manual restart annotation

kubectl runs any executable named `kubectl-lockstep` on PATH as `kubectl lockstep`; the
package installs one (`[project.scripts]`). Connection flags as kubectl's: `--kubeconfig`
(else `KUBECONFIG`, else ~/.kube/config), `--context`, `-n/--namespace` (else the
context's namespace, else `default`).

Only `restart` writes: the annotation `lockstep.dev/restart=ROLE/GROUP@REQUEST`
(`lockstep.core.records`), exactly what `kubectl annotate` would set, with a request id made
from `--reason` and the time (the operator acts once per request id). What the other
commands show comes from the PDDeployment's status, its records annotation (the open
incident's step and the pods its verdict implicated), its pods (runtime image, nodes), its
Events (an incident's steps, for as long as the API server keeps Events: an hour by
default) and the evidence ConfigMap `<name>-evidence` (`lockstep.core.evidence`).

Layers as in the operator: the `*_view` functions turn API objects into plain dicts (what
`-o json` prints) and `format_*` render them, both pure with `now` passed in; `Cluster` is
the only I/O. argparse for the command line, the official `kubernetes` client (its own
kubeconfig loading, as kopf's), rich for the tables (already a dependency; kubectl-like:
no borders, upper-case headers).

Exit codes: 0 done; 1 failed (a bad argument, the deployment or incident not found, the
API server unreachable or refusing), with a message on stderr saying what and the fix.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, TextIO

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.table import Table
from urllib3.exceptions import HTTPError as TransportError

from lockstep.api import constants as c
from lockstep.api import objects
from lockstep.api.objects import parse_time
from lockstep.clients.agent_client import AgentDataError, captured_ranks, captured_stacks
from lockstep.core.builders import group_runtime
from lockstep.core.evidence import EVIDENCE_MARK, SECTION, EvidenceEntry, configmap_name, from_data
from lockstep.core.records import ANNOTATION_RESTART, load_records
from lockstep.core.recovery import GroupRecord
from lockstep.core.verdicts import RankState

EXIT_OK, EXIT_FAILED = 0, 1
Obj = dict[str, Any]
REQUEST_TIMEOUT = (5.0, 30.0)  # connect, read (seconds) for every API call
SUMMARY_LINES = 8  # lines of an incident's evidence summary `incidents` shows
# The request id's readable part: what `--reason` keeps (letters, digits, `.`, `_`, `-`).
REQUEST_SLUG_CHARS = 40
_NOT_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
_GROUP_ARG = re.compile(r"^(?P<role>[a-z]+)/(?P<group>[0-9]+)$")
# A section of captured evidence (`lockstep.core.evidence.fit_capture`): `[<pod>] ranks|stacks|log:`.
_SECTION = SECTION


class PluginError(Exception):
    """What went wrong, for the user: printed as `error: ...`, exit code 1."""


# ------------------------------------------------------------------------- pure helpers


def human_duration(seconds: float) -> str:
    """A duration as kubectl prints ages (`45s`, `3m12s`, `2h5m`, `3d4h`)."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d"


def _seconds(value: Any) -> str:
    """A figure of seconds from status (`0.7s`, `3m12s`); `-` when absent."""
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.1f}s" if value < 120 else human_duration(value)


def _age(ts: float | None, now: float) -> str:
    return "-" if ts is None else human_duration(now - ts)


def parse_group(text: str) -> tuple[str, int]:
    """`ROLE/GROUP` (`decode/0`) as (role, group); PluginError naming the argument."""
    m = _GROUP_ARG.match(text.strip())
    if m is None or m["role"] not in c.ROLES:
        raise PluginError(
            f"ROLE/GROUP {text!r}: expected a role ({' or '.join(c.ROLES)}) and a group "
            "number, e.g. decode/0"
        )
    return m["role"], int(m["group"])


def request_id(reason: str, now: float) -> str:
    """A restart request id from `--reason`: its letters, digits, `.`, `_` and `-`
    (others become `-`), at most 40 of them, then the UTC time to the second, so the same
    reason asked again is a new request (the operator acts once per request id)."""
    slug = _NOT_SLUG.sub("-", reason).strip("-._")[:REQUEST_SLUG_CHARS].rstrip("-._")
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%d-%H%M%S")
    return f"{slug or 'manual'}-{stamp}"


def _groups(status: Mapping[str, Any], role: str) -> list[Mapping[str, Any]]:
    return list((status.get(role) or {}).get("groups") or [])


def _group_pods(pods: Sequence[Mapping[str, Any]], role: str, group: int) -> list[Obj]:
    return [
        dict(p)
        for p in pods
        if objects.label(p, c.LABEL_ROLE) == role and objects.label(p, c.LABEL_GROUP) == str(group)
    ]


def _runtime(group: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The runtime a group runs: from status when it records one; else what its pods
    run (the current epoch's, else any): the runtime init container's image, or the
    SGLang image when the runtime is built into it (`spec.runtime.inject: false`)."""
    recorded = group.get("runtime") or group.get("runtimeImage")
    if isinstance(recorded, Mapping):
        recorded = recorded.get("image")
    if isinstance(recorded, str) and recorded:
        return recorded
    current = [p for p in pods if objects.label(p, c.LABEL_EPOCH) == str(group.get("epoch"))]
    return group_runtime(current or pods)


# ------------------------------------------------------------------------------ status


def status_view(pdd: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: float) -> Obj:
    """What `status` shows, as a plain dict (`-o json`)."""
    meta, status = objects.meta(pdd), pdd.get("status") or {}
    groups = []
    for role in c.ROLES:
        for g in _groups(status, role):
            probe = g.get("lastProbe")
            probed = parse_time(probe.get("time")) if isinstance(probe, Mapping) else None
            groups.append(
                {
                    "role": role,
                    "group": g.get("index"),
                    "state": g.get("state"),
                    "spare": bool(g.get("spare", False)),
                    "epoch": g.get("epoch", 0),
                    "restarts": g.get("restarts", 0),
                    "readyPods": g.get("readyPods", 0),
                    "pods": g.get("pods", 0),
                    "consecutiveFailures": g.get("consecutiveFailures", 0),
                    "lastProbe": None
                    if not isinstance(probe, Mapping)
                    else {
                        "ok": probe.get("ok"),
                        "time": probe.get("time"),
                        "latencyMs": probe.get("latencyMs"),
                        "error": probe.get("error"),
                        "ageSeconds": None if probed is None else round(now - probed, 1),
                    },
                    "lastRestartTime": g.get("lastRestartTime"),
                    "runtime": _runtime(g, _group_pods(pods, role, int(g.get("index", 0)))),
                    "message": g.get("message"),
                }
            )
    conditions = []
    for cond in status.get("conditions") or []:
        since = parse_time(cond.get("lastTransitionTime"))
        conditions.append(
            {
                "type": cond.get("type"),
                "status": cond.get("status"),
                "reason": cond.get("reason", ""),
                "message": cond.get("message", ""),
                "lastTransitionTime": cond.get("lastTransitionTime"),
                "ageSeconds": None if since is None else round(now - since, 1),
            }
        )
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "generation": meta.get("generation"),
        "observedGeneration": status.get("observedGeneration"),
        "hasStatus": bool(status),
        "prefillReady": status.get("prefillReady"),
        "decodeReady": status.get("decodeReady"),
        "openIncidents": status.get("openIncidents", 0),
        "incidents": len(status.get("incidents") or []),
        "groups": groups,
        "conditions": conditions,
        "findings": [
            {k: f.get(k) for k in ("rule", "severity", "field", "action")}
            for f in status.get("findings") or []
        ],
    }


def _table(*columns: str) -> Table:
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0))
    for col in columns:
        table.add_column(col, no_wrap=True, overflow="ignore", header_style="")
    return table


def _indented(renderable: RenderableType, spaces: int = 2) -> Padding:
    return Padding(renderable, (0, 0, 0, spaces))


def _render(*parts: RenderableType) -> str:
    """Tables and lines as plain text (no colour, no wrapping, no trailing blanks)."""
    buf = io.StringIO()
    console = Console(
        file=buf, width=1000, color_system=None, highlight=False, markup=False, emoji=False
    )
    for part in parts:
        console.print(part, soft_wrap=isinstance(part, str))
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def format_status(view: Mapping[str, Any]) -> str:
    """`status` as text: a header line, one row per group, the conditions."""
    head = f"PDDeployment {view['name']} in {view['namespace']}"
    if not view["hasStatus"]:
        return _render(
            f"{head}: no status yet (has the operator seen it? kubectl get pods -n lockstep-system)"
        )
    head += (
        f": prefill {view['prefillReady'] or '-'} ready, decode {view['decodeReady'] or '-'} "
        f"ready, {_plural(view['openIncidents'], 'open incident')} "
        f"(generation {view['generation']}, observed {view['observedGeneration']})"
    )
    groups = _table(
        "GROUP",
        "STATE",
        "EPOCH",
        "RESTARTS",
        "READY",
        "PROBE",
        "LATENCY",
        "PROBED",
        "RUNTIME",
        "MESSAGE",
    )
    for g in view["groups"]:
        probe = g["lastProbe"] or {}
        ok = probe.get("ok")
        message = g["message"] or ""
        if ok is False and probe.get("error"):
            message = f"{message}; probe: {probe['error']}" if message else probe["error"]
        latency = probe.get("latencyMs")
        age = probe.get("ageSeconds")
        groups.add_row(
            f"{g['role']}/{g['group']}",
            f"{g['state']} (spare)" if g.get("spare") else str(g["state"]),
            str(g["epoch"]),
            str(g["restarts"]),
            f"{g['readyPods']}/{g['pods']}",
            "-" if ok is None else ("ok" if ok else "failed"),
            "-" if latency is None else f"{latency:.1f}ms",
            "-" if age is None else f"{human_duration(age)} ago",
            g["runtime"] or "-",
            message or "-",
        )
    conditions = _table("CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE")
    for cond in view["conditions"]:
        age = cond["ageSeconds"]
        conditions.add_row(
            str(cond["type"]),
            str(cond["status"]),
            cond["reason"] or "-",
            "-" if age is None else human_duration(age),
            cond["message"] or "-",
        )
    parts: list[RenderableType] = [head, "", groups, "", conditions]
    if view["findings"]:
        rules = ", ".join(f"{f['rule']} ({f['field']}, {f['action']})" for f in view["findings"])
        parts += ["", f"Flag policy: {rules}; kubectl describe pdd {view['name']} says why"]
    return _render(*parts)


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


# ----------------------------------------------------------------------------- restart


def restart_annotation(pdd: Mapping[str, Any], target: str, reason: str, now: float) -> str:
    """The value of `lockstep.dev/restart` that asks for a restart of `target`
    (`ROLE/GROUP`), checked against the deployment. PluginError when `target` names no
    group of it, when its policy refuses restarts, or when another group's request is
    still waiting for the operator (replacing it would drop that restart)."""
    role, group = parse_group(target)
    meta, spec, status = objects.meta(pdd), pdd.get("spec") or {}, pdd.get("status") or {}
    name = meta.get("name")
    replicas = int((spec.get(role) or {}).get("replicas", 1))
    served = int((status.get(role) or {}).get("replicas", 0))
    known = set(range(max(replicas, served))) | {
        int(g.get("index", -1)) for g in _groups(status, role)
    }
    if group not in known:
        ordered = sorted(known)
        have = (
            "no groups"
            if not ordered
            else f"groups 0..{ordered[-1]}"
            if ordered == list(range(len(ordered)))
            else f"groups {', '.join(map(str, ordered))}"
        )
        raise PluginError(
            f"ROLE/GROUP {target!r}: PDDeployment {name} has {role} {have} "
            f"(spec.{role}.replicas {replicas}); name one of them, e.g. {role}/0"
        )
    if (spec.get("recovery") or {}).get("policy") == "ObserveOnly":
        raise PluginError(
            f"PDDeployment {name} has spec.recovery.policy ObserveOnly: the operator refuses "
            "restart requests (a RestartRefused Event); set it to RestartGroup first"
        )
    if not reason.strip():
        raise PluginError("--reason: say why (a ticket, an incident), e.g. --reason INC-42")
    current = (meta.get("annotations") or {}).get(ANNOTATION_RESTART)
    if isinstance(current, str) and "@" in current:
        other, req = (x.strip() for x in current.split("@", 1))
        rec = load_records(pdd).get(other)
        if (
            other != f"{role}/{group}"
            and req
            and rec is not None
            and rec.manual.handled_request != req
        ):
            raise PluginError(
                f"the restart request {current} is not taken by the operator yet, and "
                f"{ANNOTATION_RESTART} holds one request: run this again once it is (its "
                f"GroupRestartRequested Event), or overwrite it with kubectl annotate "
                f"--overwrite if that request must be dropped"
            )
    return f"{role}/{group}@{request_id(reason, now)}"


# --------------------------------------------------------------------------------- I/O


class Cluster:
    """The plugin's API calls: reads of one namespace, and the restart annotation."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)

    @classmethod
    def connect(cls, kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
        """A client as kubectl would make it (see the module docstring)."""
        try:
            contexts, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            chosen = active
            if context is not None:
                chosen = next((x for x in contexts if x.get("name") == context), None)
                if chosen is None:
                    names = ", ".join(str(x.get("name")) for x in contexts)
                    raise PluginError(f"--context {context!r}: not in the kubeconfig ({names})")
            api = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, persist_config=False
            )
        except (ConfigException, OSError) as err:
            raise PluginError(
                f"kubeconfig: {err} (set KUBECONFIG or pass --kubeconfig and --context)"
            ) from None
        ns = namespace or (chosen or {}).get("context", {}).get("namespace") or "default"
        return cls(api, ns)

    def _call(
        self,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        expect: Collection[int] = (),
        **kwargs: Any,
    ) -> Any:
        """One API call; an ApiException whose status is in `expect` is the caller's,
        anything else a PluginError saying what failed."""
        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as err:
            if err.status in expect:
                raise
            raise PluginError(
                f"{what}: the API server answered {err.status}: {_reason(err)}"
            ) from None
        except TransportError as err:
            raise PluginError(
                f"{what}: cannot reach the API server at {self.api.configuration.host} "
                f"({type(err).__name__}); check --kubeconfig/--context and that it is up"
            ) from None

    def pdd(self, name: str) -> Obj:
        """The PDDeployment, with a 404 explained: no such deployment in this namespace
        (and which there are), or no PDDeployment API at all (the CRD is not installed)."""
        get = self.custom.get_namespaced_custom_object
        try:
            obj: Obj = self._call(
                f"reading PDDeployment {name}",
                get,
                c.GROUP,
                c.VERSION,
                self.namespace,
                c.PLURAL,
                name,
                expect=(404,),
            )
        except ApiException as err:
            if _details_name(err) is None:
                raise PluginError(
                    f"the API server at {self.api.configuration.host} serves no "
                    f"{c.CRD_NAME}: is lockstep installed (helm install lockstep "
                    "charts/lockstep)?"
                ) from None
            raise PluginError(self._not_found(name)) from None
        return obj

    def _not_found(self, name: str) -> str:
        text = f'PDDeployment "{name}" not found in namespace "{self.namespace}"'
        try:
            found = self._call(
                "listing PDDeployments",
                self.custom.list_namespaced_custom_object,
                c.GROUP,
                c.VERSION,
                self.namespace,
                c.PLURAL,
            )
        except PluginError:
            return f"{text} (another namespace? -n NAMESPACE)"
        names = ", ".join(
            sorted(str(objects.meta(i).get("name")) for i in found.get("items") or [])
        )
        there = f"PDDeployments there: {names}" if names else "it has no PDDeployments"
        return f"{text}; {there} (another namespace? -n NAMESPACE)"

    def pods(self, name: str) -> list[Obj]:
        """The deployment's pods (by its label)."""
        resp = self._call(
            f"listing the pods of {name}",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{c.LABEL_DEPLOYMENT}={name}",
            _preload_content=False,
        )
        items: list[Obj] = json.loads(resp.data).get("items") or []
        return items

    def events(self, uid: str) -> list[Obj]:
        """The Events about this PDDeployment object (by UID: not a namesake's)."""
        resp = self._call(
            "listing Events",
            self.core.list_namespaced_event,
            self.namespace,
            field_selector=f"involvedObject.uid={uid}",
            _preload_content=False,
        )
        items: list[Obj] = json.loads(resp.data).get("items") or []
        return items

    def evidence_configmap(self, name: str) -> Obj | None:
        """The deployment's evidence ConfigMap; None when there is none."""
        return self.configmap(configmap_name(name))

    def configmap(self, name: str) -> Obj | None:
        """A ConfigMap of the namespace; None when there is none."""
        try:
            resp = self._call(
                f"reading ConfigMap {name}",
                self.core.read_namespaced_config_map,
                name,
                self.namespace,
                _preload_content=False,
                expect=(404,),
            )
        except ApiException:
            return None
        cm: Obj = json.loads(resp.data)
        return cm

    def annotate(self, name: str, key: str, value: str, resource_version: str) -> bool:
        """Set one annotation, only on the version read (False: it changed meanwhile)."""
        body = {"metadata": {"annotations": {key: value}, "resourceVersion": resource_version}}
        try:
            self._call(
                f"annotating PDDeployment {name}",
                self.custom.patch_namespaced_custom_object,
                c.GROUP,
                c.VERSION,
                self.namespace,
                c.PLURAL,
                name,
                body,
                expect=(409,),
            )
        except ApiException:
            return False
        return True


def _reason(err: ApiException) -> str:
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        return str(err.reason)
    return str(body.get("message") or err.reason) if isinstance(body, dict) else str(err.reason)


def _details_name(err: ApiException) -> str | None:
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        return None
    details = body.get("details") if isinstance(body, dict) else None
    return details.get("name") if isinstance(details, dict) else None


# ------------------------------------------------------------------------ command line


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1, as kubectl's do (argparse's own code is 2)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_FAILED, f"error: {message}\n")


def _connection_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # On the top parser and on each command, so they go before or after the command
    # (kubectl passes the user's flags to a plugin as written).
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--kubeconfig", default=default, help="kubeconfig file (else KUBECONFIG)")
    parser.add_argument("--context", default=default, help="kubeconfig context")
    parser.add_argument(
        "-n", "--namespace", default=default, help="namespace (else the context's, or default)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The `kubectl lockstep` command line."""
    parser = _Parser(
        prog="kubectl lockstep",
        description="Status, incidents, evidence and manual restarts of lockstep PDDeployments.",
    )
    _connection_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        _connection_flags(p, top=False)
        p.add_argument("name", metavar="NAME", help="the PDDeployment")
        return p

    p = command("status", "groups: state, epoch, restarts, ready pods, last probe, runtime")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p = command("incidents", "every incident: verdict, times, steps, evidence summary, outlier")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p = command("evidence", "the rank states and stacks captured for one incident")
    p.add_argument("incident", metavar="INCIDENT", help="an incident id (see incidents)")
    p.add_argument("--logs", action="store_true", help="also the pods' log tails")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p = command("restart", "restart one whole group (the lockstep.dev/restart annotation)")
    p.add_argument("group", metavar="ROLE/GROUP", help="e.g. decode/0")
    p.add_argument("--reason", required=True, help="why (a ticket, an incident): in the request id")
    return parser


def run(args: argparse.Namespace, cluster: Cluster, now: float, out: TextIO) -> int:
    """One command against `cluster`; PluginError for anything the user must fix."""
    pdd = cluster.pdd(args.name)
    if args.command == "status":
        view = status_view(pdd, cluster.pods(args.name), now)
        text = format_status(view)
    elif args.command == "incidents":
        uid = str(objects.meta(pdd).get("uid"))
        view = incidents_view(pdd, cluster.pods(args.name), cluster.events(uid), now)
        text = format_incidents(view, now)
    elif args.command == "evidence":
        view = evidence_view(
            pdd, cluster.evidence_configmap(args.name), args.incident, cluster.configmap
        )
        text = format_evidence(view, logs=args.logs)
    elif args.command == "restart":
        for _ in range(3):  # the operator writes annotations too: read, check, write again
            value = restart_annotation(pdd, args.group, args.reason, now)
            version = str(objects.meta(pdd).get("resourceVersion"))
            if cluster.annotate(args.name, ANNOTATION_RESTART, value, version):
                break
            pdd = cluster.pdd(args.name)
        else:
            raise PluginError(f"PDDeployment {args.name} kept changing; try again")
        role_group = value.split("@", 1)[0]
        out.write(
            f"pddeployment.{c.GROUP}/{args.name} annotated: {ANNOTATION_RESTART}={value}\n"
            f"the operator drains {role_group}, restarts it whole into a new epoch and "
            f"re-admits it (kubectl lockstep status {args.name} -n {cluster.namespace})\n"
        )
        return EXIT_OK
    out.write(json.dumps(view, indent=2) + "\n" if args.output == "json" else text)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """`kubectl-lockstep`: see the module docstring."""
    args = build_parser().parse_args(argv)
    try:
        cluster = Cluster.connect(args.kubeconfig, args.context, args.namespace)
        return run(args, cluster, datetime.now(UTC).timestamp(), sys.stdout)
    except PluginError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())

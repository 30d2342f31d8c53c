"""Shared service: the incident of a group (opened once, its action and escalation kept
current, closed with its figures), as recovery reports it to status."""

from __future__ import annotations

from lockstep.api.models import Incident, IncidentOutlier
from lockstep.api.objects import rfc3339
from lockstep.core.recovery.actions import CloseIncident, OpenIncident, UpdateIncident
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.record import IncidentRecord, OutlierRecord
from lockstep.core.recovery.steps import IncidentKind
from lockstep.core.verdicts import GroupVerdict, Verdict


def open_incident(
    r: Round,
    why: Verdict | IncidentKind,
    reason: str,
    evidence: str,
    first_failure: float,
    culprits: frozenset[str] = frozenset(),
    outliers: tuple[OutlierRecord, ...] = (),
) -> None:
    seq = r.rec.incident_seq + 1
    incident = IncidentRecord(
        id=f"{r.s.role}-{r.rec.index}-{seq}",
        kind=why if isinstance(why, IncidentKind) else IncidentKind.FAILURE,
        verdict=why if isinstance(why, Verdict) else None,
        epoch=r.rec.epoch,
        reason=reason,
        first_failure_at=first_failure,
        detected_at=r.now,
        evidence=bound(evidence, r.s.recovery.diagnostics.max_evidence_bytes),
        culprits=tuple(sorted(culprits)),
        outliers=outliers,
    )
    r.update(incident=incident, incident_seq=seq, healthy_since=None)
    r.actions.append(OpenIncident(incident_model(r, incident)))


def set_action(r: Round, action: str) -> None:
    incident = r.rec.incident
    if incident is None or incident.action == action:
        return
    incident = incident.model_copy(update={"action": action})
    r.update(incident=incident)
    r.actions.append(UpdateIncident(incident_model(r, incident)))


def note_escalation(r: Round, why: str) -> None:
    if r.rec.incident is not None:
        r.update(incident=r.rec.incident.model_copy(update={"escalation": why}))


def close_incident(r: Round, action: str) -> None:
    incident = r.rec.incident
    if incident is None:
        return
    incident = incident.model_copy(update={"action": action})
    r.actions.append(CloseIncident(incident_model(r, incident, recovered_at=r.now)))
    r.update(incident=None)


def incident_model(r: Round, inc: IncidentRecord, recovered_at: float | None = None) -> Incident:
    """The incident as status shows it."""
    return Incident(
        id=inc.id,
        role=r.s.role,
        group=r.rec.index,
        epoch=inc.epoch,
        verdict=inc.label,
        state="Open" if recovered_at is None else "Closed",
        action=inc.action,
        restart_mode=r.rec.restart.mode if inc.attempts else None,
        escalation=inc.escalation or None,
        first_failure_time=rfc3339(inc.first_failure_at, "microseconds"),
        detected_time=rfc3339(inc.detected_at, "microseconds"),
        recovered_time=None if recovered_at is None else rfc3339(recovered_at, "microseconds"),
        time_to_detect_seconds=round(inc.detected_at - inc.first_failure_at, 3),
        time_to_recover_seconds=(
            None if recovered_at is None else round(recovered_at - inc.detected_at, 3)
        ),
        evidence=inc.evidence,
        outliers=[
            IncidentOutlier(pod=o.pod, rank=o.rank, node=o.node, why=o.why) for o in inc.outliers
        ],
    )


def outliers_of(r: Round, v: GroupVerdict) -> tuple[OutlierRecord, ...]:
    """The verdict's outliers with the node each one's pod runs on."""
    nodes = {p.name: p.node for p in r.pods()}
    return tuple(
        OutlierRecord(pod=o.pod, rank=o.rank, node=nodes.get(o.pod), why=o.why) for o in v.outliers
    )


def evidence_text(v: GroupVerdict) -> str:
    lines = [v.reason, f"signals: {', '.join(sorted(v.signals))}"]
    for key, value in v.evidence.items():
        if isinstance(value, list):
            lines.append(f"{key}:")
            lines.extend(f"  {item}" for item in value)
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def bound(text: str, max_bytes: int) -> str:
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[: max_bytes - 16].decode(errors="ignore") + "\n... (truncated)"

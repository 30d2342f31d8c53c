"""Status, derived: what `kubectl get pdd` and `kubectl describe pdd` show.

Pure. The status of a PDDeployment is a function of the spec and policy, the group
records and the incident history the recovery planner keeps (`lockstep.core.records`), the
evidence store's entries (`lockstep.core.evidence`), the pods, and the prober's last sample
of each group. Nothing is read back from the status itself except each condition's
`lastTransitionTime` (kept while the condition's status does not change).

`status_changed` says whether a patch is needed: a status that differs only in how fresh
its last-probe figures are is patched at most every `PROBE_REFRESH_SECONDS`, so a
healthy deployment costs the API server nothing between resyncs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lockstep.api import constants as c
from lockstep.api.models import (
    Condition,
    GroupStatus,
    Incident,
    OperatorStatus,
    PairStatus,
    PDDeployment,
    PDDeploymentStatus,
    PolicyFinding,
    ProbeResult,
    RoleStatus,
)
from lockstep.api.objects import label, rfc3339
from lockstep.core.builders import group_runtime
from lockstep.core.evidence import EvidenceEntry
from lockstep.core.pairs import PairResult
from lockstep.core.policy import PolicyResult
from lockstep.core.recovery import GroupRecord, Step, status_state
from lockstep.core.rolescale import role_scale_name
from lockstep.core.shape import RoleShape, deployment_shape
from lockstep.core.suspects import suspect_nodes
from lockstep.core.verdicts import pod_view_from_k8s

GroupId = tuple[str, int]  # role, group
PROBE_REFRESH_SECONDS = 60.0


@dataclass(frozen=True)
class LastProbe:
    """The prober's last sample of a group (wall-clock time)."""

    ok: bool
    at: float
    latency_s: float | None = None
    error: str | None = None


def condition(
    old: Sequence[Mapping[str, Any]],
    type_: str,
    ok: bool,
    reason: str,
    message: str,
    now: float,
    generation: int | None,
) -> dict[str, Any]:
    """A condition, keeping its lastTransitionTime while its status stays the same."""
    status = "True" if ok else "False"
    prev = next((x for x in old if x.get("type") == type_), None)
    since = prev.get("lastTransitionTime") if prev and prev.get("status") == status else None
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message[:1000],
        last_transition_time=since or rfc3339(now),
        observed_generation=generation,
    ).model_dump(by_alias=True, exclude_none=True)


def _findings(policy: PolicyResult) -> list[PolicyFinding]:
    return [
        PolicyFinding(
            rule=f.rule,
            severity=f.severity,
            field=f.field,
            message=f.message,
            fix=f.fix,
            action=f.action,
        )
        for f in policy.findings
        if f.severity != "info"
    ]


def incident_view(
    incident: Incident, record: GroupRecord | None, entry: EvidenceEntry | None, max_bytes: int
) -> dict[str, Any]:
    """One incident as status shows it: as the planner reported it, with its evidence.
    An open incident's figures come from the planner's own record (the freshest)."""
    view = incident.model_dump(by_alias=True, exclude_none=True)
    summary = (
        record.incident.evidence
        if record is not None and record.incident is not None and record.incident.id == incident.id
        else (entry.verdict if entry is not None else "")
    )
    shown = (
        replace(entry, verdict=summary) if entry is not None else EvidenceEntry(summary)
    ).render(max_bytes)
    view["evidence"] = shown
    return view


def derive_status(
    pdd: PDDeployment,
    policy: PolicyResult,
    old_conditions: Sequence[Mapping[str, Any]],
    records: Mapping[str, GroupRecord],
    incidents: Mapping[str, Incident],
    evidence: Mapping[str, EvidenceEntry],
    pods: Mapping[GroupId, Sequence[Mapping[str, Any]]],
    probes: Mapping[GroupId, LastProbe],
    now: float,
    shape: Mapping[str, RoleShape] | None = None,
    leader: tuple[str, str | None] | None = None,
    pairs: Sequence[PairResult] = (),
) -> dict[str, Any]:
    """The whole status of an accepted PDDeployment (see the module docstring).
    `shape`: each role's shape (`lockstep.core.shape`: its serving count and whose it is,
    the PDDeployment's or its PDRoleScale's, and its spares); default: the spec's.
    `leader`: the acting operator replica and since when (leader election), None with
    one replica. `pairs`: the pair probe's recent tries (each pair's last is shown)."""
    gen = pdd.metadata.generation
    shape = shape or deployment_shape(pdd.spec)
    roles: dict[str, RoleStatus] = {}
    # Groups whose runtime refused to start (a container's termination message).
    refused: list[str] = []
    for role in c.ROLES:
        groups = []
        for rec in sorted(records.values(), key=lambda r: r.index):
            if rec.role != role:
                continue
            current = [
                p
                for p in pods.get((role, rec.index), [])
                if label(p, c.LABEL_EPOCH) == str(rec.epoch)
            ]
            last = probes.get((role, rec.index))
            refusal = next((v.refusal for v in map(pod_view_from_k8s, current) if v.refusal), None)
            if refusal is not None:
                refused.append(f"{role}/{rec.index}: {refusal}")
            groups.append(
                GroupStatus(
                    index=rec.index,
                    state=status_state(rec),
                    epoch=rec.epoch,
                    restarts=rec.budget.restarts,
                    ready_pods=sum(pod_view_from_k8s(p).ready for p in current),
                    pods=len(current),
                    consecutive_failures=rec.detection.failures,
                    last_probe=None
                    if last is None
                    else ProbeResult(
                        ok=last.ok,
                        time=rfc3339(last.at),
                        latency_ms=None
                        if last.latency_s is None
                        else round(last.latency_s * 1000, 3),
                        error=last.error,
                    ),
                    last_restart_time=None
                    if rec.budget.last_restart_at is None
                    else rfc3339(rec.budget.last_restart_at),
                    runtime=group_runtime(current),
                    spare=rec.spare,
                    message=refusal
                    or rec.placement.unschedulable
                    or rec.maintenance
                    or rec.detection.last_reason,
                )
            )
        role_shape = shape[role]
        roles[role] = RoleStatus(
            replicas=role_shape.serving,
            replicas_source=role_shape.source,
            scale_target=role_scale_name(pdd.metadata.name, role),
            ready_groups=sum(g.state == "Healthy" and not g.spare for g in groups),
            spares=role_shape.warm,
            ready_spares=sum(g.state == "Healthy" and g.spare for g in groups),
            groups=groups,
            effective_args=list(policy.roles[role].argv),
        )
    total = sum(r.replicas for r in roles.values())
    ready_all = sum(r.ready_groups for r in roles.values())
    spares = sum(r.spares for r in roles.values())
    spares_note = (
        f"; {sum(r.ready_spares for r in roles.values())}/{spares} spare(s) ready" if spares else ""
    )
    quarantined = [f"{r.role}/{r.index}" for r in records.values() if r.step is Step.QUARANTINED]
    recovering = [
        f"{r.role}/{r.index}"
        for r in records.values()
        if status_state(r) in ("Recovering", "Starting", "Moving", "Unschedulable")
    ]
    # A group whose pods the scheduler did not place (in time, or not yet): the reason.
    unplaced = [
        f"{r.role}/{r.index}: {r.placement.unschedulable}"
        for r in sorted(records.values(), key=lambda r: (r.role, r.index))
        if r.placement.unschedulable
    ]
    broken = [
        f"{r.role}/{r.index}"
        for r in records.values()
        if status_state(r)
        in ("Desynced", "Hung", "RankDown", "TransferBroken", "KVLeak", "Suspect")
    ]
    conditions = [
        condition(
            old_conditions,
            "Ready",
            total > 0 and ready_all == total,
            "AllGroupsHealthy" if ready_all == total else "GroupsNotReady",
            f"{ready_all}/{total} groups healthy{spares_note}",
            now,
            gen,
        ),
        condition(
            old_conditions,
            "Progressing",
            bool(recovering),
            "GroupsStarting" if recovering else "Stable",
            ", ".join(recovering) or "no group starting or recovering",
            now,
            gen,
        ),
        condition(
            old_conditions,
            "Degraded",
            bool(quarantined or broken or refused),
            "GroupsQuarantined"
            if quarantined
            else "RuntimeRefused"
            if refused
            else ("GroupsBroken" if broken else "AsExpected"),
            "; ".join(
                [
                    *([f"quarantined: {', '.join(quarantined)}"] if quarantined else []),
                    *refused,
                    *([f"broken: {', '.join(broken)}"] if broken else []),
                ]
            ),
            now,
            gen,
        ),
        condition(
            old_conditions,
            "Schedulable",
            not unplaced,
            "GroupsUnschedulable" if unplaced else "AllPlaced",
            "; ".join(unplaced) or "every group's pods are placed",
            now,
            gen,
        ),
        condition(
            old_conditions,
            "FlagsAdjusted",
            policy.adjusted,
            "PolicyAdjusted" if policy.adjusted else "NoAdjustment",
            "; ".join(
                f"{f.rule}: {f.field}"
                for f in policy.findings
                if f.action == "adjusted" and f.severity != "info"
            )
            or "no flag adjusted",
            now,
            gen,
        ),
    ]
    # Nodes behind the outlier of several incidents (`suspects`).
    watch = pdd.spec.recovery.suspect_nodes
    suspects = suspect_nodes(incidents.values(), now, watch)
    conditions.append(
        condition(
            old_conditions,
            "NodesSuspect",
            bool(suspects),
            "OutlierNodes" if suspects else "NoSuspectNode",
            "; ".join(x.text(watch.window_seconds) for x in suspects)
            or f"no node hosted the outlier of {watch.incidents} incidents in "
            f"{watch.window_seconds}s",
            now,
            gen,
        )
    )
    by_incident = {r.incident.id: r for r in records.values() if r.incident is not None}
    max_bytes = pdd.spec.recovery.diagnostics.max_evidence_bytes
    shown = [
        incident_view(i, by_incident.get(i.id), evidence.get(i.id), max_bytes)
        for i in incidents.values()
    ]
    status = PDDeploymentStatus(
        observed_generation=gen,
        conditions=[Condition.model_validate(x) for x in conditions],
        prefill=roles["prefill"],
        decode=roles["decode"],
        prefill_ready=f"{roles['prefill'].ready_groups}/{roles['prefill'].replicas}",
        decode_ready=f"{roles['decode'].ready_groups}/{roles['decode'].replicas}",
        open_incidents=sum(i.get("state") == "Open" for i in shown),
        incidents=[Incident.model_validate(i) for i in shown],
        findings=_findings(policy),
        pairs=_pairs(pairs),
        operator=OperatorStatus(leader=leader[0], since=leader[1]) if leader else None,
    )
    return status.model_dump(by_alias=True, exclude_none=True)


def _pairs(results: Sequence[PairResult]) -> list[PairStatus]:
    """Each pair's last try, in pair order."""
    latest = {r.key: r for r in sorted(results, key=lambda r: r.at)}
    return [
        PairStatus(
            prefill=r.prefill,
            decode=r.decode,
            ok=r.ok,
            time=rfc3339(r.at),
            latency_ms=None if r.latency_s is None else round(r.latency_s * 1000, 3),
            error=r.error,
        )
        for _, r in sorted(latest.items())
    ]


def invalid_status(
    generation: int | None,
    old_conditions: Sequence[Mapping[str, Any]],
    message: str,
    now: float,
    policy: PolicyResult | None = None,
) -> dict[str, Any]:
    """The status of a spec that can never work: Ready False with the reason."""
    ready = condition(old_conditions, "Ready", False, "InvalidSpec", message, now, generation)
    rest = [dict(x) for x in old_conditions if x.get("type") != "Ready"]
    status: dict[str, Any] = {"observedGeneration": generation, "conditions": [ready, *rest]}
    if policy is not None:
        status["findings"] = [f.model_dump(by_alias=True) for f in _findings(policy)]
    return status


def _without_probe_freshness(status: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(status)
    for role in c.ROLES:
        role_status = out.get(role)
        if not isinstance(role_status, Mapping):
            continue
        groups = []
        for g in role_status.get("groups") or []:
            g = dict(g)
            probe = g.get("lastProbe")
            if isinstance(probe, Mapping):
                # Whether it passed counts; when, and how fast, only every so often.
                g["lastProbe"] = {k: v for k, v in probe.items() if k in ("ok", "error")}
            groups.append(g)
        out[role] = {**role_status, "groups": groups}
    if isinstance(out.get("pairs"), list):
        # A pair's state counts; when it was last tried, and how fast, only now and then.
        out["pairs"] = [
            {k: v for k, v in p.items() if k in ("prefill", "decode", "ok")} for p in out["pairs"]
        ]
    return out


def status_changed(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, old_at: float | None, now: float
) -> bool:
    """Whether `new` must be patched over `old` (patched at `old_at`)."""
    if old is None or old_at is None:
        return True
    if _without_probe_freshness(new) != _without_probe_freshness(old):
        return True
    return new != old and now - old_at >= PROBE_REFRESH_SECONDS

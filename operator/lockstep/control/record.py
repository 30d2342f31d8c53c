"""Record: the round's memory, written last, and only what changed.

The group records and the incident history (one annotation each, `lockstep.core.records`),
the evidence store's entries (the planner's summary of each incident it opened or
updated, and what this round's captures read, their cause judged by `verdicts`), the
capture book settled, the prober's targets, status (`lockstep.core.status`, patched only
when it changed), the scale targets' status and the metrics."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment
from lockstep.api.objects import label
from lockstep.clients.agent_client import agent_url, captured_reports
from lockstep.clients.pair_prober import PairTargets
from lockstep.clients.prober import ProbeTarget
from lockstep.control.act import Done, tell_suspects
from lockstep.control.judge import leader_of
from lockstep.control.observe import ROLES, Seen
from lockstep.control.runtime import Memory, Runtime
from lockstep.core.builders import build_evidence_configmap
from lockstep.core.evidence import Capture, EvidenceEntry
from lockstep.core.pairs import PairEnd
from lockstep.core.records import (
    ANNOTATION_INCIDENTS,
    ANNOTATION_RECORDS,
    apply_incident_actions,
    dump_incidents,
    dump_records,
    record_key,
)
from lockstep.core.recovery import Action, GroupRecord, OpenIncident, UpdateIncident, needs
from lockstep.core.status import LastProbe, derive_status, status_changed
from lockstep.core.verdicts import divergence_cause
from lockstep.execute import Execution, GroupId, agent_token


@dataclass
class RoundResult:
    """What a round did, for the daemon (and tests)."""

    status: dict[str, Any]
    records: dict[str, GroupRecord]
    requeue_after: float | None
    actions: list[Action]
    api_writes: int = 0  # annotation and status patches this round made


def record(
    rt: Runtime,
    mem: Memory,
    seen: Seen,
    exe: Execution,
    done: Done,
    old_conditions: list[Any],
) -> RoundResult:
    """The round's memory (records, history, evidence, the capture book), the prober's
    targets, status (and the scale targets' status), the metrics."""
    assert rt.evidence is not None
    namespace, name, pdd, records = seen.namespace, seen.name, seen.pdd, done.records
    _forget_restart_failures(rt, namespace, name, records)
    incidents = apply_incident_actions(mem.incidents, done.actions)
    rt.evidence.update(
        namespace,
        name,
        seen.key[2],
        evidence_changes(seen.entries, done.actions, mem.captures.fresh(), mem.captures.evicted),
        keep=incidents.keys(),
        build=lambda data: build_evidence_configmap(pdd, data),
    )
    mem.captures.settle(
        {r.incident.id for r in records.values() if r.incident is not None and needs(r).capture}
    )
    writes = 0
    persisted = (dump_records(records), dump_incidents(incidents))
    if persisted != mem.persisted:
        rt.kube.patch_pddeployment_annotations(
            namespace, name, {ANNOTATION_RECORDS: persisted[0], ANNOTATION_INCIDENTS: persisted[1]}
        )
        writes += 1
    mem.records, mem.incidents, mem.persisted = records, incidents, persisted
    tell_suspects(mem, seen, incidents, exe)
    _update_targets(rt, pdd, namespace, name, records, seen.by_group)
    _update_pair_targets(rt, pdd, namespace, name, records, seen.by_group)
    status = derive_status(
        pdd,
        seen.policy,
        old_conditions,
        records,
        incidents,
        rt.evidence.entries(*seen.key),
        seen.by_group,
        _last_probes(rt, namespace, name, records),
        seen.now,
        shape=seen.shape,
        leader=rt.leader,
        pairs=rt.pairs.results(namespace, name),
    )
    exe.scale.apply_status(seen.scales, seen.resolutions, status)
    for role in ROLES:
        role_status = status.get(role) or {}
        rt.metrics.desired_groups.labels(namespace, name, role).set(seen.shape[role].replicas)
        rt.metrics.ready_groups.labels(namespace, name, role).set(
            int(role_status.get("readyGroups", 0))
        )
        rt.metrics.spare_groups.labels(namespace, name, role).set(
            int(role_status.get("readySpares", 0))
        )
    writes += patch_status(rt, mem, namespace, name, status, seen.now)
    rt.metrics.incidents_open.labels(namespace, name).set(status["openIncidents"])
    rt.metrics.quarantined.labels(namespace, name).set(
        sum(needs(r).quarantined for r in records.values())
    )
    return RoundResult(status, records, done.requeue, done.actions, writes)


def patch_status(
    rt: Runtime, mem: Memory, namespace: str, name: str, status: dict[str, Any], now: float
) -> int:
    """Patch status when it changed (`status_changed`); the patches made (0 or 1)."""
    if not status_changed(status, mem.status, mem.status_at, now):
        return 0
    rt.kube.patch_pddeployment_status(namespace, name, status)
    mem.status, mem.status_at = status, now
    return 1


def evidence_changes(
    entries: Mapping[str, EvidenceEntry],
    actions: Sequence[Action],
    captured: Mapping[str, Capture],
    full_evicted: Collection[str] = (),
) -> dict[str, EvidenceEntry]:
    """The evidence store's new entries: the planner's summary of each incident it opened
    or updated, what this round's captures read (a consensus divergence among their rank
    states, judged by `verdicts`, is the incident's cause), and the incidents whose whole
    capture a newer incident's took the place of (no longer named)."""
    out: dict[str, EvidenceEntry] = {}
    for incident_id in full_evicted:
        if incident_id in entries:
            out[incident_id] = replace(entries[incident_id], full=None)
    for action in actions:
        if isinstance(action, OpenIncident | UpdateIncident):
            inc = action.incident
            base = out.get(inc.id) or entries.get(inc.id) or EvidenceEntry()
            out[inc.id] = replace(base, verdict=inc.evidence)
    for incident_id, found in captured.items():
        base = out.get(incident_id) or entries.get(incident_id) or EvidenceEntry()
        reports = captured_reports(found)
        out[incident_id] = replace(
            base,
            captured=found.captured,
            cause=divergence_cause(r for a in reports for r in a.ranks or ()),
            full=found.full,
            full_missed=found.full_missed,
        )
    return out


def _last_probes(
    rt: Runtime, namespace: str, name: str, records: Mapping[str, GroupRecord]
) -> dict[GroupId, LastProbe]:
    out: dict[GroupId, LastProbe] = {}
    offset = rt.probe_clock_offset()
    for rec in records.values():
        samples = rt.book.samples((namespace, name, rec.role, rec.index))
        if samples:
            last = samples[-1]
            at = last.wall if last.wall is not None else last.time + offset
            out[(rec.role, rec.index)] = LastProbe(last.ok, at, last.latency_s, last.error)
    return out


def _forget_restart_failures(
    rt: Runtime, namespace: str, name: str, records: Mapping[str, GroupRecord]
) -> None:
    """Drop what no group is waiting on any more (another epoch, or not restarting)."""
    assert rt.deps is not None
    failures = rt.deps.restart_failures
    for key in list(failures):
        ns, n, role, group, epoch = key
        if (ns, n) != (namespace, name):
            continue
        rec = records.get(record_key(role, group))
        if rec is None or rec.epoch != epoch or not needs(rec).restart_answers:
            del failures[key]


def probe_targets(
    pdd: PDDeployment,
    key_prefix: tuple[str, str],
    role: str,
    group: int,
    record: GroupRecord,
    pods: Sequence[Mapping[str, Any]],
    now_monotonic: float,
    token: str = "",
) -> ProbeTarget | None:
    """What the prober should probe for a group (None: nothing to probe yet)."""
    current = [
        p
        for p in pods
        if label(p, c.LABEL_EPOCH) == str(record.epoch)
        and (p.get("status") or {}).get("podIP")
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    leader = next((p for p in current if label(p, c.LABEL_RANK) == "0"), None)
    if leader is None or not needs(record).probe:
        return None
    health = pdd.spec.health
    ip = leader["status"]["podIP"]
    agents = tuple(
        (p["metadata"]["name"], agent_url(p["status"]["podIP"]))
        for p in sorted(current, key=lambda p: int(label(p, c.LABEL_RANK) or 0))
    )
    return ProbeTarget(
        key=(*key_prefix, role, group),
        epoch=record.epoch,
        # The runtime bounds its own wait below ours, so a probe never outlives the request.
        probe_url=f"http://{ip}:{c.PORT_HTTP}/lockstep/probe?timeout={health.timeout_seconds * 0.8:g}",
        agents=agents,
        period=float(health.period_seconds),
        timeout=float(health.timeout_seconds),
        not_before=now_monotonic,
        token=token,
    )


def _update_pair_targets(
    rt: Runtime,
    pdd: PDDeployment,
    namespace: str,
    name: str,
    records: Mapping[str, GroupRecord],
    by_group: Mapping[GroupId, Sequence[Mapping[str, Any]]],
) -> None:
    """The pair prober's groups of this deployment: each group in service (Healthy, not a
    spare) whose leader has an address, with its epoch and node; none while the pair
    probe is off or a role has no group to pair."""
    spec = pdd.spec.health.pair_probe
    ends: dict[str, list[PairEnd]] = {"prefill": [], "decode": []}
    for rec in sorted(records.values(), key=lambda r: (r.role, r.index)):
        if not spec.enabled or not needs(rec).pair_probe:
            continue
        ip, node = leader_of(by_group.get((rec.role, rec.index), []), rec.epoch)
        if ip:
            port = c.PORT_BOOTSTRAP if rec.role == "prefill" else None
            ends[rec.role].append(PairEnd(rec.index, rec.epoch, ip, node, port))
    targets = None
    if ends["prefill"] and ends["decode"]:
        assert rt.deps is not None
        targets = PairTargets(
            (namespace, name),
            tuple(ends["prefill"]),
            tuple(ends["decode"]),
            float(spec.period_seconds),
            float(spec.timeout_seconds),
            agent_token(rt.deps, pdd, namespace),
        )
    rt.pairs.set_targets(targets, (namespace, name))


def _update_targets(
    rt: Runtime,
    pdd: PDDeployment,
    namespace: str,
    name: str,
    records: Mapping[str, GroupRecord],
    by_group: Mapping[GroupId, Sequence[Mapping[str, Any]]],
) -> None:
    targets = []
    now_mono = time.monotonic()
    unsettled = set()
    # Pods exist only once their Secret does: reading it is a cache hit after the first.
    assert rt.deps is not None
    token = agent_token(rt.deps, pdd, namespace) if by_group else ""
    for rec in records.values():
        target = probe_targets(
            pdd,
            (namespace, name),
            rec.role,
            rec.index,
            rec,
            by_group.get((rec.role, rec.index), []),
            now_mono,
            token,
        )
        if target is not None:
            targets.append(target)
        if not needs(rec).settled:
            unsettled.add((namespace, name, rec.role, rec.index))
    rt.book.set_targets(namespace, name, targets)
    rt.known.add((namespace, name))
    rt.unsettled = {k for k in rt.unsettled if k[:2] != (namespace, name)} | unsettled

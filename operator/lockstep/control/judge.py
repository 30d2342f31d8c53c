"""Judge: each group once per round, into the planner's input.

`observe_group` builds a group's one observation of the round (the newest deep-probe
sample from the `ProbeBook` with the rank states its prober read; or the pods, when they
alone show a rank down, with the agents read then; or the rank states the incident's
evidence capture read, parsed by the agent client) and calls `verdicts.classify_group`
on it: the one call of the judge in the operator. `judge_role` adds what else the
planner needs of each group (a manual or rollout request, the restart answers, the
maintenance, the in-flight counts a drain waits for, the capture)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment
from lockstep.api.objects import label
from lockstep.clients.agent_client import captured_reports, report_from_ranks
from lockstep.clients.prober import ProbeSample
from lockstep.control.observe import Seen, step_bounds
from lockstep.control.runtime import GroupKey, Memory, Runtime
from lockstep.core.builders import build_group_pods
from lockstep.core.evidence import EvidenceEntry
from lockstep.core.maintenance import NodeState, cluster_fingerprint, group_maintenance
from lockstep.core.policy import PolicyResult, watchdog_seconds
from lockstep.core.records import manual_request, record_key
from lockstep.core.recovery import (
    CapturedEvidence,
    GroupInput,
    GroupRecord,
    Role,
    adopt_group,
    needs,
    next_rollout,
)
from lockstep.core.verdicts import (
    AgentReport,
    EndedKVJudgement,
    GroupObservation,
    GroupVerdict,
    PairJudgement,
    ProbeOutcome,
    StepBounds,
    classify_group,
    classify_pairs,
    judge_ended_kv,
    pod_view_from_k8s,
    pods_down,
    progress_baseline,
    reading_from_probe,
)
from lockstep.execute import agent_token


@dataclass
class Judged:
    """One role's groups as the planner gets them: the records (found-running groups
    adopted), and each group's input with this round's verdict."""

    replicas: int  # the groups the role runs, spares included (0 while paused); those beyond retire
    records: dict[int, GroupRecord]
    inputs: dict[int, GroupInput]
    serving: int = 0  # of those, the groups that serve (spec replicas); the rest are spares


def _to_wall(sample: ProbeSample, rt: Runtime) -> float:
    return sample.wall if sample.wall is not None else sample.time + rt.probe_clock_offset()


def observe_group(
    rt: Runtime,
    key: GroupKey,
    record: GroupRecord | None,
    pods: Sequence[Mapping[str, Any]],
    expected_pods: int,
    now: float,
    steps: StepBounds | None = None,
    token: Callable[[], str] = lambda: "",
    captured: tuple[AgentReport, ...] | None = None,
) -> GroupVerdict | None:
    """This round's verdict of a group (the one `classify_group` of the round), or None
    when nothing new was observed. What is observed: the newest probe sample with the
    rank states its prober read; else the pods, when they alone show a rank down (the
    agents are read then: ranks that went down on a consensus divergence still report
    it); and `captured`, the rank states the incident's evidence capture read, which
    take the place of the agents' answers. `token` gives the pod-agent token."""
    epoch = record.epoch if record is not None else 0
    views = tuple(pod_view_from_k8s(p) for p in pods)
    samples = [s for s in rt.book.samples(key) if s.epoch == epoch]
    fresh = samples[-1] if samples else None
    if fresh is not None and record is not None and fresh.id == record.detection.last_sample:
        fresh = None  # already counted
    baseline_counts = record.restart_baseline if record is not None else {}
    if fresh is not None:
        probe = ProbeOutcome(
            "ok" if fresh.ok else ("timeout" if "timed out" in (fresh.error or "") else "failed"),
            None if fresh.latency_s is None else fresh.latency_s * 1000,
            fresh.error,
        )
        agents = tuple(report_from_ranks(a.pod, a.body, epoch, a.error) for a in fresh.agents)
        at, previous, sample = _to_wall(fresh, rt), rt.previous_ranks.get(key, ()), fresh.id
    else:
        # No new probe: the pods alone can still show a dead rank (deleted, evicted,
        # restarted), which must not wait for the next probe period.
        probe, agents, at, previous, sample = (
            ProbeOutcome("failed", None, "not probed"),
            (),
            now,
            (),
            None,
        )
        pods_only = GroupObservation(epoch, expected_pods, probe, views, (), baseline_counts)
        if captured is None and not pods_down(pods_only):
            return None
        if captured is None:
            agents = _read_agents(rt, pods, epoch, token())
    obs = GroupObservation(
        epoch, expected_pods, probe, views, captured or agents, baseline_counts, sample=sample
    )
    verdict = classify_group(obs, previous, now=at, steps=steps)
    if fresh is not None:
        ranks = tuple(r for a in agents if a.ranks for r in a.ranks)
        baseline = progress_baseline(previous, ranks, verdict, fresh.ok)
        if baseline:
            rt.previous_ranks[key] = baseline
        else:
            rt.previous_ranks.pop(key, None)
    return verdict


def _read_agents(
    rt: Runtime, pods: Sequence[Mapping[str, Any]], epoch: int, token: str
) -> tuple[AgentReport, ...]:
    """Every reachable pod agent's ranks, plus crashed ranks that carry a consensus failure."""
    reports = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        name = str((pod.get("metadata") or {}).get("name", ""))
        if ip:
            answer = rt.agents.ranks(name, ip, token)
            reports.append(report_from_ranks(name, answer.body, epoch, answer.error))
    return tuple(reports)


def judge_pairs(rt: Runtime, mem: Memory, seen: Seen) -> PairJudgement:
    """The PD path's judgement of the round: the pair probe's recent tries of the groups
    in service (`verdicts.classify_pairs`), each group's leader's node named for a link,
    with each group's newest deep probe (a group whose TP path fails is the TP judge's)."""
    spec = seen.pdd.spec.health.pair_probe
    probed = {(str(r.role), r.index): r.epoch for r in mem.records.values() if needs(r).pair_probe}
    nodes = {gid: leader_of(seen.by_group.get(gid, []), epoch)[1] for gid, epoch in probed.items()}
    window = 3.0 * spec.period_seconds + 2.0 * spec.timeout_seconds
    deep: dict[tuple[str, int], float | None] = {}
    deep_failed: dict[tuple[str, int], float] = {}
    for (role, g), epoch in probed.items():
        samples = [
            s for s in rt.book.samples((seen.namespace, seen.name, role, g)) if s.epoch == epoch
        ]
        if samples:
            deep[(role, g)] = _to_wall(samples[-1], rt) if samples[-1].ok else None
        failed = [s for s in samples if not s.ok]
        if failed:
            deep_failed[(role, g)] = _to_wall(failed[-1], rt)
    return classify_pairs(
        rt.pairs.results(seen.namespace, seen.name),
        probed,
        seen.now,
        window,
        nodes,
        deep=deep,
        deep_failed=deep_failed,
        settled=settled_roles(mem.records.values(), deep),
    )


def settled_roles(
    records: Iterable[GroupRecord], deep: Mapping[tuple[str, int], float | None]
) -> dict[str, float | None]:
    """Per role, since when every serving group of it is Healthy with its newest deep
    probe passing (None: one is failing or in an incident now). A broken group fails its
    peers' tries with other groups too (`verdicts.pairs`)."""
    settled: dict[str, float | None] = {}
    for r in records:
        role, n = str(r.role), needs(r)
        if settled.get(role, 0.0) is None:
            continue
        if n.breaks_peers or (
            n.pair_probe and (role, r.index) in deep and deep[(role, r.index)] is None
        ):
            settled[role] = None
        elif n.pair_probe:
            settled[role] = max(settled.get(role) or 0.0, r.step_since)
    return settled


def judge_kv(rt: Runtime, mem: Memory, seen: Seen) -> EndedKVJudgement:
    """KV held by ended requests (`verdicts.judge_ended_kv`): each group in service,
    judged by its deep probes' `kv` reports of the epoch it runs and the frees asked of
    that epoch (`Memory.kv_frees`); nothing while `spec.health.endedKV` is off."""
    spec = seen.pdd.spec.health.ended_kv
    if not spec.enabled:
        return EndedKVJudgement()
    epochs = {(str(r.role), r.index): r.epoch for r in mem.records.values() if needs(r).pair_probe}
    readings = {}
    for (role, g), epoch in epochs.items():
        samples = rt.book.samples((seen.namespace, seen.name, role, g))
        found = [reading_from_probe(_to_wall(s, rt), s.detail) for s in samples if s.epoch == epoch]
        readings[(role, g)] = [r for r in found if r is not None]
    frees = {(role, g): mem.kv_frees.get((role, g, e), []) for (role, g), e in epochs.items()}
    live = {(role, g, e) for (role, g), e in epochs.items()}
    for key in [k for k in mem.kv_frees if k not in live]:
        del mem.kv_frees[key]  # an epoch that ended, or a group out of service
    return judge_ended_kv(
        readings, frees, epochs, seen.now, spec.max_tokens, float(spec.grace_seconds)
    )


def leader_of(pods: Sequence[Mapping[str, Any]], epoch: int) -> tuple[str | None, str | None]:
    """The IP and node of a group's leader (rank 0) in `epoch`, not being deleted."""
    for p in pods:
        if (
            label(p, c.LABEL_EPOCH) == str(epoch)
            and label(p, c.LABEL_RANK) == "0"
            and not (p.get("metadata") or {}).get("deletionTimestamp")
        ):
            return (p.get("status") or {}).get("podIP"), (p.get("spec") or {}).get("nodeName")
    return None, None


def judge_role(
    rt: Runtime,
    mem: Memory,
    seen: Seen,
    role: Role,
    pairs: PairJudgement | None = None,
    kv: EndedKVJudgement | None = None,
) -> Judged:
    """Each group of a role judged once (`observe_group`) and its planner input; where
    its deep probe found nothing wrong, the PD path's verdict of it (`pairs`), else the
    verdict of the KV its ended requests hold (`kv`), if any."""
    assert rt.deps is not None
    deps, pdd, now = rt.deps, seen.pdd, seen.now
    namespace, name = seen.namespace, seen.name
    spec_role = pdd.spec.role(role)
    steps = step_bounds(pdd, watchdog_seconds(seen.policy.roles[role].argv))
    shape = seen.shape[role]
    serving, replicas = shape.serving, shape.runs
    # Groups beyond replicas (a scale-down) stay planned until they have left: drained
    # first, then deleted (`recovery`); paused deployments delete at once.
    present = [g for (r, g) in seen.by_group if r == role]
    present += [rec.index for rec in mem.records.values() if rec.role == role]
    span = replicas if shape.paused else max([replicas, *(g + 1 for g in present)])
    records = {g: r for g in range(span) if (r := mem.records.get(record_key(role, g))) is not None}
    for g in range(span):
        if g not in records and seen.by_group.get((role, g)):
            # Found running without a record (fresh install, lost annotation): adopt it
            # with today's restart counts as the baseline.
            records[g] = adopt_group(
                role, g, [pod_view_from_k8s(p) for p in seen.by_group[(role, g)]], now=now
            )

    def token() -> str:
        return agent_token(deps, pdd, namespace)

    rolling = next_rollout(seen.stale, mem.records.values())
    cluster = _cluster(mem, seen)
    inputs = {}
    for g in range(span):
        group_pods = seen.by_group.get((role, g), [])
        rec = records.get(g)
        if g >= replicas and not group_pods and rec is None:
            continue
        verdict = observe_group(
            rt, (namespace, name, role, g), rec, group_pods, spec_role.pods_per_group, now,
            steps, token, _capture_of(mem, rec),
        )  # fmt: skip
        for other in (
            pairs.verdicts.get((role, g)) if pairs is not None else None,
            (kv.verdicts or {}).get((role, g)) if kv is not None else None,
        ):
            if other is not None and (verdict is None or not verdict.is_failure):
                verdict = other
        request = manual_request(seen.body, role, g)
        rollout = request is None and rolling == (role, g)
        if rollout:
            request = f"spec-{_pod_hash(pdd, seen.policy, role)}"
        failed = deps.restart_failures.get((namespace, name, role, g, rec.epoch), {}) if rec else {}
        moving, moving_nodes = _maintenance(rec, group_pods, seen.nodes)
        inputs[g] = GroupInput(
            maintenance=moving,
            maintenance_nodes=moving_nodes,
            inflight=_inflight(rt, rec, group_pods),
            pods=tuple(pod_view_from_k8s(p) for p in group_pods),
            verdict=verdict,
            manual_request=request,
            restart_failures={uid: why for uid, (why, _) in failed.items()},
            restart_unreachable=frozenset(uid for uid, (_, silent) in failed.items() if silent),
            template_changed=rollout and g < replicas,
            captured=_captured(rec, seen.entries),
            retire=g >= replicas,
            cluster=cluster,
        )
    return Judged(replicas, records, inputs, serving)


def _cluster(mem: Memory, seen: Seen) -> str:
    """The round's `maintenance.cluster_fingerprint`: every node, and the pods of this
    deployment's groups that are not themselves being placed."""
    placing = {(str(r.role), r.index) for r in mem.records.values() if needs(r).placing}
    pods = [p for gid, group in seen.by_group.items() if gid not in placing for p in group]
    return cluster_fingerprint(seen.nodes, pods)


def _maintenance(
    record: GroupRecord | None,
    pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, NodeState],
) -> tuple[str | None, tuple[str, ...]]:
    """Why the group's current epoch must leave its nodes (maintenance), and which."""
    if record is None or not nodes:
        return None, ()
    current = [
        p
        for p in pods
        if label(p, c.LABEL_EPOCH) == str(record.epoch)
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    return group_maintenance(current, nodes)


def _inflight(
    rt: Runtime, record: GroupRecord | None, pods: Sequence[Mapping[str, Any]]
) -> dict[str, int | None]:
    """The requests each leader of a group holds, read only while the group drains on
    purpose (maintenance, scale-down, standing down): one small GET per leader, bounded."""
    if record is None or not needs(record).inflight:
        return {}
    out: dict[str, int | None] = {}
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if label(pod, c.LABEL_RANK) == "0" and ip:
            out[str(pod["metadata"]["name"])] = rt.agents.inflight(ip)
    return out


def _captured(
    record: GroupRecord | None, entries: Mapping[str, EvidenceEntry]
) -> CapturedEvidence | None:
    """The evidence store's capture of the record's open incident, as planner input."""
    if record is None or record.incident is None:
        return None
    entry = entries.get(record.incident.id)
    if entry is None or entry.captured is None:
        return None
    return CapturedEvidence(record.incident.id)


def _capture_of(mem: Memory, record: GroupRecord | None) -> tuple[AgentReport, ...] | None:
    """The rank states the capture of the record's open incident read (the capture book's
    answers, parsed by the agent client), while the group waits on it (None: none, or no
    longer waiting)."""
    if record is None or record.incident is None or not needs(record).capture:
        return None
    capture = mem.captures.get(record.incident.id)
    return None if capture is None else captured_reports(capture)


def _pod_hash(pdd: PDDeployment, policy: PolicyResult, role: str) -> str:
    pod = build_group_pods(pdd, role, 0, 0, policy.roles[role])[0]
    return str(pod["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH])

"""One control round for one PDDeployment: observe, judge, plan, act, persist, report.

The round orchestrator, called by the PDDeployment's daemon (`lockstep.handlers`) when
something happened (a failed probe, a pod changed, the spec changed, a recovery step
asked to run again) and on a slow resync. It decides nothing itself:

1. observe: the deployment's pods and Services come from watch-fed caches (the caller
   passes them), the group records and the incident history from this runtime's memory
   (the annotations the last round persisted; read from the object only after an
   operator restart), the latest deep-probe samples from the `ProbeBook`;
2. judge each group (`verdicts.classify_group`) and plan each role
   (`recovery.plan_role`, the incident's one owner, with its guard rails), feeding back
   the evidence the last capture found (`recovery.CapturedEvidence`);
3. execute the planned actions in order (`lockstep.executor`), then the reconcile plan
   (`reconcile.plan_reconcile`) and the router's objects;
4. persist the records, the incident history (`lockstep.records`) and the evidence
   (`lockstep.evidence`) when they changed, derive status (`lockstep.status`) and patch
   it only when it changed, and tell the prober which groups to probe.

Every action is idempotent (see `recovery`), so a round interrupted anywhere (an
operator crash) is simply run again from the persisted records. A healthy deployment
costs the API server nothing per round: reads come from caches, writes only happen when
something changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from lockstep import constants as c
from lockstep.agent_client import AgentClient, agent_url, report_from_ranks
from lockstep.builders import (
    ROUTER_KINDS,
    build_evidence_configmap,
    build_group_pods,
    build_router,
    role_selector,
    router_name,
    spec_hash,
)
from lockstep.evidence import EvidenceEntry, EvidenceStore
from lockstep.executor import Deps, EventSink, Execution, GroupId, agent_token
from lockstep.kube import Kube
from lockstep.maintenance import NodeState, group_maintenance
from lockstep.metrics import Metrics
from lockstep.models import (
    Incident,
    InvalidPDDeployment,
    PDDeployment,
    parse_pddeployment,
    with_runtime_image,
)
from lockstep.policy import PolicyResult, evaluate, watchdog_seconds
from lockstep.prober import ProbeBook, ProbeSample, ProbeTarget
from lockstep.reconcile import ReconcilePlan, label, plan_reconcile, plan_router, pods_by_group
from lockstep.records import (
    ANNOTATION_INCIDENTS,
    ANNOTATION_RECORDS,
    Incidents,
    apply_incident_actions,
    dump_incidents,
    dump_records,
    load_incidents,
    load_records,
    manual_request,
    record_key,
)
from lockstep.recovery import (
    Action,
    CapturedEvidence,
    GroupInput,
    GroupRecord,
    OpenIncident,
    Role,
    RoleSettings,
    Step,
    UpdateIncident,
    adopt_group,
    plan_role,
    reconciler_may_create_pods,
    retired,
)
from lockstep.rolescale import (
    Resolution,
    build_role_scale,
    resolve,
    role_scale_name,
    status_patch,
)
from lockstep.status import LastProbe, derive_status, invalid_status, status_changed
from lockstep.verdicts import (
    AgentReport,
    GroupObservation,
    GroupVerdict,
    ProbeOutcome,
    RankState,
    StepBounds,
    classify_group,
    pod_view_from_k8s,
    pods_down,
    progress_baseline,
)

log = logging.getLogger(__name__)

DeploymentKey = tuple[str, str, str]  # namespace, name, uid


@dataclass
class Memory:
    """What the operator remembers of one deployment between rounds.

    The records and the incident history are the ones last persisted (the object's
    annotations say the same once the watch has caught up); the status is the one last
    patched, and when.
    """

    records: dict[str, GroupRecord]
    incidents: Incidents
    persisted: tuple[str, str]  # the two annotations' values as last written
    status: dict[str, Any] | None = None
    status_at: float | None = None
    router: str | None = None  # the router objects' hash as last applied
    router_swept_at: float | None = None  # the last sweep of the routers' registries
    # The rank states each incident's evidence capture read (by incident id), judged
    # with the group's observations while it waits in CapturingEvidence.
    captured: dict[str, tuple[AgentReport, ...]] = field(default_factory=dict)


@dataclass
class Runtime:
    """What every control round shares: I/O, the probe book, metrics, memory."""

    kube: Kube
    book: ProbeBook
    metrics: Metrics
    http: httpx.Client
    clock: Callable[[], float] = time.time
    probe_clock_offset: Callable[[], float] = lambda: time.time() - time.monotonic()
    evidence: EvidenceStore | None = None
    # spec.runtime.image when a PDDeployment leaves it unset (None: the builders' default).
    runtime_image: str | None = None
    # Rank states each group's next failed sample is judged against for progress.
    previous_ranks: dict[tuple[str, str, str, int], tuple[RankState, ...]] = field(
        default_factory=dict
    )
    # Keys of deployments whose groups the book probes (forget them when deleted).
    known: set[tuple[str, str]] = field(default_factory=set)
    memory: dict[DeploymentKey, Memory] = field(default_factory=dict)
    # Groups not settled (not Healthy, or failing): an ok probe of them wakes the round.
    unsettled: set[tuple[str, str, str, int]] = field(default_factory=set)
    deps: Deps | None = None
    # With leader election: this replica's identity and since when it leads (status shows
    # it), and whether it may act now (the fence; None: a single replica, always).
    leader: tuple[str, str | None] | None = None
    may_act: Callable[[], bool] | None = None
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.deps is None:
            self.deps = Deps(self.kube, AgentClient(self.http), self.metrics)
        if self.evidence is None:
            self.evidence = EvidenceStore(self.kube)

    @property
    def agents(self) -> AgentClient:
        """The pod agents' client (over the shared HTTP client)."""
        assert self.deps is not None
        return self.deps.agents

    def lock_for(self, namespace: str, name: str) -> threading.Lock:
        """The lock that serialises the rounds of one deployment."""
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """A deployment is gone: drop its targets, memory and evidence."""
        self.book.forget(namespace, name)
        self.known.discard((namespace, name))
        for key in [k for k in self.memory if k[:2] == (namespace, name)]:
            del self.memory[key]
        self.unsettled = {k for k in self.unsettled if k[:2] != (namespace, name)}
        if self.evidence is not None:
            self.evidence.forget(namespace, name)


@dataclass
class RoundResult:
    """What a round did, for the daemon (and tests)."""

    status: dict[str, Any]
    records: dict[str, GroupRecord]
    requeue_after: float | None
    actions: list[Action]
    api_writes: int = 0  # annotation and status patches this round made


# --------------------------------------------------------------------- observing


def step_bounds(pdd: PDDeployment, watchdog: float | None = None) -> StepBounds:
    """The deployment's `spec.health.stepBounds` for a role whose SGLang runs with
    `watchdog` seconds (its `--watchdog-timeout`; None: spec.safety.watchdogTimeoutSeconds):
    the cap defaults to that watchdog, where SGLang ends a step. The policy refuses bounds
    above the watchdog (rule step-bounds), so none is clamped here."""
    spec = pdd.spec.health.step_bounds
    cap = spec.max_seconds or watchdog or pdd.spec.safety.watchdog_timeout_seconds
    return StepBounds(spec.multiplier, spec.min_seconds, cap)


def _to_wall(sample: ProbeSample, rt: Runtime) -> float:
    return sample.wall if sample.wall is not None else sample.time + rt.probe_clock_offset()


def observe_group(
    rt: Runtime,
    key: tuple[str, str, str, int],
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
    if leader is None or record.step in (
        Step.RESTARTING_IN_PLACE,
        Step.DELETING,
        Step.WAITING_GONE,
        Step.CREATING,
    ):
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


# ---------------------------------------------------------------------- the round


def run_round(
    rt: Runtime,
    body: Mapping[str, Any],
    pods: Sequence[dict[str, Any]],
    services: Sequence[dict[str, Any]],
    events: EventSink,
    deployments: Sequence[dict[str, Any]] = (),
    nodes: Mapping[str, NodeState] | None = None,
    scales: Sequence[dict[str, Any]] = (),
    pdbs: Sequence[dict[str, Any]] = (),
) -> RoundResult | None:
    """One control round for the PDDeployment `body` (see the module docstring).

    `pods`, `services` and `deployments` are the deployment's (every object labelled
    with it), as the watch-fed caches hold them; `nodes` the cluster's nodes as the node
    watch last saw them (maintenance: cordons and taints); `scales` its PDRoleScales (the
    per-role scale targets, `lockstep.rolescale`); `pdbs` its PodDisruptionBudgets as the
    watch last saw them. Rounds of one deployment never overlap.
    """
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "default")), str(meta["name"])
    if meta.get("deletionTimestamp"):
        return None
    if rt.may_act is not None and not rt.may_act():
        return None  # not the leader (any more): nothing to decide, nothing to write
    with rt.lock_for(namespace, name):
        return _run_round(
            rt,
            body,
            namespace,
            name,
            list(pods),
            list(services),
            list(deployments),
            events,
            nodes or {},
            list(scales),
            list(pdbs),
        )


def _memory(rt: Runtime, key: DeploymentKey, body: Mapping[str, Any]) -> Memory:
    mem = rt.memory.get(key)
    if mem is None:
        # First round since the operator started: the object's annotations are the memory.
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        mem = Memory(
            records=load_records(body),
            incidents=load_incidents(body),
            persisted=(
                str(annotations.get(ANNOTATION_RECORDS, "")),
                str(annotations.get(ANNOTATION_INCIDENTS, "")),
            ),
            status=dict(body.get("status") or {}) or None,
        )
        rt.memory[key] = mem
    return mem


def _patch_status(
    rt: Runtime, mem: Memory, namespace: str, name: str, status: dict[str, Any], now: float
) -> int:
    if not status_changed(status, mem.status, mem.status_at, now):
        return 0
    rt.kube.patch_pddeployment_status(namespace, name, status)
    mem.status, mem.status_at = status, now
    return 1


def _run_round(
    rt: Runtime,
    body: Mapping[str, Any],
    namespace: str,
    name: str,
    pods: list[dict[str, Any]],
    services: list[dict[str, Any]],
    deployments: list[dict[str, Any]],
    events: EventSink,
    nodes: Mapping[str, NodeState],
    scales: list[dict[str, Any]],
    pdbs: list[dict[str, Any]],
) -> RoundResult:
    now = rt.clock()
    meta = body.get("metadata") or {}
    key: DeploymentKey = (namespace, name, str(meta.get("uid", "")))
    mem = _memory(rt, key, body)
    old_conditions = list((mem.status or {}).get("conditions") or [])
    try:
        pdd = with_runtime_image(parse_pddeployment(body), rt.runtime_image)
    except InvalidPDDeployment as err:
        status = invalid_status(meta.get("generation"), old_conditions, str(err), now)
        writes = _patch_status(rt, mem, namespace, name, status, now)
        return RoundResult(status, {}, None, [], writes)
    policy = evaluate(pdd.spec)
    if not policy.accepted:
        rejected = "; ".join(str(f) for f in policy.findings if f.action == "rejected")
        status = invalid_status(pdd.metadata.generation, old_conditions, rejected, now, policy)
        writes = _patch_status(rt, mem, namespace, name, status, now)
        return RoundResult(status, {}, None, [], writes)

    assert rt.deps is not None and rt.evidence is not None
    by_group = pods_by_group(pods)
    records = mem.records
    entries = rt.evidence.entries(*key)
    exe = Execution(
        rt.deps,
        pdd,
        namespace,
        events,
        pods,
        incident_epochs={
            r.incident.id: r.incident.epoch for r in records.values() if r.incident is not None
        },
    )
    new_records: dict[str, GroupRecord] = {}
    all_actions: list[Action] = []
    requeue: float | None = None
    # Spec changes roll group by group (one restart request at a time), judged against
    # each group's own epoch (the epoch is part of the pod template).
    roles: tuple[Role, ...] = ("prefill", "decode")
    # How many groups each role runs: the PDDeployment's count or its scale target's
    # (`rolescale.resolve`, THE RULE); the scale targets are created or corrected first.
    resolutions = {
        role: resolve(pdd.spec.role(role).replicas, _scale_of(scales, name, role)) for role in roles
    }
    _apply_scale_specs(rt, pdd, namespace, resolutions)
    wanted: dict[Role, int] = {role: res.replicas for role, res in resolutions.items()}
    current_epochs: dict[GroupId, int] = {(str(r.role), r.index): r.epoch for r in records.values()}
    current_slots: dict[GroupId, int] = {(str(r.role), r.index): r.slot for r in records.values()}
    stale = plan_reconcile(
        pdd,
        policy,
        pods,
        services,
        current_epochs,
        set(),
        slots=current_slots,
        replicas={str(k): v for k, v in wanted.items()},
    ).stale_groups
    deps = rt.deps

    def token() -> str:
        return agent_token(deps, pdd, namespace)

    retiring: set[GroupId] = set()
    for role in roles:
        spec_role = pdd.spec.role(role)
        steps = step_bounds(pdd, watchdog_seconds(policy.roles[role].argv))
        replicas = 0 if pdd.spec.paused else wanted[role]
        # Groups beyond replicas (a scale-down) stay planned until they have left: drained
        # first, then deleted (`recovery`); paused deployments delete at once.
        present = [g for (r, g) in by_group if r == role]
        present += [rec.index for rec in records.values() if rec.role == role]
        span = replicas if pdd.spec.paused else max([replicas, *(g + 1 for g in present)])
        role_records = {
            g: r for g in range(span) if (r := records.get(record_key(role, g))) is not None
        }
        for g in range(span):
            if g not in role_records and by_group.get((role, g)):
                # Found running without a record (fresh install, lost annotation): adopt
                # it with today's restart counts as the baseline.
                role_records[g] = adopt_group(
                    role, g, [pod_view_from_k8s(p) for p in by_group[(role, g)]], now=now
                )
        rolling = _rolling_group(role, stale, role_records)
        inputs = {}
        for g in range(span):
            group_pods = by_group.get((role, g), [])
            if g >= replicas and not group_pods and g not in role_records:
                continue
            verdict = observe_group(
                rt, (namespace, name, role, g), role_records.get(g), group_pods,
                spec_role.pods_per_group, now, steps, token, _capture_of(mem, role_records.get(g)),
            )  # fmt: skip
            request = manual_request(body, role, g)
            rollout = request is None and rolling == g
            if rollout:
                request = f"spec-{_pod_hash(pdd, policy, role)}"
            rec = role_records.get(g)
            failed = (
                rt.deps.restart_failures.get((namespace, name, role, g, rec.epoch), {})
                if rec
                else {}
            )
            moving, moving_nodes = _maintenance(rec, group_pods, nodes)
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
                captured=_captured(rec, entries),
                retire=g >= replicas,
            )
        plan = plan_role(RoleSettings.from_spec(pdd.spec, role), role_records, inputs, now=now)
        for g, gp in sorted(plan.groups.items()):
            exe.execute(role, g, gp.actions)
            all_actions.extend(gp.actions)
            if g >= replicas:
                if retired(gp.record, inputs[g].pods):
                    continue  # left for good: forget it
                retiring.add((role, g))
            new_records[record_key(role, g)] = gp.record
            if gp.requeue_after is not None:
                requeue = gp.requeue_after if requeue is None else min(requeue, gp.requeue_after)
            exe.epochs.setdefault((role, g), gp.record.epoch)
            exe.slots.setdefault((role, g), gp.record.slot)
            if (
                g < replicas
                and reconciler_may_create_pods(gp.record)
                and not by_group.get((role, g))
            ):
                exe.create_groups.add((role, g))
    _forget_restart_failures(rt, namespace, name, new_records)
    waiting = {
        r.incident.id
        for r in new_records.values()
        if r.incident is not None and r.step is Step.CAPTURING_EVIDENCE
    }
    mem.captured = {i: v for i, v in {**mem.captured, **exe.reports}.items() if i in waiting}
    if mem.router_swept_at is None or now - mem.router_swept_at >= ROUTER_SWEEP_SECONDS:
        # The routers' registries, level-triggered (`router_workers`: the router's own
        # races can put back a worker lockstep removed).
        exe.sweep_routers()
        mem.router_swept_at = now
    if exe.create_groups:
        # Pods read their restart token from the Secret: it exists before they do.
        agent_token(rt.deps, pdd, namespace, fresh=True)
    # Pods deleted this round are still in the cache: the reconcile plan creates nothing
    # for a group while pods of another epoch exist, so the next round (woken by the
    # deletes' watch events) creates the new epoch.
    reconcile = plan_reconcile(
        pdd,
        policy,
        pods,
        services,
        exe.epochs,
        exe.create_groups,
        exe.avoid_nodes,
        exe.slots,
        retiring,
        {str(k): v for k, v in wanted.items()},
        # A quarantined group serves nothing and waits for a person: it has no budget, so
        # a drain takes its pods rather than wait (the quarantine and its evidence stay).
        unguarded={(r.role, r.index) for r in new_records.values() if r.step is Step.QUARANTINED},
    )
    _apply_reconcile(rt, namespace, reconcile, events)
    _apply_pdbs(rt, namespace, reconcile.pdbs, pdbs)
    _apply_router(rt, pdd, namespace, mem, services, deployments)

    # Persist: the records, the history, the evidence (the planner's memory).
    incidents = apply_incident_actions(mem.incidents, all_actions)
    rt.evidence.update(
        namespace,
        name,
        key[2],
        _evidence_changes(entries, all_actions, exe.evidence),
        keep=incidents.keys(),
        build=lambda data: build_evidence_configmap(pdd, data),
    )
    writes = 0
    persisted = (dump_records(new_records), dump_incidents(incidents))
    if persisted != mem.persisted:
        rt.kube.patch_pddeployment_annotations(
            namespace, name, {ANNOTATION_RECORDS: persisted[0], ANNOTATION_INCIDENTS: persisted[1]}
        )
        writes += 1
    mem.records, mem.incidents, mem.persisted = new_records, incidents, persisted
    _update_targets(rt, pdd, namespace, name, new_records, by_group)
    status = derive_status(
        pdd,
        policy,
        old_conditions,
        new_records,
        incidents,
        rt.evidence.entries(*key),
        by_group,
        _last_probes(rt, namespace, name, new_records),
        now,
        replicas={role: (wanted[role], res.source) for role, res in resolutions.items()},
        leader=rt.leader,
    )
    _apply_scale_status(rt, pdd, namespace, scales, resolutions, status)
    for role in roles:
        role_status = status.get(role) or {}
        rt.metrics.desired_groups.labels(namespace, name, role).set(wanted[role])
        rt.metrics.ready_groups.labels(namespace, name, role).set(
            int(role_status.get("readyGroups", 0))
        )
    writes += _patch_status(rt, mem, namespace, name, status, now)
    rt.metrics.incidents_open.labels(namespace, name).set(status["openIncidents"])
    rt.metrics.quarantined.labels(namespace, name).set(
        sum(r.step is Step.QUARANTINED for r in new_records.values())
    )
    return RoundResult(status, new_records, requeue, all_actions, writes)


def _scale_of(scales: Sequence[Mapping[str, Any]], name: str, role: str) -> dict[str, Any] | None:
    """The role's PDRoleScale as the watch holds it (None: not there yet)."""
    want = role_scale_name(name, role)
    found = next((s for s in scales if (s.get("metadata") or {}).get("name") == want), None)
    return dict(found) if found is not None else None


def _apply_scale_specs(
    rt: Runtime, pdd: PDDeployment, namespace: str, resolutions: Mapping[Role, Resolution]
) -> None:
    """Create the missing scale targets; write a person's count into one (THE RULE's
    step 2): before the status records it, so a crash in between repeats the same."""
    for role, res in resolutions.items():
        if res.create:
            obj = build_role_scale(
                pdd.metadata.name,
                namespace,
                pdd.metadata.uid,
                role,
                res.replicas,
                role_selector(pdd, role),
            )
            rt.kube.create_role_scale(obj)
        elif res.scale_spec_patch is not None:
            rt.kube.patch_role_scale(
                namespace,
                role_scale_name(pdd.metadata.name, role),
                res.scale_spec_patch,
                status=False,
            )


def _apply_scale_status(
    rt: Runtime,
    pdd: PDDeployment,
    namespace: str,
    scales: Sequence[Mapping[str, Any]],
    resolutions: Mapping[Role, Resolution],
    status: Mapping[str, Any],
) -> None:
    """Each scale target's status: THE RULE's record, the groups the role has (retiring
    ones not counted) and has ready, the serving pods' selector. Written only when it
    differs from what the watch shows."""
    for role, res in resolutions.items():
        groups = (status.get(role) or {}).get("groups") or []
        patch = status_patch(
            res,
            replicas=sum(1 for g in groups if g.get("state") != "Retiring"),
            ready_groups=int((status.get(role) or {}).get("readyGroups", 0)),
            selector=role_selector(pdd, role),
        )
        live = _scale_of(scales, pdd.metadata.name, role)
        shown = (live or {}).get("status") or {}
        if res.create or any(shown.get(k) != v for k, v in patch["status"].items()):
            rt.kube.patch_role_scale(
                namespace, role_scale_name(pdd.metadata.name, role), patch, status=True
            )


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


# Steps in which a group leaving service on purpose waits for its leaders' requests.
_DRAIN_STEPS = (Step.DRAINING, Step.HANDING_OVER)


def _inflight(
    rt: Runtime, record: GroupRecord | None, pods: Sequence[Mapping[str, Any]]
) -> dict[str, int | None]:
    """The requests each leader of a group holds, read only while the group drains on
    purpose (maintenance): one small GET per leader, bounded."""
    draining = (record is not None and record.maintenance and record.step in _DRAIN_STEPS) or (
        record is not None and record.step is Step.RETIRING
    )
    if record is None or not draining:
        return {}
    out: dict[str, int | None] = {}
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if label(pod, c.LABEL_RANK) == "0" and ip:
            out[str(pod["metadata"]["name"])] = rt.agents.inflight(ip)
    return out


def _apply_pdbs(
    rt: Runtime,
    namespace: str,
    wanted: Sequence[dict[str, Any]],
    observed: Sequence[Mapping[str, Any]],
) -> None:
    """The groups' disruption budgets, level-triggered against the watch: a missing one is
    created (409: it was, the watch had not caught up), one whose size or selector differs
    from the group's is patched (a person's edit, or a group size changed while the
    operator was down), one no group wants is deleted. Each write is idempotent, so a
    watch that lags a round only repeats a write."""
    have = {
        str((o.get("metadata") or {}).get("name")): o.get("spec") or {}
        for o in observed
        if not (o.get("metadata") or {}).get("deletionTimestamp")
    }
    for pdb in wanted:
        name = pdb["metadata"]["name"]
        spec = have.get(name)
        if spec is None:
            rt.kube.create(pdb)
        elif any(spec.get(k) != pdb["spec"][k] for k in ("minAvailable", "selector")):
            rt.kube.patch(pdb)
    names = {p["metadata"]["name"] for p in wanted}
    for name in sorted(set(have) - names):
        rt.kube.delete("PodDisruptionBudget", namespace, name)


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
    """The rank states the capture of the record's open incident read, while the group
    waits in CapturingEvidence (None: none, or no longer waiting)."""
    if record is None or record.incident is None or record.step is not Step.CAPTURING_EVIDENCE:
        return None
    return mem.captured.get(record.incident.id)


def _evidence_changes(
    entries: Mapping[str, EvidenceEntry],
    actions: Sequence[Action],
    captured: Mapping[str, EvidenceEntry],
) -> dict[str, EvidenceEntry]:
    """The evidence store's new entries: the planner's summary of each incident it opened
    or updated, and what this round's captures found."""
    out: dict[str, EvidenceEntry] = {}
    for action in actions:
        if isinstance(action, OpenIncident | UpdateIncident):
            inc = action.incident
            base = out.get(inc.id) or entries.get(inc.id) or EvidenceEntry()
            out[inc.id] = replace(base, verdict=inc.evidence)
    for incident_id, found in captured.items():
        base = out.get(incident_id) or entries.get(incident_id) or EvidenceEntry()
        out[incident_id] = replace(base, captured=found.captured, cause=found.cause)
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
        if rec is None or rec.epoch != epoch or rec.step is not Step.RESTARTING_IN_PLACE:
            del failures[key]


def _pod_hash(pdd: PDDeployment, policy: PolicyResult, role: str) -> str:
    pod = build_group_pods(pdd, role, 0, 0, policy.roles[role])[0]
    return str(pod["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH])


def _rolling_group(
    role: str, stale: Sequence[GroupId], records: Mapping[int, GroupRecord]
) -> int | None:
    """The one stale group of a role to roll now (never while another is not Healthy)."""
    candidates = [g for r, g in stale if r == role]
    if not candidates:
        return None
    if any(rec.step is not Step.HEALTHY for rec in records.values()):
        return None
    return min(candidates)


def _apply_reconcile(rt: Runtime, namespace: str, plan: ReconcilePlan, events: EventSink) -> None:
    for obj in plan.create:
        rt.kube.create(obj)
    for obj in plan.patch:
        rt.kube.patch(obj)
    if plan.delete_pods:
        rt.kube.delete_pods(namespace, plan.delete_pods, grace_seconds=15)
        events("Normal", "GroupsScaledDown", f"deleted {len(plan.delete_pods)} pods")
    for name in plan.delete_services:
        try:
            rt.kube.core.delete_namespaced_service(name, namespace)
        except Exception as err:
            log.warning("delete service %s: %s", name, err)


WATCHED_ROUTER_KINDS = ("Deployment", "Service")
# How often, at most, a deployment's router registries are swept (one GET per replica).
ROUTER_SWEEP_SECONDS = 5.0


def _apply_router(
    rt: Runtime,
    pdd: PDDeployment,
    namespace: str,
    mem: Memory,
    services: Sequence[Mapping[str, Any]],
    deployments: Sequence[Mapping[str, Any]],
) -> None:
    """The router's objects follow `spec.router`: created when missing, patched when
    they drifted or the spec changed, deleted when the router is disabled. The
    Deployment and Service are watched (drift shows at once); the ServiceAccount, Role
    and RoleBinding are applied when the router spec changed (or the operator started)."""
    name = router_name(pdd)
    desired = build_router(pdd) if pdd.spec.router.enabled else []

    def live(objects: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        found = next((o for o in objects if o["metadata"]["name"] == name), None)
        return dict(found) if found is not None else None

    observed = {("Deployment", name): live(deployments), ("Service", name): live(services)}
    plan = plan_router(desired, observed)
    digest = spec_hash(desired) if desired else "disabled"
    if mem.router != digest:
        for obj in desired:
            if obj["kind"] not in WATCHED_ROUTER_KINDS:
                rt.kube.apply(obj)
        if not desired:
            for kind in ROUTER_KINDS:
                if kind not in WATCHED_ROUTER_KINDS:
                    rt.kube.delete(kind, namespace, name)
        mem.router = digest
    for obj in plan.create:
        if not rt.kube.create(obj):  # the cache had not seen it yet
            rt.kube.patch(obj)
    for obj in plan.patch:
        rt.kube.patch(obj)
    for kind, obj_name in plan.delete:
        rt.kube.delete(kind, namespace, obj_name)


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
        if rec.step is not Step.HEALTHY or rec.detection.failures:
            unsettled.add((namespace, name, rec.role, rec.index))
    rt.book.set_targets(namespace, name, targets)
    rt.known.add((namespace, name))
    rt.unsettled = {k for k in rt.unsettled if k[:2] != (namespace, name)} | unsettled


def settled(rt: Runtime, key: tuple[str, str, str, int]) -> bool:
    """Whether a group is Healthy and not failing (a passing probe of it changes nothing)."""
    return key not in rt.unsettled


__all__ = [
    "Incident",
    "Memory",
    "RoundResult",
    "Runtime",
    "run_round",
    "settled",
]

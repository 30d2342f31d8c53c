"""One control round for one PDDeployment: observe, judge, plan, execute, record.

The round orchestrator, called by the PDDeployment's daemon (`lockstep.handlers.operator`) when
something happened (a failed probe, a pod changed, the spec changed, a recovery step
asked to run again) and on a slow resync. It decides nothing itself; `_run_round` is
one call per phase:

1. observe (`_observe`): the deployment's pods, Services, budgets and scale targets come
   from watch-fed caches (the caller passes them), the group records and the incident
   history from this runtime's memory (the annotations the last round persisted; read
   from the object only after an operator restart), the evidence store's entries, each
   role's group count (`rolescale.resolve`) and the groups whose template changed;
2. judge (`_judge`): each group once (`observe_group`: the newest deep-probe sample from
   the `ProbeBook`, or the pods when they alone show a rank down, with the rank states an
   evidence capture read; `verdicts.classify_group` is called there and nowhere else),
   into the planner's input;
3. plan each role (`recovery.plan_role`, the incident's one owner, with its guard rails);
4. execute (`_execute`): every change goes through `lockstep.execute` — the scale
   targets, each group's actions in order, the new epochs with the reconcile plan
   (`reconcile.plan_reconcile`, once), the disruption budgets, the router's objects;
5. record (`_record`): the records, the incident history (`lockstep.core.records`) and the
   evidence (`lockstep.core.evidence`) when they changed, the prober's targets, status
   (`lockstep.core.status`, patched only when it changed) and the metrics.

Every action is idempotent (see `recovery`), so a round interrupted anywhere (an
operator crash) is simply run again from the persisted records. A healthy deployment
costs the API server nothing per round: reads come from caches, writes only happen when
something changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from lockstep.api import constants as c
from lockstep.api.models import (
    Incident,
    InvalidPDDeployment,
    PDDeployment,
    RuntimeSpec,
    parse_pddeployment,
    with_runtime_image,
)
from lockstep.api.objects import label
from lockstep.clients.agent_client import AgentClient, agent_url, report_from_ranks
from lockstep.clients.kube import Kube
from lockstep.clients.metrics import Metrics
from lockstep.clients.prober import ProbeBook, ProbeSample, ProbeTarget
from lockstep.clients.router_workers import RouterBook
from lockstep.core.builders import (
    build_evidence_configmap,
    build_group_pods,
)
from lockstep.core.evidence import EvidenceEntry, EvidenceStore
from lockstep.core.maintenance import (
    CORDONED_BY_ANNOTATION,
    NodeState,
    cluster_fingerprint,
    group_maintenance,
)
from lockstep.core.policy import PolicyResult, evaluate, watchdog_seconds
from lockstep.core.reconcile import kept_runtimes, plan_reconcile, pods_by_group, stale_groups
from lockstep.core.records import (
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
from lockstep.core.recovery import (
    Action,
    CapturedEvidence,
    GroupInput,
    GroupRecord,
    OpenIncident,
    Role,
    RolePlan,
    RoleSettings,
    Step,
    UpdateIncident,
    adopt_group,
    plan_role,
    reconciler_may_create_pods,
    retired,
)
from lockstep.core.rolescale import (
    Resolution,
    resolve,
    role_scale_name,
)
from lockstep.core.status import LastProbe, derive_status, invalid_status, status_changed
from lockstep.core.suspects import CORDON_REASON_ANNOTATION, cordon_decisions, suspect_nodes
from lockstep.core.verdicts import (
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
from lockstep.execute import Deps, EventSink, Execution, GroupId, agent_token

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
    # Gates set but not yet in the cache, and the router registrations asked for.
    routers: RouterBook = field(default_factory=RouterBook)
    # Runtime refusals already told in an Event: (pod UID, container restart count).
    refusals: set[tuple[str, int]] = field(default_factory=set)
    # Suspect nodes already told in an Event (`suspects`), and cordons the API refused.
    suspects: set[str] = field(default_factory=set)
    cordon_failed: set[str] = field(default_factory=set)
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
    per-role scale targets, `lockstep.core.rolescale`); `pdbs` its PodDisruptionBudgets as the
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
        parsed = parse_pddeployment(body)
    except InvalidPDDeployment as err:
        status = invalid_status(meta.get("generation"), old_conditions, str(err), now)
        writes = _patch_status(rt, mem, namespace, name, status, now)
        return RoundResult(status, {}, None, [], writes)
    pdd = with_runtime_image(parsed, rt.runtime_image)
    policy = evaluate(pdd.spec)
    if not policy.accepted:
        rejected = "; ".join(str(f) for f in policy.findings if f.action == "rejected")
        status = invalid_status(pdd.metadata.generation, old_conditions, rejected, now, policy)
        writes = _patch_status(rt, mem, namespace, name, status, now)
        return RoundResult(status, {}, None, [], writes)

    seen = _observe(rt, mem, key, body, pdd, policy, now, pods, services, deployments,
                    nodes, scales, pdbs, parsed.spec.runtime)  # fmt: skip
    judged = {role: _judge(rt, mem, seen, role) for role in ROLES}
    plans = {
        role: plan_role(
            RoleSettings.from_spec(pdd.spec, role), j.records, j.inputs, now=now, serving=j.serving
        )
        for role, j in judged.items()
    }
    assert rt.deps is not None
    exe = Execution(
        rt.deps, pdd, namespace, events, pods,
        incident_epochs={
            r.incident.id: r.incident.epoch for r in mem.records.values() if r.incident
        },
        routers=mem.routers,
        entries=seen.entries,
        incidents_oldest_first=list(mem.incidents),  # in the order opened
    )  # fmt: skip
    done = _execute(mem, seen, judged, plans, exe)
    return _record(rt, mem, seen, exe, done, old_conditions)


ROLES: tuple[Role, ...] = ("prefill", "decode")
# How often, at most, a deployment's router registries are swept (one GET per replica).
ROUTER_SWEEP_SECONDS = 5.0


@dataclass
class Seen:
    """What a round observed of one deployment: the watch caches' objects, the records
    (memory), the evidence store's entries, each role's group count (its scale target's,
    `rolescale.resolve`, THE RULE) and the groups whose pod template changed."""

    key: DeploymentKey
    body: Mapping[str, Any]
    pdd: PDDeployment
    policy: PolicyResult
    now: float
    pods: list[dict[str, Any]]
    by_group: dict[GroupId, list[dict[str, Any]]]
    services: list[dict[str, Any]]
    deployments: list[dict[str, Any]]
    nodes: Mapping[str, NodeState]
    scales: list[dict[str, Any]]
    pdbs: list[dict[str, Any]]
    entries: Mapping[str, EvidenceEntry]
    resolutions: dict[Role, Resolution]
    stale: list[GroupId]
    runtimes: dict[GroupId, str] = field(default_factory=dict)  # `reconcile.kept_runtimes`

    @property
    def namespace(self) -> str:
        return self.key[0]

    @property
    def name(self) -> str:
        return self.key[1]

    @property
    def wanted(self) -> dict[Role, int]:
        """How many groups each role serves (its replicas)."""
        return {role: res.replicas for role, res in self.resolutions.items()}

    @property
    def groups(self) -> dict[Role, int]:
        """How many groups each role runs: its replicas and its warm spares (none while
        the deployment is paused)."""
        spares = {r: 0 if self.pdd.spec.paused else self.pdd.spec.role(r).spares for r in ROLES}
        return {role: n + spares[role] for role, n in self.wanted.items()}


@dataclass
class Judged:
    """One role's groups as the planner gets them: the records (found-running groups
    adopted), and each group's input with this round's verdict."""

    replicas: int  # the groups the role runs, spares included (0 while paused); those beyond retire
    records: dict[int, GroupRecord]
    inputs: dict[int, GroupInput]
    serving: int = 0  # of those, the groups that serve (spec replicas); the rest are spares


@dataclass
class Done:
    """What the round's execution leaves to record."""

    records: dict[str, GroupRecord]
    actions: list[Action]
    requeue: float | None


def _observe(
    rt: Runtime,
    mem: Memory,
    key: DeploymentKey,
    body: Mapping[str, Any],
    pdd: PDDeployment,
    policy: PolicyResult,
    now: float,
    pods: list[dict[str, Any]],
    services: list[dict[str, Any]],
    deployments: list[dict[str, Any]],
    nodes: Mapping[str, NodeState],
    scales: list[dict[str, Any]],
    pdbs: list[dict[str, Any]],
    runtime: RuntimeSpec,
) -> Seen:
    assert rt.evidence is not None
    resolutions = {
        role: resolve(pdd.spec.role(role).replicas, _scale_of(scales, key[1], role))
        for role in ROLES
    }
    records = mem.records.values()
    epochs = {(str(r.role), r.index): r.epoch for r in records}
    slots = {(str(r.role), r.index): r.slot for r in records}
    # Each running group keeps the runtime it runs (an operator upgrade restarts nothing).
    runtimes = kept_runtimes(runtime, pods, epochs, slots)
    # Spec changes roll group by group (one restart request at a time), judged against
    # each group's own epoch and slot (the epoch is part of the pod template).
    stale = stale_groups(
        pdd,
        policy,
        pods,
        epochs,
        slots,
        {
            str(role): res.replicas + (0 if pdd.spec.paused else pdd.spec.role(role).spares)
            for role, res in resolutions.items()
        },
        runtimes,
    )
    return Seen(key, body, pdd, policy, now, pods, pods_by_group(pods), services, deployments,
                nodes, scales, pdbs, rt.evidence.entries(*key), resolutions, stale,
                runtimes)  # fmt: skip


def _judge(rt: Runtime, mem: Memory, seen: Seen, role: Role) -> Judged:
    """Each group of a role judged once (`observe_group`) and its planner input."""
    assert rt.deps is not None
    deps, pdd, now = rt.deps, seen.pdd, seen.now
    namespace, name = seen.namespace, seen.name
    spec_role = pdd.spec.role(role)
    steps = step_bounds(pdd, watchdog_seconds(seen.policy.roles[role].argv))
    serving = 0 if pdd.spec.paused else seen.wanted[role]
    replicas = 0 if pdd.spec.paused else seen.groups[role]
    # Groups beyond replicas (a scale-down) stay planned until they have left: drained
    # first, then deleted (`recovery`); paused deployments delete at once.
    present = [g for (r, g) in seen.by_group if r == role]
    present += [rec.index for rec in mem.records.values() if rec.role == role]
    span = replicas if pdd.spec.paused else max([replicas, *(g + 1 for g in present)])
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

    rolling = _rolling_group(role, seen.stale, mem.records.values())
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
        request = manual_request(seen.body, role, g)
        rollout = request is None and rolling == g
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


# Steps of a group still looking for room: its pods come and go with its placement
# attempts, which are no change of the cluster for another group waiting for room (two
# unplaceable groups would otherwise wake each other forever).
_PLACING = (Step.STARTING, Step.CREATING, Step.WAITING_PROBE, Step.UNSCHEDULABLE, Step.MOVING)


def _cluster(mem: Memory, seen: Seen) -> str:
    """The round's `maintenance.cluster_fingerprint`: every node, and the pods of this
    deployment's groups that are not themselves being placed."""
    placing = {(str(r.role), r.index) for r in mem.records.values() if r.step in _PLACING}
    pods = [p for gid, group in seen.by_group.items() if gid not in placing for p in group]
    return cluster_fingerprint(seen.nodes, pods)


def _tell_refusals(mem: Memory, seen: Seen, exe: Execution) -> None:
    """A `RuntimeRefused` Event for each pod whose runtime refused to start, once per
    container restart (the container's termination message says why; status shows it
    too)."""
    told = set()
    for (role, g), group in sorted(seen.by_group.items()):
        for pod in group:
            view = pod_view_from_k8s(pod)
            if view.refusal is None:
                continue
            key = (view.uid, view.refusal_restart)
            told.add(key)
            if key not in mem.refusals:
                exe.events(
                    "Warning",
                    view.refusal.split(":", 1)[0],
                    f"{role} group {g}: pod {view.name}: {view.refusal}",
                )
    mem.refusals = told


def _tell_suspects(
    rt: Runtime, mem: Memory, seen: Seen, incidents: Incidents, exe: Execution
) -> None:
    """A NodeSuspect Event for each node that became suspect (`suspects`: the outlier of
    several incidents), and, with spec.recovery.suspectNodes.cordon, the node cordoned
    before a restart places a group there (never past maxCordoned; never undone here)."""
    spec = seen.pdd.spec.recovery.suspect_nodes
    found = suspect_nodes(incidents.values(), seen.now, spec)
    owner = f"{seen.namespace}/{seen.name}"
    # A cordon refused (RBAC) is told once, not asked again every round.
    cordon, held = cordon_decisions(
        [s for s in found if s.node not in mem.cordon_failed], seen.nodes, owner, spec
    )
    for s in cordon:
        what = s.text(spec.window_seconds)
        failed = rt.kube.cordon_node(
            s.node, {CORDONED_BY_ANNOTATION: owner, CORDON_REASON_ANNOTATION: what}
        )
        if failed is None:
            exe.events("Warning", "NodeCordoned", f"{what}: cordoned (uncordon it by hand)")
        else:
            mem.cordon_failed.add(s.node)
            exe.events("Warning", "NodeCordonFailed", f"{what}: cordon failed: {failed}")
    for s in found:
        if s.node in mem.suspects or s in cordon:
            continue
        why = next((w for h, w in held if h == s), None)
        tail = (
            f"; not cordoned ({why})"
            if why
            else "; not cordoned (spec.recovery.suspectNodes.cordon is off)"
            if not spec.cordon
            else ""
        )
        exe.events("Warning", "NodeSuspect", s.text(spec.window_seconds) + tail)
    mem.suspects = {s.node for s in found}


def _execute(
    mem: Memory,
    seen: Seen,
    judged: Mapping[Role, Judged],
    plans: Mapping[Role, RolePlan],
    exe: Execution,
) -> Done:
    """Every change of the round, through the executor: the scale targets, each group's
    actions in order, the new epochs, the reconcile plan, the disruption budgets, the
    router's objects and registries."""
    exe.apply_scale_targets(seen.resolutions)
    _tell_refusals(mem, seen, exe)
    records: dict[str, GroupRecord] = {}
    actions: list[Action] = []
    requeue: float | None = None
    retiring: set[GroupId] = set()
    for role, plan in plans.items():
        j = judged[role]
        for g, gp in plan.order():
            exe.execute(role, g, gp.actions)
            actions.extend(gp.actions)
            if g >= j.replicas:
                if retired(gp.record, j.inputs[g].pods):
                    continue  # left for good: forget it
                retiring.add((role, g))
            records[record_key(role, g)] = gp.record
            if gp.requeue_after is not None:
                requeue = gp.requeue_after if requeue is None else min(requeue, gp.requeue_after)
            exe.epochs.setdefault((role, g), gp.record.epoch)
            exe.slots.setdefault((role, g), gp.record.slot)
            if (
                g < j.replicas
                and reconciler_may_create_pods(gp.record)
                and not seen.by_group.get((role, g))
            ):
                exe.create_groups.add((role, g))
    if mem.router_swept_at is None or seen.now - mem.router_swept_at >= ROUTER_SWEEP_SECONDS:
        # The routers' registries, level-triggered (`router_workers`: the router's own
        # races can put back a worker lockstep removed).
        exe.sweep_routers()
        mem.router_swept_at = seen.now
    exe.new_epochs()
    # Pods deleted this round are still in the cache: the reconcile plan creates nothing
    # for a group while pods of another epoch exist, so the next round (woken by the
    # deletes' watch events) creates the new epoch.
    reconcile = plan_reconcile(
        seen.pdd,
        seen.policy,
        seen.pods,
        seen.services,
        exe.epochs,
        exe.create_groups,
        exe.avoid_nodes,
        exe.slots,
        retiring,
        {str(k): v for k, v in seen.groups.items()},
        # A quarantined group serves nothing and waits for a person, a spare serves
        # nothing: neither has a budget, so a drain takes their pods rather than wait
        # (the eviction API refuses a pod of a budget none of whose pods is ready).
        unguarded={
            (r.role, r.index) for r in records.values() if r.step is Step.QUARANTINED or r.spare
        },
        runtimes=seen.runtimes,
    )
    exe.apply_reconcile(reconcile)
    exe.apply_pdbs(reconcile.pdbs, seen.pdbs)
    mem.router = exe.apply_router(mem.router, seen.services, seen.deployments)
    return Done(records, actions, requeue)


def _record(
    rt: Runtime,
    mem: Memory,
    seen: Seen,
    exe: Execution,
    done: Done,
    old_conditions: list[Any],
) -> RoundResult:
    """The round's memory (records, history, evidence, what captures read), the prober's
    targets, status (and the scale targets' status), the metrics."""
    assert rt.evidence is not None
    namespace, name, pdd, records = seen.namespace, seen.name, seen.pdd, done.records
    _forget_restart_failures(rt, namespace, name, records)
    waiting = {
        r.incident.id
        for r in records.values()
        if r.incident is not None and r.step is Step.CAPTURING_EVIDENCE
    }
    mem.captured = {i: v for i, v in {**mem.captured, **exe.reports}.items() if i in waiting}
    incidents = apply_incident_actions(mem.incidents, done.actions)
    rt.evidence.update(
        namespace,
        name,
        seen.key[2],
        _evidence_changes(seen.entries, done.actions, exe.evidence, exe.full_evicted),
        keep=incidents.keys(),
        build=lambda data: build_evidence_configmap(pdd, data),
    )
    writes = 0
    persisted = (dump_records(records), dump_incidents(incidents))
    if persisted != mem.persisted:
        rt.kube.patch_pddeployment_annotations(
            namespace, name, {ANNOTATION_RECORDS: persisted[0], ANNOTATION_INCIDENTS: persisted[1]}
        )
        writes += 1
    mem.records, mem.incidents, mem.persisted = records, incidents, persisted
    _tell_suspects(rt, mem, seen, incidents, exe)
    _update_targets(rt, pdd, namespace, name, records, seen.by_group)
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
        replicas={role: (res.replicas, res.source) for role, res in seen.resolutions.items()},
        leader=rt.leader,
    )
    exe.apply_scale_status(seen.scales, seen.resolutions, status)
    for role in ROLES:
        role_status = status.get(role) or {}
        rt.metrics.desired_groups.labels(namespace, name, role).set(seen.wanted[role])
        rt.metrics.ready_groups.labels(namespace, name, role).set(
            int(role_status.get("readyGroups", 0))
        )
        rt.metrics.spare_groups.labels(namespace, name, role).set(
            int(role_status.get("readySpares", 0))
        )
    writes += _patch_status(rt, mem, namespace, name, status, seen.now)
    rt.metrics.incidents_open.labels(namespace, name).set(status["openIncidents"])
    rt.metrics.quarantined.labels(namespace, name).set(
        sum(r.step is Step.QUARANTINED for r in records.values())
    )
    return RoundResult(status, records, done.requeue, done.actions, writes)


def _scale_of(scales: Sequence[Mapping[str, Any]], name: str, role: str) -> dict[str, Any] | None:
    """The role's PDRoleScale as the watch holds it (None: not there yet)."""
    want = role_scale_name(name, role)
    found = next((s for s in scales if (s.get("metadata") or {}).get("name") == want), None)
    return dict(found) if found is not None else None


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
        record is not None and record.step in (Step.RETIRING, Step.STANDING_DOWN)
    )
    if record is None or not draining:
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
    """The rank states the capture of the record's open incident read, while the group
    waits in CapturingEvidence (None: none, or no longer waiting)."""
    if record is None or record.incident is None or record.step is not Step.CAPTURING_EVIDENCE:
        return None
    return mem.captured.get(record.incident.id)


def _evidence_changes(
    entries: Mapping[str, EvidenceEntry],
    actions: Sequence[Action],
    captured: Mapping[str, EvidenceEntry],
    full_evicted: Collection[str] = (),
) -> dict[str, EvidenceEntry]:
    """The evidence store's new entries: the planner's summary of each incident it opened
    or updated, what this round's captures found, and the incidents whose whole capture
    a newer incident's took the place of (no longer named)."""
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
        out[incident_id] = replace(
            base,
            captured=found.captured,
            cause=found.cause,
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
        if rec is None or rec.epoch != epoch or rec.step is not Step.RESTARTING_IN_PLACE:
            del failures[key]


def _pod_hash(pdd: PDDeployment, policy: PolicyResult, role: str) -> str:
    pod = build_group_pods(pdd, role, 0, 0, policy.roles[role])[0]
    return str(pod["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH])


def _rolling_group(
    role: str, stale: Sequence[GroupId], records: Iterable[GroupRecord]
) -> int | None:
    """The one stale group of the deployment to roll now, if it is of `role`: never while
    any group (of either role) is not Healthy, so a rollout takes one group out of
    service at a time. Spares roll first (they serve nothing), then decode before
    prefill, lowest index first."""
    if not stale or any(rec.step is not Step.HEALTHY for rec in records):
        return None
    spare = {(str(rec.role), rec.index) for rec in records if rec.spare}
    order: dict[str, int] = {r: i for i, r in enumerate(reversed(ROLES))}
    first = min(stale, key=lambda gid: (gid not in spare, order.get(gid[0], 0), gid[1]))
    return first[1] if first[0] == role else None


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

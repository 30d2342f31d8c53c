"""One control round for one PDDeployment: observe, judge, plan, act, persist, report.

This is the glue between the pure core and the world, called by the kopf handlers
(`lockstep.handlers`) on every change and on a short timer:

1. read the PDDeployment's pods and group Services (`Kube`), the latest deep-probe
   samples (`ProbeBook`) and the group records persisted in an annotation;
2. judge each group (`verdicts.classify_group`) and plan each role
   (`recovery.plan_role`, with its guard rails);
3. execute the planned actions in order (gates, evidence, UID-precondition deletes,
   the next epoch), then the reconcile plan (`reconcile.plan_reconcile`);
4. persist the new records, then status (conditions, groups, incidents), and tell the
   prober which groups to probe.
Every action is idempotent (see `recovery`), so a round interrupted anywhere (an
operator crash) is simply run again from the persisted records.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from lockstep import constants as c
from lockstep.agent_client import (
    UNREACHABLE,
    AgentClient,
    agent_url,
    consensus_cause,
    report_from_ranks,
)
from lockstep.builders import (
    agent_token_secret_name,
    build_agent_token_secret,
    build_router,
    group_selector,
)
from lockstep.kube import Kube
from lockstep.metrics import Metrics
from lockstep.models import (
    Condition,
    GroupStatus,
    Incident,
    InvalidPDDeployment,
    PDDeployment,
    PDDeploymentStatus,
    PolicyFinding,
    ProbeResult,
    RoleStatus,
    parse_pddeployment,
)
from lockstep.policy import PolicyResult, evaluate
from lockstep.prober import ProbeBook, ProbeSample, ProbeTarget
from lockstep.reconcile import GroupId, ReconcilePlan, label, plan_reconcile, pods_by_group
from lockstep.recovery import (
    Action,
    CaptureEvidence,
    CloseIncident,
    CreateEpoch,
    DeletePods,
    EmitEvent,
    GroupInput,
    GroupRecord,
    OpenIncident,
    RestartInPlace,
    Role,
    RoleSettings,
    SetGate,
    Step,
    UpdateIncident,
    adopt_group,
    plan_role,
    reconciler_may_create_pods,
    status_state,
)
from lockstep.router_workers import router_pod_selector, sync_router_workers
from lockstep.verdicts import (
    AgentReport,
    GroupObservation,
    GroupVerdict,
    ProbeOutcome,
    RankState,
    Verdict,
    classify_group,
    pod_view_from_k8s,
)

log = logging.getLogger(__name__)

ANNOTATION_RECORDS = f"{c.GROUP}/groups"
# A manual restart: `kubectl annotate pdd NAME lockstep.dev/restart=decode/0@req-1`.
ANNOTATION_RESTART = f"{c.GROUP}/restart"
MAX_INCIDENTS = 20
EVIDENCE_MARK = "\n--- captured before restart ---\n"

EventSink = Callable[[str, str, str], None]  # type (Normal|Warning), reason, message


@dataclass
class Runtime:
    """What every control round shares: I/O, the probe book, metrics, memory."""

    kube: Kube
    book: ProbeBook
    metrics: Metrics
    http: httpx.Client
    clock: Callable[[], float] = time.time
    probe_clock_offset: Callable[[], float] = lambda: time.time() - time.monotonic()
    # Rank states of each group's previous failed sample (progress needs two samples).
    previous_ranks: dict[tuple[str, str, str, int], tuple[RankState, ...]] = field(
        default_factory=dict
    )
    # Keys of deployments whose groups the book probes (forget them when deleted).
    known: set[tuple[str, str]] = field(default_factory=set)
    # Pods whose in-place restart could not be asked, per (ns, name, role, group, epoch):
    # pod UID -> (why, the agent could not be reached at all). Memory only: a restarted
    # operator replans from the record and finds out again.
    restart_failures: dict[tuple[str, str, str, int, int], dict[str, tuple[str, bool]]] = field(
        default_factory=dict
    )
    # The agent-token of each deployment (by namespace, name, uid), read or made once.
    agent_tokens: dict[tuple[str, str, str], str] = field(default_factory=dict)
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock)

    @property
    def agents(self) -> AgentClient:
        """The pod agents' client (over the shared HTTP client)."""
        return AgentClient(self.http)

    def lock_for(self, namespace: str, name: str) -> threading.Lock:
        """The lock that serialises the rounds of one deployment."""
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())


@dataclass
class RoundResult:
    """What a round did, for the handler (and tests)."""

    status: dict[str, Any]
    records: dict[str, GroupRecord]
    requeue_after: float | None
    actions: list[Action]


def rfc3339(ts: float) -> str:
    """A UNIX time as RFC 3339 (UTC)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def record_key(role: str, group: int) -> str:
    """The key of a group in the records annotation."""
    return f"{role}/{group}"


def load_records(body: Mapping[str, Any]) -> dict[str, GroupRecord]:
    """The group records persisted in the PDDeployment's annotation."""
    raw = ((body.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RECORDS)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
        return {k: GroupRecord.model_validate(v) for k, v in data.items()}
    except (ValueError, TypeError) as err:
        # A hand-edited annotation must not wedge the operator: start over, loudly.
        log.error("ignoring unreadable %s annotation: %s", ANNOTATION_RECORDS, err)
        return {}


def dump_records(records: Mapping[str, GroupRecord]) -> str:
    """The annotation value for the records.

    An incident's evidence stays in status only: annotations share a 256 KiB budget per
    object, and evidence is bounded per incident, not per deployment.
    """
    out = {}
    for key, rec in sorted(records.items()):
        if rec.incident is not None and rec.incident.evidence:
            rec = rec.model_copy(
                update={"incident": rec.incident.model_copy(update={"evidence": ""})}
            )
        out[key] = json.loads(rec.to_json())
    return json.dumps(out, separators=(",", ":"))


def manual_request(body: Mapping[str, Any], role: str, group: int) -> str | None:
    """The request id of a manual restart annotation naming this group."""
    raw = ((body.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RESTART)
    if not raw or "@" not in raw:
        return None
    target, req = raw.split("@", 1)
    return req if target.strip() == f"{role}/{group}" and req.strip() else None


# --------------------------------------------------------------------- observing


def _to_wall(sample: ProbeSample, rt: Runtime) -> float:
    return sample.time + rt.probe_clock_offset()


def observe_group(
    rt: Runtime,
    key: tuple[str, str, str, int],
    record: GroupRecord | None,
    pods: Sequence[Mapping[str, Any]],
    expected_pods: int,
    now: float,
) -> GroupVerdict | None:
    """This round's verdict of a group, or None when nothing new was observed."""
    epoch = record.epoch if record is not None else 0
    views = tuple(pod_view_from_k8s(p) for p in pods)
    samples = [s for s in rt.book.samples(key) if s.epoch == epoch]
    last_seen = record.last_observed_at if record is not None else None
    fresh = samples[-1] if samples else None
    if fresh is not None and last_seen is not None and _to_wall(fresh, rt) <= last_seen:
        fresh = None
    if fresh is not None:
        probe = ProbeOutcome(
            "ok" if fresh.ok else ("timeout" if "timed out" in (fresh.error or "") else "failed"),
            None if fresh.latency_s is None else fresh.latency_s * 1000,
            fresh.error,
        )
        agents = tuple(report_from_ranks(a.pod, a.body, epoch, a.error) for a in fresh.agents)
        baseline = record.restart_baseline if record is not None else {}
        obs = GroupObservation(epoch, expected_pods, probe, views, agents, baseline)
        previous = rt.previous_ranks.get(key, ())
        verdict = classify_group(obs, previous, now=_to_wall(fresh, rt))
        ranks = tuple(r for a in agents if a.ranks for r in a.ranks)
        if fresh.ok:
            rt.previous_ranks.pop(key, None)
        elif ranks and (
            verdict.verdict is Verdict.SLOW
            or not {r.identity for r in previous} & {r.identity for r in ranks}
        ):
            # Progress is judged against the first failed sample (of these processes)
            # since the group last progressed, not the one just before: a step longer
            # than the probe period shows no progress between two close samples, but
            # does across the failure streak.
            rt.previous_ranks[key] = ranks
        return verdict
    # No new probe: the pods alone can still show a dead rank (deleted, evicted,
    # restarted), which must not wait for the next probe period.
    obs = GroupObservation(
        epoch,
        expected_pods,
        ProbeOutcome("failed", None, "not probed"),
        views,
        (),
        record.restart_baseline if record is not None else {},
    )
    verdict = classify_group(obs, (), now=now)
    if verdict.verdict is not Verdict.RANK_DOWN or not verdict.immediate:
        return None
    # A rank is down. If it went down because the consensus caught a divergence, its pod
    # agent still has the evidence (in the crashed incarnation's states): that is the
    # cause to report, not the exit it led to.
    agents = _read_agents_with_previous(rt, pods, epoch)
    if any(a.ranks and any(r.consensus_failure for r in a.ranks) for a in agents):
        obs = GroupObservation(
            epoch,
            expected_pods,
            ProbeOutcome("failed", None, "not probed"),
            views,
            agents,
            record.restart_baseline if record is not None else {},
        )
        return classify_group(obs, (), now=now)
    return verdict


def _read_agents_with_previous(
    rt: Runtime, pods: Sequence[Mapping[str, Any]], epoch: int
) -> tuple[AgentReport, ...]:
    """Every reachable pod agent's ranks, plus crashed ranks that carry a consensus failure."""
    reports = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        name = str((pod.get("metadata") or {}).get("name", ""))
        if ip:
            answer = rt.agents.ranks(name, ip)
            reports.append(report_from_ranks(name, answer.body, epoch, answer.error))
    return tuple(reports)


def token_key(pdd: PDDeployment, namespace: str) -> tuple[str, str, str]:
    return (namespace, pdd.metadata.name, pdd.metadata.uid or "")


def agent_token(rt: Runtime, pdd: PDDeployment, namespace: str, *, fresh: bool = False) -> str:
    """The deployment's pod-agent restart token: read from its Secret, or made (a fresh
    random token in a new Secret owned by the PDDeployment) when there is none. `fresh`:
    read the Secret even if the token is cached (before pods are created: a deleted
    Secret is made again, a replaced one is followed)."""
    key = token_key(pdd, namespace)
    token = None if fresh else rt.agent_tokens.get(key)
    if token is not None:
        return token
    name = agent_token_secret_name(pdd)
    token = rt.kube.read_secret_key(namespace, name, c.AGENT_TOKEN_KEY)
    if token is None:
        made = secrets.token_urlsafe(32)
        if rt.kube.create(build_agent_token_secret(pdd, made)):
            token = made
        else:  # created meanwhile (another round, a peer): use that one
            token = rt.kube.read_secret_key(namespace, name, c.AGENT_TOKEN_KEY)
            if token is None:
                raise RuntimeError(f"Secret {namespace}/{name} vanished while being made")
    rt.agent_tokens[key] = token
    return token


def _short(err: Exception) -> str:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(err).__name__}: {err}"[:200]


def probe_targets(
    pdd: PDDeployment,
    key_prefix: tuple[str, str],
    role: str,
    group: int,
    record: GroupRecord,
    pods: Sequence[Mapping[str, Any]],
    now_monotonic: float,
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
    )


# ----------------------------------------------------------------------- acting


@dataclass
class _Round:
    rt: Runtime
    pdd: PDDeployment
    namespace: str
    events: EventSink
    incidents: dict[str, dict[str, Any]]
    create_groups: set[GroupId] = field(default_factory=set)
    epochs: dict[GroupId, int] = field(default_factory=dict)
    avoid_nodes: dict[GroupId, tuple[str, ...]] = field(default_factory=dict)

    def execute(self, role: str, group: int, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, SetGate):
                self._set_gate(action)
            elif isinstance(action, CaptureEvidence):
                self._capture(action)
            elif isinstance(action, DeletePods):
                self.rt.kube.delete_pods(
                    self.namespace, [(p.name, p.uid) for p in action.pods], action.grace_seconds
                )
                self.rt.metrics.restarts.labels(role).inc()
            elif isinstance(action, RestartInPlace):
                self._restart_in_place(role, group, action)
                self.rt.metrics.restarts.labels(role).inc()
            elif isinstance(action, CreateEpoch):
                self.create_groups.add((role, group))
                self.epochs[(role, group)] = action.epoch
                if action.avoid_nodes:
                    self.avoid_nodes[(role, group)] = action.avoid_nodes
            elif isinstance(action, OpenIncident | UpdateIncident | CloseIncident):
                self._upsert_incident(action.incident)
                inc = action.incident
                if isinstance(action, OpenIncident) and inc.time_to_detect_seconds is not None:
                    self.rt.metrics.time_to_detect.labels(role).observe(inc.time_to_detect_seconds)
                    self.rt.metrics.verdicts.labels(role, inc.verdict).inc()
                if isinstance(action, CloseIncident) and inc.time_to_recover_seconds is not None:
                    self.rt.metrics.time_to_recover.labels(role).observe(
                        inc.time_to_recover_seconds
                    )
            elif isinstance(action, EmitEvent):
                self.events(
                    "Warning" if action.warning else "Normal",
                    str(action.reason),
                    action.message,
                )

    def _restart_in_place(self, role: str, group: int, action: RestartInPlace) -> None:
        """Relabel every pod with the new epoch, then ask every pod agent to restart into
        it at the same moment. What could not be asked is remembered for the planner."""
        key = (self.namespace, self.pdd.metadata.name, role, group, action.epoch)
        # A fresh ask of these pods: what an earlier ask of them met no longer counts.
        failures = self.rt.restart_failures.setdefault(key, {})
        for ref in action.pods:
            failures.pop(ref.uid, None)
        try:
            token = agent_token(self.rt, self.pdd, self.namespace)
        except Exception as err:
            for ref in action.pods:
                failures[ref.uid] = (
                    f"restart token unavailable: {type(err).__name__}: {err}",
                    False,
                )
            return
        ips = {p["metadata"]["name"]: (p.get("status") or {}).get("podIP") for p in self._pods()}
        asks: list[tuple[str, str, str]] = []  # (uid, name, pod IP)
        for ref in action.pods:
            try:
                self.rt.kube.relabel_pod(
                    self.namespace, ref.name, ref.uid, {c.LABEL_EPOCH: str(action.epoch)}
                )
            except Exception as err:
                failures[ref.uid] = (f"relabel refused: {_short(err)}", False)
                continue
            ip = ips.get(ref.name)
            if not ip:
                failures[ref.uid] = ("the pod has no IP", True)
                continue
            asks.append((ref.uid, ref.name, ip))
        client = self.rt.agents

        def ask(item: tuple[str, str, str]) -> tuple[str, tuple[str, bool] | None]:
            uid, _, ip = item
            answer = client.restart(ip, action.epoch, action.reason, token)
            if answer.accepted:
                return uid, None
            if answer.unauthorized:
                # The Secret may have been replaced: read it again next time.
                self.rt.agent_tokens.pop(token_key(self.pdd, self.namespace), None)
            return uid, (answer.error or "refused", answer.silent)

        if not asks:
            return
        # Every agent in the same moment: the ranks of the group go down together.
        with ThreadPoolExecutor(max_workers=min(len(asks), 32)) as pool:
            for uid, error in pool.map(ask, asks):
                if error is not None:
                    failures[uid] = error
        for uid, name, _ in asks:
            if uid in failures:
                log.warning("in-place restart of %s not accepted: %s", name, failures[uid][0])

    def _set_gate(self, action: SetGate) -> None:
        reason = "GroupHealthy" if action.value else "GroupDrained"
        message = (
            "the group's deep probe passed"
            if action.value
            else "lockstep drained the group before restarting it"
        )
        if not action.value:  # out of every router first: no request lands in between
            self._sync_routers(action, admit=False)
        for pod in action.pods:
            try:
                self.rt.kube.set_pod_condition(
                    self.namespace, pod.name, c.READINESS_GATE, action.value, reason, message
                )
            except Exception as err:  # a pod gone meanwhile: the planner re-checks
                log.warning("gate %s on %s: %s", action.value, pod.name, err)
        if action.value:
            self._sync_routers(action, admit=True)

    def _sync_routers(self, action: SetGate, *, admit: bool) -> None:
        """sglang-router does not follow readiness (see router_workers): besides the gate,
        remove the group's workers from every router replica, or add them back."""
        if not self.pdd.spec.router.enabled:
            return
        names = {p.name for p in action.pods}
        verb = "admit" if admit else "drain"
        try:
            pods = [p for p in self._pods() if p["metadata"]["name"] in names]
            routers = self.rt.kube.list_pods(
                self.namespace, router_pod_selector(self.pdd.metadata.name)
            )
        except Exception as err:
            log.warning("router %s of %s: %s", verb, sorted(names), err)
            return
        for problem in sync_router_workers(self.rt.http, pods, routers, admit=admit):
            log.warning("router %s of %s: %s", verb, sorted(names), problem)

    def _capture(self, action: CaptureEvidence) -> None:
        """Rank states, stacks and log tails of every pod, bounded, into the incident."""
        pods = {p["metadata"]["name"]: p for p in self._pods()}

        def one(name: str) -> tuple[list[str], str | None]:
            parts: list[str] = []
            ranks_text: str | None = None
            ip = ((pods.get(name) or {}).get("status") or {}).get("podIP")
            if ip:
                ranks_text = self.rt.agents.evidence(ip, "/ranks")
                parts.append(f"[{name}] ranks: {ranks_text}")
                # An agent that did not answer /ranks will not dump stacks either.
                if action.stacks and not ranks_text.startswith(UNREACHABLE):
                    parts.append(f"[{name}] stacks: {self.rt.agents.evidence(ip, '/stacks')}")
            if action.log_lines:
                try:
                    logs = self.rt.kube.core.read_namespaced_pod_log(
                        name, self.namespace, tail_lines=action.log_lines
                    )
                    parts.append(f"[{name}] log:\n{logs}")
                except Exception as err:
                    parts.append(f"[{name}] log: unavailable ({type(err).__name__})")
            return parts, ranks_text

        # Every pod at once: one silent agent must not hold up the others' evidence.
        with ThreadPoolExecutor(max_workers=min(len(action.pods), 16) or 1) as pool:
            results = list(pool.map(one, [ref.name for ref in action.pods]))
        parts = [part for found, _ in results for part in found]
        captured_bodies = [text for _, text in results if text is not None]
        captured = "\n".join(parts)
        inc = self.incidents.get(action.incident_id)
        cause = consensus_cause(captured_bodies, int(inc.get("epoch", 0)) if inc else 0)
        if inc is not None and cause and inc.get("verdict") == "RankDown":
            # The ranks died because the consensus caught a divergence: that is the
            # incident's verdict (the exit was only its consequence).
            inc["verdict"] = "Desynced"
            inc["evidence"] = f"cause: {cause}\n" + str(inc.get("evidence", ""))
        if inc is not None:
            base_evidence = str(inc.get("evidence", "")).split(EVIDENCE_MARK)[0]
            room = max(0, action.max_bytes - len(base_evidence) - len(EVIDENCE_MARK))
            inc["evidence"] = base_evidence + EVIDENCE_MARK + captured[:room]

    def _pods(self) -> list[dict[str, Any]]:
        return self.rt.kube.list_pods(self.namespace, {c.LABEL_DEPLOYMENT: self.pdd.metadata.name})

    def _upsert_incident(self, incident: Incident) -> None:
        new = incident.model_dump(by_alias=True, exclude_none=True)
        old = self.incidents.get(incident.id)
        if old is not None and old.get("verdict") == "Desynced" and new["verdict"] == "RankDown":
            new["verdict"] = "Desynced"  # refined from the captured evidence (see _capture)
        if old is not None and not new.get("evidence"):
            # Records persist no evidence (see dump_records): status keeps what it had.
            new["evidence"] = old.get("evidence", "")
        elif old is not None and EVIDENCE_MARK in str(old.get("evidence", "")):
            captured = str(old["evidence"]).split(EVIDENCE_MARK, 1)[1]
            new["evidence"] = str(new.get("evidence", "")) + EVIDENCE_MARK + captured
        self.incidents[incident.id] = new


# ---------------------------------------------------------------------- the round


def run_round(rt: Runtime, body: Mapping[str, Any], events: EventSink) -> RoundResult | None:
    """One control round for the PDDeployment named by `body`.

    Rounds of one deployment never overlap (kopf runs its timer and its change handlers
    concurrently), and each reads the object afresh: the records it acts on are the ones
    the previous round persisted, not a watch event that may lag behind them.
    """
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "default")), str(meta["name"])
    with rt.lock_for(namespace, name):
        fresh = rt.kube.get_pddeployment(namespace, name)
        if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp"):
            return None
        return _run_round(rt, fresh, namespace, name, events)


def _run_round(
    rt: Runtime, body: Mapping[str, Any], namespace: str, name: str, events: EventSink
) -> RoundResult:
    old_status = dict(body.get("status") or {})
    now = rt.clock()
    try:
        pdd = parse_pddeployment(body)
    except InvalidPDDeployment as err:
        status = _invalid_status(body, old_status, str(err), now)
        rt.kube.patch_pddeployment_status(namespace, name, status)
        return RoundResult(status, {}, None, [])
    policy = evaluate(pdd.spec)
    if not policy.accepted:
        rejected = "; ".join(str(f) for f in policy.findings if f.action == "rejected")
        status = _invalid_status(body, old_status, rejected, now, policy=policy)
        rt.kube.patch_pddeployment_status(namespace, name, status)
        return RoundResult(status, {}, None, [])

    selector = {c.LABEL_DEPLOYMENT: name}
    pods = rt.kube.list_pods(namespace, selector)
    services = rt.kube.list_services(namespace, selector)
    by_group = pods_by_group(pods)
    records = load_records(body)
    incidents = {str(i["id"]): dict(i) for i in old_status.get("incidents") or []}
    rnd = _Round(rt, pdd, namespace, events, incidents)
    new_records: dict[str, GroupRecord] = {}
    all_actions: list[Action] = []
    requeue: float | None = None
    # Spec changes roll group by group (one restart request at a time), judged against
    # each group's own epoch (the epoch is part of the pod template).
    current_epochs: dict[GroupId, int] = {(str(r.role), r.index): r.epoch for r in records.values()}
    stale = plan_reconcile(pdd, policy, pods, services, current_epochs, set()).stale_groups
    roles: tuple[Role, ...] = ("prefill", "decode")
    for role in roles:
        spec_role = pdd.spec.role(role)
        replicas = 0 if pdd.spec.paused else spec_role.replicas
        role_records = {
            g: r for g in range(replicas) if (r := records.get(record_key(role, g))) is not None
        }
        for g in range(replicas):
            if g not in role_records and by_group.get((role, g)):
                # Found running without a record (fresh install, lost annotation): adopt
                # it with today's restart counts as the baseline.
                role_records[g] = adopt_group(
                    role, g, [pod_view_from_k8s(p) for p in by_group[(role, g)]], now=now
                )
        rolling = _rolling_group(role, stale, role_records, by_group)
        inputs = {}
        for g in range(replicas):
            group_pods = by_group.get((role, g), [])
            verdict = observe_group(
                rt,
                (namespace, name, role, g),
                role_records.get(g),
                group_pods,
                spec_role.pods_per_group,
                now,
            )
            request = manual_request(body, role, g)
            rollout = request is None and rolling == g
            if rollout:
                request = f"spec-{_pod_hash(pdd, policy, role)}"
            rec = role_records.get(g)
            failed = (
                rt.restart_failures.get((namespace, name, role, g, rec.epoch), {}) if rec else {}
            )
            inputs[g] = GroupInput(
                pods=tuple(pod_view_from_k8s(p) for p in group_pods),
                verdict=verdict,
                manual_request=request,
                restart_failures={uid: why for uid, (why, _) in failed.items()},
                restart_unreachable=frozenset(uid for uid, (_, silent) in failed.items() if silent),
                template_changed=rollout,
            )
        plan = plan_role(RoleSettings.from_spec(pdd.spec, role), role_records, inputs, now=now)
        for g, gp in sorted(plan.groups.items()):
            rnd.execute(role, g, gp.actions)
            all_actions.extend(gp.actions)
            new_records[record_key(role, g)] = gp.record
            if gp.requeue_after is not None:
                requeue = gp.requeue_after if requeue is None else min(requeue, gp.requeue_after)
            rnd.epochs.setdefault((role, g), gp.record.epoch)
            if reconciler_may_create_pods(gp.record) and not by_group.get((role, g)):
                rnd.create_groups.add((role, g))
    # Pods of a new epoch are listed again: deletes above may have changed the picture.
    if any(isinstance(a, CreateEpoch | DeletePods) for a in all_actions):
        pods = rt.kube.list_pods(namespace, selector)
    _forget_restart_failures(rt, namespace, name, new_records)
    if rnd.create_groups:
        # Pods read their restart token from the Secret: it exists before they do.
        agent_token(rt, pdd, namespace, fresh=True)
    plan_obj = plan_reconcile(
        pdd, policy, pods, services, rnd.epochs, rnd.create_groups, rnd.avoid_nodes
    )
    _apply_reconcile(rt, namespace, plan_obj, events)
    if pdd.spec.router.enabled:
        for obj in build_router(pdd):
            rt.kube.create(obj)
    # Persist the records first: status is derived, the records are the memory.
    rt.kube.patch_pddeployment_annotations(
        namespace, name, {ANNOTATION_RECORDS: dump_records(new_records)}
    )
    _update_targets(rt, pdd, namespace, name, new_records, rt.kube.list_pods(namespace, selector))
    status = _status(pdd, policy, old_status, new_records, by_group, incidents, rt, now)
    rt.kube.patch_pddeployment_status(namespace, name, status)
    rt.metrics.incidents_open.labels(namespace, name).set(status["openIncidents"])
    rt.metrics.quarantined.labels(namespace, name).set(
        sum(r.step is Step.QUARANTINED for r in new_records.values())
    )
    return RoundResult(status, new_records, requeue, all_actions)


def _forget_restart_failures(
    rt: Runtime, namespace: str, name: str, records: Mapping[str, GroupRecord]
) -> None:
    """Drop what no group is waiting on any more (another epoch, or not restarting)."""
    for key in list(rt.restart_failures):
        ns, n, role, group, epoch = key
        if (ns, n) != (namespace, name):
            continue
        rec = records.get(record_key(role, group))
        if rec is None or rec.epoch != epoch or rec.step is not Step.RESTARTING_IN_PLACE:
            del rt.restart_failures[key]


def _pod_hash(pdd: PDDeployment, policy: PolicyResult, role: str) -> str:
    from lockstep.builders import build_group_pods

    pod = build_group_pods(pdd, role, 0, 0, policy.roles[role])[0]
    return str(pod["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH])


def _rolling_group(
    role: str,
    stale: Sequence[GroupId],
    records: Mapping[int, GroupRecord],
    by_group: Mapping[GroupId, Sequence[Any]],
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


def _update_targets(
    rt: Runtime,
    pdd: PDDeployment,
    namespace: str,
    name: str,
    records: Mapping[str, GroupRecord],
    pods: Sequence[Mapping[str, Any]],
) -> None:
    by_group = pods_by_group(list(pods))  # type: ignore[arg-type]
    targets = []
    now_mono = time.monotonic()
    for rec in records.values():
        target = probe_targets(
            pdd,
            (namespace, name),
            rec.role,
            rec.index,
            rec,
            by_group.get((rec.role, rec.index), []),
            now_mono,
        )
        if target is not None:
            targets.append(target)
    rt.book.set_targets(namespace, name, targets)
    rt.known.add((namespace, name))


# ------------------------------------------------------------------------ status


def _condition(
    old: Sequence[Mapping[str, Any]],
    type_: str,
    ok: bool,
    reason: str,
    message: str,
    now: float,
    generation: int | None,
) -> dict[str, Any]:
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


def _status(
    pdd: PDDeployment,
    policy: PolicyResult,
    old: Mapping[str, Any],
    records: Mapping[str, GroupRecord],
    by_group: Mapping[GroupId, Sequence[Mapping[str, Any]]],
    incidents: Mapping[str, Mapping[str, Any]],
    rt: Runtime,
    now: float,
) -> dict[str, Any]:
    gen = pdd.metadata.generation
    roles: dict[str, RoleStatus] = {}
    for role in c.ROLES:
        groups = []
        for rec in sorted(records.values(), key=lambda r: r.index):
            if rec.role != role:
                continue
            pods = [
                p
                for p in by_group.get((role, rec.index), [])
                if label(p, c.LABEL_EPOCH) == str(rec.epoch)
            ]
            samples = rt.book.samples(
                (pdd.metadata.namespace or "default", pdd.metadata.name, role, rec.index)
            )
            last = samples[-1] if samples else None
            groups.append(
                GroupStatus(
                    index=rec.index,
                    state=status_state(rec),
                    epoch=rec.epoch,
                    restarts=rec.restarts,
                    ready_pods=sum(pod_view_from_k8s(p).ready for p in pods),
                    pods=len(pods),
                    consecutive_failures=rec.failures,
                    last_probe=None
                    if last is None
                    else ProbeResult(
                        ok=last.ok,
                        time=rfc3339(last.time + rt.probe_clock_offset()),
                        latency_ms=None
                        if last.latency_s is None
                        else round(last.latency_s * 1000, 3),
                        error=last.error,
                    ),
                    last_restart_time=None
                    if rec.last_restart_at is None
                    else rfc3339(rec.last_restart_at),
                    message=rec.last_reason,
                )
            )
        replicas = 0 if pdd.spec.paused else pdd.spec.role(role).replicas
        ready = sum(g.state == "Healthy" for g in groups)
        roles[role] = RoleStatus(
            replicas=replicas,
            ready_groups=ready,
            groups=groups,
            effective_args=list(policy.roles[role].argv),
        )
    total = sum(r.replicas for r in roles.values())
    ready_all = sum(r.ready_groups for r in roles.values())
    quarantined = [f"{r.role}/{r.index}" for r in records.values() if r.step is Step.QUARANTINED]
    recovering = [
        f"{r.role}/{r.index}"
        for r in records.values()
        if status_state(r) in ("Recovering", "Starting")
    ]
    broken = [
        f"{r.role}/{r.index}"
        for r in records.values()
        if status_state(r) in ("Desynced", "Hung", "RankDown", "Suspect")
    ]
    old_conditions = list(old.get("conditions") or [])
    conditions = [
        _condition(
            old_conditions,
            "Ready",
            total > 0 and ready_all == total,
            "AllGroupsHealthy" if ready_all == total else "GroupsNotReady",
            f"{ready_all}/{total} groups healthy",
            now,
            gen,
        ),
        _condition(
            old_conditions,
            "Progressing",
            bool(recovering),
            "GroupsStarting" if recovering else "Stable",
            ", ".join(recovering) or "no group starting or recovering",
            now,
            gen,
        ),
        _condition(
            old_conditions,
            "Degraded",
            bool(quarantined or broken),
            "GroupsQuarantined" if quarantined else ("GroupsBroken" if broken else "AsExpected"),
            (f"quarantined: {', '.join(quarantined)}; " if quarantined else "")
            + (f"broken: {', '.join(broken)}" if broken else ""),
            now,
            gen,
        ),
        _condition(
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
    ordered = sorted(incidents.values(), key=lambda i: str(i.get("detectedTime") or ""))[
        -MAX_INCIDENTS:
    ]
    findings = [
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
    status = PDDeploymentStatus(
        observed_generation=gen,
        conditions=[Condition.model_validate(x) for x in conditions],
        prefill=roles["prefill"],
        decode=roles["decode"],
        prefill_ready=f"{roles['prefill'].ready_groups}/{roles['prefill'].replicas}",
        decode_ready=f"{roles['decode'].ready_groups}/{roles['decode'].replicas}",
        open_incidents=sum(i.get("state") == "Open" for i in ordered),
        incidents=[Incident.model_validate(i) for i in ordered],
        findings=findings,
    )
    return status.model_dump(by_alias=True, exclude_none=True)


def _invalid_status(
    body: Mapping[str, Any],
    old: Mapping[str, Any],
    message: str,
    now: float,
    policy: PolicyResult | None = None,
) -> dict[str, Any]:
    gen = (body.get("metadata") or {}).get("generation")
    conditions = list(old.get("conditions") or [])
    ready = _condition(conditions, "Ready", False, "InvalidSpec", message, now, gen)
    rest = [x for x in conditions if x.get("type") != "Ready"]
    status: dict[str, Any] = {"observedGeneration": gen, "conditions": [ready, *rest]}
    if policy is not None:
        status["findings"] = [
            PolicyFinding(
                rule=f.rule,
                severity=f.severity,
                field=f.field,
                message=f.message,
                fix=f.fix,
                action=f.action,
            ).model_dump(by_alias=True)
            for f in policy.findings
            if f.severity != "info"
        ]
    return status


__all__ = [
    "ANNOTATION_RECORDS",
    "ANNOTATION_RESTART",
    "RoundResult",
    "Runtime",
    "group_selector",
    "load_records",
    "run_round",
]

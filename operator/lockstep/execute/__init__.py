"""The executor: every change a control round makes to the cluster goes through it.

The recovery planner's actions, in order (`execute`: gates, requests ended, evidence,
deletes, in-place restarts, new epochs, incident metrics, Events), and the objects the
round keeps in line with the spec: the scale targets (`apply_scale_targets`,
`apply_scale_status`), the pods and Services of the reconcile plan with the new epochs
the planner asked for (`new_epochs`, `apply_reconcile`), the disruption budgets
(`apply_pdbs`) and the router's objects and registries (`apply_router`,
`sweep_routers`). The round's own memory (the records and history annotations, status)
is written by `lockstep.control` as its last step.

I/O only, no judgement: every action is one of `lockstep.core.recovery`'s frozen actions and
every one is idempotent (see that module's contract). The executor works on the round's
snapshot of the deployment's pods (from the watch-fed cache) and reports back what the
planner needs next round: in-place restarts that could not be asked
(`Deps.restart_failures`) and the evidence it captured (`Execution.evidence`, which the
round writes to the evidence store, and `Execution.reports`, the rank states it read,
which the next round's judgement takes as part of its observation).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lockstep.api import constants as c
from lockstep.api import objects
from lockstep.api.models import PDDeployment
from lockstep.clients.agent_client import UNREACHABLE, AgentClient, report_from_text
from lockstep.clients.kube import Kube
from lockstep.clients.metrics import Metrics
from lockstep.clients.router_workers import (
    RouterBook,
    Sweep,
    admitted_urls,
    admitted_workers,
    pending_gates,
    router_bases,
    sweep_workers,
    sync_router_workers,
    user_urls,
)
from lockstep.core.builders import (
    ROUTER_KINDS,
    agent_token_secret_name,
    build_agent_token_secret,
    build_full_capture_configmap,
    build_router,
    role_selector,
    router_name,
    spec_hash,
)
from lockstep.core.evidence import (
    FULL_CAPTURE_MAX_BYTES,
    CapturePart,
    EvidenceEntry,
    choose_full_slot,
    fit_capture,
    fit_capture_bytes,
    whole_length,
)
from lockstep.core.failover import (
    ORPHAN_GRACE_SECONDS,
    EndOrder,
    Leader,
    plan_peers,
    still_orphaned,
)
from lockstep.core.reconcile import ReconcilePlan, plan_router
from lockstep.core.recovery import (
    Action,
    CaptureEvidence,
    CloseIncident,
    CreateEpoch,
    DeletePods,
    EmitEvent,
    EndRequests,
    OpenIncident,
    RestartInPlace,
    Role,
    SetGate,
)
from lockstep.core.rolescale import Resolution, build_role_scale, role_scale_name, status_patch
from lockstep.core.verdicts import AgentReport, divergence_cause

log = logging.getLogger(__name__)

# The router objects the operator watches (the others are applied when the spec changes).
WATCHED_ROUTER_KINDS = ("Deployment", "Service")
EventSink = Callable[[str, str, str], None]  # type (Normal|Warning), reason, message
GroupId = tuple[str, int]
# Pods whose in-place restart could not be asked, per (ns, name, role, group, epoch):
# pod UID -> (why, the agent could not be reached at all).
RestartFailures = dict[tuple[str, str, str, int, int], dict[str, tuple[str, bool]]]


@dataclass
class Deps:
    """What the executor shares across rounds (owned by the control runtime)."""

    kube: Kube
    agents: AgentClient
    metrics: Metrics
    restart_failures: RestartFailures = field(default_factory=dict)
    # The agent-token of each deployment (by namespace, name, uid), read or made once.
    agent_tokens: dict[tuple[str, str, str], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def token_key(pdd: PDDeployment, namespace: str) -> tuple[str, str, str]:
    return (namespace, pdd.metadata.name, pdd.metadata.uid or "")


def agent_token(deps: Deps, pdd: PDDeployment, namespace: str, *, fresh: bool = False) -> str:
    """The deployment's pod-agent restart token: read from its Secret, or made (a fresh
    random token in a new Secret owned by the PDDeployment) when there is none. `fresh`:
    read the Secret even if the token is cached (before pods are created: a deleted
    Secret is made again, a replaced one is followed)."""
    key = token_key(pdd, namespace)
    token = None if fresh else deps.agent_tokens.get(key)
    if token is not None:
        return token
    name = agent_token_secret_name(pdd)
    token = deps.kube.read_secret_key(namespace, name, c.AGENT_TOKEN_KEY)
    if token is None:
        made = secrets.token_urlsafe(32)
        if deps.kube.create(build_agent_token_secret(pdd, made)):
            token = made
        else:  # created meanwhile (another round, a peer): use that one
            token = deps.kube.read_secret_key(namespace, name, c.AGENT_TOKEN_KEY)
            if token is None:
                raise RuntimeError(f"Secret {namespace}/{name} vanished while being made")
    deps.agent_tokens[key] = token
    return token


def _short(err: Exception) -> str:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(err).__name__}: {err}"[:200]


@dataclass
class Execution:
    """One round's execution for one PDDeployment."""

    deps: Deps
    pdd: PDDeployment
    namespace: str
    events: EventSink
    pods: Sequence[Mapping[str, Any]]  # the deployment's pods (cache snapshot), any kind
    incident_epochs: Mapping[str, int] = field(default_factory=dict)  # incident id -> epoch
    create_groups: set[GroupId] = field(default_factory=set)
    epochs: dict[GroupId, int] = field(default_factory=dict)
    avoid_nodes: dict[GroupId, tuple[str, ...]] = field(default_factory=dict)
    slots: dict[GroupId, int] = field(default_factory=dict)
    # What the captures of this round found, by incident id: the text for the evidence
    # store, and the rank states parsed, which the next round judges with its observation.
    evidence: dict[str, EvidenceEntry] = field(default_factory=dict)
    reports: dict[str, tuple[AgentReport, ...]] = field(default_factory=dict)
    # The evidence store's entries before this round, and the incidents oldest first: a
    # capture too large for the bound takes a whole-capture slot (`choose_full_slot`).
    entries: Mapping[str, EvidenceEntry] = field(default_factory=dict)
    incidents_oldest_first: Sequence[str] = ()
    # Incidents whose whole capture's slot a newer one took this round.
    full_evicted: set[str] = field(default_factory=set)
    # The routers' memory (control keeps one per deployment): readiness gates set and
    # not yet in the cache `pods` comes from, the router registrations asked for.
    routers: RouterBook = field(default_factory=RouterBook)

    def execute(self, role: str, group: int, actions: Sequence[Action]) -> None:
        """Carry out one group's actions, in order."""
        metrics = self.deps.metrics
        for action in actions:
            if isinstance(action, SetGate):
                self._set_gate(action)
            elif isinstance(action, EndRequests):
                self._end_requests(role, group, action)
            elif isinstance(action, CaptureEvidence):
                self._capture(action)
            elif isinstance(action, DeletePods):
                self.deps.kube.delete_pods(
                    self.namespace, [(p.name, p.uid) for p in action.pods], action.grace_seconds
                )
                if action.restart:
                    metrics.restarts.labels(role).inc()
            elif isinstance(action, RestartInPlace):
                self._restart_in_place(role, group, action)
                metrics.restarts.labels(role).inc()
            elif isinstance(action, CreateEpoch):
                self.create_groups.add((role, group))
                self.epochs[(role, group)] = action.epoch
                self.slots[(role, group)] = action.slot
                if action.avoid_nodes:
                    self.avoid_nodes[(role, group)] = action.avoid_nodes
            elif isinstance(action, OpenIncident):
                inc = action.incident
                if inc.time_to_detect_seconds is not None:
                    metrics.time_to_detect.labels(role).observe(inc.time_to_detect_seconds)
                    metrics.verdicts.labels(role, inc.verdict).inc()
            elif isinstance(action, CloseIncident):
                inc = action.incident
                if inc.time_to_recover_seconds is not None:
                    metrics.time_to_recover.labels(role).observe(inc.time_to_recover_seconds)
            elif isinstance(action, EmitEvent):
                self.events(
                    "Warning" if action.warning else "Normal", str(action.reason), action.message
                )

    # -- the objects the round keeps in line (level-triggered against the watch)

    def apply_scale_targets(self, resolutions: Mapping[Role, Resolution]) -> None:
        """Create the missing scale targets; write a person's count into one (THE RULE's
        step 2): before the status records it, so a crash in between repeats the same."""
        kube, pdd = self.deps.kube, self.pdd
        for role, res in resolutions.items():
            if res.create:
                obj = build_role_scale(
                    pdd.metadata.name,
                    self.namespace,
                    pdd.metadata.uid,
                    role,
                    res.replicas,
                    role_selector(pdd, role),
                )
                kube.create_role_scale(obj)
            elif res.scale_spec_patch is not None:
                kube.patch_role_scale(
                    self.namespace,
                    role_scale_name(pdd.metadata.name, role),
                    res.scale_spec_patch,
                    status=False,
                )

    def apply_scale_status(
        self,
        scales: Sequence[Mapping[str, Any]],
        resolutions: Mapping[Role, Resolution],
        status: Mapping[str, Any],
    ) -> None:
        """Each scale target's status: THE RULE's record, the groups the role has
        (retiring ones not counted) and has ready, the serving pods' selector. Written only
        when it differs from what the watch shows."""
        name = self.pdd.metadata.name
        for role, res in resolutions.items():
            groups = (status.get(role) or {}).get("groups") or []
            patch = status_patch(
                res,
                # What the autoscaler scales: the serving groups (spares are extra).
                replicas=sum(
                    1 for g in groups if g.get("state") != "Retiring" and not g.get("spare")
                ),
                ready_groups=int((status.get(role) or {}).get("readyGroups", 0)),
                selector=role_selector(self.pdd, role),
            )
            want = role_scale_name(name, role)
            live = next((o for o in scales if (o.get("metadata") or {}).get("name") == want), None)
            shown = (live or {}).get("status") or {}
            if res.create or any(shown.get(k) != v for k, v in patch["status"].items()):
                self.deps.kube.patch_role_scale(self.namespace, want, patch, status=True)

    def new_epochs(self) -> None:
        """Before the pods of new epochs are created: pods read their restart token from
        the Secret, so it exists (made again if deleted, followed if replaced) first."""
        if self.create_groups:
            agent_token(self.deps, self.pdd, self.namespace, fresh=True)

    def apply_reconcile(self, plan: ReconcilePlan) -> None:
        """The reconcile plan's pods and group Services (`reconcile.plan_reconcile`)."""
        kube = self.deps.kube
        for obj in plan.create:
            kube.create(obj)
        for obj in plan.patch:
            kube.patch(obj)
        if plan.delete_pods:
            kube.delete_pods(self.namespace, plan.delete_pods, grace_seconds=15)
            self.events("Normal", "GroupsScaledDown", f"deleted {len(plan.delete_pods)} pods")
        for name in plan.delete_services:
            try:
                kube.core.delete_namespaced_service(name, self.namespace)
            except Exception as err:
                log.warning("delete service %s: %s", name, err)

    def apply_pdbs(
        self, wanted: Sequence[dict[str, Any]], observed: Sequence[Mapping[str, Any]]
    ) -> None:
        """The groups' disruption budgets, level-triggered against the watch: a missing
        one is created (409: it was, the watch had not caught up), one whose size or
        selector differs from the group's is patched (a person's edit, or a group size
        changed while the operator was down), one no group wants is deleted. Each write
        is idempotent, so a watch that lags a round only repeats a write."""
        kube = self.deps.kube
        have = {
            str((o.get("metadata") or {}).get("name")): o.get("spec") or {}
            for o in observed
            if not (o.get("metadata") or {}).get("deletionTimestamp")
        }
        for pdb in wanted:
            spec = have.get(pdb["metadata"]["name"])
            if spec is None:
                kube.create(pdb)
            elif any(spec.get(k) != pdb["spec"][k] for k in ("minAvailable", "selector")):
                kube.patch(pdb)
        names = {p["metadata"]["name"] for p in wanted}
        for name in sorted(set(have) - names):
            kube.delete("PodDisruptionBudget", self.namespace, name)

    def apply_router(
        self,
        applied: str | None,
        services: Sequence[Mapping[str, Any]],
        deployments: Sequence[Mapping[str, Any]],
    ) -> str:
        """The router's objects follow `spec.router`: created when missing, patched when
        they drifted or the spec changed, deleted when the router is disabled. The
        Deployment and Service are watched (drift shows at once); the ServiceAccount, Role
        and RoleBinding are applied when the router spec changed from `applied` (the hash
        last applied; None: since the operator started). Returns the hash now applied."""
        kube, pdd = self.deps.kube, self.pdd
        name = router_name(pdd)
        desired = build_router(pdd) if pdd.spec.router.enabled else []

        def live(objects: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
            found = next((o for o in objects if o["metadata"]["name"] == name), None)
            return dict(found) if found is not None else None

        observed = {("Deployment", name): live(deployments), ("Service", name): live(services)}
        plan = plan_router(desired, observed)
        digest = spec_hash(desired) if desired else "disabled"
        if applied != digest:
            for obj in desired:
                if obj["kind"] not in WATCHED_ROUTER_KINDS:
                    kube.apply(obj)
            if not desired:
                for kind in ROUTER_KINDS:
                    if kind not in WATCHED_ROUTER_KINDS:
                        kube.delete(kind, self.namespace, name)
        for obj in plan.create:
            if not kube.create(obj):  # the cache had not seen it yet
                kube.patch(obj)
        for obj in plan.patch:
            kube.patch(obj)
        for kind, obj_name in plan.delete:
            kube.delete(kind, self.namespace, obj_name)
        return digest

    # -- in place

    def _restart_in_place(self, role: str, group: int, action: RestartInPlace) -> None:
        """Relabel every pod with the new epoch, then ask every pod agent to restart into
        it at the same moment. What could not be asked is remembered for the planner."""
        deps = self.deps
        key = (self.namespace, self.pdd.metadata.name, role, group, action.epoch)
        with deps.lock:
            failures = deps.restart_failures.setdefault(key, {})
            # A fresh ask of these pods: what an earlier ask of them met no longer counts.
            for ref in action.pods:
                failures.pop(ref.uid, None)
        try:
            token = agent_token(deps, self.pdd, self.namespace)
        except Exception as err:
            for ref in action.pods:
                failures[ref.uid] = (f"restart token unavailable: {_short(err)}", False)
            return
        ips = {p["metadata"]["name"]: (p.get("status") or {}).get("podIP") for p in self.pods}
        asks: list[tuple[str, str, str]] = []  # (uid, name, pod IP)
        for ref in action.pods:
            try:
                deps.kube.relabel_pod(
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
        if not asks:
            return

        def ask(item: tuple[str, str, str]) -> tuple[str, tuple[str, bool] | None]:
            uid, _, ip = item
            answer = deps.agents.restart(ip, action.epoch, action.reason, token)
            if answer.accepted:
                return uid, None
            if answer.unauthorized:
                # The Secret may have been replaced: read it again next time.
                deps.agent_tokens.pop(token_key(self.pdd, self.namespace), None)
            return uid, (answer.error or "refused", answer.silent)

        # Every agent in the same moment: the ranks of the group go down together.
        with ThreadPoolExecutor(max_workers=min(len(asks), 32)) as pool:
            for uid, error in pool.map(ask, asks):
                if error is not None:
                    failures[uid] = error
        for uid, name, _ in asks:
            if uid in failures:
                log.warning("in-place restart of %s not accepted: %s", name, failures[uid][0])

    # -- drain and re-admit

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
            self.routers.gates[pod.name] = action.value
            try:
                self.deps.kube.set_pod_condition(
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
        pods = [p for p in self.pods if p["metadata"]["name"] in names]
        verb = "admit" if admit else "drain"
        routers = self._router_pods()
        for problem in sync_router_workers(
            self.deps.agents.http, pods, routers, admit=admit, jobs=self.routers.jobs
        ):
            log.warning("router %s of %s: %s", verb, sorted(names), problem)

    def _router_pods(self) -> list[Mapping[str, Any]]:
        return [p for p in self.pods if objects.label(p, c.LABEL_COMPONENT) == "router"]

    def sweep_routers(self) -> Sweep:
        """Level-triggered, both ways: remove from every router replica the workers of no
        admitted serving pod (a pod gone, being deleted or drained) that no user flag
        names, and add back every admitted serving pod a replica does not list (its
        registration lost or failed); one Event each. Returns what it did."""
        book = self.routers
        book.gates = pending_gates(self.pods, book.gates)
        if not self.pdd.spec.router.enabled:
            return Sweep()
        bases = router_bases(self._router_pods())
        if not bases:
            return Sweep()
        keep = admitted_urls(self.pods, book.gates) | user_urls(self.pdd.spec.router.args)
        admitted = admitted_workers(self.pods, book.gates)
        done = sweep_workers(self.deps.agents.http, bases, keep, admitted, book.jobs)
        for base, url in done.removed:
            self.events(
                "Normal",
                "RouterWorkerRemoved",
                f"router {base} listed {url}, which is no admitted serving pod's "
                "(gone, being deleted or drained): removed it",
            )
        for base, url, why in done.added:
            self.events(
                "Warning",
                "RouterWorkerAdded",
                f"router {base} did not list the admitted serving pod {url} ({why}): "
                "registered it again",
            )
        for problem in done.problems:
            log.warning("router sweep of %s: %s", self.pdd.metadata.name, problem)
        return done

    # -- requests caught by an incident

    def _leaders(
        self, names: set[str] | None = None, *, exclude: frozenset[str] | set[str] = frozenset()
    ) -> list[tuple[str, str, str]]:
        """(name, role, IP) of the serving leader pods (rank 0) with an address."""
        out = []
        for pod in self.pods:
            name = str(objects.meta(pod).get("name"))
            ip = (pod.get("status") or {}).get("podIP")
            role = objects.label(pod, c.LABEL_ROLE)
            if objects.label(pod, c.LABEL_RANK) != "0" or role not in c.ROLES or not ip:
                continue
            if (names is not None and name not in names) or name in exclude:
                continue
            out.append((name, str(role), str(ip)))
        return out

    def _end_requests(self, role: str, group: int, action: EndRequests) -> None:
        """End the group's own requests (every leader, fenced), then the halves its PD
        peers hold for it (`lockstep.core.failover`); one Event says what ended where."""
        try:
            token = agent_token(self.deps, self.pdd, self.namespace)
        except Exception as err:
            log.warning("ending the requests of %s/%d: no token: %s", role, group, _short(err))
            return
        agents = self.deps.agents
        names = {p.name for p in action.pods}
        own = self._leaders(names)
        group_ips = {
            str((p.get("status") or {}).get("podIP"))
            for p in self.pods
            if p["metadata"]["name"] in names and (p.get("status") or {}).get("podIP")
        }
        ended: dict[str, int] = {}
        rooms: set[int] = set()
        problems: list[str] = []
        body = {"all": True, "fence": True, "reason": action.reason}
        for name, _, ip in own:
            answer = agents.end_requests(ip, token, body)
            if isinstance(answer, str):
                problems.append(f"{name}: {answer}")  # a dead leader holds nothing
                continue
            if answer:
                ended[name] = len(answer)
            rooms |= {r.room for r in answer if r.room is not None}
        others = self._leaders(exclude={n for n, _, _ in own} | names)
        # Prefills first, then decodes: a room listed on a prefill has its decode half
        # listed by the time the decodes are read (lockstep.core.failover).
        others.sort(key=lambda leader: leader[1] != "prefill")
        leaders = [
            Leader(name, peer_role, ip, agents.held_requests(ip, token))
            for name, peer_role, ip in others
        ]
        plan = plan_peers(role, group_ips, rooms, leaders)
        by_name = {leader.name: leader for leader in leaders}
        self._send_orders(plan.orders, by_name, token, action.reason, ended, problems)
        if plan.young:
            # Too young to tell from a live pair: look once more when they are not.
            time.sleep(ORPHAN_GRACE_SECONDS)
            decodes = [
                Leader(n, "decode", leader.ip, agents.held_requests(leader.ip, token))
                for n, leader in by_name.items()
                if leader.role == "decode"
            ]
            orders = still_orphaned(plan.young, decodes)
            self._send_orders(orders, by_name, token, action.reason, ended, problems)
        if plan.unknown:
            problems.append(
                f"decode leader(s) {', '.join(plan.unknown)} did not list their requests: "
                "prefill halves without a decode were left to SGLang's bootstrap timeout"
            )
        for problem in problems:
            log.warning("ending the requests of %s/%d: %s", role, group, problem)
        if ended:
            own_count = sum(n for name, n in ended.items() if name in names)
            peers = ", ".join(f"{k}: {v}" for k, v in sorted(ended.items()) if k not in names)
            self.events(
                "Normal",
                "RequestsEnded",
                f"{role} group {group}: ended {own_count} request(s) it held"
                + (f" and the halves its peers held for it ({peers})" if peers else "")
                + " with 503 (retryable): the router retries them on a healthy pair",
            )
            self.deps.metrics.requests_ended.labels(role).inc(sum(ended.values()))

    def _send_orders(
        self,
        orders: Mapping[str, EndOrder],
        leaders: Mapping[str, Leader],
        token: str,
        reason: str,
        ended: dict[str, int],
        problems: list[str],
    ) -> None:
        for name, order in orders.items():
            if not order:
                continue
            answer = self.deps.agents.end_requests(leaders[name].ip, token, order.body(reason))
            if isinstance(answer, str):
                problems.append(f"{name}: {answer}")
            elif answer:
                ended[name] = ended.get(name, 0) + len(answer)

    # -- evidence

    def _capture(self, action: CaptureEvidence) -> None:
        """Rank states, stacks and log tails of every pod, bounded, for the evidence
        store; the rank states parsed too (`reports`: the next round judges them), and a
        consensus divergence among them kept as the incident's cause."""
        by_name = {p["metadata"]["name"]: p for p in self.pods}
        agents = self.deps.agents
        token = agent_token(self.deps, self.pdd, self.namespace)

        def one(name: str) -> tuple[list[CapturePart], str | None]:
            parts: list[CapturePart] = []
            ranks_text: str | None = None
            ip = ((by_name.get(name) or {}).get("status") or {}).get("podIP")
            if ip:
                ranks_text = agents.evidence(ip, "/ranks", token)
                parts.append(CapturePart(name, "ranks", ranks_text))
                # An agent that did not answer /ranks will not dump stacks either.
                if action.stacks and not ranks_text.startswith(UNREACHABLE):
                    parts.append(CapturePart(name, "stacks", agents.evidence(ip, "/stacks", token)))
            if action.log_lines:
                try:
                    logs = self.deps.kube.core.read_namespaced_pod_log(
                        name, self.namespace, tail_lines=action.log_lines
                    )
                    parts.append(CapturePart(name, "log", str(logs), inline=False))
                except Exception as err:
                    parts.append(CapturePart(name, "log", f"unavailable ({type(err).__name__})"))
            return parts, ranks_text

        # Every pod at once: one silent agent must not hold up the others' evidence.
        with ThreadPoolExecutor(max_workers=min(len(action.pods), 16) or 1) as pool:
            results = list(pool.map(one, [ref.name for ref in action.pods]))
        parts = [part for found, _ in results for part in found]
        full, missed = self._keep_whole(action, parts)
        # Every pod's share of the bound, not first come first served (`fit_capture`).
        captured = fit_capture(parts, action.max_bytes)
        epoch = self.incident_epochs.get(action.incident_id, 0)
        reports = tuple(
            report_from_text(ref.name, text, epoch)
            for ref, (_, text) in zip(action.pods, results, strict=True)
            if text is not None
        )
        self.reports[action.incident_id] = reports
        cause = divergence_cause(r for a in reports for r in a.ranks or ())
        self.evidence[action.incident_id] = EvidenceEntry(
            captured=captured, cause=cause, full=full, full_missed=missed
        )

    def _keep_whole(
        self, action: CaptureEvidence, parts: Sequence[CapturePart]
    ) -> tuple[str | None, str | None]:
        """A capture larger than its bound, kept whole in a slot ConfigMap: the slot's
        name (None: it fit, or it could not be kept), and why it could not be kept."""
        size = whole_length(parts)
        if size <= action.max_bytes or action.full_captures <= 0:
            return None, None
        taken = {e.full for e in self.evidence.values() if e.full is not None}
        chosen = choose_full_slot(
            self.pdd.metadata.name,
            action.incident_id,
            {**self.entries, **self.evidence},
            self.incidents_oldest_first,
            action.full_captures,
            taken,
        )
        if chosen is None:
            return None, f"{size} chars, no free slot"
        name, evicted = chosen
        whole = fit_capture_bytes(parts, FULL_CAPTURE_MAX_BYTES)
        try:
            self.deps.kube.apply_configmap(
                build_full_capture_configmap(self.pdd, name, action.incident_id, whole)
            )
        except Exception as err:
            log.error("%s: whole capture not kept in %s: %s", action.incident_id, name, err)
            return None, f"{size} chars, ConfigMap {name}: {_short(err)}"
        self.full_evicted.update(evicted)
        return name, None

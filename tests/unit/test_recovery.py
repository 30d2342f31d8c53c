"""Recovery: the per-group state machine and the role's guard rails, with an injected clock.

Most tests drive `plan_role` against `Sim`, a fake API server for one role: it applies
the planner's actions to pods (gates, deletes with UID preconditions, create-or-409)
exactly as the I/O layer is specified to, and persists the records between rounds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from factories import pdd_obj, with_path

from lockstep.api.models import (
    BackoffSpec,
    BudgetSpec,
    HealthSpec,
    Incident,
    MaintenanceSpec,
    RecoverySpec,
    parse_pddeployment,
)
from lockstep.api.objects import rfc3339
from lockstep.core.recovery import (
    DELETE_GRACE_SECONDS,
    FORCE_DELETE_AFTER_SECONDS,
    RESTARTING_STEPS,
    Action,
    CapturedEvidence,
    CaptureEvidence,
    CloseIncident,
    CreateEpoch,
    DeletePods,
    EmitEvent,
    GroupInput,
    GroupRecord,
    IncidentKind,
    IncidentRecord,
    OpenIncident,
    PodRef,
    Reason,
    RestartInPlace,
    RoleGuards,
    RolePlan,
    RoleSettings,
    SetGate,
    Step,
    UpdateIncident,
    adopt_group,
    backoff_until,
    new_group_record,
    plan_group,
    plan_role,
    reconciler_may_create_pods,
    status_state,
)
from lockstep.core.verdicts import (
    AgentReport,
    Collective,
    Decision,
    GroupObservation,
    GroupVerdict,
    PodView,
    ProbeOutcome,
    RankState,
    Signal,
    Verdict,
    classify_group,
)

T0 = 10_000.0
GRACE = 600


def settings(
    *,
    threshold: int = 3,
    max_concurrent: int = 1,
    budget: int = 3,
    window: int = 3600,
    base: int = 30,
    max_backoff: int = 600,
    reset_after: int = 1800,
    policy: str = "RestartGroup",
    pods_per_group: int = 2,
    mode: str = "Recreate",
    restart_timeout: int = 60,
    escalation_window: int = 900,
) -> RoleSettings:
    return RoleSettings(
        "decode",
        pods_per_group,
        HealthSpec(failure_threshold=threshold, startup_grace_seconds=GRACE),
        RecoverySpec.model_validate(
            {
                "policy": policy,
                "mode": mode,
                "inPlace": {
                    "restartTimeoutSeconds": restart_timeout,
                    "escalationWindowSeconds": escalation_window,
                },
                "maxConcurrentGroupRestarts": max_concurrent,
                "backoff": BackoffSpec(
                    base_seconds=base, max_seconds=max_backoff, reset_after_seconds=reset_after
                ),
                "budget": BudgetSpec(restarts=budget, window_seconds=window),
            }
        ),
    )


# What a probe round may say about a group, as the recovery planner sees it.
VERDICTS: dict[str, tuple[Verdict, bool, frozenset[Signal]]] = {
    "ok": (Verdict.HEALTHY, False, frozenset()),
    "slow": (Verdict.SLOW, False, frozenset({Signal.PROGRESS})),
    "hung": (Verdict.HUNG, False, frozenset({Signal.SAME_COLLECTIVE, Signal.NO_PROGRESS})),
    "timeout": (Verdict.UNKNOWN, False, frozenset({Signal.PROBE_TIMEOUT})),
    "desync!": (Verdict.DESYNCED, True, frozenset({Signal.CONSENSUS_FAILURE})),
    "down!": (Verdict.RANK_DOWN, True, frozenset({Signal.CONTAINER_RESTARTED})),
    "missing!": (Verdict.RANK_DOWN, True, frozenset({Signal.POD_MISSING})),
}


def verdict(kind: str, epoch: int, at: float) -> GroupVerdict:
    v, immediate, signals = VERDICTS[kind]
    return GroupVerdict(
        verdict=v,
        immediate=immediate,
        reason=f"test says {kind}",
        epoch=epoch,
        observed_at=at,
        signals=signals,
        evidence={"ranks": ["m-decode-0-0/r0 it=5"], "probe": "timeout"},
    )


@dataclass
class Sim:
    """A fake API server for the pods of one role, plus the records the I/O layer keeps."""

    cfg: RoleSettings = field(default_factory=settings)
    groups: int = 1
    now: float = T0
    pods: dict[int, dict[str, PodView]] = field(default_factory=dict)
    records: dict[int, GroupRecord] = field(default_factory=dict)
    log: list[tuple[float, int, Action]] = field(default_factory=list)
    incidents: dict[str, Incident] = field(default_factory=dict)
    settle_deletes: bool = True
    _uids: Iterable[int] = field(default_factory=itertools.count)
    # In place: pods whose agent does not answer, pods whose container never comes back,
    # restarts asked and not done yet, restarts done per UID, failures per (group, epoch).
    agents_down: set[str] = field(default_factory=set)
    stuck: set[str] = field(default_factory=set)
    pending: set[str] = field(default_factory=set)
    restarted: dict[str, int] = field(default_factory=dict)
    failures: dict[tuple[int, int], dict[str, str]] = field(default_factory=dict)
    # The evidence store: incident id -> whether the captured rank states show a
    # consensus failure (the next round's judgement then says Desynced, as
    # control.observe_group's one classify_group over them does).
    captured: dict[str, bool] = field(default_factory=dict)
    capture_divergence: bool = False
    # Warm spares: how many groups serve (None: all, no spares), and facts per group the
    # I/O layer would add (maintenance, in-flight counts), as GroupInput fields.
    serving: int | None = None
    facts: dict[int, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i in range(self.groups):
            self.pods[i] = {}
            self.create(i, 0, gate=True)
            self.records[i] = new_group_record("decode", i, now=self.now - 5000).model_copy(
                update={"step": Step.HEALTHY, "healthy_since": self.now - 4000}
            )

    # -- the fake API server

    def create(self, group: int, epoch: int, gate: bool | None = None) -> None:
        names = {p.name for p in self.pods[group].values()}
        for rank in range(self.cfg.pods_per_group):
            name = f"m-decode-{group}-{rank}"
            if name in names:
                continue  # 409: a pod of that name still exists
            uid = f"g{group}-e{epoch}-r{rank}-{next(iter(self._uids))}"
            self.pods[group][uid] = PodView(name, uid, epoch, rank, gate=gate, node=f"node-{rank}")

    def apply(self, group: int, actions: Iterable[Action]) -> None:
        pods = self.pods[group]
        for a in actions:
            self.log.append((self.now, group, a))
            if isinstance(a, SetGate):
                for ref in a.pods:
                    if ref.uid in pods:
                        pods[ref.uid] = replace(pods[ref.uid], gate=a.value)
            elif isinstance(a, DeletePods):
                for ref in a.pods:  # the UID is the precondition
                    if ref.uid in pods:
                        pods[ref.uid] = replace(pods[ref.uid], deleting=True)
                        if a.grace_seconds == 0:
                            del pods[ref.uid]
            elif isinstance(a, CreateEpoch):
                self.create(group, a.epoch)
            elif isinstance(a, RestartInPlace):
                for ref in a.pods:
                    pod = pods.get(ref.uid)
                    failed = self.failures.setdefault((group, a.epoch), {})
                    failed.pop(ref.uid, None)  # a fresh ask
                    if pod is None or pod.name in self.agents_down:
                        why = "connection refused" if pod else "pod not found"
                        failed[ref.uid] = why
                        continue
                    # The agent is idempotent per epoch: a repeat does nothing.
                    if pod.epoch != a.epoch:
                        pods[ref.uid] = replace(pod, epoch=a.epoch)
                        self.pending.add(ref.uid)
            elif isinstance(a, OpenIncident | UpdateIncident | CloseIncident):
                self.incidents[a.incident.id] = a.incident
            elif isinstance(a, CaptureEvidence):
                self.captured[a.incident_id] = self.capture_divergence

    def settle(self) -> None:
        """The kubelet finishes every pending delete and in-place restart."""
        for pods in self.pods.values():
            for uid in [u for u, p in pods.items() if p.deleting]:
                del pods[uid]
            for uid in [u for u in pods if u in self.pending and pods[u].name not in self.stuck]:
                pods[uid] = replace(pods[uid], restart_count=pods[uid].restart_count + 1)
                self.pending.discard(uid)
                self.restarted[uid] = self.restarted.get(uid, 0) + 1

    def view(self, group: int) -> tuple[PodView, ...]:
        return tuple(sorted(self.pods[group].values(), key=lambda p: p.name))

    # -- the I/O layer

    def inputs(
        self, verdicts: dict[int, str] | None = None, manual: dict[int, str] | None = None
    ) -> dict[int, GroupInput]:
        verdicts, manual = dict(verdicts or {}), manual or {}
        for i in range(self.groups):
            rec = self.records[i]
            if (
                rec.step is Step.CAPTURING_EVIDENCE
                and rec.incident is not None
                and self.captured.get(rec.incident.id)
            ):
                verdicts[i] = "desync!"
        return {
            i: GroupInput(
                pods=self.view(i),
                verdict=(
                    verdict(verdicts[i], self.records[i].epoch, self.now) if i in verdicts else None
                ),
                manual_request=manual.get(i),
                restart_failures=self.failures.get((i, self.records[i].epoch), {}),
                # The fake's agents either answer or are unreachable: never a "no".
                restart_unreachable=frozenset(self.failures.get((i, self.records[i].epoch), {})),
                captured=self.captured_for(i),
                **self.facts.get(i, {}),
            )
            for i in range(self.groups)
        }

    def captured_for(self, group: int) -> CapturedEvidence | None:
        incident = self.records[group].incident
        if incident is None or incident.id not in self.captured:
            return None
        return CapturedEvidence(incident.id)

    def round(
        self,
        verdicts: dict[int, str] | None = None,
        manual: dict[int, str] | None = None,
        dt: float = 1.0,
    ) -> RolePlan:
        plan = plan_role(
            self.cfg,
            self.records,
            self.inputs(verdicts, manual),
            now=self.now,
            serving=self.serving,
        )
        for i, gp in plan.order():
            self.apply(i, gp.actions)
            self.records[i] = gp.record
        if self.settle_deletes:
            self.settle()
        self.now += dt
        return plan

    def step(self, group: int = 0) -> Step:
        return self.records[group].step

    def recover(self, group: int = 0, rounds: int = 30) -> None:
        """Rounds in which the group's probe passes (no news of the others), until it is
        Healthy again."""
        for _ in range(rounds):
            if self.step(group) is Step.HEALTHY:
                return
            self.round({group: "ok"})
        raise AssertionError(f"group {group} stuck in {self.step(group)}")

    def actions(self, kind: type, group: int | None = None) -> list[Action]:
        return [a for _, g, a in self.log if isinstance(a, kind) and group in (None, g)]

    def reasons(self, group: int | None = None) -> list[str]:
        return [a.reason for a in self.actions(EmitEvent, group) if isinstance(a, EmitEvent)]


def steps_of(plan: RolePlan) -> dict[int, Step]:
    return {i: p.record.step for i, p in plan.groups.items()}


# ------------------------------------------------------------------- the whole path


def test_desync_recovers_through_every_step_in_order() -> None:
    sim = Sim()
    old = {p.uid for p in sim.view(0)}
    seen = [sim.step()]
    sim.round({0: "desync!"})
    seen.append(sim.step())
    for _ in range(20):
        sim.round({0: "ok"})
        if seen[-1] != sim.step():
            seen.append(sim.step())
        if sim.step() is Step.HEALTHY:
            break
    assert seen == [
        Step.HEALTHY,
        Step.DRAINING,
        Step.CAPTURING_EVIDENCE,
        Step.AWAITING_RESTART,
        Step.DELETING,
        Step.WAITING_GONE,
        Step.CREATING,
        Step.WAITING_PROBE,
        Step.READMITTING,
        Step.HEALTHY,
    ]
    # Drained before evidence, evidence before delete, delete before create; the group's
    # requests (and its peers' halves) end right after it left the routers, and once more
    # as the drain completes.
    kinds = [type(a).__name__ for _, _, a in sim.log if not isinstance(a, EmitEvent)]
    assert kinds == [
        "OpenIncident",
        "UpdateIncident",
        "SetGate",
        "EndRequests",
        "EndRequests",
        "CaptureEvidence",
        "UpdateIncident",
        "DeletePods",
        "CreateEpoch",
        "SetGate",
        "CloseIncident",
    ]
    (drain, readmit) = sim.actions(SetGate)
    assert isinstance(drain, SetGate) and isinstance(readmit, SetGate)
    assert drain.value is False and {r.uid for r in drain.pods} == old
    (delete,) = sim.actions(DeletePods)
    assert isinstance(delete, DeletePods)
    assert {r.uid for r in delete.pods} == old
    assert delete.grace_seconds == DELETE_GRACE_SECONDS
    assert sim.actions(CreateEpoch) == [CreateEpoch(1)]
    assert readmit.value is True and {r.uid for r in readmit.pods} == {p.uid for p in sim.view(0)}
    assert {p.epoch for p in sim.view(0)} == {1}
    assert all(p.gate for p in sim.view(0))
    assert sim.reasons() == [
        "GroupDesynced",
        "GroupDrained",
        "GroupRestarted",
        "GroupReadmitted",
    ]
    rec = sim.records[0]
    assert (rec.epoch, rec.budget.restarts, rec.incident) == (1, 1, None)


def test_closed_incident_has_time_to_detect_and_time_to_recover() -> None:
    sim = Sim()
    t_first = sim.now
    sim.round({0: "hung"}, dt=5)
    sim.round({0: "hung"}, dt=5)
    t_verdict = sim.now
    sim.round({0: "hung"}, dt=5)
    assert sim.step() is Step.DRAINING
    sim.recover(0)
    t_readmit = sim.now - 1  # the round that saw every gate true
    (incident,) = sim.incidents.values()
    assert incident.state == "Closed"
    assert incident.verdict == "Hung"
    assert incident.epoch == 0
    assert incident.time_to_detect_seconds == t_verdict - t_first == 10
    assert incident.time_to_recover_seconds == t_readmit - t_verdict
    assert incident.first_failure_time == rfc3339(t_first, "microseconds")
    assert incident.detected_time == rfc3339(t_verdict, "microseconds")
    assert incident.recovered_time == rfc3339(t_readmit, "microseconds")
    assert "restarted the whole group (Recreate, 1 attempt(s))" in incident.action
    assert "test says hung" in incident.evidence
    assert "same-collective" in incident.evidence


# ------------------------------------------------------------------- every transition


def rec(step: Step, **kw: object) -> GroupRecord:
    """A record in `step`; `kw` in the record's flat (pre-sub-record) field names, which
    a record still loads (as from an older operator's annotation)."""
    base = new_group_record("decode", 0, now=T0 - 100, epoch=4)
    flat = {**base.model_dump(exclude_defaults=True), "step": step, "step_since": T0 - 10}
    return GroupRecord.model_validate({**flat, **kw})


INCIDENT = IncidentRecord(
    id="decode-0-1",
    verdict="Desynced",
    epoch=4,
    reason="x",
    first_failure_at=T0 - 20,
    detected_at=T0 - 15,
)


def pods(epoch: int = 4, gate: bool | None = True, deleting: bool = False) -> tuple[PodView, ...]:
    return tuple(
        PodView(
            f"m-decode-0-{r}",
            f"e{epoch}-{r}",
            epoch,
            r,
            gate=gate,
            deleting=deleting,
            node=f"node-{r}",
        )
        for r in range(2)
    )


def V(kind: str, epoch: int = 4) -> GroupVerdict:
    return verdict(kind, epoch, T0)


OLD_REFS = tuple(PodRef(name=f"m-decode-0-{r}", uid=f"e4-{r}") for r in range(2))

TRANSITIONS: list[tuple[str, GroupRecord, GroupInput, Step, list[str]]] = [
    # (name, record, facts, next step, action kinds)
    ("starting: probe passes", rec(Step.STARTING), GroupInput(pods(gate=None), V("ok")),
     Step.READMITTING, []),
    ("starting: failures within grace wait", rec(Step.STARTING), GroupInput(pods(), V("hung")),
     Step.STARTING, []),
    ("starting: a pod not there yet waits", rec(Step.STARTING),
     GroupInput(pods()[:1], V("missing!")), Step.STARTING, []),
    ("starting: a container restarted", rec(Step.STARTING), GroupInput(pods(), V("down!")),
     Step.DRAINING, ["OpenIncident", "EmitEvent", "UpdateIncident"]),
    ("starting: grace over", rec(Step.STARTING, epoch_started_at=T0 - GRACE),
     GroupInput(pods()), Step.DRAINING, ["OpenIncident", "EmitEvent", "UpdateIncident"]),
    ("healthy: probe passes", rec(Step.HEALTHY), GroupInput(pods(), V("ok")), Step.HEALTHY, []),
    ("healthy: slow", rec(Step.HEALTHY), GroupInput(pods(), V("slow")), Step.HEALTHY, []),
    ("healthy: first hung", rec(Step.HEALTHY), GroupInput(pods(), V("hung")), Step.SUSPECT,
     ["EmitEvent"]),
    ("healthy: desync acts at once", rec(Step.HEALTHY), GroupInput(pods(), V("desync!")),
     Step.DRAINING, ["OpenIncident", "EmitEvent", "UpdateIncident"]),
    ("healthy: rank down acts at once", rec(Step.HEALTHY), GroupInput(pods(), V("down!")),
     Step.DRAINING, ["OpenIncident", "EmitEvent", "UpdateIncident"]),
    ("suspect: passes again", rec(Step.SUSPECT, failures=2), GroupInput(pods(), V("ok")),
     Step.HEALTHY, []),
    ("suspect: slow again", rec(Step.SUSPECT, failures=2), GroupInput(pods(), V("slow")),
     Step.HEALTHY, []),
    ("suspect: below threshold", rec(Step.SUSPECT, failures=1), GroupInput(pods(), V("timeout")),
     Step.SUSPECT, []),
    ("suspect: threshold reached", rec(Step.SUSPECT, failures=2), GroupInput(pods(), V("hung")),
     Step.DRAINING, ["OpenIncident", "EmitEvent", "UpdateIncident"]),
    ("suspect: no probe this round", rec(Step.SUSPECT, failures=2), GroupInput(pods()),
     Step.SUSPECT, []),
    ("observing: passes again", rec(Step.OBSERVING, incident=INCIDENT), GroupInput(pods(), V("ok")),
     Step.READMITTING, []),
    ("observing: policy now RestartGroup", rec(Step.OBSERVING, incident=INCIDENT),
     GroupInput(pods(), V("hung")), Step.DRAINING, ["UpdateIncident"]),
    ("draining: gates to set, then its requests end", rec(Step.DRAINING, incident=INCIDENT),
     GroupInput(pods()), Step.DRAINING, ["SetGate", "EndRequests"]),
    ("draining: every gate false, requests ended once more",
     rec(Step.DRAINING, incident=INCIDENT), GroupInput(pods(gate=False)),
     Step.CAPTURING_EVIDENCE, ["EmitEvent", "EndRequests"]),
    ("capturing evidence: asks once", rec(Step.CAPTURING_EVIDENCE, incident=INCIDENT),
     GroupInput(pods(gate=False)), Step.CAPTURING_EVIDENCE, ["CaptureEvidence"]),
    ("capturing evidence: asked, not in the store yet",
     rec(Step.CAPTURING_EVIDENCE, incident=INCIDENT, capture_asked=True),
     GroupInput(pods(gate=False)), Step.CAPTURING_EVIDENCE, []),
    ("capturing evidence: captured", rec(Step.CAPTURING_EVIDENCE, incident=INCIDENT,
     capture_asked=True), GroupInput(pods(gate=False), captured=CapturedEvidence(INCIDENT.id)),
     Step.AWAITING_RESTART, []),
    ("awaiting restart: slot free", rec(Step.AWAITING_RESTART, incident=INCIDENT),
     GroupInput(pods(gate=False)), Step.DELETING, ["UpdateIncident"]),
    ("deleting", rec(Step.DELETING, incident=INCIDENT, old_pods=OLD_REFS),
     GroupInput(pods(gate=False)), Step.WAITING_GONE, ["DeletePods"]),
    ("waiting gone: still terminating", rec(Step.WAITING_GONE, old_pods=OLD_REFS),
     GroupInput(pods(deleting=True)), Step.WAITING_GONE, []),
    ("waiting gone: a delete was lost", rec(Step.WAITING_GONE, old_pods=OLD_REFS),
     GroupInput(pods()), Step.WAITING_GONE, ["DeletePods"]),
    ("waiting gone: all gone", rec(Step.WAITING_GONE, old_pods=OLD_REFS), GroupInput(()),
     Step.CREATING, []),
    ("waiting gone: old pods a lost in-place round relabelled with the target still go",
     rec(Step.WAITING_GONE, old_pods=OLD_REFS),
     GroupInput(tuple(replace(p, epoch=5) for p in pods())), Step.WAITING_GONE,
     ["DeletePods"]),
    ("creating: pods missing", rec(Step.CREATING, epoch=5), GroupInput(()), Step.CREATING,
     ["CreateEpoch"]),
    ("creating: one pod of two", rec(Step.CREATING, epoch=5), GroupInput(pods(5)[:1]),
     Step.CREATING, ["CreateEpoch"]),
    ("creating: every pod there", rec(Step.CREATING, epoch=5, incident=INCIDENT),
     GroupInput(pods(5, gate=None)), Step.WAITING_PROBE, ["EmitEvent"]),
    ("waiting probe: passes", rec(Step.WAITING_PROBE, epoch=5, incident=INCIDENT),
     GroupInput(pods(5, gate=None), V("ok", 5)), Step.READMITTING, []),
    ("waiting probe: still loading", rec(Step.WAITING_PROBE, epoch=5, incident=INCIDENT),
     GroupInput(pods(5, gate=None), V("timeout", 5)), Step.WAITING_PROBE, []),
    ("waiting probe: old epoch verdict ignored",
     rec(Step.WAITING_PROBE, epoch=5, incident=INCIDENT, epoch_started_at=T0 - 1),
     GroupInput(pods(5, gate=None), V("down!", 4)), Step.WAITING_PROBE, []),
    ("waiting probe: new epoch broke",
     rec(Step.WAITING_PROBE, epoch=5, incident=INCIDENT),
     GroupInput(pods(5, gate=None), V("down!", 5)), Step.DRAINING,
     ["EmitEvent", "UpdateIncident"]),
    ("waiting probe: timed out",
     rec(Step.WAITING_PROBE, epoch=5, incident=INCIDENT, epoch_started_at=T0 - GRACE),
     GroupInput(pods(5, gate=None)), Step.DRAINING, ["EmitEvent", "UpdateIncident"]),
    ("readmitting: gates to set", rec(Step.READMITTING, incident=INCIDENT),
     GroupInput(pods(gate=None)), Step.READMITTING, ["SetGate"]),
    ("readmitting: every gate true", rec(Step.READMITTING, incident=INCIDENT),
     GroupInput(pods()), Step.HEALTHY, ["CloseIncident", "EmitEvent"]),
    ("readmitting: first admission", rec(Step.READMITTING), GroupInput(pods()),
     Step.HEALTHY, ["EmitEvent"]),
    ("quarantined stays", rec(Step.QUARANTINED, incident=INCIDENT),
     GroupInput(pods(gate=False), V("ok")), Step.QUARANTINED, []),
    ("quarantined: manual request", rec(Step.QUARANTINED, incident=INCIDENT),
     GroupInput(pods(gate=False), manual_request="req-1"), Step.DRAINING,
     ["UpdateIncident", "EmitEvent"]),
    ("healthy: manual request", rec(Step.HEALTHY), GroupInput(pods(), manual_request="req-1"),
     Step.DRAINING, ["OpenIncident", "UpdateIncident", "EmitEvent"]),
    ("awaiting restart: manual request lifts backoff",
     rec(Step.AWAITING_RESTART, incident=INCIDENT, backoff_streak=4, last_restart_at=T0),
     GroupInput(pods(gate=False), manual_request="req-1"), Step.AWAITING_RESTART, ["EmitEvent"]),
    # Maintenance and placement (the whole paths: tests/unit/test_maintenance.py).
    ("healthy: its node is cordoned", rec(Step.HEALTHY),
     GroupInput(pods(), maintenance="node node-1 is cordoned", maintenance_nodes=("node-1",)),
     Step.MOVING, ["OpenIncident", "UpdateIncident", "EmitEvent", "CreateEpoch"]),
    ("moving: new pods missing", rec(Step.MOVING, epoch=5, slot=1, maintenance="m"),
     GroupInput(pods()), Step.MOVING, ["CreateEpoch"]),
    ("moving: new epoch passes", rec(Step.MOVING, epoch=5, slot=1, maintenance="m"),
     GroupInput((*pods(), *(
         PodView(f"m-decode-0b-{r}", f"e5-{r}", 5, r, node="node-9") for r in range(2)
     )), V("ok", 5)), Step.HANDING_OVER, []),
    ("handing over: admit the new pods first",
     rec(Step.HANDING_OVER, epoch=5, slot=1, maintenance="m", old_pods=OLD_REFS),
     GroupInput((*pods(), *(
         PodView(f"m-decode-0b-{r}", f"e5-{r}", 5, r, node="node-9") for r in range(2)
     ))), Step.HANDING_OVER, ["SetGate"]),
    ("starting: pods not placed in time", rec(Step.STARTING, epoch_started_at=T0 - 300),
     GroupInput(tuple(replace(p, node=None) for p in pods(gate=None))), Step.UNSCHEDULABLE,
     ["EmitEvent", "DeletePods"]),
    ("unschedulable: retry after backoff", rec(Step.UNSCHEDULABLE, retry_at=T0 - 1),
     GroupInput(()), Step.CREATING, []),
    ("healthy: beyond replicas leaves the routers first", rec(Step.HEALTHY),
     GroupInput(pods(), retire=True), Step.RETIRING, ["EmitEvent", "SetGate"]),
    ("retiring: drained, gone", rec(Step.RETIRING, drained_at=T0 - 5, drain_done=True),
     GroupInput((), retire=True), Step.RETIRING, ["EmitEvent"]),
    ("waiting probe: a pod not placed yet is no rank down, it is placement's",
     rec(Step.WAITING_PROBE, epoch_started_at=T0 - 5),
     GroupInput((pods()[0], replace(pods()[1], node=None)), V("down!")), Step.WAITING_PROBE, []),
    ("readmitting a spare: it stands by, out of the routers", rec(Step.READMITTING, spare=True),
     GroupInput(pods(gate=None)), Step.HEALTHY, ["EmitEvent"]),
    ("readmitting a spare that served: its gates go false first",
     rec(Step.READMITTING, spare=True), GroupInput(pods()), Step.READMITTING, ["SetGate"]),
    ("standing down: leaves the routers first", rec(Step.STANDING_DOWN, spare=True),
     GroupInput(pods()), Step.STANDING_DOWN, ["SetGate"]),
    ("standing down: drained, it stands by",
     rec(Step.STANDING_DOWN, spare=True, drained_at=T0 - 5, drain_done=True),
     GroupInput(pods(gate=False)), Step.HEALTHY, ["EmitEvent"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("record", "inp", "step", "kinds"),
    [t[1:] for t in TRANSITIONS],
    ids=[t[0] for t in TRANSITIONS],
)
def test_transition(record: GroupRecord, inp: GroupInput, step: Step, kinds: list[str]) -> None:
    plan = plan_group(record, inp, settings(), now=T0)
    assert plan.record.step is step
    assert [type(a).__name__ for a in plan.actions] == kinds
    # The same round planned again from the same record is the same plan (a restarted
    # operator that lost the I/O of this round redoes exactly it).
    assert plan_group(record, inp, settings(), now=T0) == plan
    # Every record survives the annotation round trip.
    assert GroupRecord.from_json(plan.record.to_json()) == plan.record


def restarted(epoch: int = 5, count: int = 1) -> tuple[PodView, ...]:
    """The two pods of `pods()` (same UIDs, epoch-4 names) relabelled and restarted."""
    return tuple(replace(p, epoch=epoch, restart_count=count) for p in pods(gate=False))


ASKED = {"e4-0": 0, "e4-1": 0}
IN_PLACE_REC = {
    "incident": INCIDENT,
    "epoch": 5,
    "mode": "InPlace",
    "old_pods": OLD_REFS,
    "asked_counts": ASKED,
    "last_in_place_at": T0 - 10,
}

IN_PLACE_TRANSITIONS: list[tuple[str, GroupRecord, GroupInput, Step, list[str]]] = [
    ("awaiting restart: in place", rec(Step.AWAITING_RESTART, incident=INCIDENT),
     GroupInput(pods(gate=False)), Step.RESTARTING_IN_PLACE,
     ["UpdateIncident", "EmitEvent", "RestartInPlace"]),
    ("awaiting restart: a pod missing, recreate", rec(Step.AWAITING_RESTART, incident=INCIDENT),
     GroupInput(pods(gate=False)[:1]), Step.DELETING, ["UpdateIncident"]),
    ("awaiting restart: failed again soon after in place, recreate",
     rec(Step.AWAITING_RESTART, incident=INCIDENT, last_in_place_at=T0 - 60),
     GroupInput(pods(gate=False)), Step.DELETING, ["UpdateIncident"]),
    ("awaiting restart: in place again after the window",
     rec(Step.AWAITING_RESTART, incident=INCIDENT, last_in_place_at=T0 - 901),
     GroupInput(pods(gate=False)), Step.RESTARTING_IN_PLACE,
     ["UpdateIncident", "EmitEvent", "RestartInPlace"]),
    ("restarting in place: not yet relabelled", rec(Step.RESTARTING_IN_PLACE, **IN_PLACE_REC),
     GroupInput(pods(gate=False)), Step.RESTARTING_IN_PLACE, []),
    ("restarting in place: relabelled, not restarted",
     rec(Step.RESTARTING_IN_PLACE, **IN_PLACE_REC),
     GroupInput(restarted(count=0)), Step.RESTARTING_IN_PLACE, []),
    ("restarting in place: one restarted", rec(Step.RESTARTING_IN_PLACE, **IN_PLACE_REC),
     GroupInput((restarted()[0], restarted(count=0)[1])), Step.RESTARTING_IN_PLACE, []),
    ("restarting in place: restarted, not running again yet",
     rec(Step.RESTARTING_IN_PLACE, **IN_PLACE_REC),
     GroupInput((restarted()[0], replace(restarted()[1], container_running=False))),
     Step.RESTARTING_IN_PLACE, []),
    ("restarting in place: every container restarted",
     rec(Step.RESTARTING_IN_PLACE, **IN_PLACE_REC),
     GroupInput(restarted()), Step.WAITING_PROBE, ["EmitEvent"]),
    ("restarting in place: an agent refused", rec(Step.RESTARTING_IN_PLACE, **IN_PLACE_REC),
     GroupInput(restarted(count=0), restart_failures={"e4-1": "401 Unauthorized"}),
     Step.DELETING, ["UpdateIncident", "EmitEvent"]),
    ("restarting in place: an agent not answering yet is asked again next round",
     rec(Step.RESTARTING_IN_PLACE, **IN_PLACE_REC),
     GroupInput(restarted(count=0), restart_failures={"e4-1": "ConnectError"},
                restart_unreachable=frozenset({"e4-1"})),
     Step.RESTARTING_IN_PLACE, []),
    ("restarting in place: ...and asked again",
     rec(Step.RESTARTING_IN_PLACE, **{**IN_PLACE_REC, "asked_counts": {"e4-0": 0}}),
     GroupInput(restarted(count=0), restart_failures={"e4-1": "ConnectError"},
                restart_unreachable=frozenset({"e4-1"})),
     Step.RESTARTING_IN_PLACE, ["RestartInPlace"]),
    ("restarting in place: an agent silent too long escalates",
     rec(Step.RESTARTING_IN_PLACE, **{**IN_PLACE_REC, "step_since": T0 - 20}),
     GroupInput(restarted(count=0), restart_failures={"e4-1": "ConnectError"},
                restart_unreachable=frozenset({"e4-1"})),
     Step.DELETING, ["UpdateIncident", "EmitEvent"]),
    ("restarting in place: a pod went away", rec(Step.RESTARTING_IN_PLACE, **IN_PLACE_REC),
     GroupInput(restarted()[:1]), Step.DELETING, ["UpdateIncident", "EmitEvent"]),
    ("restarting in place: timed out",
     rec(Step.RESTARTING_IN_PLACE, **{**IN_PLACE_REC, "step_since": T0 - 60}),
     GroupInput((restarted()[0], restarted(count=0)[1])), Step.DELETING,
     ["UpdateIncident", "EmitEvent"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("record", "inp", "step", "kinds"),
    [t[1:] for t in IN_PLACE_TRANSITIONS],
    ids=[t[0] for t in IN_PLACE_TRANSITIONS],
)
def test_in_place_transition(
    record: GroupRecord, inp: GroupInput, step: Step, kinds: list[str]
) -> None:
    cfg = settings(mode="InPlace", restart_timeout=60, escalation_window=900)
    plan = plan_group(record, inp, cfg, now=T0)
    assert plan.record.step is step
    assert [type(a).__name__ for a in plan.actions] == kinds
    assert plan_group(record, inp, cfg, now=T0) == plan
    assert GroupRecord.from_json(plan.record.to_json()) == plan.record


def test_every_step_has_a_transition_case() -> None:
    covered = {t[1].step for t in [*TRANSITIONS, *IN_PLACE_TRANSITIONS]}
    assert covered == set(Step)


def test_an_observation_counts_once_however_often_the_planner_runs() -> None:
    r = rec(Step.HEALTHY)
    inp = GroupInput(pods(), V("hung"))
    first = plan_group(r, inp, settings(), now=T0)
    again = plan_group(first.record, inp, settings(), now=T0 + 1)
    assert first.record.detection.failures == again.record.detection.failures == 1
    assert again.actions == ()


def test_suspect_event_once_then_verdict_at_threshold() -> None:
    sim = Sim()
    for _ in range(2):
        sim.round({0: "timeout"})
        assert sim.step() is Step.SUSPECT
    assert sim.reasons() == ["GroupSuspect"]
    sim.round({0: "timeout"})
    assert sim.step() is Step.DRAINING
    assert sim.reasons() == ["GroupSuspect", "GroupUnresponsive"]


def test_pods_gone_forever_are_force_deleted_once() -> None:
    sim = Sim(settle_deletes=False)
    sim.round({0: "down!"})
    for _ in range(6):
        sim.round()
    assert sim.step() is Step.WAITING_GONE
    sim.now += FORCE_DELETE_AFTER_SECONDS
    sim.round()
    sim.round()
    forced = [
        a for a in sim.actions(DeletePods) if isinstance(a, DeletePods) and not a.grace_seconds
    ]
    assert len(forced) == 1
    assert sim.reasons().count("GroupForceDeleted") == 1
    assert sim.step() is Step.CREATING


def test_evidence_is_asked_for_with_the_spec_limits() -> None:
    sim = Sim()
    sim.round({0: "desync!"})
    sim.recover(0)
    (cap,) = sim.actions(CaptureEvidence)
    assert isinstance(cap, CaptureEvidence)
    assert cap.incident_id in sim.incidents
    assert (cap.stacks, cap.log_lines, cap.max_bytes) == (True, 200, 16384)
    assert len(cap.pods) == 2


def test_incident_evidence_is_bounded_by_max_evidence_bytes() -> None:
    big = replace(V("desync!"), evidence={"ranks": ["r" * 200] * 500})
    plan = plan_group(rec(Step.HEALTHY), GroupInput(pods(), big), settings(), now=T0)
    (opened,) = [a for a in plan.actions if isinstance(a, OpenIncident)]
    assert len(opened.incident.evidence.encode()) <= 16384
    assert opened.incident.evidence.endswith("(truncated)")


# ------------------------------------------------------------ operator restart anywhere


def crash_every_round(sim: Sim, lose: str) -> set[Step]:
    """Desync group 0, then let its probe pass, while every round the operator dies once:
    before the I/O (it re-plans the same round), after the I/O but before persisting the
    record, or after only the first action of the round (both: it re-plans from the old
    record against the changed world). Returns the steps visited."""
    visited = set()
    for kind in ["desync!"] + ["ok"] * 40:
        before = sim.records[0]
        inputs = sim.inputs({0: kind})
        plan = plan_role(sim.cfg, sim.records, inputs, now=sim.now)
        if lose == "io":
            # Crash before any I/O: the same round planned again gives the same plan.
            assert plan_role(sim.cfg, sim.records, inputs, now=sim.now) == plan
        else:
            done = plan.groups[0].actions
            sim.apply(0, done if lose == "record" else done[:1])
            # Crash before the record was persisted: plan again from the old record.
            plan = plan_role(sim.cfg, {0: before}, sim.inputs({0: kind}), now=sim.now)
        sim.apply(0, plan.groups[0].actions)
        sim.records[0] = plan.groups[0].record
        visited.add(sim.step())
        sim.settle()
        sim.now += 1
        if sim.step() is Step.HEALTHY and sim.records[0].epoch == 1:
            break
    return visited


@pytest.mark.parametrize("lose", ["io", "record", "half"])
def test_operator_restart_at_every_step_never_doubles_a_delete_or_a_create(lose: str) -> None:
    sim = Sim(settle_deletes=False)
    old_uids = {p.uid for p in sim.view(0)}
    visited = crash_every_round(sim, lose)
    assert visited >= {
        Step.DRAINING,
        Step.CAPTURING_EVIDENCE,
        Step.AWAITING_RESTART,
        Step.DELETING,
        Step.WAITING_GONE,
        Step.CREATING,
        Step.WAITING_PROBE,
        Step.READMITTING,
        Step.HEALTHY,
    }
    deleted = {r.uid for a in sim.actions(DeletePods) if isinstance(a, DeletePods) for r in a.pods}
    assert deleted == old_uids  # never a pod of the new epoch
    assert {a for a in sim.actions(CreateEpoch)} == {CreateEpoch(1)}
    assert len(sim.view(0)) == 2 and {p.epoch for p in sim.view(0)} == {1}
    assert sim.records[0].budget.restarts == 1
    assert [i.state for i in sim.incidents.values()] == ["Closed"]


def test_record_survives_a_restart_mid_recovery_through_its_json() -> None:
    sim = Sim()
    sim.round({0: "desync!"})
    for _ in range(5):
        sim.round()
    assert sim.step() in (Step.DELETING, Step.WAITING_GONE, Step.CREATING)
    sim.records = {i: GroupRecord.from_json(r.to_json()) for i, r in sim.records.items()}
    sim.recover(0)
    assert sim.records[0].epoch == 1
    assert len(sim.records[0].to_json()) < 2048


def test_reconciler_keeps_off_the_pods_while_recovery_replaces_them() -> None:
    owned = {s for s in Step if not reconciler_may_create_pods(rec(s))}
    assert owned == {
        Step.RESTARTING_IN_PLACE,
        Step.DELETING,
        Step.WAITING_GONE,
        Step.CREATING,
        Step.MOVING,
        Step.HANDING_OVER,
        Step.UNSCHEDULABLE,
        Step.RETIRING,
    }


# ------------------------------------------------------------------------ guard rails


def test_slow_but_progressing_never_restarts() -> None:
    sim = Sim()
    for i in range(500):
        sim.round({0: "timeout" if i % 3 == 0 else "slow"}, dt=5)
    assert sim.step() in (Step.HEALTHY, Step.SUSPECT)
    assert not sim.actions(SetGate) and not sim.actions(DeletePods)
    assert not sim.actions(OpenIncident)


def test_slow_from_real_rank_states_never_restarts() -> None:
    """The verdict pipeline end to end: probes time out under load, ranks progress."""
    sim = Sim()
    previous: tuple[RankState, ...] = ()
    for n in range(50):
        ranks = tuple(
            RankState(
                pod=f"m-decode-0-{r // 2}",
                rank=r,
                iteration=100 + n * 7,
                pid=40 + r,
                last_decision=Decision("batch", 60 + n * 7 + (r % 2), "DECODE", 4, "h"),
                collective=Collective("all_reduce", "tp:device", 900 + n, sim.now - 0.2),
            )
            for r in range(4)
        )
        obs = GroupObservation(
            epoch=0,
            expected_pods=2,
            probe=ProbeOutcome("timeout"),
            pods=sim.view(0),
            agents=(
                AgentReport("m-decode-0-0", ranks[:2]),
                AgentReport("m-decode-0-1", ranks[2:]),
            ),
        )
        v = classify_group(obs, previous, now=sim.now)
        previous = ranks
        plan = plan_role(sim.cfg, sim.records, {0: GroupInput(sim.view(0), v)}, now=sim.now)
        sim.apply(0, plan.groups[0].actions)
        sim.records[0] = plan.groups[0].record
        sim.now += 5
    assert sim.step() in (Step.HEALTHY, Step.SUSPECT)
    assert not sim.actions(DeletePods) and not sim.actions(SetGate)


def test_two_broken_groups_with_one_slot_restart_one_after_the_other() -> None:
    sim = Sim(groups=3)
    sim.round({0: "desync!", 1: "desync!"})
    overlap = 0
    order: list[int] = []
    for _ in range(60):
        plan = sim.round({0: "ok", 1: "ok", 2: "ok"})
        restarting = [i for i, s in steps_of(plan).items() if s in RESTARTING_STEPS]
        overlap = max(overlap, len(restarting))
        for i in restarting:
            if i not in order:
                order.append(i)
        if all(sim.step(i) is Step.HEALTHY for i in range(3)) and len(order) == 2:
            break
    assert overlap == 1
    assert order == [0, 1]
    assert [sim.records[i].epoch for i in range(3)] == [1, 1, 0]
    assert sim.reasons(1).count("RestartDeferred") == 1
    assert "RestartDeferred" not in sim.reasons(0)
    # Both were drained at once: a desynced group serves nothing, waiting is out of service.
    first_drain = {g for t, g, a in sim.log if isinstance(a, SetGate) and t == T0 + 1}
    assert first_drain == {0, 1}


def test_concurrency_limit_of_two_restarts_both_at_once() -> None:
    sim = Sim(cfg=settings(max_concurrent=2), groups=3)
    sim.round({0: "desync!", 1: "down!"})
    overlap = 0
    for _ in range(20):
        plan = sim.round({0: "ok", 1: "ok", 2: "ok"})
        overlap = max(overlap, sum(s in RESTARTING_STEPS for s in steps_of(plan).values()))
    assert overlap == 2
    assert "RestartDeferred" not in sim.reasons()


def test_the_group_with_the_earliest_verdict_restarts_first() -> None:
    sim = Sim(groups=2)
    sim.round({1: "desync!"})
    sim.round({0: "desync!"})
    for _ in range(10):
        sim.round()
    assert sim.step(1) in RESTARTING_STEPS
    assert sim.step(0) is Step.AWAITING_RESTART


def test_last_group_in_service_is_not_taken_out_while_another_comes_back() -> None:
    sim = Sim(groups=2)
    sim.round({0: "desync!"})
    for _ in range(9):
        sim.round()
    assert sim.step(0) is Step.WAITING_PROBE  # model loading
    for _ in range(3):
        sim.round({1: "hung"})
    assert sim.step(1) is Step.SUSPECT
    assert sim.records[1].incident is not None
    assert status_state(sim.records[1]) == "Hung"
    assert not sim.actions(SetGate, group=1)
    assert sim.reasons(1) == ["GroupSuspect", "GroupHung", "RestartDeferred"]
    updates = len(sim.actions(UpdateIncident, group=1))
    sim.round({1: "hung"})
    sim.round({1: "hung"})
    assert sim.reasons(1).count("RestartDeferred") == 1  # once, not every round
    assert len(sim.actions(UpdateIncident, group=1)) == updates
    sim.recover(0)
    sim.round({1: "hung"})
    assert sim.step(1) is Step.DRAINING


def test_a_deferred_group_that_recovers_by_itself_closes_its_incident() -> None:
    sim = Sim(groups=2)
    sim.round({0: "desync!"})
    for _ in range(8):
        sim.round()
    for _ in range(3):
        sim.round({1: "hung"})
    sim.round({1: "slow"})
    sim.round()
    assert sim.step(1) is Step.HEALTHY
    closed = [i for i in sim.incidents.values() if i.group == 1]
    assert [i.state for i in closed] == ["Closed"]
    assert "no restart" in closed[0].action
    assert not sim.actions(DeletePods, group=1)


def test_when_every_group_is_broken_the_last_one_restarts_too() -> None:
    sim = Sim(groups=2)
    sim.records[0] = sim.records[0].model_copy(
        update={"step": Step.QUARANTINED, "incident": INCIDENT}
    )
    for _ in range(3):
        sim.round({1: "hung"})
    assert sim.step(1) is Step.DRAINING


def test_a_single_group_role_is_restarted() -> None:
    sim = Sim(groups=1)
    for _ in range(3):
        sim.round({0: "hung"})
    assert sim.step(0) is Step.DRAINING


def test_flapping_group_backs_off_then_is_quarantined() -> None:
    sim = Sim(cfg=settings(budget=3, base=30, max_backoff=45))
    restart_times: list[float] = []
    for _ in range(4):
        sim.round({0: "down!"})
        for _ in range(300):
            if sim.step() in (Step.HEALTHY, Step.QUARANTINED):
                break
            before = sim.step()
            sim.round({0: "ok"})
            if before is Step.AWAITING_RESTART and sim.step() is Step.DELETING:
                restart_times.append(sim.now - 1)
    assert sim.step() is Step.QUARANTINED
    gaps = [b - a for a, b in itertools.pairwise(restart_times)]
    assert len(restart_times) == 3
    assert gaps[0] >= 30 and gaps[1] >= 45  # 30, then 60 capped at 45
    assert gaps[1] < 60
    assert sim.reasons().count("GroupQuarantined") == 1
    deferred = [
        a.message
        for a in sim.actions(EmitEvent)
        if isinstance(a, EmitEvent) and a.reason == "RestartDeferred"
    ]
    assert len(deferred) == 2 and all("backoff" in m for m in deferred)
    plan = sim.round({0: "down!"})
    assert plan.degraded and plan.quarantined == [0]
    assert status_state(sim.records[0]) == "Quarantined"
    deletes = len(sim.actions(DeletePods))
    for _ in range(20):
        sim.round({0: "down!"}, dt=60)  # well within the budget window
    assert len(sim.actions(DeletePods)) == deletes  # no restart storm
    incident = [i for i in sim.incidents.values() if i.state == "Open"]
    assert len(incident) == 1 and "quarantined" in incident[0].action
    # A person asks: the group restarts once more, the incident closes.
    sim.round(manual={0: "fix-1"})
    sim.recover(0)
    assert sim.records[0].budget.restarts == 4
    assert all(i.state == "Closed" for i in sim.incidents.values())
    # ...and starts a fresh budget: the next failure restarts again, no quarantine.
    sim.round({0: "down!"})
    for _ in range(10):
        sim.round(dt=10)  # past the 30 s backoff of the streak the manual restart began
    assert sim.step() in RESTARTING_STEPS


def test_budget_window_slides() -> None:
    sim = Sim(cfg=settings(budget=1, window=600, base=0))
    sim.round({0: "down!"})
    sim.recover(0)
    sim.now += 601  # the first restart left the window
    sim.round({0: "down!"})
    sim.recover(0)
    assert sim.records[0].budget.restarts == 2
    sim.round({0: "down!"})
    for _ in range(10):
        sim.round()
    assert sim.step() is Step.QUARANTINED


def test_backoff_grows_caps_and_resets_after_a_healthy_window() -> None:
    rs = settings(base=30, max_backoff=100, reset_after=1800).recovery
    r = rec(Step.AWAITING_RESTART, last_restart_at=T0)
    assert backoff_until(r, rs) is None
    assert [
        backoff_until(
            r.model_copy(update={"budget": r.budget.model_copy(update={"backoff_streak": n})}),
            rs,
        )
        for n in (1, 2, 3, 9)
    ] == [
        T0 + 30,
        T0 + 60,
        T0 + 100,
        T0 + 100,
    ]
    healthy = rec(Step.HEALTHY, backoff_streak=3, healthy_since=T0 - 1799)
    assert (
        plan_group(healthy, GroupInput(pods()), settings(), now=T0).record.budget.backoff_streak
        == 3
    )
    assert (
        plan_group(healthy, GroupInput(pods()), settings(), now=T0 + 1).record.budget.backoff_streak
        == 0
    )


def test_observe_only_records_verdicts_and_incidents_but_never_acts() -> None:
    sim = Sim(cfg=settings(policy="ObserveOnly"), groups=2)
    sim.round({0: "desync!"})
    for _ in range(3):
        sim.round({1: "hung"})
    for _ in range(20):
        sim.round({0: "desync!", 1: "hung"}, manual={0: "please"})
    assert sim.step(0) is Step.OBSERVING and sim.step(1) is Step.OBSERVING
    assert status_state(sim.records[0]) == "Desynced"
    for kind in (SetGate, CaptureEvidence, DeletePods, CreateEpoch):
        assert not sim.actions(kind), kind
    assert {i.verdict for i in sim.incidents.values()} == {"Desynced", "Hung"}
    assert all("ObserveOnly" in i.action for i in sim.incidents.values())
    assert sim.reasons(0).count("RestartRefused") == 1
    sim.round({0: "ok"})
    sim.round()
    assert sim.step(0) is Step.HEALTHY
    closed = [i for i in sim.incidents.values() if i.group == 0]
    assert closed[0].state == "Closed" and "no restart" in closed[0].action


def test_manual_restart_once_per_request_id() -> None:
    sim = Sim(groups=2)
    sim.round(manual={0: "req-1"})
    sim.recover(0)
    assert sim.records[0].epoch == 1
    for _ in range(10):
        sim.round({0: "ok", 1: "ok"}, manual={0: "req-1"})
    assert sim.records[0].epoch == 1 and sim.step(0) is Step.HEALTHY
    sim.round(manual={0: "req-2"})
    sim.recover(0)
    assert sim.records[0].epoch == 2
    assert sim.records[1].epoch == 0
    manual = [i for i in sim.incidents.values() if i.verdict == "Manual"]
    assert len(manual) == 2 and all(i.state == "Closed" for i in manual)


def test_manual_restart_skips_backoff_but_not_the_concurrency_limit() -> None:
    sim = Sim(groups=2)
    sim.round({0: "desync!"})
    for _ in range(9):
        sim.round()
    assert sim.step(0) is Step.WAITING_PROBE
    budget = sim.records[1].budget.model_copy(
        update={"backoff_streak": 5, "last_restart_at": sim.now}
    )
    sim.records[1] = sim.records[1].model_copy(update={"budget": budget})
    sim.round(manual={1: "now"})
    for _ in range(5):
        sim.round()
    assert sim.step(1) is Step.AWAITING_RESTART  # the slot is taken by group 0
    sim.recover(0)
    sim.round()
    assert sim.step(1) is Step.DELETING  # no backoff wait


def test_manual_request_during_a_restart_is_absorbed() -> None:
    sim = Sim()
    sim.round({0: "desync!"})
    for _ in range(6):
        sim.round()
    sim.round(manual={0: "dup"})
    sim.recover(0)
    assert sim.records[0].epoch == 1
    assert sim.records[0].manual.handled_request == "dup"
    sim.round({0: "ok"}, manual={0: "dup"})
    assert sim.step() is Step.HEALTHY


def test_a_new_epoch_that_never_passes_counts_as_another_failure() -> None:
    sim = Sim(cfg=settings(base=0))
    sim.round({0: "desync!"})
    for _ in range(9):
        sim.round({0: "timeout"})
    assert sim.step() is Step.WAITING_PROBE
    sim.now += GRACE
    sim.round({0: "timeout"})
    assert sim.step() is Step.DRAINING
    assert sim.reasons().count("GroupRestartFailed") == 1
    sim.recover(0)
    assert sim.records[0].epoch == 2 and sim.records[0].budget.restarts == 2
    (incident,) = sim.incidents.values()
    assert "2 attempt(s)" in incident.action


def test_an_adopted_group_keeps_old_restarts_as_its_baseline() -> None:
    """A fresh operator finds a group whose pod restarted long ago: not a RankDown."""
    view = tuple(replace(p, restart_count=3 * p.rank) for p in pods(7) if p.rank is not None)
    record = adopt_group("decode", 0, view, now=T0)
    assert (record.step, record.epoch) == (Step.STARTING, 7)
    assert record.restart_baseline == {"e7-0": 0, "e7-1": 3}
    obs = GroupObservation(7, 2, ProbeOutcome("ok"), view, restart_baseline=record.restart_baseline)
    assert classify_group(obs, now=T0).verdict is Verdict.HEALTHY
    moved = replace(obs, pods=(view[0], replace(view[1], restart_count=4)))
    assert classify_group(moved, now=T0).verdict is Verdict.RANK_DOWN
    assert GroupRecord.from_json(record.to_json()) == record


def test_a_new_epoch_records_its_restart_baseline() -> None:
    new = tuple(replace(p, restart_count=1) for p in pods(5, gate=None))
    plan = plan_group(rec(Step.CREATING, epoch=5), GroupInput(new), settings(), now=T0)
    assert plan.record.restart_baseline == {"e5-0": 1, "e5-1": 1}


def test_groups_without_a_record_start_from_their_pods_epoch() -> None:
    cfg = settings()
    view = pods(7, gate=None)
    plan = plan_role(cfg, {}, {0: GroupInput(view, verdict("ok", 7, T0))}, now=T0)
    assert plan.groups[0].record.epoch == 7
    assert plan.groups[0].record.step is Step.READMITTING


def test_status_state_for_every_step() -> None:
    with_incident = {s: status_state(rec(s, incident=INCIDENT)) for s in Step}
    assert with_incident[Step.SUSPECT] == "Desynced"
    assert with_incident[Step.OBSERVING] == "Desynced"
    assert with_incident[Step.QUARANTINED] == "Quarantined"
    assert with_incident[Step.WAITING_GONE] == "Recovering"
    assert status_state(rec(Step.SUSPECT)) == "Suspect"
    assert status_state(rec(Step.STARTING)) == "Starting"
    assert status_state(rec(Step.HEALTHY)) == "Healthy"


def test_guards_default_to_a_lone_group() -> None:
    r = rec(Step.AWAITING_RESTART, incident=INCIDENT)
    alone = plan_group(r, GroupInput(pods(gate=False)), settings(), now=T0)
    held = plan_group(
        r,
        GroupInput(pods(gate=False)),
        settings(),
        now=T0,
        guards=RoleGuards(slot_granted=False, may_leave_service=True, restarting=1),
    )
    assert alone.record.step is Step.DELETING
    assert held.record.step is Step.AWAITING_RESTART
    assert [a.reason for a in held.actions if isinstance(a, EmitEvent)] == [Reason.DEFERRED]


def test_role_settings_come_from_the_spec() -> None:
    obj = with_path(pdd_obj(), "spec.recovery", {"maxConcurrentGroupRestarts": 2})
    obj = with_path(obj, "spec.decode", {"tp": 4, "gpusPerPod": 2, "podsPerGroup": 2})
    got = RoleSettings.from_spec(parse_pddeployment(obj).spec, "decode")
    assert (got.role, got.pods_per_group) == ("decode", 2)
    assert got.recovery.max_concurrent_group_restarts == 2
    assert got.health.failure_threshold == 3


# ------------------------------------------------------------------ in-place restarts


def in_place_sim(**kw: object) -> Sim:
    cfg_kw = {k: kw.pop(k) for k in ("restart_timeout", "escalation_window") if k in kw}
    return Sim(cfg=settings(mode="InPlace", base=0, **cfg_kw), **kw)  # type: ignore[arg-type]


def run_to_healthy(sim: Sim, first: str = "desync!", rounds: int = 200) -> list[Step]:
    seen = [sim.step()]
    sim.round({0: first})
    for _ in range(rounds):
        if seen[-1] != sim.step():
            seen.append(sim.step())
        if sim.step() is Step.HEALTHY:
            return seen
        sim.round({0: "ok"} if sim.step() in (Step.WAITING_PROBE, Step.STARTING) else None)
    raise AssertionError(f"stuck in {sim.step()}: {seen}")


def test_in_place_restart_keeps_the_pods_and_moves_every_one_to_the_next_epoch() -> None:
    sim = in_place_sim()
    before = {p.uid: p for p in sim.view(0)}
    seen = run_to_healthy(sim)
    assert seen == [
        Step.HEALTHY,
        Step.DRAINING,
        Step.CAPTURING_EVIDENCE,
        Step.AWAITING_RESTART,
        Step.RESTARTING_IN_PLACE,
        Step.WAITING_PROBE,
        Step.READMITTING,
        Step.HEALTHY,
    ]
    after = {p.uid: p for p in sim.view(0)}
    assert after.keys() == before.keys()  # same pods
    assert all(after[u].restart_count == before[u].restart_count + 1 for u in after)
    assert {p.epoch for p in after.values()} == {1}
    assert sim.restarted == {u: 1 for u in before}
    assert sim.actions(DeletePods) == [] and sim.actions(CreateEpoch) == []
    (ask,) = sim.actions(RestartInPlace)
    assert isinstance(ask, RestartInPlace)
    assert ask.epoch == 1 and {r.uid for r in ask.pods} == before.keys()
    assert ask.reason == "decode-0-1"
    rec = sim.records[0]
    assert (rec.epoch, rec.budget.restarts, rec.restart.mode) == (1, 1, "InPlace")
    assert rec.restart_baseline == {u: p.restart_count for u, p in after.items()}
    assert sim.reasons() == [
        "GroupDesynced",
        "GroupDrained",
        "GroupRestartingInPlace",
        "GroupRestarted",
        "GroupReadmitted",
    ]
    (incident,) = sim.incidents.values()
    assert incident.state == "Closed"
    assert "restarted the whole group (InPlace, 1 attempt(s))" in incident.action
    assert (incident.restart_mode, incident.escalation) == ("InPlace", None)


def test_an_agent_that_does_not_answer_escalates_to_recreate_away_from_its_node() -> None:
    sim = in_place_sim()
    old = {p.uid for p in sim.view(0)}
    sim.agents_down = {"m-decode-0-1"}
    seen = run_to_healthy(sim)
    assert Step.RESTARTING_IN_PLACE in seen and Step.DELETING in seen
    assert not old & {p.uid for p in sim.view(0)}  # new pods
    (create,) = set(sim.actions(CreateEpoch))
    # The agent's pod is the culprit: its node is avoided (the other pod's is not).
    assert create == CreateEpoch(2, ("node-1",))
    assert sim.records[0].budget.restarts == 1  # one attempt, escalated, not two restarts
    modes = [
        a.incident.restart_mode
        for a in sim.actions(UpdateIncident)
        if isinstance(a, UpdateIncident)
    ]
    assert modes[-2:] == ["InPlace", "Recreate"]
    assert "GroupRestartEscalated" in sim.reasons()
    (incident,) = sim.incidents.values()
    assert incident.action.startswith(
        "restarted the whole group (Recreate, 1 attempt(s); in-place restart escalated: "
        "the agent of m-decode-0-1 did not accept the restart (connection refused))"
    )
    events = [a.message for a in sim.actions(EmitEvent) if isinstance(a, EmitEvent)]
    assert any("m-decode-0-1 did not accept the restart (connection refused)" in m for m in events)


def test_a_container_that_does_not_come_back_escalates_after_the_timeout() -> None:
    sim = in_place_sim(restart_timeout=30)
    sim.stuck = {"m-decode-0-0"}
    sim.round({0: "desync!"})
    for _ in range(5):
        sim.round()
    assert sim.step() is Step.RESTARTING_IN_PLACE
    asked_at = sim.records[0].step_since
    while sim.step() is Step.RESTARTING_IN_PLACE:
        sim.round()
    assert sim.step() is Step.DELETING or sim.step() is Step.WAITING_GONE
    assert sim.now - asked_at >= 30
    msgs = [a.message for a in sim.actions(EmitEvent) if isinstance(a, EmitEvent)]
    assert any(
        "m-decode-0-0 did not restart within inPlace.restartTimeoutSeconds=30" in m for m in msgs
    )
    assert set(sim.actions(CreateEpoch)) <= {CreateEpoch(2, ("node-0",))}
    run_to_healthy(sim, first="ok")
    assert {p.epoch for p in sim.view(0)} == {2}


def test_a_group_failing_again_within_the_window_is_recreated_then_in_place_again_later() -> None:
    sim = in_place_sim(escalation_window=600)
    run_to_healthy(sim)
    assert sim.records[0].restart.mode == "InPlace"
    sim.now += 100
    run_to_healthy(sim)  # failed again 100 s after the in-place restart
    assert sim.records[0].restart.mode == "Recreate"
    assert len(sim.actions(RestartInPlace)) == 1 and sim.actions(DeletePods)
    (second,) = [i for i in sim.incidents.values() if i.id == "decode-0-2"]
    assert "escalationWindowSeconds=600" in second.action
    assert second.restart_mode == "Recreate"
    assert second.escalation and "failed again 1" in second.escalation
    sim.now += 1000
    run_to_healthy(sim)  # long after: in place again
    assert sim.records[0].restart.mode == "InPlace" and len(sim.actions(RestartInPlace)) == 2


def test_recreate_mode_never_asks_the_agents() -> None:
    sim = Sim(cfg=settings(mode="Recreate", base=0))
    run_to_healthy(sim)
    assert sim.actions(RestartInPlace) == [] and sim.actions(DeletePods)
    assert set(sim.actions(CreateEpoch)) == {CreateEpoch(1, ())}


def test_a_rank_whose_pod_is_gone_is_recreated_not_restarted_in_place() -> None:
    sim = in_place_sim()
    gone = next(iter(sim.pods[0]))
    del sim.pods[0][gone]
    run_to_healthy(sim, first="missing!")
    assert sim.actions(RestartInPlace) == [] and sim.actions(CreateEpoch)
    (incident,) = sim.incidents.values()
    assert "1 pod(s) of the group are gone or going" in str(
        [a.incident.action for a in sim.actions(UpdateIncident) if isinstance(a, UpdateIncident)]
    )
    assert incident.state == "Closed"


@pytest.mark.parametrize("lose", ["io", "record", "half"])
def test_operator_restart_during_an_in_place_restart_never_restarts_a_pod_twice(
    lose: str,
) -> None:
    sim = in_place_sim(settle_deletes=False)
    uids = {p.uid for p in sim.view(0)}
    assert Step.RESTARTING_IN_PLACE in crash_every_round(sim, lose)
    assert sim.step() is Step.HEALTHY and sim.records[0].epoch == 1
    assert sim.restarted == {u: 1 for u in uids}  # each container restarted exactly once
    assert {p.uid for p in sim.view(0)} == uids
    assert sim.actions(DeletePods) == []
    assert sim.records[0].budget.restarts == 1


def test_a_template_rollout_recreates_even_in_in_place_mode() -> None:
    sim = in_place_sim()
    # Draining first: the role's only group (see the make-before-break rollout below).
    sim.cfg = replace(sim.cfg, maintenance=MaintenanceSpec(mode="DrainFirst"))
    old = {p.uid for p in sim.view(0)}
    plan = plan_role(
        sim.cfg,
        sim.records,
        {0: GroupInput(sim.view(0), manual_request="spec-abc", template_changed=True)},
        now=sim.now,
    )
    sim.apply(0, plan.groups[0].actions)
    sim.records[0] = plan.groups[0].record
    sim.now += 1
    run_to_healthy(sim, first="ok")
    assert sim.actions(RestartInPlace) == []
    assert not old & {p.uid for p in sim.view(0)}
    assert sim.records[0].manual.rollout is False
    # A person's restart request (no template change) is done in place.
    sim.now += 2000
    plan = plan_role(
        sim.cfg, sim.records, {0: GroupInput(sim.view(0), manual_request="req-2")}, now=sim.now
    )
    sim.apply(0, plan.groups[0].actions)
    sim.records[0] = plan.groups[0].record
    sim.now += 1
    run_to_healthy(sim, first="ok")
    assert len(sim.actions(RestartInPlace)) == 1


def test_a_template_rollout_of_the_roles_only_group_starts_the_new_epoch_beside_it() -> None:
    """The role's only group in service rolls make-before-break (it never stops
    serving); with another group in service it drains and restarts as before."""
    alone = Sim()
    plan = plan_role(
        alone.cfg,
        alone.records,
        {0: GroupInput(alone.view(0), manual_request="spec-abc", template_changed=True)},
        now=alone.now,
    )
    rec, acts = plan.groups[0].record, plan.groups[0].actions
    assert rec.step is Step.MOVING and (rec.epoch, rec.slot) == (1, 1)
    assert [a for a in acts if isinstance(a, CreateEpoch)] == [CreateEpoch(1, (), 1)]
    assert not [a for a in acts if isinstance(a, SetGate)]  # the old epoch keeps serving
    assert rec.incident is not None and rec.incident.kind is IncidentKind.MANUAL
    assert rec.manual.handled_request == "spec-abc"
    pair = Sim(groups=2)
    plan = plan_role(
        pair.cfg,
        pair.records,
        {
            0: GroupInput(pair.view(0), manual_request="spec-abc", template_changed=True),
            1: GroupInput(pair.view(1)),
        },
        now=pair.now,
    )
    assert plan.groups[0].record.step is Step.DRAINING
    assert plan.groups[0].record.manual.rollout is True


def test_a_container_down_when_the_group_is_restarted_is_asked_once_it_runs_again() -> None:
    """After a divergence the ranks exit and their containers restart on their own: an
    agent that is not up yet is asked when its container runs again, not given up on."""
    sim = in_place_sim()
    sim.round({0: "desync!"})
    down = next(u for u, p in sim.pods[0].items() if p.name == "m-decode-0-1")
    sim.pods[0][down] = replace(sim.pods[0][down], container_running=False)
    while sim.step() is not Step.RESTARTING_IN_PLACE:
        sim.round()
    (first,) = sim.actions(RestartInPlace)
    assert isinstance(first, RestartInPlace) and [r.name for r in first.pods] == ["m-decode-0-0"]
    for _ in range(3):
        sim.round()
    assert sim.step() is Step.RESTARTING_IN_PLACE  # waits for the down container
    # The kubelet brings it back (its own restart, in the old epoch): now it is asked.
    pod = sim.pods[0][down]
    sim.pods[0][down] = replace(pod, container_running=True, restart_count=pod.restart_count + 1)
    run_to_healthy(sim, first="ok")
    asks = [a for a in sim.actions(RestartInPlace) if isinstance(a, RestartInPlace)]
    assert [[r.name for r in a.pods] for a in asks] == [["m-decode-0-0"], ["m-decode-0-1"]]
    assert sim.restarted.get(down) == 1 and sim.actions(DeletePods) == []
    assert sim.records[0].restart.mode == "InPlace" and sim.records[0].epoch == 1


def test_the_captured_evidence_refines_a_rank_down_into_a_desync_once() -> None:
    """The planner owns the incident: ranks that died on a consensus divergence are
    a desync, decided from the captured evidence, in the incident the planner keeps."""
    sim = Sim()
    sim.capture_divergence = True
    sim.round({0: "down!"})
    (opened,) = [a for a in sim.actions(OpenIncident) if isinstance(a, OpenIncident)]
    assert opened.incident.verdict == "RankDown"
    sim.recover(0)
    incident = sim.incidents[opened.incident.id]
    assert incident.verdict == "Desynced" and incident.state == "Closed"
    assert incident.evidence.startswith("cause: test says desync!")
    assert sim.reasons().count("GroupDesynced") == 1
    updates = [a for a in sim.actions(UpdateIncident) if isinstance(a, UpdateIncident)]
    verdicts = [u.incident.verdict for u in updates]
    # RankDown until the capture, Desynced from then on, never back.
    assert verdicts.index("Desynced") == len(verdicts) - verdicts[::-1].index("RankDown")


def test_a_capture_that_never_lands_does_not_hold_the_restart_up() -> None:
    record = rec(Step.CAPTURING_EVIDENCE, incident=INCIDENT, capture_asked=True)
    record = record.model_copy(update={"step_since": T0 - 31})
    plan = plan_group(record, GroupInput(pods(gate=False)), settings(), now=T0)
    assert plan.record.step is Step.AWAITING_RESTART
    assert [a.reason for a in plan.actions if isinstance(a, EmitEvent)] == [Reason.EVIDENCE_MISSING]


def test_a_suspect_that_resolves_on_its_own_warns_once_per_interval() -> None:
    sim = Sim()
    for _ in range(9):  # flapping for 90 s: a failed probe, then a passing one
        sim.round({0: "timeout"}, dt=5.0)
        assert sim.step() is Step.SUSPECT
        sim.round({0: "ok"}, dt=5.0)
        assert sim.step() is Step.HEALTHY
    assert sim.reasons().count("GroupSuspect") == 1
    sim.now += 300
    sim.round({0: "timeout"})
    assert sim.reasons().count("GroupSuspect") == 2
    assert not sim.incidents  # never a verdict


def test_the_incident_names_the_outlier_rank_with_its_pod_and_node() -> None:
    """The verdict's outliers go into the incident (record and status) with the node
    their pod runs on, and into the verdict's Event."""
    from lockstep.core.verdicts import Outlier

    sim = Sim()
    v = replace(
        verdict("down!", 0, sim.now),
        outliers=(Outlier("m-decode-0-1", 1, "its process is stopped"),),
    )
    plan = plan_role(sim.cfg, sim.records, {0: GroupInput(sim.view(0), verdict=v)}, now=sim.now)
    rec = plan.groups[0].record
    assert rec.incident is not None
    (o,) = rec.incident.outliers
    assert (o.pod, o.rank, o.node, o.why) == ("m-decode-0-1", 1, "node-1", "its process is stopped")
    assert "outlier: m-decode-0-1/r1 on node-1 (its process is stopped)" in rec.incident.evidence
    (opened,) = [a for a in plan.groups[0].actions if isinstance(a, OpenIncident)]
    assert [x.model_dump(exclude_none=True) for x in opened.incident.outliers] == [
        {"pod": "m-decode-0-1", "rank": 1, "node": "node-1", "why": "its process is stopped"}
    ]
    events = [a.message for a in plan.groups[0].actions if isinstance(a, EmitEvent)]
    assert any(
        "outlier: m-decode-0-1/r1 on node-1 (its process is stopped)" in m for m in events
    ), events

"""Recovery: the per-group state machine that restarts a broken TP group as one unit.

Pure: no I/O, no clock (every function takes `now`). The I/O layer owns one small
`GroupRecord` per group, persisted in status and in an annotation so an operator restart
resumes where it stopped. Each round it calls `plan_role` with every group's record, the
facts it just read (the group's pods, this round's verdict, a manual restart request) and
the role's settings; it gets back, per group, the next record and a list of actions.

Contract with the I/O layer (what makes every step idempotent):
1. Execute the actions in order, then persist the new record. A crash in between
   re-plans from the old record: the same actions come out again (at least once).
2. Every action is safe to repeat: `SetGate` is a level; `DeletePods` carries the UIDs
   snapshotted into the record before the first delete (a UID precondition turns a
   repeat into a no-op, and never touches a pod of the new epoch); `CreateEpoch` names
   the epoch (create-or-409); `OpenIncident`/`UpdateIncident`/`CloseIncident` carry the
   incident's id (upsert); events may repeat.
3. Transitions that need the world to change wait for the facts (gates false on every
   pod, every old pod gone, every new pod present), so a lost action is re-emitted.
4. While the record is in `Deleting`, `WaitingGone` or `Creating` the reconciler must not
   create pods for the group (`reconciler_may_create_pods`): recovery owns them.

The steps:

    Starting ─probe ok─> Readmitting ─gate true─> Healthy ─failure─> Suspect
    Suspect ─threshold or immediate verdict─> Draining (or Observing, or deferred)
    Draining ─gate false everywhere─> CapturingEvidence ─> AwaitingRestart
    AwaitingRestart ─budget spent─> Quarantined (until a manual request)
    AwaitingRestart ─backoff over, slot free, mode InPlace─> RestartingInPlace
    RestartingInPlace ─every container restarted─> WaitingProbe
    RestartingInPlace ─an agent refused or did not answer, a pod vanished, or a container
        did not restart within inPlace.restartTimeoutSeconds─> Deleting (escalation)
    AwaitingRestart ─backoff over, slot free, mode Recreate─> Deleting ─> WaitingGone
    WaitingGone ─old pods gone─> Creating ─new pods present─> WaitingProbe
    WaitingProbe ─probe ok─> Readmitting ─> Healthy
    WaitingProbe / Starting ─startup grace over, or the new epoch broke─> Draining

Restart modes (`recovery.mode`, decided per attempt in AwaitingRestart and kept in the
record): `InPlace` asks every pod agent of the group to restart its container into the
next epoch at the same moment (`RestartInPlace`: the I/O layer relabels the pods with the
new epoch, then posts to every agent once; the agents are idempotent per epoch, so a
replay after an operator crash restarts nothing twice). The same pods, nodes and IPs come
back with the image present and the weights in the page cache. It escalates to `Recreate`
(delete and create the group's pods, preferring other nodes than the culprits') when an
agent does not accept, a pod vanishes or a container does not come back in time, and an
attempt starts as `Recreate` when the group failed again within
`inPlace.escalationWindowSeconds` of its last in-place restart or when the group's pods
are not all there to restart. The incident's action says which mode ran and why it
escalated.

Guard rails across the groups of a role (`plan_role`), judged on the records as they
were at the start of the round so the outcome does not depend on group order:
- at most `maxConcurrentGroupRestarts` groups in Deleting..Readmitting; waiting groups
  get a slot by earliest verdict (then group index) and emit `RestartDeferred`;
- a group is not taken out of service (drained) while it is the role's last group in
  service and some other group is on its way back (restarting or starting): only when
  every other group is broken too does draining it leave the role no worse off;
- backoff `base * 2^(n-1)` (capped at `max`) before the n-th restart of a streak; the
  streak ends after `resetAfterSeconds` healthy;
- budget: a restart needed when `budget.restarts` already happened within
  `budget.windowSeconds` quarantines the group instead (the caller marks Degraded);
- `policy: ObserveOnly`: verdicts and incidents, no drain, delete or create. A restart
  already in flight when the policy changes completes (stopping after a delete would
  leave the group without pods);
- a manual request (its id) restarts one group once: it bypasses backoff, budget and the
  last-in-service guard (a person asked), not the concurrency limit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lockstep.models import (
    GroupState,
    HealthSpec,
    Incident,
    MaintenanceSpec,
    PDDeploymentSpec,
    RecoverySpec,
)
from lockstep.verdicts import BROKEN_SIGNALS, GroupVerdict, PodView, Verdict, clip_evidence

# A wedged NCCL rank ignores SIGTERM, and the group is restarted as a whole: there is
# nothing to shut down gracefully, so deletes use a short grace...
DELETE_GRACE_SECONDS = 5
# ...and pods still there this long after the delete (a lost node keeps them Terminating
# forever, and the new epoch reuses their names) are force-deleted.
FORCE_DELETE_AFTER_SECONDS = 120
# How soon to look again while waiting for the API server to reflect an action.
RECHECK_SECONDS = 2.0
# An in-place restart asks an agent that does not answer (its container may be starting
# again) once more each round; one still silent this long after the first ask escalates.
SILENT_AGENT_SECONDS = 15.0
# A group that turns Suspect and back on its own warns at most this often.
SUSPECT_EVENT_INTERVAL_SECONDS = 300.0
# Evidence capture runs in the round that asks for it; one that never reached the
# evidence store this long after (its store write failed) does not hold the restart up.
CAPTURE_TIMEOUT_SECONDS = 30.0
# Restart times kept in the record (the budget window is what matters; this bounds the
# annotation even for a large budget).
MAX_RESTART_TIMES = 64

Role = Literal["prefill", "decode"]


class Step(StrEnum):
    """Where a group's recovery stands (kept in its record)."""

    STARTING = "Starting"
    HEALTHY = "Healthy"
    SUSPECT = "Suspect"
    OBSERVING = "Observing"
    DRAINING = "Draining"
    CAPTURING_EVIDENCE = "CapturingEvidence"
    AWAITING_RESTART = "AwaitingRestart"
    RESTARTING_IN_PLACE = "RestartingInPlace"
    DELETING = "Deleting"
    WAITING_GONE = "WaitingGone"
    CREATING = "Creating"
    WAITING_PROBE = "WaitingProbe"
    READMITTING = "Readmitting"
    QUARANTINED = "Quarantined"
    # Maintenance, make-before-break: the next epoch starts on other nodes while the old
    # pods serve; then the new pods are admitted and the old ones drained and deleted.
    MOVING = "Moving"
    HANDING_OVER = "HandingOver"
    # The epoch's pods were not all placed in time: withdrawn whole, retried after backoff.
    UNSCHEDULABLE = "Unschedulable"
    # Scale-down: out of every router, in-flight requests finish, then the pods go.
    RETIRING = "Retiring"


# A restart slot of the role is held from the first delete to re-admission.
RESTARTING_STEPS = frozenset(
    {
        Step.RESTARTING_IN_PLACE,
        Step.DELETING,
        Step.WAITING_GONE,
        Step.CREATING,
        Step.WAITING_PROBE,
        Step.READMITTING,
    }
)
# Steps of a group known to be broken and not on its way back yet.
BROKEN_STEPS = frozenset(
    {
        Step.OBSERVING,
        Step.DRAINING,
        Step.CAPTURING_EVIDENCE,
        Step.AWAITING_RESTART,
        Step.QUARANTINED,
    }
)
# Steps in which recovery, not the reconciler, decides which pods exist.
POD_OWNING_STEPS = frozenset(
    {
        Step.RESTARTING_IN_PLACE,
        Step.DELETING,
        Step.WAITING_GONE,
        Step.CREATING,
        Step.MOVING,
        Step.HANDING_OVER,
        Step.UNSCHEDULABLE,
        Step.RETIRING,
    }
)
# Steps of a group moving off a node under maintenance while its old pods still serve.
MOVE_STEPS = frozenset({Step.MOVING, Step.HANDING_OVER})


class Reason(StrEnum):
    """Event reasons (also the names metrics use)."""

    SUSPECT = "GroupSuspect"
    DESYNCED = "GroupDesynced"
    HUNG = "GroupHung"
    RANK_DOWN = "GroupRankDown"
    UNRESPONSIVE = "GroupUnresponsive"
    RESTART_REQUESTED = "GroupRestartRequested"
    RESTART_REFUSED = "RestartRefused"
    RESTART_FAILED = "GroupRestartFailed"
    DRAINED = "GroupDrained"
    RESTARTED = "GroupRestarted"
    RESTARTING_IN_PLACE = "GroupRestartingInPlace"
    ESCALATED = "GroupRestartEscalated"
    FORCE_DELETED = "GroupForceDeleted"
    READY = "GroupReady"
    READMITTED = "GroupReadmitted"
    QUARANTINED = "GroupQuarantined"
    DEFERRED = "RestartDeferred"
    EVIDENCE_MISSING = "EvidenceMissing"
    MAINTENANCE = "GroupMaintenance"
    RETIRING = "GroupRetiring"
    RETIRED = "GroupRetired"
    RETIRE_DEFERRED = "ScaleDownDeferred"
    MOVE_FAILED = "GroupMoveFailed"
    MOVED = "GroupMoved"
    UNSCHEDULABLE = "GroupUnschedulable"
    REQUESTS_ENDED = "RequestsEnded"


_VERDICT_REASON = {
    Verdict.DESYNCED: Reason.DESYNCED,
    Verdict.HUNG: Reason.HUNG,
    Verdict.RANK_DOWN: Reason.RANK_DOWN,
    Verdict.UNKNOWN: Reason.UNRESPONSIVE,
}

MANUAL_VERDICT = "Manual"
MAINTENANCE_VERDICT = "Maintenance"
# A make-before-break move whose new pods the scheduler reports unschedulable this long
# falls back to draining first (there is no capacity elsewhere right now).
MOVE_UNSCHEDULABLE_SECONDS = 10.0
# A group leaving service on purpose waits at least this long after it left the routers
# before it reads its leader idle (a request routed just before is then counted).
DRAIN_SETTLE_SECONDS = 1.0
# A move that could neither make before break nor drain first waits this long to retry.
MOVE_RETRY_SECONDS = 30.0
# How often a drain looks at the leader's in-flight requests again.
DRAIN_RECHECK_SECONDS = 1.0


# ---------------------------------------------------------------------------- record


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class PodRef(_Frozen):
    """A pod by name and UID (the UID is the precondition of every delete)."""

    name: str
    uid: str


class IncidentRecord(_Frozen):
    """The open incident of a group, as much as recovery needs to close it."""

    id: str
    verdict: str
    epoch: int
    reason: str
    first_failure_at: float
    detected_at: float
    evidence: str = ""
    action: str = ""
    attempts: int = 0
    # Why the last attempt recreated the group instead of restarting it in place.
    escalation: str = ""
    # Pods the verdict implicated (their nodes are avoided when the group is recreated).
    culprits: tuple[str, ...] = ()


class GroupRecord(_Frozen):
    """Everything recovery remembers about one group; small and JSON-serialisable.

    Stored by the I/O layer in status and in an annotation (`to_json`/`from_json`).
    Unknown fields are ignored on load so an older operator can read a newer record.
    """

    role: Role
    index: int = Field(ge=0)
    step: Step = Step.STARTING
    # The restart mechanism of the recovery in flight (decided per attempt).
    mode: Literal["InPlace", "Recreate"] = "Recreate"
    epoch: int = Field(0, ge=0)
    step_since: float = 0.0
    epoch_started_at: float = 0.0
    failures: int = 0
    first_failure_at: float | None = None
    last_verdict: str | None = None
    last_reason: str | None = None
    last_observed_at: float | None = None
    # The probe sample last counted (`GroupVerdict.sample`): never counted twice.
    last_sample: str | None = None
    last_suspect_event_at: float | None = None
    healthy_since: float | None = None
    incident: IncidentRecord | None = None
    incident_seq: int = 0
    old_pods: tuple[PodRef, ...] = ()
    force_deleted: bool = False
    restarts: int = 0
    restart_times: tuple[float, ...] = ()
    backoff_streak: int = 0
    last_restart_at: float | None = None
    handled_request: str | None = None
    manual: bool = False
    deferred: str | None = None
    # Restart count of each pod (by UID) when its epoch started or was adopted: pass it
    # to `GroupObservation.restart_baseline`, so only a restart after that is a RankDown.
    restart_baseline: dict[str, int] = Field(default_factory=dict)
    # In place: each old pod's restart count (by UID) when its agent was asked to restart.
    asked_counts: dict[str, int] = Field(default_factory=dict)
    last_in_place_at: float | None = None
    # Recreate: nodes the new pods should avoid when capacity allows.
    avoid_nodes: tuple[str, ...] = ()
    # The restart under way rolls out a new pod template: recreate, never in place.
    rollout: bool = False
    # The open incident's evidence capture was asked for (CapturingEvidence).
    capture_asked: bool = False
    # Which name slot the current epoch's pods use (0 or 1): a make-before-break move
    # starts the next epoch in the other slot, so old and new pods coexist.
    slot: int = Field(0, ge=0, le=1)
    # Why the group is moving for maintenance (None: it is not), and the nodes it leaves.
    maintenance: str | None = None
    maintenance_nodes: tuple[str, ...] = ()
    # When the pods leaving service were out of every router (the drain's start), and
    # whether their in-flight requests are done (or the drain timed out).
    drained_at: float | None = None
    drain_done: bool = False
    # Epochs withdrawn in a row because their pods could not all be placed; when the
    # next attempt may start; the scheduler's reason.
    withdrawals: int = 0
    retry_at: float | None = None
    unschedulable: str | None = None

    def to_json(self) -> str:
        """The compact JSON stored in the group's annotation."""
        return self.model_dump_json(exclude_defaults=True)

    @classmethod
    def from_json(cls, text: str) -> GroupRecord:
        """Load a record written by `to_json` (raises pydantic's ValidationError)."""
        return cls.model_validate_json(text)


def new_group_record(role: Role, index: int, *, now: float, epoch: int = 0) -> GroupRecord:
    """The record of a group whose pods of `epoch` were just created."""
    return GroupRecord(role=role, index=index, epoch=epoch, step_since=now, epoch_started_at=now)


def adopt_group(role: Role, index: int, pods: Sequence[PodView], *, now: float) -> GroupRecord:
    """The record of a group found running without one (a fresh operator install or a
    lost annotation): the newest epoch among its pods, in `Starting` (so the next passing
    probe admits it), with today's restart counts as the baseline — restarts that
    happened before lockstep looked are not a reason to restart the group now.

    Create records with this before classifying the group's first observation.
    """
    epoch = max((p.epoch for p in pods if p.epoch is not None), default=0)
    record = new_group_record(role, index, now=now, epoch=epoch)
    return record.model_copy(update={"restart_baseline": _baseline(pods, epoch)})


def retired(record: GroupRecord, pods: Sequence[PodView]) -> bool:
    """A retiring group whose pods are all gone: the I/O layer forgets its record."""
    return record.step is Step.RETIRING and not pods


def reconciler_may_create_pods(record: GroupRecord) -> bool:
    """False while recovery decides which pods of the group exist (delete..create)."""
    return record.step not in POD_OWNING_STEPS


def status_state(record: GroupRecord) -> GroupState:
    """The group's `state` for status and `kubectl get` (models.GroupState)."""
    step = record.step
    if step in MOVE_STEPS or (record.maintenance and step not in _STEP_STATE):
        return "Moving"
    if step is Step.UNSCHEDULABLE:
        return "Unschedulable"
    if step is Step.RETIRING:
        return "Retiring"
    if step in (Step.STARTING, Step.HEALTHY, Step.SUSPECT, Step.QUARANTINED):
        if step is Step.SUSPECT and record.incident is not None:
            return _verdict_state(record.incident.verdict)
        return _STEP_STATE[step]
    if step is Step.OBSERVING and record.incident is not None:
        return _verdict_state(record.incident.verdict)
    return "Recovering"


_STEP_STATE: dict[Step, GroupState] = {
    Step.STARTING: "Starting",
    Step.HEALTHY: "Healthy",
    Step.SUSPECT: "Suspect",
    Step.QUARANTINED: "Quarantined",
}


def _verdict_state(verdict: str) -> GroupState:
    if verdict == "Desynced":
        return "Desynced"
    if verdict == "Hung":
        return "Hung"
    if verdict == "RankDown":
        return "RankDown"
    return "Suspect"


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class SetGate:
    """Set the `lockstep.dev/group-healthy` readiness-gate condition on these pods."""

    pods: tuple[PodRef, ...]
    value: bool


@dataclass(frozen=True)
class EndRequests:
    """End at once, with a retryable 503, every request the group's leaders hold (and
    fence them: new work refused), and the halves of its PD pairs that peers of the other
    role hold for it (`lockstep.failover`). Emitted after the group left every router
    (its `SetGate` false), so the router's retries go to healthy pairs; safe to repeat
    (what has ended is no longer held)."""

    pods: tuple[PodRef, ...]
    reason: str


@dataclass(frozen=True)
class CaptureEvidence:
    """Read rank states, stacks and last log lines of these pods into the incident."""

    incident_id: str
    pods: tuple[PodRef, ...]
    stacks: bool
    log_lines: int
    max_bytes: int


@dataclass(frozen=True)
class DeletePods:
    """Delete these pods, each with its UID as precondition (404/409 mean done).
    `restart`: the delete is part of a restart (counted in the restart metric); a move
    or a withdrawn epoch is not."""

    pods: tuple[PodRef, ...]
    grace_seconds: int
    restart: bool = True


@dataclass(frozen=True)
class RestartInPlace:
    """Restart these pods' containers in place into `epoch`: relabel each pod with the
    epoch (UID as precondition), then `POST /restart` to each pod agent once. A pod whose
    relabel or request fails is reported back in `GroupInput.restart_failures`."""

    pods: tuple[PodRef, ...]
    epoch: int
    reason: str


@dataclass(frozen=True)
class CreateEpoch:
    """Create every pod (and the headless Service) of the group in `epoch` (409 = done),
    preferring nodes other than `avoid_nodes`."""

    epoch: int
    avoid_nodes: tuple[str, ...] = ()
    slot: int = 0


@dataclass(frozen=True)
class OpenIncident:
    """Add the incident to status (upsert by id)."""

    incident: Incident


@dataclass(frozen=True)
class UpdateIncident:
    """Replace the incident with this id in status."""

    incident: Incident


@dataclass(frozen=True)
class CloseIncident:
    """Replace the incident with this id in status, now closed with its figures."""

    incident: Incident


@dataclass(frozen=True)
class EmitEvent:
    """An Event on the PDDeployment (and a metric named after the reason)."""

    reason: Reason
    message: str
    warning: bool = False


Action = (
    SetGate
    | EndRequests
    | CaptureEvidence
    | RestartInPlace
    | DeletePods
    | CreateEpoch
    | OpenIncident
    | UpdateIncident
    | CloseIncident
    | EmitEvent
)


@dataclass(frozen=True)
class GroupInput:
    """This round's facts about one group.

    `pods`: every pod of the group the API server lists (any epoch). `verdict`: this
    round's classification, or None when the group was not probed this round.
    `manual_request`: the id of the group's restart request, if one is set.
    `restart_failures`: pod UID -> why its in-place restart into the record's epoch could
    not be asked (relabel refused, agent unreachable or refusing). `template_changed`:
    the manual request rolls out a new pod template (so the restart must recreate).
    `captured`: the open incident's evidence was captured (and what it found).
    """

    pods: tuple[PodView, ...] = ()
    verdict: GroupVerdict | None = None
    manual_request: str | None = None
    restart_failures: Mapping[str, str] = field(default_factory=dict)
    # Of those, the pods whose agent could not be reached at all (no answer, not a "no").
    restart_unreachable: frozenset[str] = frozenset()
    # The manual request rolls a changed pod template out: only new pods apply it.
    template_changed: bool = False
    # What the evidence store holds for the record's open incident, once captured.
    captured: CapturedEvidence | None = None
    # Why the group must leave its nodes (a pod of its current epoch is on a node that
    # is cordoned or tainted for maintenance), and those nodes; None: it need not.
    maintenance: str | None = None
    maintenance_nodes: tuple[str, ...] = ()
    # Work requests each leader pod (by name) holds, for a group draining on purpose
    # (None: the leader did not answer).
    inflight: Mapping[str, int | None] = field(default_factory=dict)
    # The group is beyond the role's replicas: it leaves (drained first). See plan_role.
    retire: bool = False


@dataclass(frozen=True)
class CapturedEvidence:
    """The capture of an incident's evidence is done (`CaptureEvidence` executed): fed
    back to the planner, which refines the incident's verdict and cause from it once.
    `cause`: a consensus divergence found in the captured rank states, if any."""

    incident_id: str
    cause: str | None = None


@dataclass(frozen=True)
class RoleSettings:
    """What recovery needs from the spec for one role."""

    role: Role
    pods_per_group: int
    health: HealthSpec = field(default_factory=HealthSpec)
    recovery: RecoverySpec = field(default_factory=RecoverySpec)
    maintenance: MaintenanceSpec = field(default_factory=MaintenanceSpec)
    scheduling_timeout_seconds: float = 300.0

    @classmethod
    def from_spec(cls, spec: PDDeploymentSpec, role: Role) -> RoleSettings:
        """The settings of `role` in a PDDeployment spec."""
        r = spec.role(role)
        return cls(
            role,
            r.pods_per_group,
            spec.health,
            spec.recovery,
            spec.maintenance,
            float(r.placement.scheduling_timeout_seconds),
        )


@dataclass(frozen=True)
class GroupPlan:
    """The next record of a group and what to do to get there.

    `requeue_after`: plan again after this many seconds even without a new observation
    (0: at once, a transition needs no I/O); None: the next probe round is soon enough.
    """

    record: GroupRecord
    actions: tuple[Action, ...] = ()
    requeue_after: float | None = None


@dataclass(frozen=True)
class RolePlan:
    """The plans of every group of a role."""

    groups: Mapping[int, GroupPlan]

    @property
    def degraded(self) -> bool:
        """A group is quarantined: the caller sets the `Degraded` condition."""
        return any(p.record.step is Step.QUARANTINED for p in self.groups.values())

    @property
    def quarantined(self) -> list[int]:
        """The quarantined groups, for the Degraded condition's message."""
        return sorted(i for i, p in self.groups.items() if p.record.step is Step.QUARANTINED)


@dataclass(frozen=True)
class RoleGuards:
    """What the role's guard rails allow one group this round (see `plan_role`)."""

    slot_granted: bool
    may_leave_service: bool
    restarting: int
    # Why a group beyond replicas may not start retiring now (None: it may).
    retire_blocked: str | None = None


# --------------------------------------------------------------------------- planning


def plan_role(
    settings: RoleSettings,
    records: Mapping[int, GroupRecord],
    inputs: Mapping[int, GroupInput],
    *,
    now: float,
) -> RolePlan:
    """Plan one round for every group of a role, applying the role's guard rails.

    A group in `inputs` without a record is adopted (`adopt_group`).
    """
    recs = dict(records)
    for index, inp in inputs.items():
        if index not in recs:
            recs[index] = adopt_group(settings.role, index, inp.pods, now=now)
    restarting = sum(r.step in RESTARTING_STEPS for r in recs.values())
    waiting = sorted(
        (
            r
            for r in recs.values()
            if r.step is Step.AWAITING_RESTART and _restart_allowed(r, settings, now)
        ),
        key=lambda r: (r.incident.detected_at if r.incident else now, r.index),
    )
    free = max(0, settings.recovery.max_concurrent_group_restarts - restarting)
    granted = {r.index for r in waiting[:free]}
    plans: dict[int, GroupPlan] = {}
    blocked = _retire_blocked(recs, inputs)
    for index in sorted(recs):
        # A group planned this round to leave service for maintenance has left it: two
        # groups never drain for maintenance in the same round.
        others = [
            plans[i].record if i in plans and plans[i].record.maintenance else r
            for i, r in recs.items()
            if i != index
        ]
        guards = RoleGuards(
            slot_granted=index in granted,
            may_leave_service=_may_leave_service(others),
            restarting=restarting,
            retire_blocked=blocked,
        )
        plans[index] = plan_group(
            recs[index], inputs.get(index, GroupInput()), settings, guards=guards, now=now
        )
    return RolePlan(plans)


def plan_group(
    record: GroupRecord,
    inp: GroupInput,
    settings: RoleSettings,
    *,
    now: float,
    guards: RoleGuards | None = None,
) -> GroupPlan:
    """Plan one round for one group (guards default to a role with only this group)."""
    g = guards or RoleGuards(
        slot_granted=record.step is Step.AWAITING_RESTART
        and _restart_allowed(record, settings, now),
        may_leave_service=True,
        restarting=0,
    )
    return _Planner(record, inp, settings, g, now).run()


def restarts_in_window(record: GroupRecord, recovery: RecoverySpec, now: float) -> int:
    """Restarts of the group within the budget window ending now."""
    window = recovery.budget.window_seconds
    return sum(1 for t in record.restart_times if now - t < window)


def backoff_until(record: GroupRecord, recovery: RecoverySpec) -> float | None:
    """When the next restart of the group may start (None: at once)."""
    if record.backoff_streak == 0 or record.last_restart_at is None:
        return None
    b = recovery.backoff
    # Cap the exponent: the delay saturates at max_seconds long before 2^32.
    delay = min(b.base_seconds << min(record.backoff_streak - 1, 32), b.max_seconds)
    return record.last_restart_at + delay


def _restart_allowed(record: GroupRecord, settings: RoleSettings, now: float) -> bool:
    """The group may take a slot now (budget left and backoff over, or a manual request)."""
    if record.manual or record.maintenance:
        return True  # a person asked, or a move for maintenance: not a failure
    if restarts_in_window(record, settings.recovery, now) >= settings.recovery.budget.restarts:
        return False
    until = backoff_until(record, settings.recovery)
    return until is None or now >= until


def _retire_blocked(
    records: Mapping[int, GroupRecord], inputs: Mapping[int, GroupInput]
) -> str | None:
    """Why a scale-down may not take a group out of service now (None: it may).

    The groups that stay (not retiring) must include one in service, so a scale-down
    never takes the role's last healthy group, and none of them may be recovering a
    failure: a scale-down waits until the role is whole again.
    """
    staying = [r for i, r in records.items() if not inputs.get(i, GroupInput()).retire]
    if not staying:
        return None  # scaled to zero on purpose: every group goes
    recovering = [
        r
        for r in staying
        if (
            (r.step in BROKEN_STEPS or r.step in RESTARTING_STEPS or r.step is Step.UNSCHEDULABLE)
            and not r.maintenance
        )
        or (r.step is Step.SUSPECT and r.incident is not None)
    ]
    if recovering:
        names = ", ".join(f"group {r.index} ({r.step})" for r in recovering)
        return f"the role is recovering {names}"
    if not any(r.step is Step.HEALTHY or r.step in MOVE_STEPS for r in staying):
        return "no group that stays is in service yet"
    return None


def _may_leave_service(others: Sequence[GroupRecord]) -> bool:
    healthy_peer = any(
        r.step is Step.HEALTHY
        or r.step in MOVE_STEPS  # its old pods serve, then its new ones
        or (r.step is Step.SUSPECT and r.incident is None)
        for r in others
    )
    # A group moving for maintenance is on its way back, not broken.
    all_broken = all(
        (r.step in BROKEN_STEPS and not r.maintenance)
        or (r.step is Step.SUSPECT and r.incident is not None)
        for r in others
    )
    return healthy_peer or all_broken


class _Planner:
    """One planning round of one group: mutable scratch state, pure inputs."""

    def __init__(
        self,
        record: GroupRecord,
        inp: GroupInput,
        settings: RoleSettings,
        guards: RoleGuards,
        now: float,
    ) -> None:
        self.rec = record
        self.inp = inp
        self.s = settings
        self.g = guards
        self.now = now
        self.actions: list[Action] = []
        self.requeue: float | None = None
        self.name = f"{settings.role} group {record.index}"

    # -- helpers

    def update(self, **changes: object) -> None:
        self.rec = self.rec.model_copy(update=changes)

    def goto(self, step: Step, **changes: object) -> None:
        self.update(
            step=step,
            step_since=self.now,
            deferred=None,
            capture_asked=False,
            drain_done=False,
            **changes,
        )
        self.requeue = 0.0

    def event(self, reason: Reason, message: str, *, warning: bool = False) -> None:
        self.actions.append(EmitEvent(reason, f"{self.name}: {message}", warning))

    def again_in(self, seconds: float) -> None:
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def pods(self) -> list[PodView]:
        return list(self.inp.pods)

    def current_pods(self) -> list[PodView]:
        return [p for p in self.inp.pods if p.epoch == self.rec.epoch]

    def defer(self, key: str, message: str, reason: Reason = Reason.DEFERRED) -> None:
        """A RestartDeferred (or ScaleDownDeferred) event once per reason, not once per
        round."""
        if self.rec.deferred != key:
            self.update(deferred=key)
            self.event(reason, message)

    # -- the round

    def run(self) -> GroupPlan:
        verdict = self._fresh_verdict()
        if verdict is not None:
            self.update(
                last_observed_at=verdict.observed_at,
                last_sample=verdict.sample or self.rec.last_sample,
                last_verdict=verdict.verdict.value,
                last_reason=verdict.reason,
            )
        if self.inp.retire or self.rec.step is Step.RETIRING:
            self._retire()
        elif not self._manual_request():
            handler = getattr(self, f"_on_{self.rec.step.name.lower()}")
            handler(verdict)
        return GroupPlan(self.rec, tuple(self.actions), self.requeue)

    def _fresh_verdict(self) -> GroupVerdict | None:
        # Count each observation once (the caller may plan several times per probe) and
        # drop verdicts about an epoch this record has already left behind.
        v = self.inp.verdict
        if v is None or v.epoch != self.rec.epoch:
            return None
        if v.sample is not None:
            # A probe sample counts once, by its identity (a timestamp recomputed from
            # two clocks drifts, and once made one sample count twice).
            return None if v.sample == self.rec.last_sample else v
        last = self.rec.last_observed_at
        if last is not None and v.observed_at <= last:
            return None
        return v

    def _manual_request(self) -> bool:
        """Handle a new manual request; True when it decided this round."""
        req = self.inp.manual_request
        if not req or req == self.rec.handled_request:
            return False
        self.update(handled_request=req)
        if self.s.recovery.policy == "ObserveOnly":
            self.event(Reason.RESTART_REFUSED, f"request {req} refused: policy is ObserveOnly")
            return False
        if self.rec.step in RESTARTING_STEPS:
            self.event(
                Reason.RESTART_REQUESTED, f"request {req}: already restarting ({self.rec.step})"
            )
            return False
        if self.rec.step in (Step.DRAINING, Step.CAPTURING_EVIDENCE, Step.AWAITING_RESTART):
            # Already on the way to a restart: the request lifts backoff and budget for it.
            # The role's slots were granted on the record without it: go on next round.
            self.update(manual=True)
            self.event(Reason.RESTART_REQUESTED, f"request {req}: restart already under way")
            self.requeue = 0.0
            return True
        if self.inp.template_changed:
            self.update(rollout=True)
        if self.rec.step is Step.QUARANTINED:
            # Quarantine lasts until a person asks; asking starts a fresh budget.
            self.update(restart_times=(), backoff_streak=0)
        if self.rec.incident is None:
            self._open_incident(
                MANUAL_VERDICT, f"manual restart request {req}", "", first_failure=self.now
            )
        self._set_action(f"drain and restart the whole group on request {req}")
        self.event(Reason.RESTART_REQUESTED, f"restart requested ({req})")
        self.goto(Step.DRAINING, manual=True, failures=0, first_failure_at=None)
        return True

    # -- incidents

    def _open_incident(
        self,
        verdict: str,
        reason: str,
        evidence: str,
        first_failure: float,
        culprits: frozenset[str] = frozenset(),
    ) -> None:
        seq = self.rec.incident_seq + 1
        incident = IncidentRecord(
            id=f"{self.s.role}-{self.rec.index}-{seq}",
            verdict=verdict,
            epoch=self.rec.epoch,
            reason=reason,
            first_failure_at=first_failure,
            detected_at=self.now,
            evidence=_bound(evidence, self.s.recovery.diagnostics.max_evidence_bytes),
            culprits=tuple(sorted(culprits)),
        )
        self.update(incident=incident, incident_seq=seq, healthy_since=None)
        self.actions.append(OpenIncident(self._incident_model(incident)))

    def _set_action(self, action: str) -> None:
        incident = self.rec.incident
        if incident is None or incident.action == action:
            return
        incident = incident.model_copy(update={"action": action})
        self.update(incident=incident)
        self.actions.append(UpdateIncident(self._incident_model(incident)))

    def _close_incident(self, action: str) -> None:
        incident = self.rec.incident
        if incident is None:
            return
        incident = incident.model_copy(update={"action": action})
        self.actions.append(CloseIncident(self._incident_model(incident, recovered_at=self.now)))
        self.update(incident=None)

    def _incident_model(self, inc: IncidentRecord, recovered_at: float | None = None) -> Incident:
        return Incident(
            id=inc.id,
            role=self.s.role,
            group=self.rec.index,
            epoch=inc.epoch,
            verdict=inc.verdict,
            state="Open" if recovered_at is None else "Closed",
            action=inc.action,
            restart_mode=self.rec.mode if inc.attempts else None,
            escalation=inc.escalation or None,
            first_failure_time=rfc3339(inc.first_failure_at),
            detected_time=rfc3339(inc.detected_at),
            recovered_time=None if recovered_at is None else rfc3339(recovered_at),
            time_to_detect_seconds=round(inc.detected_at - inc.first_failure_at, 3),
            time_to_recover_seconds=(
                None if recovered_at is None else round(recovered_at - inc.detected_at, 3)
            ),
            evidence=inc.evidence,
        )

    # -- verdicts

    def _count_failure(self, v: GroupVerdict, *, in_service: bool) -> None:
        """A failed observation of a group in service: Suspect, or a verdict."""
        failures = self.rec.failures + 1
        first = (
            self.rec.first_failure_at if self.rec.first_failure_at is not None else v.observed_at
        )
        self.update(failures=failures, first_failure_at=first)
        if v.immediate or failures >= self.s.health.failure_threshold:
            self._reach_verdict(v, leaving_service=in_service)
        elif self.rec.step is not Step.SUSPECT:
            self.goto(Step.SUSPECT)
            self.requeue = None
            last = self.rec.last_suspect_event_at
            if last is None or self.now - last >= SUSPECT_EVENT_INTERVAL_SECONDS:
                # A Suspect that resolves on its own is status, not news: one warning
                # per group per interval (a verdict always gets its own Event).
                self.update(last_suspect_event_at=self.now)
                self.event(
                    Reason.SUSPECT,
                    f"{v.verdict}: {v.reason} ({failures}/{self.s.health.failure_threshold})",
                    warning=True,
                )

    def _reach_verdict(self, v: GroupVerdict, *, leaving_service: bool) -> None:
        first = (
            self.rec.first_failure_at if self.rec.first_failure_at is not None else v.observed_at
        )
        self._open_incident(
            v.verdict.value, v.reason, _evidence_text(v), first_failure=first, culprits=v.culprits
        )
        self.event(
            _VERDICT_REASON.get(v.verdict, Reason.UNRESPONSIVE),
            f"{v.verdict} in epoch {self.rec.epoch}: {v.reason}",
            warning=True,
        )
        self._begin_recovery(leaving_service=leaving_service)

    def _begin_recovery(self, *, leaving_service: bool, note: str = "") -> None:
        """Start draining, unless the policy or the role's last group in service forbid."""
        if self.s.recovery.policy == "ObserveOnly":
            self._set_action("observed only (policy ObserveOnly)")
            self.goto(Step.OBSERVING)
            self.requeue = None
            return
        if leaving_service and not self.g.may_leave_service:
            if self.rec.step is not Step.SUSPECT:
                self.goto(Step.SUSPECT)
                self.requeue = None
            self._set_action("deferred: last group of the role in service")
            self.defer(
                "last-in-service",
                "restart deferred: it is the last group of the role in service and another "
                "group is still coming back",
            )
            return
        self._set_action(f"drain and restart the whole group{note}")
        self.goto(Step.DRAINING, failures=0, first_failure_at=None)

    def _attempt_failed(self, reason: str, verdict: str) -> None:
        """The epoch being started did not come up: treat it as another failure."""
        if self.rec.incident is None:
            self._open_incident(verdict, reason, "", first_failure=self.now)
            self.event(
                _VERDICT_REASON.get(Verdict(verdict), Reason.UNRESPONSIVE),
                f"epoch {self.rec.epoch} did not come up: {reason}",
                warning=True,
            )
            self._begin_recovery(leaving_service=False)
            return
        attempts = self.rec.incident.attempts
        self.event(
            Reason.RESTART_FAILED,
            f"epoch {self.rec.epoch} did not come up: {reason}",
            warning=True,
        )
        self._begin_recovery(leaving_service=False, note=f"; attempt {attempts} failed: {reason}")

    # -- steps (one method per Step, named after it)

    def _on_starting(self, v: GroupVerdict | None) -> None:
        self._wait_first_pass(v)

    def _on_waiting_probe(self, v: GroupVerdict | None) -> None:
        self._wait_first_pass(v)

    def _wait_first_pass(self, v: GroupVerdict | None) -> None:
        if self._placement_expired():
            return
        if v is not None and v.verdict is Verdict.HEALTHY:
            self.goto(Step.READMITTING)
            return
        if v is not None and v.is_failure and v.signals & BROKEN_SIGNALS:
            self._attempt_failed(v.reason, v.verdict.value)
            return
        deadline = self.rec.epoch_started_at + self.s.health.startup_grace_seconds
        if self.now >= deadline:
            why = (
                f"no deep probe passed within startupGraceSeconds="
                f"{self.s.health.startup_grace_seconds}"
            )
            if self.rec.last_reason:
                why += f" (last: {self.rec.last_reason})"
            self._attempt_failed(why, Verdict.UNKNOWN.value)
            return
        self.again_in(deadline - self.now)

    def _on_healthy(self, v: GroupVerdict | None) -> None:
        reset = self.s.recovery.backoff.reset_after_seconds
        since = self.rec.healthy_since
        if self.rec.backoff_streak and since is not None and self.now - since >= reset:
            self.update(backoff_streak=0)
        if self._maintenance_due():
            return
        if v is None:
            return
        if v.is_failure:
            self._count_failure(v, in_service=True)
        else:
            self.update(failures=0, first_failure_at=None)

    def _on_suspect(self, v: GroupVerdict | None) -> None:
        if self.rec.incident is not None:
            # A verdict was reached but the role's guard kept the group in service.
            if v is not None and not v.is_failure:
                self.goto(Step.READMITTING)
                return
            self._begin_recovery(leaving_service=True)
            return
        if self._maintenance_due():
            return
        if v is None:
            return
        if v.is_failure:
            self._count_failure(v, in_service=True)
        else:
            # Slow is progress: a probe that times out under load never restarts a group.
            self.goto(Step.HEALTHY, failures=0, first_failure_at=None)
            self.requeue = None

    def _on_observing(self, v: GroupVerdict | None) -> None:
        if v is not None and not v.is_failure:
            # Through Readmitting: a group that never passed a probe has no gate yet.
            self.goto(Step.READMITTING)
            return
        if self.s.recovery.policy != "ObserveOnly":
            self._begin_recovery(leaving_service=True)

    def _on_draining(self, v: GroupVerdict | None) -> None:
        todo = [p for p in self.pods() if not p.deleting and p.gate is not False]
        broken = not self.rec.maintenance
        if todo:
            self.actions.append(SetGate(_refs(todo), False))
            if broken:
                # Out of the routers first (the action before), then nothing in flight
                # waits on the group: its requests and its peers' halves end, retryable.
                self.actions.append(EndRequests(_refs(self.pods()), self._end_reason()))
            self.again_in(RECHECK_SECONDS)
            return
        if self.rec.maintenance:
            # Leaving service on purpose: the requests it holds finish first (bounded).
            if not self._drained(self.pods()):
                return
            self.goto(Step.AWAITING_RESTART)
            return
        self.event(Reason.DRAINED, "out of the router (readiness gate false on every pod)")
        # Once more as the drain completes: halves the router placed in the instant before
        # it let go of the group are old enough now to be told from live ones.
        self.actions.append(EndRequests(_refs(self.pods()), self._end_reason()))
        self.goto(Step.CAPTURING_EVIDENCE)

    def _end_reason(self) -> str:
        inc = self.rec.incident
        what = inc.verdict if inc is not None else "out of service"
        return (
            f"{self.s.role}/{self.rec.index} ({what}) is being restarted by lockstep; "
            "retry on another group"
        )

    def _on_capturing_evidence(self, v: GroupVerdict | None) -> None:
        incident = self.rec.incident
        diag = self.s.recovery.diagnostics
        if incident is None or not self.pods():
            self.goto(Step.AWAITING_RESTART)
            return
        captured = self.inp.captured
        if captured is not None and captured.incident_id == incident.id:
            self._refine(captured)
            self.goto(Step.AWAITING_RESTART)
            return
        if self.now - self.rec.step_since >= CAPTURE_TIMEOUT_SECONDS:
            # The capture never reached the evidence store: restart without it.
            self.event(
                Reason.EVIDENCE_MISSING,
                f"no evidence captured after {CAPTURE_TIMEOUT_SECONDS:.0f}s; restarting without",
                warning=True,
            )
            self.goto(Step.AWAITING_RESTART)
            return
        if not self.rec.capture_asked:
            self.actions.append(
                CaptureEvidence(
                    incident.id,
                    _refs(self.pods()),
                    diag.capture_stacks,
                    diag.log_lines,
                    diag.max_evidence_bytes,
                )
            )
            self.update(capture_asked=True)
            self.requeue = 0.0  # the capture is done in this round's I/O
        else:
            self.again_in(RECHECK_SECONDS)

    def _refine(self, captured: CapturedEvidence) -> None:
        """The one place an incident's verdict and cause change after it opened: ranks
        that died because the consensus caught a divergence are a desync (the exit was
        only its consequence)."""
        incident = self.rec.incident
        if incident is None or not captured.cause:
            return
        changes: dict[str, object] = {
            "evidence": _bound(
                f"cause: {captured.cause}\n{incident.evidence}",
                self.s.recovery.diagnostics.max_evidence_bytes,
            )
        }
        if incident.verdict == Verdict.RANK_DOWN.value:
            changes["verdict"] = Verdict.DESYNCED.value
            changes["reason"] = clip_evidence(captured.cause)
            self.update(last_verdict=Verdict.DESYNCED.value)
            self.event(
                Reason.DESYNCED,
                f"the ranks went down on a consensus divergence: {captured.cause}",
                warning=True,
            )
        incident = incident.model_copy(update=changes)
        self.update(incident=incident)
        self.actions.append(UpdateIncident(self._incident_model(incident)))

    def _on_awaiting_restart(self, v: GroupVerdict | None) -> None:
        rec, rs = self.rec, self.s.recovery
        if not rec.manual:
            used = restarts_in_window(rec, rs, self.now)
            if used >= rs.budget.restarts:
                why = (
                    f"{used} restarts within {rs.budget.window_seconds}s "
                    f"(budget {rs.budget.restarts}); restart by hand to retry (until then a "
                    "node drain may evict its pods)"
                )
                self._set_action(f"quarantined: {why}")
                self.event(Reason.QUARANTINED, f"quarantined: {why}", warning=True)
                self.goto(Step.QUARANTINED)
                self.requeue = None
                return
            until = backoff_until(rec, rs)
            if until is not None and self.now < until:
                self.defer("backoff", f"restart deferred by backoff for {until - self.now:.0f}s")
                self.again_in(until - self.now)
                return
        if not self.g.slot_granted:
            self.defer(
                "concurrency",
                f"restart deferred: {self.g.restarting} group(s) of the role restarting "
                f"(maxConcurrentGroupRestarts={rs.max_concurrent_group_restarts})",
            )
            return
        window = rs.budget.window_seconds
        times = (*(t for t in rec.restart_times if self.now - t < window), self.now)
        attempts = rec.incident.attempts + 1 if rec.incident else 1
        if rec.incident is not None:
            self.update(incident=rec.incident.model_copy(update={"attempts": attempts}))
        counted = {
            "restarts": rec.restarts + 1,
            "restart_times": times[-MAX_RESTART_TIMES:],
            "backoff_streak": rec.backoff_streak + 1,
            "last_restart_at": self.now,
            "manual": False,
        }
        if rec.maintenance:
            # A move is not a failure: no restart counted, no backoff, never in place
            # (the same pods would stay on the node that is going away).
            self._set_action(
                f"recreate the whole group on other nodes (maintenance: {rec.maintenance})"
            )
            self._recreate(set(), avoid=rec.maintenance_nodes, changes={"manual": False})
            return
        why_not = self._why_not_in_place()
        if why_not is None:
            self._restart_in_place(attempts, counted)
            return
        culprits = set(rec.incident.culprits) if rec.incident else set()
        self.update(mode="Recreate")
        if rs.mode == "InPlace":
            self._note_escalation(why_not)
            self._set_action(f"restart the whole group (Recreate; attempt {attempts}): {why_not}")
        else:
            self._set_action(f"restart the whole group (Recreate; attempt {attempts})")
        self._recreate(culprits, changes=counted)

    def _note_escalation(self, why: str) -> None:
        if self.rec.incident is not None:
            incident = self.rec.incident.model_copy(update={"escalation": why})
            self.update(incident=incident)

    def _why_not_in_place(self) -> str | None:
        """Why this attempt must recreate the group (None: restart it in place)."""
        rs, rec = self.s.recovery, self.rec
        if rs.mode == "Recreate":
            return "recovery.mode is Recreate"
        if rec.rollout:
            return "a new pod template is rolled out (only new pods apply it)"
        window = rs.in_place.escalation_window_seconds
        if rec.last_in_place_at is not None and self.now - rec.last_in_place_at < window:
            return (
                f"failed again {self.now - rec.last_in_place_at:.0f}s after an in-place "
                f"restart (inPlace.escalationWindowSeconds={window})"
            )
        pods = self._in_place_pods()
        if len(pods) < self.s.pods_per_group:
            return f"{self.s.pods_per_group - len(pods)} pod(s) of the group are gone or going"
        bad = [p.name for p in pods if p.evicted or p.phase in ("Failed", "Succeeded")]
        if bad:
            return f"pod(s) {', '.join(bad)} cannot restart in place (evicted or ended)"
        return None

    def _in_place_pods(self) -> list[PodView]:
        """The pods an in-place restart asks: those of the current epoch, and those an
        earlier round already relabelled with the next one (its record was lost)."""
        epochs = (self.rec.epoch, self.rec.epoch + 1)
        pods = (p for p in self.pods() if p.epoch in epochs and not p.deleting)
        return sorted(pods, key=lambda p: p.name)

    def _restart_in_place(self, attempts: int, counted: Mapping[str, object]) -> None:
        pods = self._in_place_pods()
        target = self.rec.epoch + 1
        self.update(mode="InPlace")
        # A pod relabelled by a lost round may have restarted already: count from the
        # epoch's baseline for it (a restart since then is taken as the one asked for).
        # A container that is down (restarting after its ranks exited, as they do on a
        # divergence) has no agent to ask yet: it is asked once it runs again.
        running = [p for p in pods if p.container_running]
        asked = {
            p.uid: (
                p.restart_count
                if p.epoch == self.rec.epoch
                else self.rec.restart_baseline.get(p.uid, p.restart_count)
            )
            for p in running
        }
        reason = self.rec.incident.id if self.rec.incident else "restart"
        self._set_action(
            f"restart the whole group in place into epoch {target} (attempt {attempts})"
        )
        self.event(
            Reason.RESTARTING_IN_PLACE,
            f"asking the agents of {len(pods)} pod(s) to restart into epoch {target}",
        )
        if running:
            self.actions.append(RestartInPlace(_refs(running), target, reason))
        self.goto(
            Step.RESTARTING_IN_PLACE,
            mode="InPlace",
            epoch=target,
            old_pods=_refs(pods),
            asked_counts=asked,
            last_in_place_at=self.now,
            avoid_nodes=(),
            **counted,
        )
        self.requeue = RECHECK_SECONDS

    def _recreate(
        self,
        culprits: set[str],
        *,
        avoid: Sequence[str] = (),
        changes: Mapping[str, object] | None = None,
    ) -> None:
        # Snapshot the pods to delete before the first delete: every retry of the delete
        # then names the same UIDs, whatever the API server shows by then.
        nodes = {p.node for p in self.pods() if p.name in culprits and p.node} | set(avoid)
        self.goto(
            Step.DELETING,
            mode="Recreate",
            old_pods=_refs(self.pods()),
            force_deleted=False,
            avoid_nodes=tuple(sorted(nodes)),
            rollout=False,
            **(changes or {}),
        )

    def _on_restarting_in_place(self, v: GroupVerdict | None) -> None:
        by_uid = {p.uid: p for p in self.pods()}
        old = self.rec.old_pods
        asked = dict(self.rec.asked_counts)
        failures = self.inp.restart_failures
        gone = [r.name for r in old if r.uid not in by_uid or by_uid[r.uid].deleting]
        if gone:
            self._escalate(
                f"pod(s) {', '.join(gone)} went away during the in-place restart", set(gone)
            )
            return
        refused = {
            r.name: failures[r.uid]
            for r in old
            if r.uid in asked and r.uid in failures and r.uid not in self.inp.restart_unreachable
        }
        silent = {
            r.name: failures[r.uid]
            for r in old
            if r.uid in asked and r.uid in failures and r.uid in self.inp.restart_unreachable
        }
        if silent and self.now - self.rec.step_since >= SILENT_AGENT_SECONDS:
            refused.update(silent)
        if refused:
            self._escalate(
                "the agent of "
                + "; ".join(
                    f"{name} did not accept the restart ({why})"
                    for name, why in sorted(refused.items())
                ),
                set(refused),
            )
            return
        # An agent not answering yet (its container was just starting again) is asked
        # again next round; one that stays silent escalates after SILENT_AGENT_SECONDS.
        retry = {r.uid for r in old if r.name in silent}
        ask = [
            by_uid[r.uid]
            for r in old
            if r.uid not in asked and r.uid not in retry and by_uid[r.uid].container_running
        ]
        if ask:
            reason = self.rec.incident.id if self.rec.incident else "restart"
            self.actions.append(RestartInPlace(_refs(ask), self.rec.epoch, reason))
            asked.update({p.uid: p.restart_count for p in ask})
        if retry or ask:
            self.update(asked_counts={u: n for u, n in asked.items() if u not in retry})
        asked = dict(self.rec.asked_counts)
        waiting = [
            r.name
            for r in old
            if r.uid not in asked
            or by_uid[r.uid].restart_count <= asked[r.uid]
            or by_uid[r.uid].epoch != self.rec.epoch
            # The count moves when the old container ends; the new one may still wait.
            or not by_uid[r.uid].container_running
        ]
        if not waiting:
            self._restarted([by_uid[r.uid] for r in old], "restarted in place")
            return
        timeout = self.s.recovery.in_place.restart_timeout_seconds
        if self.now - self.rec.step_since >= timeout:
            self._escalate(
                f"container(s) of {', '.join(waiting)} did not restart within "
                f"inPlace.restartTimeoutSeconds={timeout}",
                set(waiting),
            )
            return
        self.again_in(min(RECHECK_SECONDS, self.rec.step_since + timeout - self.now))

    def _restarted(self, pods: Sequence[PodView], what: str) -> None:
        """Every pod of the new epoch is there: wait for its deep probe."""
        attempts = self.rec.incident.attempts if self.rec.incident else 0
        self.event(
            Reason.RESTARTED,
            f"{what} as epoch {self.rec.epoch} ({self.rec.mode}, attempt {attempts})",
        )
        self.goto(
            Step.WAITING_PROBE,
            epoch_started_at=self.now,
            failures=0,
            restart_baseline=_baseline(pods, self.rec.epoch),
        )
        self.requeue = None

    def _escalate(self, why: str, culprits: set[str]) -> None:
        """An in-place restart that cannot finish: recreate the group instead (the same
        attempt: the restart was counted when it began)."""
        attempts = self.rec.incident.attempts if self.rec.incident else 0
        self.update(mode="Recreate")
        self._note_escalation(f"in-place restart escalated: {why}")
        self._set_action(f"in-place restart escalated to Recreate (attempt {attempts}): {why}")
        self.event(Reason.ESCALATED, f"in-place restart escalated to Recreate: {why}", warning=True)
        self._recreate(culprits)

    def _on_deleting(self, v: GroupVerdict | None) -> None:
        if self.rec.old_pods:
            self.actions.append(
                DeletePods(
                    self.rec.old_pods, DELETE_GRACE_SECONDS, restart=not self.rec.maintenance
                )
            )
        self.goto(Step.WAITING_GONE)

    def _on_waiting_gone(self, v: GroupVerdict | None) -> None:
        target = self.rec.epoch + 1
        # Anything of another epoch must go before the new epoch rendezvouses, and so
        # must the pods snapshotted for deletion even if a lost in-place round relabelled
        # them with the target epoch; new pods of the target epoch are never deleted here.
        doomed = {r.uid for r in self.rec.old_pods}
        left = [p for p in self.pods() if p.epoch != target or p.uid in doomed]
        if not left:
            self.goto(Step.CREATING, epoch=target)
            return
        alive = [p for p in left if not p.deleting]
        if alive:
            self.actions.append(
                DeletePods(_refs(alive), DELETE_GRACE_SECONDS, restart=not self.rec.maintenance)
            )
        if (
            not self.rec.force_deleted
            and self.now - self.rec.step_since >= FORCE_DELETE_AFTER_SECONDS
        ):
            self.actions.append(DeletePods(_refs(left), 0))
            self.event(
                Reason.FORCE_DELETED,
                f"{len(left)} pod(s) still terminating after {FORCE_DELETE_AFTER_SECONDS}s: "
                "deleted with grace 0",
                warning=True,
            )
            self.update(force_deleted=True)
        self.again_in(RECHECK_SECONDS)

    def _on_creating(self, v: GroupVerdict | None) -> None:
        have = [p for p in self.current_pods() if not p.deleting]
        if len(have) >= self.s.pods_per_group:
            self._restarted(have, "moved" if self.rec.maintenance else "restarted")
            return
        timeout = self.s.scheduling_timeout_seconds
        if self.now - self.rec.step_since >= timeout:
            self._withdraw(
                f"{self.s.pods_per_group - len(have)} pod(s) of epoch {self.rec.epoch} could "
                f"not be created within schedulingTimeoutSeconds={timeout:g}"
            )
            return
        self.actions.append(CreateEpoch(self.rec.epoch, self.rec.avoid_nodes, self.rec.slot))
        self.again_in(RECHECK_SECONDS)

    def _on_readmitting(self, v: GroupVerdict | None) -> None:
        todo = [p for p in self.current_pods() if not p.deleting and p.gate is not True]
        if todo:
            self.actions.append(SetGate(_refs(todo), True))
            self.again_in(RECHECK_SECONDS)
            return
        if self.rec.incident is not None and self.rec.maintenance:
            done = (
                f"moved for maintenance ({self.rec.maintenance}) by draining first; "
                f"re-admitted in epoch {self.rec.epoch}"
            )
            self._close_incident(done)
            self.event(Reason.MOVED, done)
        elif self.rec.incident is not None:
            attempts = self.rec.incident.attempts
            escalation = self.rec.incident.escalation
            why = f"; {escalation}" if escalation and self.rec.mode == "Recreate" else ""
            done = (
                f"restarted the whole group ({self.rec.mode}, {attempts} attempt(s){why})"
                if attempts
                else f"no restart ({self.rec.incident.action or 'none'}); recovered by itself"
            )
            self._close_incident(f"{done}; re-admitted in epoch {self.rec.epoch}")
            self.event(Reason.READMITTED, f"{done}; re-admitted in epoch {self.rec.epoch}")
        else:
            self.event(Reason.READY, f"admitted in epoch {self.rec.epoch}")
        self.goto(Step.HEALTHY, healthy_since=self.now, **_SETTLED)
        self.requeue = None

    def _on_quarantined(self, v: GroupVerdict | None) -> None:
        # Nothing until a manual request (handled before the step handlers run).
        return

    # -- scale-down: the group beyond replicas leaves, drained first

    def _retire(self) -> None:
        """A group beyond the role's replicas (`GroupInput.retire`): out of every router,
        its in-flight requests finish (bounded by maintenance.drainTimeoutSeconds), then
        its pods are deleted. The I/O layer forgets the record once no pod is left.
        Scaled back up meanwhile: a group still serving is kept, one already going is
        created anew."""
        if not self.inp.retire:
            self._unretire()
            return
        if self.rec.step is not Step.RETIRING:
            serving = any(p.gate is True and not p.deleting for p in self.pods())
            if serving and self.g.retire_blocked:
                self.defer(
                    "retire",
                    f"scale-down deferred: {self.g.retire_blocked}",
                    Reason.RETIRE_DEFERRED,
                )
                self.again_in(RECHECK_SECONDS * 5)
                return
            self.event(Reason.RETIRING, "scale-down: leaving the routers, then removed")
            if self.rec.incident is not None:
                self._close_incident("not restarted: the group was removed by a scale-down")
            self.goto(Step.RETIRING, drained_at=None, old_pods=_refs(self.pods()))
        pods = self.pods()
        leave = [p for p in pods if not p.deleting and p.gate is not False]
        if self.rec.drained_at is None and leave:
            self.actions.append(SetGate(_refs(leave), False))
            self.again_in(RECHECK_SECONDS)
            return
        if not self._drained(pods):
            return
        alive = [p for p in pods if not p.deleting]
        if alive:
            self.actions.append(DeletePods(_refs(alive), DELETE_GRACE_SECONDS, restart=False))
        if pods:
            self.again_in(RECHECK_SECONDS)
            return
        self.event(Reason.RETIRED, "scale-down: removed (no pod left)")
        self.requeue = None

    def _unretire(self) -> None:
        """Back within replicas while retiring."""
        if any(p.deleting for p in self.pods()) or not self.pods():
            self.goto(Step.WAITING_GONE, old_pods=_refs(self.pods()), drained_at=None)
            return
        self.event(Reason.RETIRING, "scale-down undone: the group stays")
        self.goto(Step.READMITTING, drained_at=None)

    # -- placement: an epoch is placed whole within schedulingTimeoutSeconds, or withdrawn

    def _placement_expired(self) -> bool:
        """The current epoch's pods are not all bound to nodes in time: withdraw it
        (True). Counted from the epoch's start; the scheduler's reason is kept."""
        pods = [p for p in self.current_pods() if not p.deleting]
        unplaced = [p for p in pods if p.node is None]
        if not unplaced:
            if self.rec.unschedulable:
                self.update(unschedulable=None)
            return False
        why = _unplaced_reason(unplaced)
        if why != self.rec.unschedulable:
            self.update(unschedulable=why)
        timeout = self.s.scheduling_timeout_seconds
        deadline = self.rec.epoch_started_at + timeout
        if self.now < deadline:
            self.again_in(deadline - self.now)
            return False
        self._withdraw(
            f"{len(unplaced)} of {self.s.pods_per_group} pod(s) of epoch {self.rec.epoch} not "
            f"placed within schedulingTimeoutSeconds={timeout:g}: {why}"
        )
        return True

    def _withdraw(self, why: str) -> None:
        """Delete every pod of the group (a half-placed group holds GPUs and serves
        nothing) and retry a fresh epoch after backoff; not a restart."""
        n = self.rec.withdrawals + 1
        b = self.s.recovery.backoff
        delay = max(min(b.base_seconds << min(n - 1, 32), b.max_seconds), RECHECK_SECONDS)
        self.event(
            Reason.UNSCHEDULABLE,
            f"epoch {self.rec.epoch} withdrawn whole: {why}; retrying in {delay:g}s "
            f"(withdrawal {n})",
            warning=True,
        )
        self._set_action(f"epoch {self.rec.epoch} withdrawn (unschedulable): {why}")
        pods = self.pods()
        if pods:
            self.actions.append(DeletePods(_refs(pods), DELETE_GRACE_SECONDS, restart=False))
        self.goto(
            Step.UNSCHEDULABLE,
            old_pods=_refs(pods),
            withdrawals=n,
            retry_at=self.now + delay,
            unschedulable=why,
        )
        self.requeue = RECHECK_SECONDS

    def _on_unschedulable(self, v: GroupVerdict | None) -> None:
        doomed = {r.uid for r in self.rec.old_pods}
        left = [p for p in self.pods() if p.uid in doomed or p.epoch == self.rec.epoch]
        alive = [p for p in left if not p.deleting]
        if alive:
            self.actions.append(DeletePods(_refs(alive), DELETE_GRACE_SECONDS, restart=False))
        if left:
            self.again_in(RECHECK_SECONDS)
            return
        retry_at = self.rec.retry_at or self.now
        if self.now < retry_at:
            self.again_in(retry_at - self.now)
            return
        self.goto(Step.CREATING, epoch=self.rec.epoch + 1, old_pods=())

    # -- maintenance: move off a cordoned or drained node, make-before-break

    def _maintenance_due(self) -> bool:
        """A pod of the group is on a node under maintenance: start moving (True)."""
        why = self.inp.maintenance
        mode = self.s.maintenance.mode
        if why is None or mode == "Off":
            return False
        if self.rec.retry_at is not None and self.now < self.rec.retry_at:
            self.again_in(self.rec.retry_at - self.now)
            return False
        nodes = self.inp.maintenance_nodes
        if mode == "MakeBeforeBreak":
            self._open_incident(MAINTENANCE_VERDICT, why, why, first_failure=self.now)
            target, slot = self.rec.epoch + 1, 1 - self.rec.slot
            self._set_action(f"move make-before-break: epoch {target} on other nodes first")
            self.event(
                Reason.MAINTENANCE,
                f"maintenance ({why}): starting epoch {target} on other nodes while "
                f"epoch {self.rec.epoch} serves",
            )
            self.actions.append(CreateEpoch(target, nodes, slot))
            self.goto(
                Step.MOVING,
                epoch=target,
                slot=slot,
                old_pods=_refs(self.pods()),
                maintenance=why,
                maintenance_nodes=nodes,
                epoch_started_at=self.now,
                failures=0,
                first_failure_at=None,
                drained_at=None,
            )
            self.requeue = RECHECK_SECONDS
            return True
        return self._drain_first(why, nodes)

    def _drain_first(self, why: str, nodes: Sequence[str]) -> bool:
        """Move by draining first: out of the routers, in-flight requests finish, then
        the group is recreated on other nodes (True: started; False: deferred)."""
        if not self.g.may_leave_service:
            self.defer(
                "maintenance-last-in-service",
                f"maintenance ({why}) deferred: the group is the last of the role in service "
                "and another group is coming back",
            )
            return False
        if self.rec.incident is None:
            self._open_incident(MAINTENANCE_VERDICT, why, why, first_failure=self.now)
        self._set_action("move by draining first, then recreate on other nodes")
        self.event(Reason.MAINTENANCE, f"maintenance ({why}): draining the group, then moving it")
        self.goto(
            Step.DRAINING,
            maintenance=why,
            maintenance_nodes=tuple(nodes),
            failures=0,
            first_failure_at=None,
            drained_at=None,
        )
        return True

    def _on_moving(self, v: GroupVerdict | None) -> None:
        new = [p for p in self.current_pods() if not p.deleting]
        timeout = self.s.scheduling_timeout_seconds
        waited = self.now - self.rec.step_since
        if len(new) < self.s.pods_per_group:
            if waited >= timeout:
                self._move_failed(f"the new pods were not created within {timeout:g}s")
                return
            self.actions.append(
                CreateEpoch(self.rec.epoch, self.rec.maintenance_nodes, self.rec.slot)
            )
            self.again_in(RECHECK_SECONDS)
            return
        unplaced = [p for p in new if p.node is None]
        if unplaced:
            refused = [p for p in unplaced if p.unschedulable]
            if (refused and waited >= MOVE_UNSCHEDULABLE_SECONDS) or waited >= timeout:
                self._move_failed(f"no room elsewhere: {_unplaced_reason(unplaced)}")
                return
            self.again_in(RECHECK_SECONDS)
            return
        if v is not None and v.verdict is Verdict.HEALTHY:
            self.goto(
                Step.HANDING_OVER, drained_at=None, restart_baseline=_baseline(new, self.rec.epoch)
            )
            return
        if v is not None and v.is_failure and v.signals & BROKEN_SIGNALS:
            self._move_failed(f"the new epoch broke: {v.reason}")
            return
        deadline = self.rec.epoch_started_at + self.s.health.startup_grace_seconds
        if self.now >= deadline:
            self._move_failed(
                f"no deep probe passed within startupGraceSeconds="
                f"{self.s.health.startup_grace_seconds}"
            )
            return
        self.again_in(min(deadline - self.now, RECHECK_SECONDS * 5))

    def _move_failed(self, why: str) -> None:
        """The new epoch cannot take over: delete it and move by draining first."""
        new = [p for p in self.current_pods() if not p.deleting]
        self.event(
            Reason.MOVE_FAILED,
            f"make-before-break move not possible ({why}): draining first instead",
            warning=True,
        )
        if new:
            self.actions.append(DeletePods(_refs(new), DELETE_GRACE_SECONDS, restart=False))
        maintenance = self.rec.maintenance or "maintenance"
        if not self._drain_first(f"{maintenance}; {why}", self.rec.maintenance_nodes):
            # The role cannot lose this group now: its old pods keep serving (the old
            # epoch and slot are the group's again); the move is tried again later.
            self._close_incident(f"move deferred: {why}")
            self.goto(
                Step.HEALTHY,
                epoch=max(self.rec.epoch - 1, 0),
                slot=1 - self.rec.slot,
                healthy_since=self.now,
                **{**_SETTLED, "retry_at": self.now + MOVE_RETRY_SECONDS},
            )
            self.requeue = MOVE_RETRY_SECONDS

    def _on_handing_over(self, v: GroupVerdict | None) -> None:
        new = [p for p in self.current_pods() if not p.deleting]
        old_uids = {r.uid for r in self.rec.old_pods}
        old = [p for p in self.pods() if p.uid in old_uids]
        admit = [p for p in new if p.gate is not True]
        if admit:
            # The new epoch joins the routers before the old one leaves them.
            self.actions.append(SetGate(_refs(admit), True))
            self.again_in(RECHECK_SECONDS)
            return
        if not all(p.ready for p in new):
            # Ready (its gate seen by the kubelet): what readiness-following routers and
            # Services use. Only then may the old pods leave.
            self.again_in(RECHECK_SECONDS)
            return
        if self.rec.drained_at is None:
            leave = [p for p in old if not p.deleting and p.gate is not False]
            if leave:
                self.actions.append(SetGate(_refs(leave), False))
                self.again_in(RECHECK_SECONDS)
                return
        if not self._drained(old):
            return
        if old:
            alive = [p for p in old if not p.deleting]
            if alive:
                self.actions.append(DeletePods(_refs(alive), DELETE_GRACE_SECONDS, restart=False))
            self.again_in(RECHECK_SECONDS)
            return
        nodes = sorted({p.node for p in new if p.node})
        done = (
            f"moved make-before-break for maintenance ({self.rec.maintenance}) to epoch "
            f"{self.rec.epoch} on {', '.join(nodes)}; never out of service"
        )
        self._close_incident(done)
        self.event(Reason.MOVED, done)
        self.goto(Step.HEALTHY, healthy_since=self.now, **_SETTLED)
        self.requeue = None

    def _drained(self, pods: Sequence[PodView]) -> bool:
        """The pods left every router and their leaders hold no request any more, or
        drainTimeoutSeconds passed (then the rest are cut off, and the Event says so)."""
        if self.rec.drain_done:
            return True
        if self.rec.drained_at is None:
            self.update(drained_at=self.now)
            self.again_in(DRAIN_SETTLE_SECONDS)
            return False
        waited = self.now - self.rec.drained_at
        timeout = self.s.maintenance.drain_timeout_seconds
        leaders = [p for p in pods if p.rank == 0 and not p.deleting and p.container_running]
        holding = {p.name: self.inp.inflight.get(p.name) for p in leaders}
        busy = {name: n for name, n in holding.items() if n is None or n > 0}
        if waited < DRAIN_SETTLE_SECONDS or (busy and waited < timeout):
            self.again_in(DRAIN_RECHECK_SECONDS)
            return False
        self.update(drain_done=True)
        if busy:
            # What is still running ends retryable (the router retries it elsewhere)
            # before the pods go, never cut off silently.
            self.actions.append(
                EndRequests(
                    _refs(pods),
                    f"{self.s.role}/{self.rec.index} is leaving service and its drain ran out of "
                    f"time ({timeout}s); retry on another group",
                )
            )
            self.event(
                Reason.DRAINED,
                f"drain timed out after {timeout}s (maintenance.drainTimeoutSeconds) with "
                + ", ".join(f"{k}: {'unknown' if n is None else n}" for k, n in busy.items())
                + " request(s) in flight",
                warning=True,
            )
        else:
            self.event(
                Reason.DRAINED,
                f"out of every router; in-flight requests finished after {waited:.1f}s",
            )
        return True


# ---------------------------------------------------------------------------- helpers

# What a group that reached Healthy forgets of the road there.
_SETTLED: dict[str, object] = {
    "failures": 0,
    "first_failure_at": None,
    "maintenance": None,
    "maintenance_nodes": (),
    "old_pods": (),
    "drained_at": None,
    "withdrawals": 0,
    "retry_at": None,
    "unschedulable": None,
}


def _unplaced_reason(pods: Sequence[PodView]) -> str:
    """The scheduler's own words for pods it did not place (or that it has not yet)."""
    for p in pods:
        if p.unschedulable:
            return f"{p.name}: {p.unschedulable}"
    return f"{', '.join(p.name for p in pods[:4])} not scheduled yet"


def rfc3339(t: float) -> str:
    """A unix time as RFC 3339 UTC, the form Kubernetes status uses."""
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _baseline(pods: Sequence[PodView], epoch: int) -> dict[str, int]:
    return {p.uid: p.restart_count for p in pods if p.epoch == epoch}


def _refs(pods: Sequence[PodView]) -> tuple[PodRef, ...]:
    return tuple(PodRef(name=p.name, uid=p.uid) for p in sorted(pods, key=lambda p: p.name))


def _evidence_text(v: GroupVerdict) -> str:
    lines = [v.reason, f"signals: {', '.join(sorted(v.signals))}"]
    for key, value in v.evidence.items():
        if isinstance(value, list):
            lines.append(f"{key}:")
            lines.extend(f"  {item}" for item in value)
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _bound(text: str, max_bytes: int) -> str:
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[: max_bytes - 16].decode(errors="ignore") + "\n... (truncated)"

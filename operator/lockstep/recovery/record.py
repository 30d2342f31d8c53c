"""What recovery remembers about a group between rounds (`GroupRecord`), and the pure
questions the I/O layer and status ask of it.

Stored by the I/O layer in an annotation (`to_json`/`from_json`, `lockstep.records`), so
an operator restart resumes every recovery where it stopped. Unknown fields are ignored
on load, so an older operator can read a newer record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lockstep.models import GroupState
from lockstep.recovery.steps import MOVE_STEPS, POD_OWNING_STEPS, Role, Step
from lockstep.verdicts import PodView


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
    return record.model_copy(update={"restart_baseline": baseline(pods, epoch)})


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


def baseline(pods: Sequence[PodView], epoch: int) -> dict[str, int]:
    return {p.uid: p.restart_count for p in pods if p.epoch == epoch}


def refs(pods: Sequence[PodView]) -> tuple[PodRef, ...]:
    return tuple(PodRef(name=p.name, uid=p.uid) for p in sorted(pods, key=lambda p: p.name))

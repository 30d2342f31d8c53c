"""What recovery remembers about a group between rounds (`GroupRecord`), and the pure
questions the I/O layer and status ask of it.

Stored by the I/O layer in an annotation (`to_json`/`from_json`, `lockstep.core.records`), so
an operator restart resumes every recovery where it stopped. Unknown fields are ignored
on load, so an older operator can read a newer record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from lockstep.api.models import GroupState
from lockstep.core.recovery.steps import MOVE_STEPS, POD_OWNING_STEPS, IncidentKind, Role, Step
from lockstep.core.verdicts import PodView, Verdict


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class PodRef(_Frozen):
    """A pod by name and UID (the UID is the precondition of every delete)."""

    name: str
    uid: str


class OutlierRecord(_Frozen):
    """A rank (`rank` None: the whole pod) that differed from the rest of its group, where
    it ran and how it differed (`verdicts.Outlier`, with the pod's node)."""

    pod: str
    rank: int | None = None
    node: str | None = None
    why: str = ""

    @property
    def text(self) -> str:
        where = self.pod if self.rank is None else f"{self.pod}/r{self.rank}"
        return f"{where} on {self.node or 'an unknown node'} ({self.why})"


class IncidentRecord(_Frozen):
    """The open incident of a group, as much as recovery needs to close it."""

    id: str
    kind: IncidentKind = IncidentKind.FAILURE
    verdict: Verdict | None = None  # a failure's verdict (None for the other kinds)
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
    # The ranks that differed from the rest, named with pod and node.
    outliers: tuple[OutlierRecord, ...] = ()

    @property
    def label(self) -> str:
        """What status shows: the verdict, else the kind (Manual, Maintenance)."""
        return self.verdict.value if self.verdict is not None else self.kind.value

    # Stored as before (the verdict's or the kind's name in `verdict`), so that an older
    # operator still reads the record; a record stored that way loads into the kind.
    @field_serializer("verdict")
    def _store_label(self, verdict: Verdict | None) -> str:
        return self.label

    @model_validator(mode="before")
    @classmethod
    def _kind_from_label(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("verdict") in _KIND_LABELS:
            data = {**data, "kind": data["verdict"], "verdict": None}
        return data


_KIND_LABELS = {k.value for k in IncidentKind if k is not IncidentKind.FAILURE}


class Detection(_Frozen):
    """What detection counted (written by `detect`; a transition may clear the failure
    count through `core.Round.goto`)."""

    failures: int = 0
    first_failure_at: float | None = None
    last_verdict: Verdict | None = None
    last_reason: str | None = None
    last_observed_at: float | None = None
    # The probe sample last counted (`GroupVerdict.sample`): never counted twice.
    last_sample: str | None = None
    last_suspect_event_at: float | None = None


class Budget(_Frozen):
    """Restarts counted against the budget and the backoff (written by `budget`)."""

    restarts: int = 0
    restart_times: tuple[float, ...] = ()
    backoff_streak: int = 0
    last_restart_at: float | None = None


class Manual(_Frozen):
    """A person's restart request (written by `manual`)."""

    handled_request: str | None = None
    # The request being carried out (it lifts backoff, budget and the last-in-service
    # guard), and whether it rolls a new pod template out (then only new pods will do).
    requested: bool = False
    rollout: bool = False


class Restarting(_Frozen):
    """How the restart under way replaces the epoch (written by `restart`, `in_place`)."""

    # The restart mechanism of the recovery in flight (decided per attempt).
    mode: Literal["InPlace", "Recreate"] = "Recreate"
    # The pods of the epoch being replaced (snapshotted before the first delete or ask).
    old_pods: tuple[PodRef, ...] = ()
    # In place: each old pod's restart count (by UID) when its agent was asked to restart.
    asked_counts: dict[str, int] = Field(default_factory=dict)
    last_in_place_at: float | None = None
    # Recreate: nodes the new pods should avoid when capacity allows.
    avoid_nodes: tuple[str, ...] = ()
    force_deleted: bool = False


class Moving(_Frozen):
    """A move off nodes under maintenance (written by `move`)."""

    # Why the group is moving (None: it is not), and the nodes it leaves.
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    # The old epoch's pods, serving until the new one took over.
    old_pods: tuple[PodRef, ...] = ()
    # A move that could not be made: when to try again.
    retry_at: float | None = None


class Placement(_Frozen):
    """Whole-or-nothing placement (written by `placement`)."""

    # Epochs withdrawn in a row because their pods could not all be placed; the pods
    # withdrawn; when the next attempt may start; the scheduler's reason.
    withdrawals: int = 0
    withdrawn: tuple[PodRef, ...] = ()
    retry_at: float | None = None
    unschedulable: str | None = None
    # The cluster as it was once the withdrawn pods were gone (`GroupInput.cluster`): the
    # next attempt waits for it to change (or for `retry_at`, the safety net).
    cluster: str | None = None


class Drain(_Frozen):
    """A drain on purpose (written by `drain`): when the pods leaving service were out of
    every router, and whether their in-flight requests are done (or the drain timed out;
    per step: `core.Round.goto` clears it)."""

    started_at: float | None = None
    done: bool = False


# The record's fields before it had sub-records, by sub-record (`GroupRecord` still
# loads them: an annotation written by an older operator, or a test's flat fields).
_LEGACY: dict[str, dict[str, str]] = {
    "detection": {k: k for k in Detection.model_fields},
    "budget": {k: k for k in Budget.model_fields},
    "manual": {"handled_request": "handled_request", "rollout": "rollout"},
    "restart": {
        "mode": "mode",
        "asked_counts": "asked_counts",
        "last_in_place_at": "last_in_place_at",
        "avoid_nodes": "avoid_nodes",
        "force_deleted": "force_deleted",
    },
    "move": {"maintenance": "reason", "maintenance_nodes": "nodes"},
    "placement": {"withdrawals": "withdrawals", "unschedulable": "unschedulable"},
    "drain": {"drained_at": "started_at", "drain_done": "done"},
}


def _from_legacy(data: dict[str, Any]) -> dict[str, Any]:
    """Nest the flat fields of an older record into their sub-records. `old_pods` and
    `retry_at` served several concerns; the step says whose they were."""
    out = dict(data)
    step = out.get("step")
    if not isinstance(out.get("manual", {}), dict):
        out["manual"] = {"requested": out.pop("manual")}  # once a flag of its own
    for sub, fields in _LEGACY.items():
        moved = {
            new: out.pop(old)
            for old, new in fields.items()
            if old in out and not (old == sub and isinstance(out[old], dict))
        }
        if moved:
            out[sub] = {**(out.get(sub) or {}), **moved}
    if "old_pods" in out:
        pods = out.pop("old_pods")
        owner, name = {
            "Moving": ("move", "old_pods"),
            "HandingOver": ("move", "old_pods"),
            "Unschedulable": ("placement", "withdrawn"),
        }.get(str(step), ("restart", "old_pods"))
        out[owner] = {**(out.get(owner) or {}), name: pods}
    if "retry_at" in out:
        owner = "placement" if str(step) == "Unschedulable" else "move"
        out[owner] = {**(out.get(owner) or {}), "retry_at": out.pop("retry_at")}
    return out


class GroupRecord(_Frozen):
    """Everything recovery remembers about one group; small and JSON-serialisable.

    The core fields are the group's place (step, epoch, name slot), its incident and its
    restart baseline; each concern keeps its own memory in a sub-record only it writes.
    Stored by the I/O layer in an annotation (`to_json`/`from_json`). Unknown fields are
    ignored on load, so an older operator can read a newer record; a record of an older
    operator (flat fields) loads into the sub-records.
    """

    role: Role
    index: int = Field(ge=0)
    step: Step = Step.STARTING
    epoch: int = Field(0, ge=0)
    step_since: float = 0.0
    epoch_started_at: float = 0.0
    # Which name slot the current epoch's pods use (0 or 1): a make-before-break move
    # starts the next epoch in the other slot, so old and new pods coexist.
    slot: int = Field(0, ge=0, le=1)
    healthy_since: float | None = None
    # A warm spare (`spec.<role>.spares`): kept out of every router; `spares` decides
    # which groups are spares (the one writer of this field).
    spare: bool = False
    incident: IncidentRecord | None = None
    incident_seq: int = 0
    # Restart count of each pod (by UID) when its epoch started or was adopted: pass it
    # to `GroupObservation.restart_baseline`, so only a restart after that is a RankDown.
    restart_baseline: dict[str, int] = Field(default_factory=dict)
    # Step scratch (cleared by every transition): the deferral last reported, and
    # whether the open incident's evidence capture was asked for (CapturingEvidence).
    deferred: str | None = None
    capture_asked: bool = False
    detection: Detection = Field(default_factory=Detection)
    budget: Budget = Field(default_factory=Budget)
    manual: Manual = Field(default_factory=Manual)
    restart: Restarting = Field(default_factory=Restarting)
    move: Moving = Field(default_factory=Moving)
    placement: Placement = Field(default_factory=Placement)
    drain: Drain = Field(default_factory=Drain)

    @model_validator(mode="before")
    @classmethod
    def _nest_legacy_fields(cls, data: Any) -> Any:
        return _from_legacy(data) if isinstance(data, dict) else data

    @property
    def maintenance(self) -> str | None:
        """Why the group moves off its nodes (None: it does not)."""
        return self.move.reason

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
    if step is Step.UNSCHEDULABLE:  # a move that cannot be placed says so too
        return "Unschedulable"
    if step in MOVE_STEPS or (record.maintenance and step not in _STEP_STATE):
        return "Moving"
    if step is Step.RETIRING:
        return "Retiring"
    if step is Step.STANDING_DOWN:
        return "StandingDown"
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


_VERDICT_STATE: dict[Verdict, GroupState] = {
    Verdict.DESYNCED: "Desynced",
    Verdict.HUNG: "Hung",
    Verdict.RANK_DOWN: "RankDown",
    Verdict.TRANSFER_BROKEN: "TransferBroken",
    Verdict.KV_LEAK: "KVLeak",
}


def _verdict_state(verdict: Verdict | None) -> GroupState:
    return _VERDICT_STATE.get(verdict, "Suspect") if verdict is not None else "Suspect"


def baseline(pods: Sequence[PodView], epoch: int) -> dict[str, int]:
    return {p.uid: p.restart_count for p in pods if p.epoch == epoch}


def refs(pods: Sequence[PodView]) -> tuple[PodRef, ...]:
    return tuple(PodRef(name=p.name, uid=p.uid) for p in sorted(pods, key=lambda p: p.name))

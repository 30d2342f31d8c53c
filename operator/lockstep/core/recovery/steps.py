"""The vocabulary of recovery: its steps, the step sets the guard rails count, the Event
reasons, and the timings every concern shares."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from lockstep.core.verdicts import Verdict

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
    # A serving group becoming a spare (the role has more serving groups than replicas):
    # out of every router, in-flight requests finish, then it stands by.
    STANDING_DOWN = "StandingDown"


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
    TRANSFER_BROKEN = "GroupTransferBroken"
    KV_LEAK = "GroupKVLeak"
    ENDED_KV_FREED = "EndedKVFreed"
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
    PROMOTED = "SparePromoted"
    STANDBY = "GroupStandingBy"
    STANDING_DOWN = "GroupStandingDown"


VERDICT_REASON = {
    Verdict.DESYNCED: Reason.DESYNCED,
    Verdict.HUNG: Reason.HUNG,
    Verdict.RANK_DOWN: Reason.RANK_DOWN,
    Verdict.TRANSFER_BROKEN: Reason.TRANSFER_BROKEN,
    Verdict.KV_LEAK: Reason.KV_LEAK,
    Verdict.UNKNOWN: Reason.UNRESPONSIVE,
}


class IncidentKind(StrEnum):
    """Why an incident opened: a failure (it carries the verdict), or a restart that is
    not one (a manual request, a maintenance move); status shows the verdict, else this."""

    FAILURE = "Failure"
    MANUAL = "Manual"
    MAINTENANCE = "Maintenance"


# A make-before-break move whose new pods the scheduler reports unschedulable this long
# falls back to draining first (there is no capacity elsewhere right now).
MOVE_UNSCHEDULABLE_SECONDS = 10.0
# A group leaving service on purpose waits at least this long after it left the routers
# before it reads its leader idle (a request routed just before is then counted).
DRAIN_SETTLE_SECONDS = 1.0
# A move that could neither make before break nor drain first waits this long to retry.
MOVE_RETRY_SECONDS = 30.0
# A group withdrawn as unplaceable tries again when the cluster changes (a node added,
# uncordoned, untainted, a pod gone); without a change only this often, for what lockstep
# cannot see (another workload's pod ending on a node it does not watch).
UNPLACED_RETRY_SECONDS = 300.0
# How often a drain looks at the leader's in-flight requests again.
DRAIN_RECHECK_SECONDS = 1.0

"""Recovery: the per-group state machine that restarts a broken TP group as one unit.

A package in layers (docs/architecture.md): `dispatch` (the step table, the guards in
order: retire, manual, maintenance, placement; the role's guard rails across groups)
over the concerns (`detect`, `restart` with `in_place`, `move`, `retire`), over the
shared services (`placement`, `drain`, `manual`, `budget`, `incidents`), over the
per-round core (`core.Round`: the record being planned, the actions, the requeue) and
the vocabulary (`steps`, `record`, `actions`, `inputs`). `needs` tells the I/O layer
what each record asks of a round (what to read, probe, keep), so it names no step. No module imports one above it.

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

from lockstep.core.recovery.actions import (
    Action,
    CaptureEvidence,
    CloseIncident,
    CreateEpoch,
    DeletePods,
    EmitEvent,
    EndRequests,
    OpenIncident,
    RestartInPlace,
    SetGate,
    UpdateIncident,
)
from lockstep.core.recovery.budget import backoff_until, restarts_in_window
from lockstep.core.recovery.dispatch import STEP_TABLE, plan_group, plan_role
from lockstep.core.recovery.inputs import (
    CapturedEvidence,
    GroupInput,
    GroupPlan,
    RoleGuards,
    RolePlan,
    RoleSettings,
)
from lockstep.core.recovery.needs import ROLLOUT_ORDER, GroupNeeds, needs, next_rollout
from lockstep.core.recovery.record import (
    GroupRecord,
    IncidentRecord,
    OutlierRecord,
    PodRef,
    adopt_group,
    new_group_record,
    reconciler_may_create_pods,
    retired,
    status_state,
)
from lockstep.core.recovery.steps import (
    BROKEN_STEPS,
    CAPTURE_TIMEOUT_SECONDS,
    DELETE_GRACE_SECONDS,
    DRAIN_RECHECK_SECONDS,
    DRAIN_SETTLE_SECONDS,
    FORCE_DELETE_AFTER_SECONDS,
    MAX_RESTART_TIMES,
    MOVE_RETRY_SECONDS,
    MOVE_STEPS,
    MOVE_UNSCHEDULABLE_SECONDS,
    POD_OWNING_STEPS,
    RECHECK_SECONDS,
    RESTARTING_STEPS,
    SILENT_AGENT_SECONDS,
    SUSPECT_EVENT_INTERVAL_SECONDS,
    IncidentKind,
    Reason,
    Role,
    Step,
)

__all__ = [
    "BROKEN_STEPS",
    "CAPTURE_TIMEOUT_SECONDS",
    "DELETE_GRACE_SECONDS",
    "DRAIN_RECHECK_SECONDS",
    "DRAIN_SETTLE_SECONDS",
    "FORCE_DELETE_AFTER_SECONDS",
    "MAX_RESTART_TIMES",
    "MOVE_RETRY_SECONDS",
    "MOVE_STEPS",
    "MOVE_UNSCHEDULABLE_SECONDS",
    "POD_OWNING_STEPS",
    "RECHECK_SECONDS",
    "RESTARTING_STEPS",
    "ROLLOUT_ORDER",
    "SILENT_AGENT_SECONDS",
    "STEP_TABLE",
    "SUSPECT_EVENT_INTERVAL_SECONDS",
    "Action",
    "CaptureEvidence",
    "CapturedEvidence",
    "CloseIncident",
    "CreateEpoch",
    "DeletePods",
    "EmitEvent",
    "EndRequests",
    "GroupInput",
    "GroupNeeds",
    "GroupPlan",
    "GroupRecord",
    "IncidentKind",
    "IncidentRecord",
    "OpenIncident",
    "OutlierRecord",
    "PodRef",
    "Reason",
    "RestartInPlace",
    "Role",
    "RoleGuards",
    "RolePlan",
    "RoleSettings",
    "SetGate",
    "Step",
    "UpdateIncident",
    "adopt_group",
    "backoff_until",
    "needs",
    "new_group_record",
    "next_rollout",
    "plan_group",
    "plan_role",
    "reconciler_may_create_pods",
    "restarts_in_window",
    "retired",
    "status_state",
]  # fmt: skip

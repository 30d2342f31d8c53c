"""The dispatcher: one round of one group, and the role's guard rails across its groups.

A round runs the guards in order, each of which may decide the round alone, then the step
table's handler of the record's step:

1. **retire** (`retire`): a group beyond the role's replicas, or one retiring, leaves
   (scale-down), whatever else is true;
2. **manual** (`manual`): a new manual restart request (a spec change's rollout of the
   role's only group in service moves it make-before-break instead, `move`);
3. **maintenance** (`move`): a group in service (Healthy, or Suspect without a verdict)
   with a pod on a node under maintenance moves off it;
4. **placement** (`placement`): an epoch that is starting but not wholly placed in time
   is withdrawn.

Then `STEP_TABLE[step]`: every `Step` has exactly one handler (a test checks the table
covers them), in the concern that owns it: detect (starting, in service, suspect,
observing), restart and in_place (draining to re-admission), move, placement, retire.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from lockstep.core.recovery import (
    budget,
    detect,
    in_place,
    manual,
    move,
    placement,
    restart,
    retire,
    spares,
)
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.inputs import GroupInput, GroupPlan, RoleGuards, RolePlan, RoleSettings
from lockstep.core.recovery.record import GroupRecord, adopt_group
from lockstep.core.recovery.steps import (
    BROKEN_STEPS,
    MOVE_STEPS,
    RECHECK_SECONDS,
    RESTARTING_STEPS,
    Step,
)
from lockstep.core.verdicts import GroupVerdict

Handler = Callable[[Round, GroupVerdict | None], None]

STEP_TABLE: Mapping[Step, Handler] = {
    Step.STARTING: detect.on_starting,
    Step.HEALTHY: detect.on_healthy,
    Step.SUSPECT: detect.on_suspect,
    Step.OBSERVING: detect.on_observing,
    Step.DRAINING: restart.on_draining,
    Step.CAPTURING_EVIDENCE: restart.on_capturing_evidence,
    Step.AWAITING_RESTART: restart.on_awaiting_restart,
    Step.RESTARTING_IN_PLACE: in_place.on_restarting_in_place,
    Step.DELETING: restart.on_deleting,
    Step.WAITING_GONE: restart.on_waiting_gone,
    Step.CREATING: restart.on_creating,
    Step.WAITING_PROBE: detect.on_waiting_probe,
    Step.READMITTING: restart.on_readmitting,
    Step.QUARANTINED: restart.on_quarantined,
    Step.MOVING: move.on_moving,
    Step.HANDING_OVER: move.on_handing_over,
    Step.UNSCHEDULABLE: placement.on_unschedulable,
    Step.RETIRING: retire.retire,
    Step.STANDING_DOWN: spares.on_standing_down,
}


def _retire_guard(r: Round, v: GroupVerdict | None) -> bool:
    if r.inp.retire or r.rec.step is Step.RETIRING:
        retire.retire(r, v)
        return True
    return False


def _maintenance_guard(r: Round, v: GroupVerdict | None) -> bool:
    in_service = r.rec.step is Step.HEALTHY or (
        r.rec.step is Step.SUSPECT and r.rec.incident is None
    )
    return in_service and move.due(r)


def _placement_guard(r: Round, v: GroupVerdict | None) -> bool:
    if r.rec.step in (Step.STARTING, Step.WAITING_PROBE):
        return placement.expired(r)
    return False


def _manual_guard(r: Round, v: GroupVerdict | None) -> bool:
    beside = manual.rollout_beside(r)
    if beside is not None:
        move.make_before_break(r, beside, (), beside)
        return True
    return manual.request(r)


# In order; the first that decides ends the round. Between the first two and the last
# two, a group in service does its budget's bookkeeping (budget.reset_streak).
GUARDS: Sequence[Callable[[Round, GroupVerdict | None], bool]] = (
    _retire_guard,
    _manual_guard,
    _maintenance_guard,
    _placement_guard,
)


def run(r: Round) -> GroupPlan:
    """One round of one group: the verdict counted once, the guards, the step's handler."""
    verdict = detect.observe(r)
    retire_or_manual, rest = GUARDS[:2], GUARDS[2:]
    if any(guard(r, verdict) for guard in retire_or_manual):
        return r.plan()
    if r.rec.step is Step.HEALTHY:
        budget.reset_streak(r)
    if not any(guard(r, verdict) for guard in rest):
        STEP_TABLE[r.rec.step](r, verdict)
    return r.plan()


def plan_role(
    settings: RoleSettings,
    records: Mapping[int, GroupRecord],
    inputs: Mapping[int, GroupInput],
    *,
    now: float,
    serving: int | None = None,
) -> RolePlan:
    """Plan one round for every group of a role, applying the role's guard rails.

    A group in `inputs` without a record is adopted (`adopt_group`). `serving`: how many
    of the groups that stay serve (`spec.<role>.replicas`); the others are warm spares
    (`spares`). None: every group serves and none is ever a spare.
    """
    recs = dict(records)
    for index, inp in inputs.items():
        if index not in recs:
            recs[index] = adopt_group(settings.role, index, inp.pods, now=now)
    pre = spares.Designation(recs)
    if serving is not None:
        pre = spares.before(
            recs, inputs, serving, maintenance=settings.maintenance.mode != "Off", now=now
        )
        recs = pre.records
    restarting = sum(r.step in RESTARTING_STEPS for r in recs.values())
    waiting = sorted(
        (
            r
            for r in recs.values()
            if r.step is Step.AWAITING_RESTART and budget.restart_allowed(r, settings, now)
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
            peer_in_service=_peer_in_service(others),
            retire_blocked=blocked,
        )
        plans[index] = plan_group(
            recs[index], inputs.get(index, GroupInput()), settings, guards=guards, now=now
        )
    if serving is None:
        return RolePlan(plans)
    post = spares.after(plans, inputs, now)
    out = {}
    for index, p in plans.items():
        acts = (*pre.actions.get(index, ()), *p.actions, *post.actions.get(index, ()))
        requeue = p.requeue_after
        if index in post.first:  # finish the admission soon
            requeue = RECHECK_SECONDS if requeue is None else min(requeue, RECHECK_SECONDS)
        out[index] = GroupPlan(post.records[index], acts, requeue)
    return RolePlan(out, frozenset(pre.first | post.first))


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
        and budget.restart_allowed(record, settings, now),
        may_leave_service=True,
        restarting=0,
        peer_in_service=False,
    )
    return run(Round(record, inp, settings, g, now))


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
    if not any((r.step is Step.HEALTHY or r.step in MOVE_STEPS) and not r.spare for r in staying):
        return "no group that stays is in service yet"
    return None


def _peer_in_service(others: Sequence[GroupRecord]) -> bool:
    return any(
        r.step is Step.HEALTHY
        or r.step in MOVE_STEPS  # its old pods serve, then its new ones
        or (r.step is Step.SUSPECT and r.incident is None)
        for r in others
    )


def _may_leave_service(others: Sequence[GroupRecord]) -> bool:
    healthy_peer = _peer_in_service(others)
    # A group moving for maintenance is on its way back, not broken.
    all_broken = all(
        (r.step in BROKEN_STEPS and not r.maintenance)
        or (r.step is Step.SUSPECT and r.incident is not None)
        for r in others
    )
    return healthy_peer or all_broken

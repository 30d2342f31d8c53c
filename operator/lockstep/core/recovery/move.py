"""Concern: maintenance. A group with a pod on a node under maintenance moves off it,
make-before-break (the next epoch on other nodes, admitted, then the old pods drained and
deleted) or drain-first; never the role's last group in service."""

from __future__ import annotations

from collections.abc import Sequence

from lockstep.core.recovery import drain, incidents, placement
from lockstep.core.recovery.actions import (
    CreateEpoch,
    DeletePods,
    SetGate,
)
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.record import Drain, Moving, baseline, refs
from lockstep.core.recovery.steps import (
    DELETE_GRACE_SECONDS,
    MOVE_RETRY_SECONDS,
    MOVE_UNSCHEDULABLE_SECONDS,
    RECHECK_SECONDS,
    IncidentKind,
    Reason,
    Step,
)
from lockstep.core.verdicts import BROKEN_SIGNALS, GroupVerdict, Verdict


def due(r: Round) -> bool:
    """A pod of the group is on a node under maintenance: start moving (True)."""
    why = r.inp.maintenance
    mode = r.s.maintenance.mode
    if why is None or mode == "Off":
        return False
    retry_at = r.rec.move.retry_at
    if retry_at is not None and r.now < retry_at:
        r.again_in(retry_at - r.now)
        return False
    nodes = r.inp.maintenance_nodes
    # A spare serves nothing: it moves by draining first (a spare took over from a
    # serving group the same way, `spares.before`).
    if mode == "MakeBeforeBreak" and not r.rec.spare:
        incidents.open_incident(r, IncidentKind.MAINTENANCE, why, why, first_failure=r.now)
        make_before_break(r, why, nodes, f"maintenance ({why})")
        return True
    return drain_first(r, why, nodes)


def make_before_break(r: Round, why: str, nodes: Sequence[str], what: str) -> None:
    """Start the next epoch in the other name slot (preferring nodes other than `nodes`)
    while the current one serves; `on_moving` admits it once it passes the deep probe,
    then the old pods drain and go. The caller opened the incident."""
    target, slot = r.rec.epoch + 1, 1 - r.rec.slot
    where = " on other nodes" if nodes else ""
    incidents.set_action(r, f"move make-before-break: epoch {target}{where} first")
    r.event(
        Reason.MAINTENANCE,
        f"{what}: starting epoch {target}{where} while epoch {r.rec.epoch} serves",
    )
    r.actions.append(CreateEpoch(target, tuple(nodes), slot))
    r.goto(
        Step.MOVING,
        epoch=target,
        slot=slot,
        move=Moving(reason=why, nodes=tuple(nodes), old_pods=refs(r.pods())),
        epoch_started_at=r.now,
        clear_failures=True,
        drain=Drain(),
    )
    r.requeue = RECHECK_SECONDS


def drain_first(r: Round, why: str, nodes: Sequence[str]) -> bool:
    """Move by draining first: out of the routers, in-flight requests finish, then
    the group is recreated on other nodes (True: started; False: deferred)."""
    if not r.rec.spare and not r.g.may_leave_service:
        r.defer(
            "maintenance-last-in-service",
            f"maintenance ({why}) deferred: the group is the last of the role in service "
            "and another group is coming back",
        )
        return False
    if r.rec.incident is None:
        incidents.open_incident(r, IncidentKind.MAINTENANCE, why, why, first_failure=r.now)
    incidents.set_action(r, "move by draining first, then recreate on other nodes")
    r.event(Reason.MAINTENANCE, f"maintenance ({why}): draining the group, then moving it")
    r.goto(
        Step.DRAINING,
        move=Moving(reason=why, nodes=tuple(nodes)),
        clear_failures=True,
        drain=Drain(),
    )
    return True


def on_moving(r: Round, v: GroupVerdict | None) -> None:
    new = [p for p in r.current_pods() if not p.deleting]
    timeout = r.s.scheduling_timeout_seconds
    waited = r.now - r.rec.step_since
    if len(new) < r.s.pods_per_group:
        if waited >= timeout:
            move_failed(r, f"the new pods were not created within {timeout:g}s")
            return
        r.actions.append(CreateEpoch(r.rec.epoch, r.rec.move.nodes, r.rec.slot))
        r.again_in(RECHECK_SECONDS)
        return
    unplaced = [p for p in new if p.node is None]
    if unplaced:
        refused = [p for p in unplaced if p.unschedulable]
        if (refused and waited >= MOVE_UNSCHEDULABLE_SECONDS) or waited >= timeout:
            move_failed(r, f"no room elsewhere: {placement.unplaced_reason(unplaced)}")
            return
        r.again_in(RECHECK_SECONDS)
        return
    if v is not None and v.verdict is Verdict.HEALTHY:
        r.goto(Step.HANDING_OVER, drain=Drain(), restart_baseline=baseline(new, r.rec.epoch))
        return
    if v is not None and v.is_failure and v.signals & BROKEN_SIGNALS:
        move_failed(r, f"the new epoch broke: {v.reason}")
        return
    deadline = r.rec.epoch_started_at + r.s.health.startup_grace_seconds
    if r.now >= deadline:
        move_failed(
            r, f"no deep probe passed within startupGraceSeconds={r.s.health.startup_grace_seconds}"
        )
        return
    r.again_in(min(deadline - r.now, RECHECK_SECONDS * 5))


def move_failed(r: Round, why: str) -> None:
    """The new epoch cannot take over: delete it and move by draining first."""
    new = [p for p in r.current_pods() if not p.deleting]
    r.event(
        Reason.MOVE_FAILED,
        f"make-before-break move not possible ({why}): draining first instead",
        warning=True,
    )
    if new:
        r.actions.append(DeletePods(refs(new), DELETE_GRACE_SECONDS, restart=False))
    maintenance = r.rec.maintenance or "maintenance"
    if not drain_first(r, f"{maintenance}; {why}", r.rec.move.nodes):
        # The role cannot lose this group now: its old pods keep serving (the old
        # epoch and slot are the group's again); the move is tried again later.
        incidents.close_incident(r, f"move deferred: {why}")
        r.settle(
            epoch=max(r.rec.epoch - 1, 0),
            slot=1 - r.rec.slot,
            move=Moving(retry_at=r.now + MOVE_RETRY_SECONDS),
        )
        r.requeue = MOVE_RETRY_SECONDS


def on_handing_over(r: Round, v: GroupVerdict | None) -> None:
    new = [p for p in r.current_pods() if not p.deleting]
    old_uids = {ref.uid for ref in r.rec.move.old_pods}
    old = [p for p in r.pods() if p.uid in old_uids]
    admit = [p for p in new if p.gate is not True]
    if admit:
        # The new epoch joins the routers before the old one leaves them.
        r.actions.append(SetGate(refs(admit), True))
        r.again_in(RECHECK_SECONDS)
        return
    if not all(p.ready for p in new):
        # Ready (its gate seen by the kubelet): what readiness-following routers and
        # Services use. Only then may the old pods leave.
        r.again_in(RECHECK_SECONDS)
        return
    if r.rec.drain.started_at is None:
        leave = [p for p in old if not p.deleting and p.gate is not False]
        if leave:
            r.actions.append(SetGate(refs(leave), False))
            r.again_in(RECHECK_SECONDS)
            return
    if not drain.drained(r, old):
        return
    if old:
        alive = [p for p in old if not p.deleting]
        if alive:
            r.actions.append(DeletePods(refs(alive), DELETE_GRACE_SECONDS, restart=False))
        r.again_in(RECHECK_SECONDS)
        return
    nodes = sorted({p.node for p in new if p.node})
    what = (
        f"for maintenance ({r.rec.maintenance})" if r.rec.move.nodes else (f"({r.rec.maintenance})")
    )
    done = (
        f"moved make-before-break {what} to epoch {r.rec.epoch} on {', '.join(nodes)}; "
        "never out of service"
    )
    incidents.close_incident(r, done)
    r.event(Reason.MOVED, done)
    r.settle()
    r.requeue = None

"""Concern: scale-down. A group beyond the role's replicas leaves every router, its
in-flight requests finish (bounded), then its pods go; scaled back up meanwhile, it stays
or is created anew."""

from __future__ import annotations

from lockstep.core.recovery import drain, incidents
from lockstep.core.recovery.actions import DeletePods
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.record import Drain, refs
from lockstep.core.recovery.steps import DELETE_GRACE_SECONDS, RECHECK_SECONDS, Reason, Step
from lockstep.core.verdicts import GroupVerdict


def retire(r: Round, v: GroupVerdict | None = None) -> None:
    """A group beyond the role's replicas (`GroupInput.retire`): out of every router,
    its in-flight requests finish (bounded by maintenance.drainTimeoutSeconds), then
    its pods are deleted. The I/O layer forgets the record once no pod is left.
    Scaled back up meanwhile: a group still serving is kept, one already going is
    created anew."""
    if not r.inp.retire:
        unretire(r)
        return
    if r.rec.step is not Step.RETIRING:
        serving = any(p.gate is True and not p.deleting for p in r.pods())
        if serving and r.g.retire_blocked:
            r.defer(
                "retire",
                f"scale-down deferred: {r.g.retire_blocked}",
                Reason.RETIRE_DEFERRED,
            )
            r.again_in(RECHECK_SECONDS * 5)
            return
        r.event(Reason.RETIRING, "scale-down: leaving the routers, then removed")
        if r.rec.incident is not None:
            incidents.close_incident(r, "not restarted: the group was removed by a scale-down")
        r.goto(Step.RETIRING, drain=Drain())
    pods = r.pods()
    if not drain.drain_out(r, pods):
        return
    alive = [p for p in pods if not p.deleting]
    if alive:
        r.actions.append(DeletePods(refs(alive), DELETE_GRACE_SECONDS, restart=False))
    if pods:
        r.again_in(RECHECK_SECONDS)
        return
    r.event(Reason.RETIRED, "scale-down: removed (no pod left)")
    r.requeue = None


def unretire(r: Round) -> None:
    """Back within replicas while retiring."""
    if any(p.deleting for p in r.pods()) or not r.pods():
        r.goto(
            Step.WAITING_GONE,
            restart=r.rec.restart.model_copy(update={"old_pods": refs(r.pods())}),
            drain=Drain(),
        )
        return
    r.event(Reason.RETIRING, "scale-down undone: the group stays")
    r.goto(Step.READMITTING, drain=Drain())

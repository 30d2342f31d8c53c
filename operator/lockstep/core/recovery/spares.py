"""Concern: warm spare groups (`spec.<role>.spares`).

A spare is a whole group of the role, started and deep-probed like any other, kept out
of every router (its readiness gates stay false). Which groups are spares is the one
thing this module decides (`GroupRecord.spare` has no other writer), in two passes over
the role's records around the per-group rounds (`dispatch.plan_role`):

- `before` (on the records as the round found them):
  - a serving group due to move for maintenance hands over to a ready spare: the spare
    is admitted (`Readmitting`), the old group becomes the spare and moves by draining
    first (nobody waits on it: the spare already serves);
  - the role serves `replicas` groups: with fewer serving (a scale-up, a spare count
    lowered), a ready spare is admitted (else a starting one will be when its probe
    passes); with more (the first round of a new role, a scale-down that removed a
    spare), the extra ones become spares: groups never admitted first, then groups out
    for a failure, then a serving group, which stands down (out of every router, its
    requests finish, bounded by `maintenance.drainTimeoutSeconds`).
- `after` (on the planned records): a serving group this round (or earlier) took out
  of service (a failure, a restart request, a move that drains first) hands over to a
  ready spare, admitted at once; the broken group goes on with its restart and stands by as the spare once its
  new epoch passes the deep probe. The promoted groups' actions run first (`first`), so
  the spare is in the routers before the broken group's requests are ended and retried.

Ready means Healthy: its last deep probe passed and nothing else is under way (not
moving, not retiring). A spare that fails its probe is recovered like any group and is
never admitted while broken; it does not hold the role's last-in-service guard (it
serves nothing) and a scale-down takes spares last only in that the count of spares is
kept: the groups beyond `replicas + spares` leave, whatever they were, and the role then
stands the extra serving group down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lockstep.core.recovery import drain
from lockstep.core.recovery.actions import Action, EmitEvent, SetGate
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.inputs import GroupInput, GroupPlan
from lockstep.core.recovery.record import Drain, GroupRecord, refs
from lockstep.core.recovery.steps import (
    BROKEN_STEPS,
    Reason,
    Step,
)
from lockstep.core.verdicts import GroupVerdict

# Steps of a group out of service for a failure (or a restart request) and not yet on
# its way back into the routers: a ready spare takes its place.
OUT_STEPS = (BROKEN_STEPS - {Step.OBSERVING}) | {
    Step.RESTARTING_IN_PLACE,
    Step.DELETING,
    Step.WAITING_GONE,
    Step.CREATING,
    Step.WAITING_PROBE,
    Step.UNSCHEDULABLE,
}
# Steps of a serving group in service (it serves; standing it down drains it).
_IN_SERVICE = (Step.HEALTHY, Step.SUSPECT)


@dataclass
class Designation:
    """The records after a pass, the actions it adds per group, and the groups whose
    actions must run before the others' (promotions: admitted before anyone drains)."""

    records: dict[int, GroupRecord]
    actions: dict[int, list[Action]] = field(default_factory=dict)
    first: set[int] = field(default_factory=set)

    def add(self, index: int, action: Action) -> None:
        self.actions.setdefault(index, []).append(action)


def ready(rec: GroupRecord, inp: GroupInput) -> bool:
    """A spare that can be admitted now."""
    return (
        rec.spare
        and rec.step is Step.HEALTHY
        and rec.maintenance is None
        and inp.maintenance is None
        and not inp.retire
    )


def out_for_failure(rec: GroupRecord) -> bool:
    """A serving group out of service: for a failure, a restart request, or a move that
    drains first (no room to make before break); a move whose old pods still serve
    (`Moving`, `HandingOver`) is in service."""
    return not rec.spare and rec.incident is not None and rec.step in OUT_STEPS


def _leaving(rec: GroupRecord, inp: GroupInput) -> bool:
    return inp.retire or rec.step is Step.RETIRING


def _event(d: Designation, rec: GroupRecord, reason: Reason, message: str) -> None:
    d.add(rec.index, EmitEvent(reason, f"{rec.role} group {rec.index}: {message}"))


def _promote(
    d: Designation, rec: GroupRecord, inp: GroupInput, why: str, now: float, *, gate: bool
) -> None:
    """A ready spare (or one standing down) joins the serving groups: Readmitting (whose
    round sets its gates true; `gate`: set them here, the group's round has run), its
    actions first this round."""
    d.records[rec.index] = rec.model_copy(
        update={"spare": False, "step": Step.READMITTING, "step_since": now, "deferred": None}
    )
    todo = [p for p in inp.pods if p.epoch == rec.epoch and not p.deleting and p.gate is not True]
    if gate and todo:
        d.add(rec.index, SetGate(refs(todo), True))
    d.first.add(rec.index)
    _event(d, rec, Reason.PROMOTED, f"spare admitted to every router at once: {why}")


def _pick(d: Designation, inputs: Mapping[int, GroupInput], taken: set[int]) -> int | None:
    for i in sorted(d.records):
        if i not in taken and ready(d.records[i], inputs.get(i, GroupInput())):
            return i
    return None


def before(
    records: Mapping[int, GroupRecord],
    inputs: Mapping[int, GroupInput],
    serving: int,
    *,
    maintenance: bool,
    now: float,
) -> Designation:
    """The first pass (see the module docstring): maintenance hand-overs, then the count
    of serving groups brought to `serving`."""
    d = Designation(dict(records))
    facts = {i: inputs.get(i, GroupInput()) for i in d.records}
    staying = {i for i, rec in d.records.items() if not _leaving(rec, facts[i])}
    taken: set[int] = set()
    if maintenance:
        for i in sorted(staying):
            rec, inp = d.records[i], facts[i]
            if rec.spare or inp.maintenance is None or rec.step is not Step.HEALTHY:
                continue
            j = _pick(d, facts, taken)
            if j is None:
                break
            taken.add(j)
            _promote(d, d.records[j], facts[j], f"group {i} moves for maintenance", now, gate=False)
            d.records[i] = rec.model_copy(update={"spare": True})
            _event(
                d,
                rec,
                Reason.MAINTENANCE,
                f"spare group {j} took its place; it moves off its nodes and stands by "
                "as the role's spare",
            )
    # New groups beyond the serving count are spares from their start.
    new = sorted(
        (i for i in staying if not d.records[i].spare and d.records[i].step is Step.STARTING),
        reverse=True,
    )
    excess = sum(1 for i in staying if not d.records[i].spare) - serving
    for i in new[: max(0, excess)]:
        d.records[i] = d.records[i].model_copy(update={"spare": True})
    # A group that never served yet (a scale-up's new group) waits for its first probe;
    # a ready spare serves now: it takes the new group's place, the new group stands by.
    for i in sorted(staying, reverse=True):
        rec = d.records[i]
        if rec.spare or rec.step is not Step.STARTING:
            continue
        j = _pick(d, facts, taken)
        if j is None:
            break
        taken.add(j)
        _promote(d, d.records[j], facts[j], f"in place of group {i}, still starting", now,
                 gate=False)  # fmt: skip
        d.records[i] = rec.model_copy(update={"spare": True})
    serving_now = sorted(i for i in staying if not d.records[i].spare)
    excess = len(serving_now) - serving
    if excess > 0:
        _stand_down(d, facts, serving_now, excess, now)
    elif excess < 0:
        spares = sorted(i for i in staying if d.records[i].spare and i not in taken)
        # Standing down (still partly serving) first, then ready, then any.
        order = sorted(
            spares,
            key=lambda i: (
                d.records[i].step is not Step.STANDING_DOWN,
                not ready(d.records[i], facts[i]),
                i,
            ),
        )
        for i in order[:-excess]:
            rec = d.records[i]
            if rec.step is Step.STANDING_DOWN or ready(rec, facts[i]):
                _promote(d, rec, facts[i], f"the role serves {serving} group(s)", now, gate=False)
            else:  # admitted when its deep probe passes, as any group
                d.records[i] = rec.model_copy(update={"spare": False})
    return d


def _stand_down(
    d: Designation,
    facts: Mapping[int, GroupInput],
    serving_now: list[int],
    excess: int,
    now: float,
) -> None:
    """Make `excess` serving groups spares: never admitted first (highest index first),
    then out for a failure, then in service (they stand down)."""

    def rank(i: int) -> tuple[int, int]:
        rec = d.records[i]
        if rec.step is Step.STARTING:
            return (0, -i)
        if out_for_failure(rec):
            return (1, -i)
        if rec.step in _IN_SERVICE and rec.incident is None and rec.maintenance is None:
            return (2, -i)
        return (3, -i)

    for i in sorted(serving_now, key=rank)[:excess]:
        rec = d.records[i]
        tier = rank(i)[0]
        if tier == 3:
            continue  # moving, readmitting, retiring: decided again next round
        if tier == 2:
            d.records[i] = rec.model_copy(
                update={
                    "spare": True,
                    "step": Step.STANDING_DOWN,
                    "step_since": now,
                    "drain": Drain(),
                    "deferred": None,
                }
            )
            _event(
                d,
                rec,
                Reason.STANDING_DOWN,
                "the role serves more groups than its replicas: leaving every router, its "
                "requests finish, then it stands by as a spare",
            )
        else:
            d.records[i] = rec.model_copy(update={"spare": True})


def after(
    plans: Mapping[int, GroupPlan], inputs: Mapping[int, GroupInput], now: float
) -> Designation:
    """The second pass: each serving group out for a failure hands over to a ready
    spare, admitted at once; the broken group becomes the spare."""
    d = Designation({i: p.record for i, p in plans.items()})
    facts = {i: inputs.get(i, GroupInput()) for i in d.records}
    taken: set[int] = set()
    for i in sorted(d.records):
        rec = d.records[i]
        if _leaving(rec, facts[i]) or not out_for_failure(rec):
            continue
        j = _pick(d, facts, taken)
        if j is None:
            break
        taken.add(j)
        what = rec.incident.label if rec.incident is not None else "out of service"
        _promote(d, d.records[j], facts[j], f"in place of group {i} ({what})", now, gate=True)
        d.records[i] = rec.model_copy(update={"spare": True})
        _event(
            d,
            rec,
            Reason.PROMOTED,
            f"spare group {j} took its place in every router; once restarted this group "
            "stands by as the role's spare",
        )
    return d


def on_standing_down(r: Round, v: GroupVerdict | None) -> None:
    """Out of every router, in-flight requests finish (bounded), then stand by."""
    pods = [p for p in r.current_pods() if not p.deleting]
    if not drain.drain_out(r, pods):
        return
    r.event(Reason.STANDBY, f"standing by as a spare in epoch {r.rec.epoch}")
    r.settle()
    r.requeue = None

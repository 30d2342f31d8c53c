"""The per-round core every concern works on: the record being planned, the actions so
far, when to plan again. One `Round` per group and round; nothing in it outlives the
round but the record it returns (`GroupPlan`)."""

from __future__ import annotations

from lockstep.recovery.actions import Action, EmitEvent
from lockstep.recovery.inputs import GroupInput, GroupPlan, RoleGuards, RoleSettings
from lockstep.recovery.record import GroupRecord
from lockstep.recovery.steps import Reason, Step
from lockstep.verdicts import PodView

# What a group that reached Healthy forgets of the road there.
SETTLED: dict[str, object] = {
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


class Round:
    """One planning round of one group: mutable scratch state over pure inputs."""

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

    def update(self, **changes: object) -> None:
        """Change fields of the record being planned."""
        self.rec = self.rec.model_copy(update=changes)

    def goto(self, step: Step, **changes: object) -> None:
        """Enter `step` (its own scratch flags reset) and plan again at once."""
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
        """Plan again within `seconds` (the earliest of every ask this round)."""
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def pods(self) -> list[PodView]:
        return list(self.inp.pods)

    def current_pods(self) -> list[PodView]:
        """The pods of the record's epoch."""
        return [p for p in self.inp.pods if p.epoch == self.rec.epoch]

    def defer(self, key: str, message: str, reason: Reason = Reason.DEFERRED) -> None:
        """A RestartDeferred (or ScaleDownDeferred) event once per reason, not once per
        round."""
        if self.rec.deferred != key:
            self.update(deferred=key)
            self.event(reason, message)

    def plan(self) -> GroupPlan:
        return GroupPlan(self.rec, tuple(self.actions), self.requeue)

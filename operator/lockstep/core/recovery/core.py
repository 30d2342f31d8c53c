"""The per-round core every concern works on: the record being planned, the actions so
far, when to plan again. One `Round` per group and round; nothing in it outlives the
round but the record it returns (`GroupPlan`)."""

from __future__ import annotations

from lockstep.core.recovery.actions import Action, EmitEvent
from lockstep.core.recovery.inputs import GroupInput, GroupPlan, RoleGuards, RoleSettings
from lockstep.core.recovery.record import Drain, GroupRecord, Moving, Placement
from lockstep.core.recovery.steps import Reason, Step
from lockstep.core.verdicts import PodView


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

    def goto(self, step: Step, *, clear_failures: bool = False, **changes: object) -> None:
        """Enter `step` and plan again at once. The step scratch is cleared (the deferral,
        the capture asked, a drain's `done`); `clear_failures`: the failures counted so far
        no longer count (a recovery began, or the group is well again). `changes` are core
        fields, or whole sub-records from their owners."""
        updates: dict[str, object] = {
            "step": step,
            "step_since": self.now,
            "deferred": None,
            "capture_asked": False,
            "drain": self.rec.drain.model_copy(update={"done": False}),
        }
        if clear_failures:
            updates["detection"] = self.rec.detection.model_copy(
                update={"failures": 0, "first_failure_at": None}
            )
        updates.update(changes)
        self.update(**updates)
        self.requeue = 0.0

    def settle(self, **changes: object) -> None:
        """Back in service (Healthy): what the road there needed is forgotten (the move,
        the drain, the withdrawn epochs, the pods replaced, the failures)."""
        settled: dict[str, object] = {
            "healthy_since": self.now,
            "restart": self.rec.restart.model_copy(update={"old_pods": ()}),
            "move": Moving(),
            "drain": Drain(),
            "placement": Placement(),
        }
        self.goto(Step.HEALTHY, clear_failures=True, **{**settled, **changes})

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

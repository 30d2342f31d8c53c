"""`stuck-step`: a step that never ends on every rank of decode/0."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockstep_dev.drills.restart import restart_checks
from lockstep_dev.drills.scenario import Scenario

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill


def act(drill: Drill) -> None:
    """A step that never ends on every rank of decode/0 (a wedged kernel or
    collective inside the step): Hung once no rank progressed for longer than the
    step bound (the deployment's stepBounds), then the usual restart."""
    drill.conclude(restart_checks(drill, "Hung", "slow", step_seconds=3600.0))


SCENARIO = Scenario("stuck-step", act)

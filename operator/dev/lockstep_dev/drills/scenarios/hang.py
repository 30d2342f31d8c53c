"""`hang`: the ranks of decode/0 stop answering; Hung, drained, the whole group
restarted in the deployment's mode."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockstep_dev.drills.restart import expect_restart
from lockstep_dev.drills.scenario import BOTH_ENGINES, Scenario

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill


def act(drill: Drill) -> None:
    expect_restart(drill, "Hung", "hang")


SCENARIO = Scenario("hang", act, engines=BOTH_ENGINES)

"""`rank-kill`: one rank of decode/0 killed; RankDown, drained, the whole group
restarted in the deployment's mode."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockstep_dev.drills.restart import expect_restart
from lockstep_dev.drills.scenario import BOTH_ENGINES, Scenario

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill


def act(drill: Drill) -> None:
    expect_restart(drill, "RankDown", "kill-rank")


SCENARIO = Scenario("rank-kill", act, engines=BOTH_ENGINES)

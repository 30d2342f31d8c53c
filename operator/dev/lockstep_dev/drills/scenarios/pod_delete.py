"""`pod-delete`: one pod of decode/0 deleted; RankDown, and the group recreated."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockstep_dev.drills.restart import expect_restart
from lockstep_dev.drills.scenario import BOTH_ENGINES, Scenario

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill


def act(drill: Drill) -> None:
    # A pod that is gone cannot restart in place: the group is always recreated.
    expect_restart(drill, "RankDown", "delete-pod", mode="Recreate")


SCENARIO = Scenario("pod-delete", act, engines=BOTH_ENGINES)

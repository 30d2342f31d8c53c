"""`desync`: the ranks of decode/0 diverge on a decision; Desynced, drained, the whole
group restarted in the deployment's mode."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockstep_dev.drills.restart import expect_restart
from lockstep_dev.drills.scenario import BOTH_ENGINES, Scenario

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill


def act(drill: Drill) -> None:
    expect_restart(drill, "Desynced", "desync")


SCENARIO = Scenario("desync", act, engines=BOTH_ENGINES)

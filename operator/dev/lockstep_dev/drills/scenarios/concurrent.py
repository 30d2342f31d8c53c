"""`concurrent`: both decode groups desynced at once, with one restart slot: they are
restarted one after the other, never both at once."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from lockstep_dev.drills.deployment import NAMESPACE, RESTARTING_STEPS
from lockstep_dev.drills.scenario import Scenario

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

BOTH = ("decode/0", "decode/1")


def act(drill: Drill) -> None:
    drill.result.injected_at = time.time()
    drill.inject("desync", "decode/0")
    drill.inject("desync", "decode/1")
    drill.wait(
        lambda: all(drill.incident(k) for k in BOTH),
        drill.timeout_s * 2,
        "both decode groups recovered",
    )
    injected = drill.result.injected_at or 0.0
    both = [
        s
        for at, s in drill.samples
        if at >= injected and sum(s.get(k) in RESTARTING_STEPS for k in BOTH) > 1
    ]
    reasons = {e.get("reason") for e in drill.cluster.events(NAMESPACE)}
    if both:
        drill.note(f"two groups restarting at once: {both[0]}")
    drill.judge_incident(drill.incident("decode/0") or {})
    checks = [
        (not both, "never two decode groups restarting at once"),
        ("RestartDeferred" in reasons, "the second restart was deferred"),
        (
            int(drill.group("decode/0")["epoch"]) == 1
            and int(drill.group("decode/1")["epoch"]) == 1,
            "both groups restarted once",
        ),
    ]
    drill.conclude(checks)


# The fault goes into both decode groups: neither's failed requests are another group's.
SCENARIO = Scenario("concurrent", act, faulted=BOTH)

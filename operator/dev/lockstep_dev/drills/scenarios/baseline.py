"""`baseline`: the alternative without lockstep. Without its guard and recovery a
desynced group stays wedged."""

from __future__ import annotations

import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from lockstep_dev.drills.deployment import AFFECTED
from lockstep_dev.drills.scenario import Scenario

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

# SGLang without lockstep's decision consensus (plain SGLang has none in its loops): an
# image that carries it off, since no PDDeployment may switch a lockstep guard off
# (policy rule operator-owned-env).
CLUSTER = MappingProxyType({"image_env": {"LOCKSTEP_CONSENSUS": "0"}})


def overrides(drill: Drill) -> dict[str, Any]:
    # The alternative without lockstep: the runtime's decision consensus off (the
    # image's env, see CLUSTER), SGLang's gloo timeout left long, and nobody restarts
    # the group (the operator only observes). The drill's step bounds do not apply.
    return {
        "safety": {
            "mode": "Warn",
            "overlapSchedule": "Disabled",
            "glooTimeoutSeconds": 3600,
        },
        "recovery": {"policy": "ObserveOnly"},
    }


def act(drill: Drill) -> None:
    """Without lockstep's guard and recovery a desynced group stays wedged."""
    drill.result.injected_at = time.time()
    drill.inject("desync")
    window = 60.0
    end = time.time() + window
    while time.time() < end:
        drill.poll()
        time.sleep(0.5)
    assert drill.traffic is not None
    s = drill.traffic.stats(drill.result.injected_at + 10).get(AFFECTED)
    drill.note(f"after {window:.0f}s decode/0 still fails every request; nobody restarted it")
    checks = [
        (
            s is not None and s.sent > 0 and s.ok == 0,
            "the wedged group failed every request after the first 10 s",
        ),
        (int(drill.group(AFFECTED).get("restarts", 0)) == 0, "nothing restarted it"),
    ]
    drill.conclude(checks)


SCENARIO = Scenario("baseline", act, overrides=overrides, cluster_options=CLUSTER)

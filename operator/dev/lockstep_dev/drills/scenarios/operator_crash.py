"""`operator-crash`: the operator SIGKILLed mid-recovery of decode/0; the recovery
finishes without doubling (one restart, one new epoch, one incident)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from lockstep_dev.cluster import ChartOperator, restart_count
from lockstep_dev.drills.deployment import AFFECTED, RESTARTING_STEPS
from lockstep_dev.drills.restart import Checks
from lockstep_dev.drills.scenario import BOTH_ENGINES, Scenario

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill


def act(drill: Drill) -> None:
    """SIGKILL the operator mid-recovery. Installed by the chart (the default), it is
    brought back by the kubelet (restartPolicy Always), nobody starts it; as a
    process (`operator="process"`) the drill starts it again, as a supervisor would."""
    operator = drill.cluster.operator
    assert operator is not None
    drill.result.injected_at = time.time()
    drill.inject("desync")
    drill.wait(
        lambda: drill.records().get(AFFECTED, {}).get("step") in RESTARTING_STEPS,
        60,
        "the restart under way",
    )
    step = drill.records()[AFFECTED]["step"]
    checks: Checks = []
    if isinstance(operator, ChartOperator):
        pod = operator.pod()
        assert pod is not None
        uid, restarts = pod["metadata"]["uid"], restart_count(pod)
        pid = operator.kill()
        killed = time.time()
        drill.note(
            f"operator container (pid {pid}) killed (SIGKILL) in step {step}; "
            "left to the kubelet and its Deployment"
        )
        back = drill.wait(
            lambda: operator.ready_pod(restarts_at_least=restarts + 1),
            120,
            "the operator restarted by the kubelet",
        )
        drill.note(
            f"operator back by itself in {time.time() - killed:.1f}s (container "
            f"restarts {restarts} -> {restart_count(back)}, same pod)"
        )
        checks.append(
            (
                back["metadata"]["uid"] == uid and restart_count(back) == restarts + 1,
                "the kubelet restarted the operator's container once, in the same pod",
            )
        )
    else:
        operator.kill()
        drill.note(f"operator killed (SIGKILL) in step {step}; starting it again")
        time.sleep(2)
        operator.start()
    inc = drill.wait(lambda: drill.incident(AFFECTED), drill.timeout_s, "recovery finished")
    drill.judge_incident(inc)
    incidents = [
        i
        for i in drill.status().get("incidents") or []
        if i["group"] == 0 and i["role"] == "decode"
    ]
    checks += [
        (int(drill.group(AFFECTED)["restarts"]) == 1, "one restart, not two"),
        (int(drill.group(AFFECTED)["epoch"]) == 1, "one new epoch"),
        (len(incidents) == 1, "one incident"),
    ]
    drill.conclude(checks)


SCENARIO = Scenario("operator-crash", act, engines=BOTH_ENGINES)

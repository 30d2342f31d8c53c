"""`upgrade`: `helm upgrade` of the operator to a new image (and so a new default
runtime image) with traffic through the router: no group restarts, no request fails,
status shows every group still on the runtime it ran; then `spec.runtime.upgrade:
Rolling` moves the groups onto the new runtime one at a time, with no request failing
(decode's two groups restart in turn; prefill's only group rolls make-before-break, so
the drill's cluster has room for a second prefill group)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from lockstep.api import constants as c
from lockstep_dev.cluster import ChartOperator
from lockstep_dev.drills.deployment import MORE_NODES, NAME, NAMESPACE
from lockstep_dev.drills.restart import Checks
from lockstep_dev.drills.scenario import Scenario
from lockstep_dev.drills.scenarios.spares import waited

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

NEXT_TAG = "checkout-next"  # the "new release" of the operator image
HOLD_S = 15.0  # traffic watched after the new operator took over
IN_SERVICE = ("Healthy", "Moving", "HandingOver")


def snapshot(drill: Drill) -> dict[str, tuple[int, int, frozenset[str]]]:
    """Each group's (epoch, restarts, pod UIDs)."""
    out: dict[str, tuple[int, int, frozenset[str]]] = {}
    for role in c.ROLES:
        for index, g in drill.groups(role).items():
            key = f"{role}/{index}"
            out[key] = (int(g.get("epoch", 0)), int(g.get("restarts", 0)),
                        frozenset(drill.uids(key)))  # fmt: skip
    return out


def runtimes(drill: Drill) -> dict[str, Any]:
    return {
        f"{role}/{index}": g.get("runtime")
        for role in c.ROLES
        for index, g in drill.groups(role).items()
    }


def act(drill: Drill) -> None:
    operator = drill.cluster.operator
    assert isinstance(operator, ChartOperator), "the upgrade drill needs the chart's operator"
    assert drill.traffic is not None
    checks: Checks = []
    before = snapshot(drill)
    old_runtime = set(runtimes(drill).values())
    old_pod = operator.pod()
    started = drill.result.injected_at = drill.first_injection = time.time()
    values = dict(operator.values)
    values["image"] = {**values.get("image", {}), "tag": NEXT_TAG}
    operator.values = values
    operator.install()  # helm upgrade, then the new operator pod Ready
    new_pod = operator.pod()
    drill.note(
        f"helm upgrade: operator image tag {NEXT_TAG}, pod {new_pod and new_pod['metadata']['name']}"
    )
    hold_until = time.time() + HOLD_S
    drill.wait(lambda: time.time() >= hold_until, HOLD_S + 10, "traffic under the new operator")
    after = snapshot(drill)
    failed = [o for o in drill.traffic.failures() if o.sent_at >= started]
    kept = runtimes(drill)
    replaced = (
        old_pod is not None
        and new_pod is not None
        and old_pod["metadata"]["uid"] != new_pod["metadata"]["uid"]
    )
    restarted = sorted(k for k in before if before[k] != after.get(k))
    upgrade: dict[str, Any] = {
        "operator_replaced": replaced,
        "groups_restarted": restarted,
        "requests_failed": len(failed),
        "runtimes_after": kept,
    }
    checks += [
        (replaced, "the operator pod was not replaced by the upgrade"),
        (not restarted, f"groups restarted: {restarted}"),
        (set(kept.values()) == old_runtime, f"runtimes changed: {kept} (was {old_runtime})"),
        (not failed, f"{len(failed)} request(s) failed during the upgrade"),
    ]
    # The explicit decision: the new runtime, group by group.
    rolled_from = time.time()
    drill.cluster.custom().patch_namespaced_custom_object(
        c.GROUP, c.VERSION, NAMESPACE, c.PLURAL, NAME, {"spec": {"runtime": {"upgrade": "Rolling"}}}
    )
    new_runtime = f"lockstep.local/operator:{NEXT_TAG}"
    at_once = [0]

    def rolled() -> bool:
        recs = drill.records()
        steps = [r.get("step", "Healthy") for r in recs.values()]
        # Out of service: any step but these (a make-before-break roll serves throughout).
        out = sum(1 for step in steps if step not in IN_SERVICE)
        at_once[0] = max(at_once[0], out)
        return set(runtimes(drill).values()) == {new_runtime} and all(
            step == "Healthy" for step in steps
        )

    waited(drill, "decode/0", rolled, 300, "every group on the new runtime")
    rolled_s = round(time.time() - rolled_from, 2)
    failed = [o for o in drill.traffic.failures() if o.sent_at >= rolled_from]
    final = snapshot(drill)
    upgrade.update(
        {
            "rollout_s": rolled_s,
            "groups_out_at_once_max": at_once[0],
            "groups_rolled": sorted(k for k in after if after[k][2] != final.get(k, after[k])[2]),
            "requests_failed_in_rollout": len(failed),
        }
    )
    drill.result.maintenance = {"upgrade": upgrade}
    drill.note(f"upgrade figures: {json.dumps(upgrade, default=str)}")
    checks += [
        (upgrade["groups_rolled"] == sorted(after), f"rolled {upgrade['groups_rolled']}"),
        (at_once[0] <= 1, f"{at_once[0]} groups out of service at once during the rollout"),
        (not failed, f"{len(failed)} request(s) failed during the rollout"),
    ]
    drill.conclude(checks)


# The promises are about requests through the router, and about the chart's operator.
SCENARIO = Scenario("upgrade", act, router=True, cluster_options=MORE_NODES)

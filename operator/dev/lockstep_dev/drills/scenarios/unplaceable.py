"""`unplaceable`: decode/0 restarted (Recreate) after every node lost the label its pods
require: its epoch is withdrawn whole and retried until a node has the label again."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lockstep.api import constants as c
from lockstep.core.records import ANNOTATION_RESTART
from lockstep_dev.drills.deployment import (
    AFFECTED,
    MORE_NODES,
    NAME,
    NAMESPACE,
    required_node_terms,
)
from lockstep_dev.drills.scenario import Scenario

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

# The capacity label: decode pods need it; the drill takes it away.
DRILL_CAPACITY = "lockstep.dev/drill-capacity"


def overrides(drill: Drill) -> dict[str, Any]:
    need = {"key": DRILL_CAPACITY, "operator": "In", "values": ["yes"]}
    return {
        "decode": {
            "placement": {
                "nodeAffinity": required_node_terms(need),
                "schedulingTimeoutSeconds": 10,
            }
        },
    }


def prepare(drill: Drill) -> None:
    """Label every node before the deployment exists."""
    core = drill.cluster.core()
    for n in sorted(drill.nodes()):
        core.patch_node(n, {"metadata": {"labels": {DRILL_CAPACITY: "yes"}}})
    drill.note(f"every node labelled {DRILL_CAPACITY}=yes (decode pods require it)")


def act(drill: Drill) -> None:
    """The nodes lose the label decode pods require, then decode/0 is restarted
    (Recreate): its next epoch cannot be placed, is withdrawn whole after
    schedulingTimeoutSeconds and retried; once a node has the label again, it comes up."""
    core = drill.cluster.core()
    nodes = sorted(drill.nodes())
    for n in nodes:
        core.patch_node(n, {"metadata": {"labels": {DRILL_CAPACITY: None}}})
    drill.note(f"label {DRILL_CAPACITY} removed from every node; restarting decode/0")
    drill.result.injected_at = drill.first_injection = time.time()
    drill.cluster.custom().patch_namespaced_custom_object(
        c.GROUP,
        c.VERSION,
        NAMESPACE,
        c.PLURAL,
        NAME,
        {"metadata": {"annotations": {ANNOTATION_RESTART: "decode/0@unplaceable-1"}}},
    )
    drill.wait(
        lambda: drill.group(AFFECTED).get("state") == "Unschedulable",
        120,
        "decode/0 Unschedulable (its epoch withdrawn)",
    )
    withdrawn = time.time() - drill.result.injected_at
    left = drill.group_pods(AFFECTED)
    schedulable: dict[str, Any] = next(
        (x for x in drill.status().get("conditions") or [] if x["type"] == "Schedulable"), {}
    )
    events = [e for e in drill.cluster.events(NAMESPACE) if e.get("reason") == "GroupUnschedulable"]
    drill.note(f"withdrawn after {withdrawn:.1f}s: {schedulable.get('message')}")
    for n in nodes[:2]:
        core.patch_node(n, {"metadata": {"labels": {DRILL_CAPACITY: "yes"}}})
    back_at = time.time()
    drill.note(f"{DRILL_CAPACITY}=yes on {nodes[:2]} again")
    drill.wait(lambda: drill.group(AFFECTED).get("state") == "Healthy", 120, "decode/0 Healthy")
    placed = time.time() - back_at
    drill.result.maintenance = {
        "restart_to_withdrawn_s": round(withdrawn, 2),
        "capacity_to_healthy_s": round(placed, 2),
        "pods_left_when_withdrawn": len(left),
        "schedulable_condition": schedulable,
        "unschedulable_events": len(events),
        "event_message": (events[0].get("message") if events else None),
        "restarts": int(drill.group(AFFECTED).get("restarts", 0)),
    }
    msg = str(schedulable.get("message"))
    drill.conclude(
        [
            (not left, f"{len(left)} pod(s) of decode/0 left after the withdrawal"),
            (schedulable.get("status") == "False", f"Schedulable condition {schedulable}"),
            ("affinity" in msg or "selector" in msg, f"no scheduler reason in {msg!r}"),
            (bool(events), "no GroupUnschedulable Event"),
            (drill.result.maintenance["restarts"] == 1, "the withdrawals counted as restarts"),
        ]
    )


SCENARIO = Scenario(
    "unplaceable",
    act,
    overrides=overrides,
    cluster_options=MORE_NODES,
    recovery_mode="Recreate",  # the restart must place new pods
    prepare=prepare,
)

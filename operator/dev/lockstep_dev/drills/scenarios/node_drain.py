"""`node-drain`: `kubectl drain` of a node under decode/0, with traffic through the
router: the operator moves the group make-before-break, the drain then completes, the
group is never out of service and no request fails."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from lockstep.api import constants as c
from lockstep_dev.drills.deployment import (
    AFFECTED,
    MORE_NODES,
    NAMESPACE,
    group_key,
    required_node_terms,
)
from lockstep_dev.drills.figures import out_of_service
from lockstep_dev.drills.scenario import Scenario
from lockstep_dev.localcluster.kubelet import RACK_LABEL
from lockstep_dev.localcluster.maintenance import start_drain
from lockstep_dev.traffic import ROUTER

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

# The decode pool: 4 of 6 nodes, labelled and tainted so that only decode pods land there
# (the operator, the router and prefill stay off the drained node).
DRILL_POOL = "lockstep.dev/drill-pool"


def overrides(drill: Drill) -> dict[str, Any]:
    pool = {"key": DRILL_POOL, "operator": "In", "values": ["decode"]}
    return {
        "decode": {
            "tolerations": [
                {
                    "key": DRILL_POOL,
                    "operator": "Equal",
                    "value": "decode",
                    "effect": "NoSchedule",
                }
            ],
            "placement": {
                "topologyKey": RACK_LABEL,
                "spread": [{"topologyKey": RACK_LABEL, "whenUnsatisfiable": "DoNotSchedule"}],
                "nodeAffinity": required_node_terms(pool),
            },
        }
    }


def prepare(drill: Drill) -> None:
    """Label and taint 4 idle nodes as the decode pool before the deployment exists."""
    make_pool(drill, 4)


def make_pool(drill: Drill, size: int) -> None:
    """Label and taint `size` idle nodes as the decode pool (only decode pods land there:
    the operator, the router and prefill stay off the nodes a drill drains)."""
    core = drill.cluster.core()
    nodes = sorted(drill.nodes())
    busy = {
        str(p.spec.node_name)
        for p in core.list_pod_for_all_namespaces().items
        if p.spec is not None and p.spec.node_name
    }
    pool = [n for n in nodes if n not in busy][:size]
    if len(pool) < size:
        raise RuntimeError(f"need {size} idle nodes for the decode pool, have {pool}")
    for n in pool:
        core.patch_node(
            n,
            {
                "metadata": {"labels": {DRILL_POOL: "decode"}},
                "spec": {
                    "taints": [{"key": DRILL_POOL, "value": "decode", "effect": "NoSchedule"}]
                },
            },
        )
    racks = {n: drill.cluster.node_labels.get(n, {}).get(RACK_LABEL) for n in pool}
    drill.note(f"decode pool (labelled and tainted): {racks}")


def serving(drill: Drill, key: str) -> bool:
    """A rank-0 pod of the group is Ready (admitted) and not being deleted."""
    role, index = key.split("/")
    sel = f"{drill.selector},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index},{c.LABEL_RANK}=0"
    for pod in drill.cluster.pods(NAMESPACE, sel):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                return True
    return False


def watch(drill: Drill) -> None:
    """Each poll after the injection: whether decode/0 has a serving leader."""
    if drill.result.injected_at is not None:
        drill.serving.append((time.time(), serving(drill, AFFECTED)))


def act(drill: Drill) -> None:
    """`kubectl drain` the node of one pod of decode/0, with traffic through the router:
    the eviction API refuses the serving group's pods (its disruption budget), the
    operator moves the group make-before-break, and the drain then completes."""
    pods = drill.group_pods(AFFECTED)
    follower = next(p for p in pods if p["metadata"]["labels"].get(c.LABEL_RANK) == "1")
    node = str(follower["spec"]["nodeName"])
    old_nodes = sorted({str(p["spec"]["nodeName"]) for p in pods})
    epoch = int(drill.group(AFFECTED).get("epoch", 0))
    restarts = int(drill.group(AFFECTED).get("restarts", 0))
    assert drill.cluster.cp is not None
    drill.result.injected_at = drill.first_injection = time.time()
    drill.drained_at = None
    with start_drain(drill.cluster.cp.kubeconfig, node, timeout_s=240) as drain:
        drill.note(f"kubectl drain {node} (decode/0 on {old_nodes}); traffic continues")
        drill.wait(lambda: not drain.running, 280, "kubectl drain to finish")
        done = drain.wait(5)
    drill.note(f"kubectl drain exited {done.returncode} after {done.seconds:.1f}s")
    inc = drill.wait(
        lambda: next(
            (
                i
                for i in drill.status().get("incidents") or []
                if group_key(i) == AFFECTED and i["state"] == "Closed"
            ),
            None,
        ),
        120,
        "the maintenance incident closed",
    )
    drill.wait(lambda: drill.group(AFFECTED).get("state") == "Healthy", 60, "decode/0 Healthy")
    time.sleep(2)  # requests sent during the move finish (or fail) before counting
    moved = drill.group_pods(AFFECTED)
    new_nodes = sorted({str(p["spec"]["nodeName"]) for p in moved})
    node_racks = {
        name: (n["metadata"].get("labels") or {}).get(RACK_LABEL)
        for name, n in drill.nodes().items()
    }
    racks = {node_racks.get(n) for n in new_nodes}
    out = out_of_service(drill.serving)
    assert drill.traffic is not None
    failed = [o for o in drill.traffic.failures() if o.sent_at >= drill.result.injected_at]
    hanging = [o for o in failed if o.latency_s >= drill.traffic.timeout_s - 0.1]
    sent = drill.traffic.stats(drill.result.injected_at).get(ROUTER)
    drill.result.maintenance = {
        "node": node,
        "drain_exit_code": done.returncode,
        "cordon_to_drain_complete_s": round(done.seconds, 2),
        "evicted": list(done.evicted),
        "old_nodes": old_nodes,
        "new_nodes": new_nodes,
        "new_racks": sorted(r or "" for r in racks),
        "epoch": [epoch, int(drill.group(AFFECTED).get("epoch", 0))],
        "out_of_service_s": round(out, 2),
        "requests_sent": sent.sent if sent else 0,
        "requests_failed": len(failed),
        "requests_hanging": len(hanging),
        "incident_verdict": inc.get("verdict"),
        "incident_action": inc.get("action"),
        "restarts": [restarts, int(drill.group(AFFECTED).get("restarts", 0))],
    }
    drill.note(f"maintenance figures: {json.dumps(drill.result.maintenance)}")
    drill.conclude(
        [
            (done.returncode == 0, f"kubectl drain failed: {done.output[-400:]}"),
            (node not in new_nodes, f"decode/0 still on the drained node {node}"),
            (len(racks) == 1, f"decode/0's new pods span racks {racks}"),
            (inc.get("verdict") == "Maintenance", f"incident verdict {inc.get('verdict')}"),
            (
                "make-before-break" in str(inc.get("action")),
                f"not moved make-before-break: {inc.get('action')}",
            ),
            (out == 0.0, f"decode/0 out of service for {out:.2f}s"),
            (not failed, f"{len(failed)} request(s) failed during the move"),
            (
                int(drill.group(AFFECTED).get("restarts", 0)) == restarts,
                "the move counted as a restart",
            ),
        ]
    )


SCENARIO = Scenario(
    "node-drain",
    act,
    overrides=overrides,
    cluster_options=MORE_NODES,
    # The promises are about requests through the router.
    router=True,
    prepare=prepare,
    watch=watch,
)

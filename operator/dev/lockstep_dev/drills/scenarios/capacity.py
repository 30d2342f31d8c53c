"""`capacity`: what an incident costs in serving capacity, with `Drill.spares` warm
spares (0 or 1) beside decode's serving groups, in a decode pool with no free GPU,
traffic through the router (`benchmarks/capacity.py` runs it both ways). One cluster:

1. a desync, a hang and a killed rank, one after another, each in a serving decode
   group, each recovered (the role back to its serving count and its spares) before
   the next;
2. `kubectl drain` of a node under a serving group, watched for `HOLD_S`, then the node
   uncordoned and the role recovered;
3. two idle nodes join the pool (free GPUs), then `kubectl scale` of decode by one: the
   time until the role serves one group more.

Per step: group-seconds the role served short of its wanted count
(`figures.group_seconds_short`) from the fault to the role whole again, and how long
that took. Figures, not verdicts: the drill passes when every step recovered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockstep.api import constants as c
from lockstep_dev.drills.deployment import required_node_terms
from lockstep_dev.drills.figures import group_seconds_short
from lockstep_dev.drills.restart import Checks
from lockstep_dev.drills.scenario import BOTH_ENGINES, Scenario
from lockstep_dev.drills.scenarios.node_drain import DRILL_POOL, make_pool
from lockstep_dev.drills.scenarios.scale import kubectl_scale
from lockstep_dev.drills.scenarios.spares import serving_groups, serving_index, watch
from lockstep_dev.faults import FaultKind
from lockstep_dev.localcluster.maintenance import start_drain, uncordon

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

INCIDENTS: tuple[FaultKind, ...] = ("desync", "hang", "kill-rank")
HOLD_S = 30.0  # how long a drained node stays cordoned
RESERVE = 2  # idle nodes kept out of the pool until the scale-up


def serving_wanted(drill: Drill) -> int:
    return 1 if drill.engine == "sglang" else 2


def cluster_nodes(serving: int, spares: int) -> int:
    """Nodes of one GPU each: the pool (two per group), two more for the rest, and the
    reserve the scale-up adds to the pool."""
    return 2 * (serving + spares) + 2 + RESERVE


def overrides(drill: Drill) -> dict[str, Any]:
    pool = {"key": DRILL_POOL, "operator": "In", "values": ["decode"]}
    return {
        "decode": {
            "replicas": serving_wanted(drill),
            "spares": drill.spares,
            "tolerations": [
                {"key": DRILL_POOL, "operator": "Equal", "value": "decode", "effect": "NoSchedule"}
            ],
            "placement": {
                "nodeAffinity": required_node_terms(pool),
                "schedulingTimeoutSeconds": 10,
            },
        },
        "recovery": {"budget": {"restarts": 10, "windowSeconds": 3600}},
    }


def prepare(drill: Drill) -> None:
    make_pool(drill, 2 * (serving_wanted(drill) + drill.spares))


def whole(drill: Drill, spares: int) -> Callable[[], bool]:
    """The role serves its wanted count, and has its spares Healthy, nothing open."""

    def check() -> bool:
        st = drill.status().get("decode") or {}
        groups = st.get("groups") or []
        return (
            int(st.get("readyGroups", -1)) == int(st.get("replicas", 0))
            and int(st.get("readySpares", -1)) >= spares
            and all(g.get("state") in ("Healthy", "Unschedulable") for g in groups)
            and not any(i.get("state") == "Open" for i in drill.status().get("incidents") or [])
        )

    return check


def verdict_on(drill: Drill, key: str, seen: int) -> Callable[[], bool]:
    return lambda: drill.incident(key, closed=False, after=seen) is not None


def step_figures(drill: Drill, name: str, started: float, whole_at: float) -> dict[str, Any]:
    short = [t for t, n in drill.capacity if started <= t <= whole_at and n > 0]
    return {
        "step": name,
        "group_seconds_short": round(group_seconds_short(drill.capacity, started), 2),
        # From the fault to the last moment the role served short of its count.
        "short_until_s": round(short[-1] - started, 2) if short else 0.0,
        "fault_to_whole_s": round(whole_at - started, 2),
    }


def act(drill: Drill) -> None:
    checks: Checks = []
    timeout = drill.timeout_s
    for kind in INCIDENTS:
        target = serving_index(drill)
        seen = drill.incident_count(f"decode/{target}")
        started = time.time()
        drill.result.injected_at = drill.first_injection = drill.first_injection or started
        key = f"decode/{target}"
        drill.down.add(key)
        drill.inject(kind, key)
        drill.wait(verdict_on(drill, key, seen), 120, f"a verdict on {key}")
        drill.down.discard(key)
        drill.wait(whole(drill, drill.spares), timeout, f"decode whole after the {kind}")
        drill.result.steps.append({**step_figures(drill, kind, started, time.time()),
                                   "group": target})  # fmt: skip
    target = serving_index(drill)
    pods = drill.group_pods(f"decode/{target}")
    follower = next(p for p in pods if p["metadata"]["labels"].get(c.LABEL_RANK) == "1")
    node = str(follower["spec"]["nodeName"])
    assert drill.cluster.cp is not None
    started = time.time()
    with start_drain(drill.cluster.cp.kubeconfig, node, timeout_s=HOLD_S + 120) as drain:
        drill.note(f"kubectl drain {node} (under decode/{target})")
        deadline = started + HOLD_S
        drill.wait(lambda: time.time() >= deadline, HOLD_S + 10, "the node held cordoned")
        uncordon(drill.cluster.cp.kubeconfig, node)
        drill.wait(lambda: not drain.running, 180, "kubectl drain to end")
    drill.wait(whole(drill, drill.spares), timeout, "decode whole after the drain")
    drill.result.steps.append({**step_figures(drill, "node-drain", started, time.time()),
                               "held_cordoned_s": HOLD_S})  # fmt: skip
    # Room for one group more, then one group more wanted.
    make_pool(drill, RESERVE)
    wanted = serving_wanted(drill) + 1
    started = time.time()
    kubectl_scale(drill, "decode", wanted)
    drill.wait(lambda: sum(serving_groups(drill).values()) >= wanted, timeout, f"{wanted} serving")
    drill.result.scaling.append(
        {
            "role": "decode",
            "scaled": [wanted - 1, wanted],
            "spares": drill.spares,
            "scale_to_serving_s": round(time.time() - started, 2),
        }
    )
    checks.append((True, "every step recovered"))
    drill.conclude(checks)


SCENARIO = Scenario(
    "capacity",
    act,
    engines=BOTH_ENGINES,
    overrides=overrides,
    cluster_options={"nodes": cluster_nodes(2, 1), "gpus_per_node": 1},
    router=True,
    prepare=prepare,
    watch=watch,
)

"""`spares`: decode runs a warm spare beside its two serving groups (`spares: 1`) in a
cluster with no free GPU (a decode pool of six one-GPU nodes for three TP2 groups), with
traffic through the router. One cluster, three things in a row:

1. a desync in decode/0: the spare is admitted within 3 s of the verdict (the role is
   back to its two serving groups), decode/0 restarts and becomes the spare, and no
   request reaches decode/0 from the verdict on;
2. `kubectl drain` of a node of decode/1: the spare (decode/0 now) takes over with no
   moment below two serving groups, the drain completes, decode/1 becomes the spare and
   cannot be placed (no free GPU): it waits with no pod and creates none while nothing
   changes, then comes back as the spare once the node is uncordoned;
3. `kubectl scale` of decode to 3: the spare is admitted within 3 s; the new group is
   the new spare, and waits unplaced (still no free GPU) holding nothing.

On the real SGLang engine (three TP2 servers would not start beside the prefill on two
cores in time) decode serves one group beside one spare and the drill runs the first
step only: the spare admitted within 3 s of the verdict, the desynced group restarted
into the spare, no request reaching it.

The figure throughout is capacity: group-seconds the role served below its wanted count
(`figures.group_seconds_short`), sampled at every poll."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockstep import constants as c
from lockstep_dev.drills.deployment import NAME, NAMESPACE, group_key, required_node_terms
from lockstep_dev.drills.figures import group_seconds_short, ts
from lockstep_dev.drills.restart import Checks
from lockstep_dev.drills.scenario import BOTH_ENGINES, Scenario
from lockstep_dev.drills.scenarios.node_drain import DRILL_POOL, make_pool
from lockstep_dev.drills.scenarios.scale import kubectl_scale
from lockstep_dev.localcluster.maintenance import start_drain, uncordon
from lockstep_dev.traffic import request_log_arrivals

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

# Eight one-GPU nodes: six make the decode pool (three TP2 groups fill it), two hold the
# prefill group, the router and the operator.
CLUSTER = {"nodes": 8, "gpus_per_node": 1}
PROMOTION_BOUND_S = 3.0
# How long the unplaceable group is watched creating nothing.
IDLE_WATCH_S = 15.0


def serving_wanted(drill: Drill) -> int:
    """decode's serving groups in the drill (the spare is the next index)."""
    return 1 if drill.engine == "sglang" else 2


def overrides(drill: Drill) -> dict[str, Any]:
    pool = {"key": DRILL_POOL, "operator": "In", "values": ["decode"]}
    return {
        "decode": {
            "replicas": serving_wanted(drill),
            "spares": 1,
            "tolerations": [
                {"key": DRILL_POOL, "operator": "Equal", "value": "decode", "effect": "NoSchedule"}
            ],
            "placement": {
                "nodeAffinity": required_node_terms(pool),
                "schedulingTimeoutSeconds": 10,
            },
        },
        # Three restarts of decode groups within minutes: room in the budget.
        "recovery": {"budget": {"restarts": 5, "windowSeconds": 3600}},
    }


def prepare(drill: Drill) -> None:
    make_pool(drill, 6)


def serving_groups(drill: Drill) -> dict[int, bool]:
    """Decode groups whose leader is admitted (readiness gate true, not being deleted)."""
    out: dict[int, bool] = {}
    sel = f"{drill.selector},{c.LABEL_ROLE}=decode,{c.LABEL_RANK}=0"
    for pod in drill.cluster.pods(NAMESPACE, sel):
        index = int(pod["metadata"]["labels"][c.LABEL_GROUP])
        if pod["metadata"].get("deletionTimestamp"):
            continue
        gate = any(
            cond.get("type") == c.READINESS_GATE and cond.get("status") == "True"
            for cond in (pod.get("status") or {}).get("conditions") or []
        )
        out[index] = out.get(index, False) or gate
    return out


def watch(drill: Drill) -> None:
    """Each poll: how many groups the decode role serves short of its wanted count."""
    wanted = int((drill.status().get("decode") or {}).get("replicas", 0))
    serving = sum(serving_groups(drill).values())
    drill.capacity.append((time.time(), max(0, wanted - serving)))


def full_since(drill: Drill, since: float) -> float | None:
    """The first sample at or after `since` with the role at full serving count."""
    return next((t for t, short in drill.capacity if t >= since and short == 0), None)


def spare_of(drill: Drill) -> list[int]:
    return sorted(i for i, g in drill.groups("decode").items() if g.get("spare"))


def healthy_spare(drill: Drill, index: int) -> Callable[[], bool]:
    def check() -> bool:
        g = drill.groups("decode").get(index, {})
        return bool(g.get("spare")) and g.get("state") == "Healthy"

    return check


def arrivals_at(drill: Drill, index: int, since: float) -> int:
    return sum(
        1
        for a in request_log_arrivals(drill.workdir / "kubelet", NAMESPACE, NAME)
        if a.role == "decode" and a.group == index and a.at >= since
    )


def desync_step(drill: Drill, checks: Checks) -> None:
    """A desync in decode/0 with the spare (the highest group) standing by."""
    spare = serving_wanted(drill)
    before = spare_of(drill)
    checks.append((before == [spare], f"the spares before the desync are {before}"))
    checks.append((arrivals_at(drill, spare, 0.0) == 0, "the spare received requests"))
    seen = drill.incident_count("decode/0")
    drill.result.injected_at = drill.first_injection = time.time()
    drill.inject("desync", "decode/0")
    inc = drill.wait(
        lambda: drill.incident("decode/0", closed=False, after=seen), 60, "a verdict on decode/0"
    )
    verdict_at = ts(inc.get("detectedTime")) or time.time()
    drill.wait(lambda: full_since(drill, verdict_at) is not None, 30, "full serving capacity")
    full = full_since(drill, verdict_at) or time.time()
    promoted_s = round(full - verdict_at, 2)
    drill.note(f"verdict {inc.get('verdict')}: decode at full serving capacity {promoted_s}s after")
    drill.wait(healthy_spare(drill, 0), drill.timeout_s, "decode/0 restarted, standing by")
    closed = drill.incident("decode/0", after=seen) or {}
    drill.note(f"decode/0 standing by as the spare: {closed.get('action')}")
    time.sleep(2)
    late = arrivals_at(drill, 0, verdict_at + 1)  # a second of slack for the drain itself
    assert drill.traffic is not None
    failed = [o for o in drill.traffic.failures() if o.sent_at >= drill.first_injection]
    drill.result.steps.append(
        {
            "fault": "desync",
            "verdict": inc.get("verdict"),
            "verdict_to_full_capacity_s": promoted_s,
            "requests_to_decode0_after_verdict": late,
            "requests_failed": len(failed),
            "spares_after": spare_of(drill),
        }
    )
    checks += [
        (promoted_s <= PROMOTION_BOUND_S, f"full capacity {promoted_s}s after the verdict"),
        (spare_of(drill) == [0], f"the spares after the desync are {spare_of(drill)}"),
        (late == 0, f"{late} request(s) reached decode/0 after its verdict"),
        ("spare" in str(closed.get("action")), f"incident action {closed.get('action')}"),
        (not failed, f"{len(failed)} request(s) failed around the desync"),
    ]


def drain_step(drill: Drill, checks: Checks) -> None:
    """`kubectl drain` of decode/1's follower node in the full pool."""
    pods = drill.group_pods("decode/1")
    follower = next(p for p in pods if p["metadata"]["labels"].get(c.LABEL_RANK) == "1")
    node = str(follower["spec"]["nodeName"])
    assert drill.cluster.cp is not None
    started = time.time()
    with start_drain(drill.cluster.cp.kubeconfig, node, timeout_s=180) as drain:
        drill.note(f"kubectl drain {node} (under decode/1); no free GPU in the decode pool")
        drill.wait(lambda: not drain.running, 200, "kubectl drain to finish")
        done = drain.wait(5)
    drill.note(f"kubectl drain exited {done.returncode} after {done.seconds:.1f}s")
    drill.wait(
        lambda: (
            drill.groups("decode").get(1, {}).get("state") == "Unschedulable"
            and not drill.group_pods("decode/1")
        ),
        120,
        "decode/1 waiting unplaced with no pod",
    )
    epoch = int(drill.groups("decode")[1].get("epoch", 0))
    uids: set[str] = set()
    idle_from = time.time()
    while time.time() - idle_from < IDLE_WATCH_S:
        drill.poll()
        uids |= drill.uids("decode/1")
        time.sleep(0.5)
    created = len(uids)
    epoch_after = int(drill.groups("decode")[1].get("epoch", 0))
    short = group_seconds_short(drill.capacity, started)
    uncordon(drill.cluster.cp.kubeconfig, node)
    drill.note(f"kubectl uncordon {node}")
    back_from = time.time()
    drill.wait(healthy_spare(drill, 1), drill.timeout_s, "decode/1 placed again, standing by")
    back_s = round(time.time() - back_from, 2)
    assert drill.traffic is not None
    failed = [o for o in drill.traffic.failures() if o.sent_at >= started]
    drill.result.maintenance = {
        "node": node,
        "drain_exit_code": done.returncode,
        "cordon_to_drain_complete_s": round(done.seconds, 2),
        "group_seconds_short": round(short, 2),
        "pods_created_while_unplaceable": created,
        "epochs_while_unplaceable": [epoch, epoch_after],
        "uncordon_to_standing_by_s": back_s,
        "requests_failed": len(failed),
        "spares_after": spare_of(drill),
    }
    drill.note(f"maintenance figures: {json.dumps(drill.result.maintenance)}")
    checks += [
        (done.returncode == 0, f"kubectl drain failed: {done.output[-400:]}"),
        (short == 0.0, f"decode served {short:.2f} group-seconds short during the drain"),
        (created == 0 and epoch_after == epoch, f"{created} pod(s) created while unplaceable"),
        (spare_of(drill) == [1], f"the spares after the drain are {spare_of(drill)}"),
        (not failed, f"{len(failed)} request(s) failed around the drain"),
    ]


def scale_step(drill: Drill, checks: Checks) -> None:
    """decode scaled 2 -> 3: the spare (decode/1) admitted at once, a new spare asked."""
    started = time.time()
    kubectl_scale(drill, "decode", 3)
    drill.wait(
        lambda: int((drill.status().get("decode") or {}).get("replicas", 0)) == 3,
        30,
        "decode wanting 3 serving groups",
    )
    drill.wait(lambda: full_since(drill, started) is not None, 30, "three serving groups")
    full = full_since(drill, started) or time.time()
    promoted_s = round(full - started, 2)
    new = drill.wait(lambda: drill.groups("decode").get(3), 30, "a new decode group")
    drill.note(f"decode at 3 serving groups {promoted_s}s after kubectl scale; new group {new}")
    drill.result.scaling.append(
        {
            "role": "decode",
            "scaled": [2, 3],
            "scale_to_full_capacity_s": promoted_s,
            "new_group": {k: new.get(k) for k in ("index", "state", "spare")},
        }
    )
    checks += [
        (promoted_s <= PROMOTION_BOUND_S, f"3 serving groups {promoted_s}s after the scale"),
        (bool(new.get("spare")), f"the new group is not the spare: {new}"),
        (serving_groups(drill).get(1) is True, "decode/1 (the spare) was not admitted"),
    ]


def act(drill: Drill) -> None:
    checks: Checks = []
    desync_step(drill, checks)
    if drill.engine == "standin" and all(ok for ok, _ in checks):
        drain_step(drill, checks)
    if drill.engine == "standin" and all(ok for ok, _ in checks):
        scale_step(drill, checks)
    incidents = [i for i in drill.status().get("incidents") or [] if group_key(i) == "decode/0"]
    drill.result.incidents = incidents
    drill.conclude(checks)


SCENARIO = Scenario(
    "spares",
    act,
    engines=BOTH_ENGINES,
    overrides=overrides,
    cluster_options=CLUSTER,
    router=True,
    prepare=prepare,
    watch=watch,
)

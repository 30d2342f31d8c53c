"""`spares`: decode runs a warm spare beside its two serving groups (`spares: 1`) in a
cluster with no free GPU (a decode pool of six one-GPU nodes for three TP2 groups), with
traffic through the router. One cluster, three things in a row:

1. a desync in a serving group: the spare is admitted within PROMOTION_BOUND_S of the verdict (the
   role is back to its two serving groups), the broken group restarts and becomes the
   spare, and no request reaches it from the verdict on;
2. `kubectl drain` of a node of a serving group: the spare (the desynced group now)
   takes over with no moment below two serving groups, the drain completes, the drained
   group becomes the spare and
   cannot be placed (no free GPU): withdrawn whole (the Schedulable condition and a
   GroupUnschedulable Event say why, no restart counted), it waits with no pod and
   creates none while nothing changes, then comes back as the spare once the node is
   uncordoned;
3. `kubectl scale` of decode to 3: the spare is admitted within PROMOTION_BOUND_S; the new group is
   the new spare, and waits unplaced (still no free GPU) holding nothing;
4. `kubectl drain` under a serving group again, now with no spare ready: the group
   drains first (capacity is lost: the figure), waits unplaced creating nothing, and
   the role serves three groups again once the node is uncordoned.

On the real SGLang engine (three TP2 servers would not start beside the prefill on two
cores in time) decode serves one group beside one spare and the drill runs the first
step only: the spare admitted within PROMOTION_BOUND_S of the verdict, the desynced group restarted
into the spare, no request reaching it.

The figure throughout is capacity: group-seconds the role served below its wanted count
(`figures.group_seconds_short`), sampled at every poll."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockstep.api import constants as c
from lockstep_dev.drills.deployment import NAME, NAMESPACE, required_node_terms
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
# The spare takes the broken group's place instead of the role waiting for its restart
# (a real-engine restart takes 90 s and more here): a behavioural bound, not a speed
# target (the figure itself is reported: 0.24 s and 3.62 s on the real engine, 0.3 s on
# the stand-in, on a 2-core machine shared with other work).
PROMOTION_BOUND_S = 15.0
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


# Steps of a group that serves (its leader admitted): in service, just admitted, or
# moving with its old pods serving. Suspect (failing probes) and every recovery step do not.
SERVING_STEPS = ("Healthy", "Readmitting", "Moving", "HandingOver")


def serving_groups(drill: Drill) -> dict[int, bool]:
    """Decode groups that serve: the leader admitted (readiness gate true, not being
    deleted), the group in a serving step, and not one a fault was just injected into
    (`Drill.down`: broken before the operator could tell)."""
    records = drill.records()
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
        step = str((records.get(f"decode/{index}") or {}).get("step", "Starting"))
        ok = gate and step in SERVING_STEPS and f"decode/{index}" not in drill.down
        out[index] = out.get(index, False) or ok
    return out


def watch(drill: Drill) -> None:
    """Each poll: how many groups the decode role serves short of its wanted count."""
    wanted = int((drill.status().get("decode") or {}).get("replicas", 0))
    serving = sum(serving_groups(drill).values())
    drill.capacity.append((time.time(), max(0, wanted - serving)))


def full_since(drill: Drill, since: float) -> float | None:
    """The first sample at or after `since` with the role at full serving count."""
    return next((t for t, short in drill.capacity if t >= since and short == 0), None)


def story(drill: Drill, key: str, last: int = 12) -> str:
    """For a failed wait: the group's record and its last Events, oldest first."""
    role, index = key.split("/")
    mine = f"{role} group {index}:"
    events = sorted(
        (e for e in drill.cluster.events(NAMESPACE) if mine in str(e.get("message"))),
        key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""),
    )
    said = [
        f"{e.get('reason')}: {str(e.get('message'))[len(mine) :].strip()[:200]}" for e in events
    ]
    pods = [
        (
            p["metadata"]["name"],
            p["metadata"]["labels"].get(c.LABEL_EPOCH),
            p["spec"].get("nodeName"),
            (p.get("status") or {}).get("phase"),
            bool(p["metadata"].get("deletionTimestamp")),
        )
        for p in drill.cluster.pods(NAMESPACE, f"{drill.selector},{c.LABEL_ROLE}={role},"
                                    f"{c.LABEL_GROUP}={index}")
    ]  # fmt: skip
    return f"{key} record {drill.records().get(key)}; pods {pods}; events {said[-last:]}"


def waited(drill: Drill, key: str, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """`drill.wait`, whose timeout also tells the group's story."""
    try:
        return drill.wait(predicate, timeout, what)
    except TimeoutError as err:
        raise TimeoutError(f"{err}; {story(drill, key)}") from None


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


def serving_index(drill: Drill) -> int:
    """The lowest-numbered decode group that serves."""
    return min(i for i, ok in serving_groups(drill).items() if ok)


def desync_step(drill: Drill, checks: Checks) -> None:
    """A desync in a serving decode group with one spare standing by."""
    before = spare_of(drill)
    checks.append((len(before) == 1, f"the spares before the desync are {before}"))
    if not before:
        return
    spare = before[0]
    checks.append((arrivals_at(drill, spare, 0.0) == 0, f"the spare decode/{spare} got requests"))
    target = serving_index(drill)
    key = f"decode/{target}"
    seen = drill.incident_count(key)
    drill.result.injected_at = drill.first_injection = time.time()
    drill.down.add(key)
    drill.inject("desync", key)
    inc = drill.wait(
        lambda: drill.incident(key, closed=False, after=seen), 60, f"a verdict on {key}"
    )
    drill.down.discard(key)  # from the verdict on, its record says
    verdict_at = ts(inc.get("detectedTime")) or time.time()
    drill.wait(lambda: full_since(drill, verdict_at) is not None, 30, "full serving capacity")
    full = full_since(drill, verdict_at) or time.time()
    promoted_s = round(full - verdict_at, 2)
    drill.note(f"verdict {inc.get('verdict')}: decode at full serving capacity {promoted_s}s after")
    waited(drill, key, healthy_spare(drill, target), drill.timeout_s, f"{key} standing by")
    closed = drill.incident(key, after=seen) or {}
    drill.note(f"{key} standing by as the spare: {closed.get('action')}")
    time.sleep(2)
    late = arrivals_at(drill, target, verdict_at + 1)  # a second of slack for the drain
    assert drill.traffic is not None
    failed = [o for o in drill.traffic.failures() if o.sent_at >= drill.first_injection]
    drill.result.steps.append(
        {
            "fault": "desync",
            "group": target,
            "spare_before": spare,
            "verdict": inc.get("verdict"),
            "verdict_to_full_capacity_s": promoted_s,
            "requests_to_the_group_after_verdict": late,
            "requests_failed": len(failed),
            "spares_after": spare_of(drill),
        }
    )
    checks += [
        (promoted_s <= PROMOTION_BOUND_S, f"full capacity {promoted_s}s after the verdict"),
        (spare_of(drill) == [target], f"the spares after the desync are {spare_of(drill)}"),
        (late == 0, f"{late} request(s) reached {key} after its verdict"),
        ("spare" in str(closed.get("action")), f"incident action {closed.get('action')}"),
        (not failed, f"{len(failed)} request(s) failed around the desync"),
    ]


def placement_events(drill: Drill, key: str) -> list[dict[str, Any]]:
    """The operator's GroupUnschedulable Events for the group `key` (role/index)."""
    role, index = key.split("/")
    return [
        e
        for e in drill.cluster.events(NAMESPACE)
        if e.get("reason") == "GroupUnschedulable"
        and f"{role} group {index}:" in str(e.get("message"))
    ]


def pods_created_while_watched(drill: Drill, key: str) -> set[str]:
    """The uids of the pods of `key` created during IDLE_WATCH_S. A withdrawn pod still
    terminating when the watch begins is none of them (the drill's wait for "no pod"
    sees only pods not being deleted; CI once counted such a pod as created)."""
    before = drill.uids(key)
    if before:
        drill.note(f"{key}: {len(before)} withdrawn pod(s) still terminating as the watch begins")
    created: set[str] = set()
    idle_from = time.time()
    while time.time() - idle_from < IDLE_WATCH_S:
        drill.poll()
        created |= drill.uids(key) - before
        time.sleep(0.5)
    if created:
        # Why it tried again, for whoever reads a failed run: the operator's placement
        # Events for the group and what the nodes looked like (a taint, a cordon).
        said = [str(e.get("message")) for e in placement_events(drill, key)]
        nodes = {
            name: [n["spec"].get("unschedulable"), n["spec"].get("taints")]
            for name, n in drill.nodes().items()
        }
        drill.note(
            f"{key}: pod(s) {sorted(created)} created while it could not be placed; "
            f"its placement Events {said[-4:]}; the nodes {nodes}"
        )
    return created


def drain_step(drill: Drill, checks: Checks) -> None:
    """`kubectl drain` of a serving group's follower node in the full pool."""
    target = serving_index(drill)
    key = f"decode/{target}"
    pods = drill.group_pods(key)
    follower = next(p for p in pods if p["metadata"]["labels"].get(c.LABEL_RANK) == "1")
    node = str(follower["spec"]["nodeName"])
    assert drill.cluster.cp is not None
    started = time.time()
    with start_drain(drill.cluster.cp.kubeconfig, node, timeout_s=180) as drain:
        drill.note(f"kubectl drain {node} (under {key}); no free GPU in the decode pool")
        drill.wait(lambda: not drain.running, 200, "kubectl drain to finish")
        done = drain.wait(5)
    drill.note(f"kubectl drain exited {done.returncode} after {done.seconds:.1f}s")
    waited(
        drill,
        key,
        lambda: (
            drill.groups("decode").get(target, {}).get("state") == "Unschedulable"
            and not drill.group_pods(key)
        ),
        120,
        f"{key} waiting unplaced with no pod",
    )
    epoch = int(drill.groups("decode")[target].get("epoch", 0))
    restarts = int(drill.groups("decode")[target].get("restarts", 0))
    schedulable: dict[str, Any] = next(
        (x for x in drill.status().get("conditions") or [] if x["type"] == "Schedulable"), {}
    )
    withdrawn = placement_events(drill, key)
    created = len(pods_created_while_watched(drill, key))
    epoch_after = int(drill.groups("decode")[target].get("epoch", 0))
    short = group_seconds_short(drill.capacity, started)
    uncordon(drill.cluster.cp.kubeconfig, node)
    drill.note(f"kubectl uncordon {node}")
    back_from = time.time()
    waited(drill, key, healthy_spare(drill, target), drill.timeout_s, f"{key} standing by")
    back_s = round(time.time() - back_from, 2)
    assert drill.traffic is not None
    failed = [o for o in drill.traffic.failures() if o.sent_at >= started]
    drill.result.maintenance = {
        "node": node,
        "group": target,
        "drain_exit_code": done.returncode,
        "cordon_to_drain_complete_s": round(done.seconds, 2),
        "group_seconds_short": round(short, 2),
        "pods_created_while_unplaceable": created,
        "epochs_while_unplaceable": [epoch, epoch_after],
        "uncordon_to_standing_by_s": back_s,
        "requests_failed": len(failed),
        "spares_after": spare_of(drill),
        "schedulable_condition": schedulable,
        "unschedulable_events": len(withdrawn),
        "restarts": [restarts, int(drill.groups("decode")[target].get("restarts", 0))],
    }
    drill.note(f"maintenance figures: {json.dumps(drill.result.maintenance)}")
    said = str(schedulable.get("message"))
    checks += [
        (done.returncode == 0, f"kubectl drain failed: {done.output[-400:]}"),
        (short == 0.0, f"decode served {short:.2f} group-seconds short during the drain"),
        (created == 0 and epoch_after == epoch, f"{created} pod(s) created while unplaceable"),
        (spare_of(drill) == [target], f"the spares after the drain are {spare_of(drill)}"),
        (not failed, f"{len(failed)} request(s) failed around the drain"),
        (schedulable.get("status") == "False", f"Schedulable condition {schedulable}"),
        ("Insufficient nvidia.com/gpu" in said, f"no scheduler reason in {said!r}"),
        (bool(withdrawn), "no GroupUnschedulable Event"),
        (drill.result.maintenance["restarts"][1] == restarts, "the move counted as a restart"),
    ]


def scale_step(drill: Drill, checks: Checks) -> None:
    """decode scaled 2 -> 3: the spare admitted at once, a new spare asked for."""
    (spare,) = spare_of(drill)
    started = time.time()
    kubectl_scale(drill, "decode", 3)
    drill.wait(lambda: sum(serving_groups(drill).values()) >= 3, 30, "three serving groups")
    promoted_s = round(time.time() - started, 2)
    new = drill.wait(lambda: drill.groups("decode").get(3), 30, "a new decode group")
    drill.note(f"decode at 3 serving groups {promoted_s}s after kubectl scale; new group {new}")
    drill.result.scaling.append(
        {
            "role": "decode",
            "scaled": [2, 3],
            "spare_before": spare,
            "scale_to_full_capacity_s": promoted_s,
            "new_group": {k: new.get(k) for k in ("index", "state", "spare")},
        }
    )
    checks += [
        (promoted_s <= PROMOTION_BOUND_S, f"3 serving groups {promoted_s}s after the scale"),
        (bool(new.get("spare")), f"the new group is not the spare: {new}"),
        (serving_groups(drill).get(spare) is True, f"decode/{spare} (the spare) not admitted"),
    ]


def drain_without_spare_step(drill: Drill, checks: Checks) -> None:
    """`kubectl drain` under a serving group with no spare ready (the new one has no
    room): the group cannot be moved make-before-break, drains first and waits unplaced,
    creating nothing, until the node is back; then the role serves three groups again."""
    target = serving_index(drill)
    key = f"decode/{target}"
    follower = next(
        p for p in drill.group_pods(key) if p["metadata"]["labels"].get(c.LABEL_RANK) == "1"
    )
    node = str(follower["spec"]["nodeName"])
    assert drill.cluster.cp is not None
    started = time.time()
    with start_drain(drill.cluster.cp.kubeconfig, node, timeout_s=180) as drain:
        drill.note(f"kubectl drain {node} (under {key}); no spare ready, no free GPU")
        waited(
            drill,
            key,
            lambda: (
                drill.groups("decode").get(target, {}).get("state") == "Unschedulable"
                and not drill.group_pods(key)
            ),
            180,
            f"{key} waiting unplaced with no pod",
        )
        uids = pods_created_while_watched(drill, key)
        drill.wait(lambda: not drain.running, 200, "kubectl drain to finish")
        done = drain.wait(5)
    short = group_seconds_short(drill.capacity, started)
    uncordon(drill.cluster.cp.kubeconfig, node)
    drill.note(f"kubectl uncordon {node}")
    back_from = time.time()
    waited(
        drill, key, lambda: sum(serving_groups(drill).values()) >= 3, drill.timeout_s,
        "three serving groups again",
    )  # fmt: skip
    back_s = round(time.time() - back_from, 2)
    figures = {
        "node": node,
        "group": target,
        "drain_exit_code": done.returncode,
        "group_seconds_short": round(short, 2),
        "pods_created_while_unplaceable": len(uids),
        "uncordon_to_serving_s": back_s,
    }
    drill.result.maintenance["without_spare"] = figures
    drill.note(f"drain without a spare: {json.dumps(figures)}")
    checks += [
        (done.returncode == 0, f"kubectl drain failed: {done.output[-400:]}"),
        (not uids, f"{len(uids)} pod(s) created while {key} could not be placed"),
        (short > 0.0, "no capacity lost without a spare: the drill did not drain a group"),
    ]


def act(drill: Drill) -> None:
    checks: Checks = []
    desync_step(drill, checks)
    if drill.engine == "standin" and all(ok for ok, _ in checks):
        drain_step(drill, checks)
    if drill.engine == "standin" and all(ok for ok, _ in checks):
        scale_step(drill, checks)
    if drill.engine == "standin" and all(ok for ok, _ in checks):
        drain_without_spare_step(drill, checks)
    drill.result.incidents = list(drill.status().get("incidents") or [])
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

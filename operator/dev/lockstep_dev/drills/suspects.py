"""The suspect-node checks of a drill whose deployment sets `recovery.suspectNodes` (the
sequence drills', `Drill(..., suspect_nodes=...)`), judged once its incidents are over.

What the drill expects is counted here from the incidents as status lists them (each
incident's `outliers`, the nodes their pods ran on), not asked of the operator's own
code: a node behind the outlier of `incidents` of them is suspect. For each, the
NodesSuspect condition names it and an Event tells it. With `cordon`, the operator
cordons the first suspect node (annotated with this deployment and why), tells it in a
NodeCordoned Event, places no pod there afterwards, and cordons no more than
`maxCordoned`; without, it cordons nothing and the Event says the cordon is off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lockstep.cli.kubectl import event_time
from lockstep.core.maintenance import CORDONED_BY_ANNOTATION
from lockstep_dev.drills.deployment import NAME, NAMESPACE
from lockstep_dev.drills.figures import ts

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

Checks = list[tuple[bool, str]]


def outlier_nodes(incidents: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The incidents (by id, in order) whose outliers ran on each node; an incident
    counts once per node, however many of its ranks there differed."""
    found: dict[str, list[str]] = {}
    for inc in incidents:
        for node in dict.fromkeys(
            str(o["node"]) for o in inc.get("outliers") or [] if o.get("node")
        ):
            found.setdefault(node, []).append(str(inc["id"]))
    return found


def suspect_checks(drill: Drill) -> Checks:
    """The condition, the Events and the cordon (or none) the incidents call for."""
    spec = dict(drill.suspect_nodes or {})
    needed = int(spec.get("incidents", 3))
    cordon = bool(spec.get("cordon", False))
    most = int(spec.get("maxCordoned", 1))
    status = drill.status()
    incidents = status.get("incidents") or []
    order = {str(inc["id"]): i for i, inc in enumerate(incidents)}
    by_node = outlier_nodes(incidents)
    suspects = sorted(n for n, ids in by_node.items() if len(ids) >= needed)
    r = drill.result
    r.suspects = {"nodes": {n: by_node[n] for n in suspects}}
    checks: Checks = [
        (bool(suspects), f"no node hosted the outlier of {needed} incidents: {by_node}")
    ]
    if not suspects:
        return checks
    cond: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c["type"] == "NodesSuspect"), {}
    )
    checks.append(
        (
            cond.get("status") == "True"
            and all(
                f"node {n} hosted the outlier rank" in str(cond.get("message")) for n in suspects
            ),
            f"the NodesSuspect condition does not name {suspects}: {cond}",
        )
    )
    events = drill.cluster.events(NAMESPACE)
    told = {
        n: [e for e in events if e.get("reason") in ("NodeSuspect", "NodeCordoned")
            and f"node {n} hosted" in str(e.get("message"))]
        for n in suspects
    }  # fmt: skip
    checks += [(bool(told[n]), f"no Event tells that node {n} is suspect") for n in suspects]
    nodes = drill.nodes()
    owner = f"{NAMESPACE}/{NAME}"
    ours = sorted(
        n
        for n, node in nodes.items()
        if (node["metadata"].get("annotations") or {}).get(CORDONED_BY_ANNOTATION) == owner
        and node["spec"].get("unschedulable")
    )
    r.suspects["cordoned"] = ours
    if not cordon:
        unschedulable = sorted(n for n, node in nodes.items() if node["spec"].get("unschedulable"))
        off = "not cordoned (spec.recovery.suspectNodes.cordon is off)"
        checks += [
            (not unschedulable, f"nodes cordoned with the cordon off: {unschedulable}"),
            (
                all(any(off in str(e.get("message")) for e in told[n]) for n in suspects),
                f"the NodeSuspect Events do not say the cordon is off: {told}",
            ),
        ]
        return checks
    # The first to become suspect (ties: by name, as the operator goes through them).
    first = min(suspects, key=lambda n: (order[by_node[n][needed - 1]], n))
    held = f"not cordoned (maxCordoned={most}"
    checks += [
        (first in ours, f"the first suspect node {first} is not cordoned by {owner} ({ours})"),
        (len(ours) <= most, f"{len(ours)} nodes cordoned, maxCordoned is {most}: {ours}"),
        (
            all(
                any(held in str(e.get("message")) for e in told[n])
                for n in suspects
                if n not in ours
            ),
            f"a suspect node left uncordoned is not told held back by maxCordoned: {told}",
        ),
    ]
    cordoned = [e for e in told[first] if e.get("reason") == "NodeCordoned"]
    checks.append((bool(cordoned), f"no NodeCordoned Event for {first}"))
    at = min((t for t in map(event_time, cordoned) if t is not None), default=None)
    if at is not None:
        # API times are whole seconds: a pod created in the second of the cordon counts
        # as placed after it.
        placed = sorted(
            p["metadata"]["name"]
            for p in drill.cluster.pods(NAMESPACE, drill.selector)
            if p["spec"].get("nodeName") == first
            and (ts(p["metadata"].get("creationTimestamp")) or 0.0) >= int(at)
        )
        checks.append((not placed, f"pods placed on cordoned {first} after the cordon: {placed}"))
        r.suspects["cordoned_at"] = at
        # The incident that made it suspect was restarted onto new pods: the cordon came
        # first (no pod of the restart created in an earlier second), none of them on it.
        made = by_node[first][needed - 1]
        step = next((s for s in r.steps if s.get("incident") == made), {})
        if step.get("restart_mode") == "Recreate":
            early = [p for p in step.get("pods") or [] if (ts(p["created"]) or 0.0) < int(at)]
            checks.append(
                (
                    not early and all(p["node"] != first for p in step["pods"]),
                    f"{made}'s restart placed {step['pods']} (cordoned {first} at {at})",
                )
            )
    else:
        checks.append((False, f"the NodeCordoned Event of {first} has no time: {cordoned}"))
    return checks

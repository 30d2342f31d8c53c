"""Suspect nodes (`lockstep.core.suspects`): a node behind the outlier of N incidents in a
window is named; the opt-in cordon is bounded, skips what a person decided, and is off by
default."""

from __future__ import annotations

from lockstep.api.models import Incident, IncidentOutlier, SuspectNodesSpec
from lockstep.api.objects import rfc3339
from lockstep.core.maintenance import NodeState
from lockstep.core.suspects import cordon_decisions, suspect_nodes

NOW = 1_800_000_000.0
OWNER = "ns/qwen"


def incident(n: int, node: str | None, ago: float, *nodes: str) -> Incident:
    outliers = [IncidentOutlier(pod=f"p-{n}", rank=1, node=node, why="its process is stopped")]
    outliers += [IncidentOutlier(pod=f"q-{n}-{x}", node=x, why="down") for x in nodes]
    return Incident(
        id=f"decode-0-{n}",
        role="decode",
        group=0,
        epoch=n,
        verdict="RankDown",
        detected_time=rfc3339(NOW - ago, "microseconds"),
        outliers=outliers,
    )


def test_a_node_behind_the_outlier_of_n_incidents_in_the_window_is_suspect() -> None:
    spec = SuspectNodesSpec()  # 3 in 3600 s
    history = [
        incident(1, "gpu-a", 4000),  # outside the window
        incident(2, "gpu-a", 3000),
        incident(3, "gpu-b", 2000),
        incident(4, "gpu-a", 1000, "gpu-a"),  # twice on gpu-a: counts once
    ]
    assert suspect_nodes(history, NOW, spec) == []
    history.append(incident(5, "gpu-a", 10))
    (found,) = suspect_nodes(history, NOW, spec)
    assert (found.node, found.incidents) == ("gpu-a", ("decode-0-2", "decode-0-4", "decode-0-5"))
    assert found.text(3600) == (
        "node gpu-a hosted the outlier rank of 3 incidents in 3600s "
        "(decode-0-2, decode-0-4, decode-0-5)"
    )
    # An outlier on no known node, or an incident with none (a hang), names no node.
    assert suspect_nodes([incident(n, None, 5) for n in range(5)], NOW, spec) == []


def test_the_cordon_is_opt_in_bounded_and_leaves_what_a_person_decided() -> None:
    history = [incident(n, node, 10) for n in range(3) for node in ("gpu-a", "gpu-b")]
    found = suspect_nodes(history, NOW, SuspectNodesSpec())
    assert [s.node for s in found] == ["gpu-a", "gpu-b"]
    nodes = {n: NodeState(n) for n in ("gpu-a", "gpu-b")}
    assert cordon_decisions(found, nodes, OWNER, SuspectNodesSpec()) == ([], [])  # off
    on = SuspectNodesSpec(cordon=True)  # maxCordoned 1
    cordon, held = cordon_decisions(found, nodes, OWNER, on)
    assert [s.node for s in cordon] == ["gpu-a"]
    # Room for one, taken by gpu-a.
    assert [(s.node, why) for s, why in held] == [
        ("gpu-b", "maxCordoned=1: already cordoned gpu-a")
    ]
    # Once gpu-a is ours and cordoned, gpu-b waits for room.
    nodes["gpu-a"] = NodeState("gpu-a", unschedulable=True, cordoned_by=OWNER)
    cordon, held = cordon_decisions(found, nodes, OWNER, on)
    assert cordon == [] and [(s.node, why) for s, why in held] == [
        ("gpu-b", "maxCordoned=1: already cordoned gpu-a")
    ]
    # A person uncordoned gpu-a: it is not cordoned again, and its slot is free.
    nodes["gpu-a"] = NodeState("gpu-a", cordoned_by=OWNER)
    cordon, held = cordon_decisions(found, nodes, OWNER, on)
    assert [s.node for s in cordon] == ["gpu-b"] and held == []
    # A node a person cordoned, or one that is gone, is left alone.
    nodes = {"gpu-a": NodeState("gpu-a", unschedulable=True)}
    assert cordon_decisions(found, nodes, OWNER, on) == ([], [])

"""Suspect nodes: a node that hosted the outlier rank of several incidents in a window.

One incident's outlier says which rank differed from the rest (`verdicts.Outlier`, kept
with its pod's node in `status.incidents[].outliers`); the same node behind the outlier
of N incidents is a pattern worth a person's look (a failing GPU, a bad NIC), and worth
keeping restarts off it. `suspect_nodes` finds them in a deployment's incident history;
`cordon_decisions` says which of them this deployment may cordon now (opt-in
`spec.recovery.suspectNodes.cordon`, bounded by `maxCordoned`, never a node already
unschedulable, never undone by the operator). Pure: the control round reads the nodes
and carries out the cordons, and tells them in Events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lockstep.api.models import Incident, SuspectNodesSpec
from lockstep.api.objects import parse_time
from lockstep.core.maintenance import NodeState

# Beside `CORDONED_BY_ANNOTATION`: why lockstep cordoned the node.
CORDON_REASON_ANNOTATION = "lockstep.dev/cordon-reason"


@dataclass(frozen=True)
class SuspectNode:
    """A node, the incidents whose outlier ran on it (in the window, oldest first)."""

    node: str
    incidents: tuple[str, ...]

    def text(self, window_seconds: int) -> str:
        shown = ", ".join(self.incidents[-5:])
        return (
            f"node {self.node} hosted the outlier rank of {len(self.incidents)} incidents "
            f"in {window_seconds}s ({shown})"
        )


def _at(incident: Incident) -> float | None:
    return parse_time(incident.detected_time)


def suspect_nodes(
    incidents: Iterable[Incident], now: float, spec: SuspectNodesSpec
) -> list[SuspectNode]:
    """The nodes behind the outlier of at least `spec.incidents` incidents whose verdict
    came within `spec.window_seconds` of `now` (an incident counts once per node), by
    node name."""
    by_node: dict[str, list[tuple[float, str]]] = {}
    for inc in incidents:
        at = _at(inc)
        if at is None or now - at > spec.window_seconds:
            continue
        for node in {o.node for o in inc.outliers if o.node}:
            by_node.setdefault(str(node), []).append((at, inc.id))
    return [
        SuspectNode(node, tuple(i for _, i in sorted(found)))
        for node, found in sorted(by_node.items())
        if len(found) >= spec.incidents
    ]


def cordoned_by(nodes: Mapping[str, NodeState], owner: str) -> set[str]:
    """The nodes this deployment (`<namespace>/<name>`) cordoned and that are still
    cordoned (a person who uncordons one gives the deployment its slot back)."""
    return {n.name for n in nodes.values() if n.cordoned_by == owner and n.unschedulable}


def cordon_decisions(
    suspects: Sequence[SuspectNode],
    nodes: Mapping[str, NodeState],
    owner: str,
    spec: SuspectNodesSpec,
) -> tuple[list[SuspectNode], list[tuple[SuspectNode, str]]]:
    """(the suspect nodes to cordon now, the ones held back and why): only with
    `spec.cordon`; not a node already unschedulable (cordoned by a person or by us) or
    gone, not a node this deployment cordoned before (its annotation stays: a person who
    uncordoned it decided), and never past `spec.max_cordoned` nodes cordoned by this
    deployment."""
    if not spec.cordon:
        return [], []
    ours = cordoned_by(nodes, owner)
    room = spec.max_cordoned - len(ours)
    cordon: list[SuspectNode] = []
    held: list[tuple[SuspectNode, str]] = []
    for s in suspects:
        node = nodes.get(s.node)
        if node is None or node.unschedulable or node.cordoned_by == owner:
            continue
        if room <= 0:
            taken = sorted(ours | {c.node for c in cordon})
            held.append(
                (s, f"maxCordoned={spec.max_cordoned}: already cordoned {', '.join(taken)}")
            )
            continue
        cordon.append(s)
        room -= 1
    return cordon, held

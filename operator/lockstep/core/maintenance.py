"""Which nodes are under maintenance, and which groups must move off them (pure).

Planned maintenance shows on the Node: `kubectl cordon`/`kubectl drain` set
`spec.unschedulable`, and maintenance tooling taints nodes (NoSchedule or NoExecute). A
group with a pod of its current epoch on such a node must move before the node goes:
the recovery planner (`recovery`, `GroupInput.maintenance`) moves it make-before-break.

Taints the node lifecycle controller sets (`node.kubernetes.io/not-ready`,
`unreachable`, pressure taints) are failures, not maintenance: the verdicts see what they
do to a group. A taint the group's pods tolerate is not a reason to move either.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Taints of node health, not of maintenance (kubectl cordon's own taint is maintenance).
HEALTH_TAINT_PREFIX = "node.kubernetes.io/"
CORDON_TAINT = "node.kubernetes.io/unschedulable"
MOVE_EFFECTS = ("NoSchedule", "NoExecute")
GPU_RESOURCE = "nvidia.com/gpu"


# The annotation on a node lockstep cordoned as a suspect: `<namespace>/<deployment>`.
CORDONED_BY_ANNOTATION = "lockstep.dev/cordoned-by"


@dataclass(frozen=True)
class NodeState:
    """What the operator keeps of a Node (from its watch): enough to judge maintenance."""

    name: str
    unschedulable: bool = False
    taints: tuple[tuple[str, str, str], ...] = ()  # key, value, effect
    # The node's allocatable accelerators (`nvidia.com/gpu`), as the node reports them:
    # a change is a change of what the scheduler can place (`cluster_fingerprint`).
    gpus: str = ""
    # Its labels (what node affinity and topology keys select on).
    labels: tuple[tuple[str, str], ...] = ()
    # The deployment (`<namespace>/<name>`) that cordoned it as a suspect (`suspects`).
    cordoned_by: str | None = None

    @classmethod
    def from_k8s(cls, node: Mapping[str, Any]) -> NodeState:
        spec = node.get("spec") or {}
        taints = tuple(
            (str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in spec.get("taints") or []
            if isinstance(t, Mapping)
        )
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        return cls(
            name=str((node.get("metadata") or {}).get("name", "")),
            unschedulable=bool(spec.get("unschedulable")),
            taints=taints,
            gpus=str(allocatable.get(GPU_RESOURCE, "")),
            labels=tuple(sorted(((node.get("metadata") or {}).get("labels") or {}).items())),
            cordoned_by=((node.get("metadata") or {}).get("annotations") or {}).get(
                CORDONED_BY_ANNOTATION
            ),
        )


def cluster_fingerprint(nodes: Mapping[str, NodeState], pods: Sequence[Mapping[str, Any]]) -> str:
    """What a group that could not be placed waits to see change before it tries again:
    the nodes (added, removed, cordoned or uncordoned, tainted, labelled, their GPUs) and the bound
    pods among `pods` (one gone frees its GPUs). A digest, equal while nothing changed."""

    parts = [
        repr(sorted((n.name, n.unschedulable, n.taints, n.gpus, n.labels) for n in nodes.values()))
    ]
    bound = sorted(
        str((p.get("metadata") or {}).get("uid", ""))
        for p in pods
        if (p.get("spec") or {}).get("nodeName")
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    )
    parts.append(",".join(bound))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _tolerated(taint: tuple[str, str, str], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    key, value, effect = taint
    for t in tolerations:
        if t.get("effect") and t.get("effect") != effect:
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == key):
            return True
        if t.get("key") == key and (t.get("value") or "") == value:
            return True
    return False


def node_maintenance(node: NodeState, tolerations: Sequence[Mapping[str, Any]] = ()) -> str | None:
    """Why pods with these tolerations should leave the node (None: they need not)."""
    if node.unschedulable:
        return f"node {node.name} is cordoned"
    for taint in node.taints:
        key, _, effect = taint
        if effect not in MOVE_EFFECTS or _tolerated(taint, tolerations):
            continue
        if key.startswith(HEALTH_TAINT_PREFIX) and key != CORDON_TAINT:
            continue
        return f"node {node.name} is tainted {key}:{effect}"
    return None


def group_maintenance(
    pods: Sequence[Mapping[str, Any]], nodes: Mapping[str, NodeState]
) -> tuple[str | None, tuple[str, ...]]:
    """Why a group must move (its pods' nodes under maintenance) and those nodes.

    `pods` are the group's pods of its current epoch; a pod not scheduled, or on a node
    the operator has not seen, is no reason.
    """
    reasons: list[str] = []
    moving: list[str] = []
    for pod in pods:
        node = nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
        if node is None or node.name in moving:
            continue
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        why = node_maintenance(node, tolerations)
        if why is not None:
            reasons.append(why)
            moving.append(node.name)
    if not reasons:
        return None, ()
    return "; ".join(reasons), tuple(sorted(moving))

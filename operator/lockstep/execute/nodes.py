"""Manager: the nodes lockstep cordons (opt-in `spec.recovery.suspectNodes.cordon`).

`lockstep.core.suspects.cordon_decisions` says which suspect nodes this deployment may
cordon now; this cordons each (as `kubectl cordon` does), annotates who and why, and
tells each outcome in an Event. Never undone here: a person uncordons."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lockstep.core.maintenance import CORDONED_BY_ANNOTATION
from lockstep.core.suspects import CORDON_REASON_ANNOTATION, SuspectNode
from lockstep.execute.scene import Scene


@dataclass
class NodeManager:
    scene: Scene

    def cordon(self, nodes: Iterable[SuspectNode], window_seconds: int) -> set[str]:
        """Cordon each node; the nodes the API server refused (RBAC: the chart grants
        `patch` on nodes only with rbac.cordonNodes), each told once in an Event."""
        owner = f"{self.scene.namespace}/{self.scene.pdd.metadata.name}"
        refused = set()
        for s in nodes:
            what = s.text(window_seconds)
            failed = self.scene.deps.kube.cordon_node(
                s.node, {CORDONED_BY_ANNOTATION: owner, CORDON_REASON_ANNOTATION: what}
            )
            if failed is None:
                self.scene.events(
                    "Warning", "NodeCordoned", f"{what}: cordoned (uncordon it by hand)"
                )
            else:
                refused.add(s.node)
                self.scene.events("Warning", "NodeCordonFailed", f"{what}: cordon failed: {failed}")
        return refused

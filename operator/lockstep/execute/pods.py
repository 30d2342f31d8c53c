"""Manager: the groups' pods, their headless Services and their disruption budgets.

The planner's deletes (`DeletePods`, by UID) and the new epochs it asks for
(`CreateEpoch`: noted here, created by the reconcile plan), the agent-token Secret before
any new pod (pods read it), the reconcile plan's creates, patches and deletes, and the
disruption budgets, level-triggered against the watch."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lockstep.core.reconcile import ReconcilePlan
from lockstep.core.recovery import CreateEpoch, DeletePods
from lockstep.execute.scene import GroupId, Scene

log = logging.getLogger(__name__)


@dataclass
class PodManager:
    """The round's pods: what to delete now, and which groups get a new epoch."""

    scene: Scene
    create_groups: set[GroupId] = field(default_factory=set)
    epochs: dict[GroupId, int] = field(default_factory=dict)
    avoid_nodes: dict[GroupId, tuple[str, ...]] = field(default_factory=dict)
    slots: dict[GroupId, int] = field(default_factory=dict)

    def delete(self, role: str, action: DeletePods) -> None:
        """Delete the group's pods, each under its UID (a repeat is a no-op)."""
        deps = self.scene.deps
        deps.kube.delete_pods(
            self.scene.namespace, [(p.name, p.uid) for p in action.pods], action.grace_seconds
        )
        if action.restart:
            deps.metrics.restarts.labels(role).inc()

    def create_epoch(self, group: GroupId, action: CreateEpoch) -> None:
        """Note the group's next epoch: the reconcile plan creates its pods (409: done)."""
        self.create_groups.add(group)
        self.epochs[group] = action.epoch
        self.slots[group] = action.slot
        if action.avoid_nodes:
            self.avoid_nodes[group] = action.avoid_nodes

    def keep(self, group: GroupId, epoch: int, slot: int, *, create: bool) -> None:
        """A group planned this round: its epoch and slot unless an action set them, and
        whether the reconciler may create its missing pods."""
        self.epochs.setdefault(group, epoch)
        self.slots.setdefault(group, slot)
        if create:
            self.create_groups.add(group)

    def new_epochs(self) -> None:
        """Before the pods of new epochs are created: pods read their restart token from
        the Secret, so it exists (made again if deleted, followed if replaced) first."""
        if self.create_groups:
            self.scene.token(fresh=True)

    def apply_reconcile(self, plan: ReconcilePlan) -> None:
        """The reconcile plan's pods and group Services (`reconcile.plan_reconcile`)."""
        kube, namespace = self.scene.deps.kube, self.scene.namespace
        for obj in plan.create:
            kube.create(obj)
        for obj in plan.patch:
            kube.patch(obj)
        if plan.delete_pods:
            kube.delete_pods(namespace, plan.delete_pods, grace_seconds=15)
            self.scene.events("Normal", "GroupsScaledDown", f"deleted {len(plan.delete_pods)} pods")
        for name in plan.delete_services:
            try:
                kube.delete("Service", namespace, name)
            except Exception as err:
                log.warning("delete service %s: %s", name, err)

    def apply_pdbs(
        self, wanted: Sequence[dict[str, Any]], observed: Sequence[Mapping[str, Any]]
    ) -> None:
        """The groups' disruption budgets, level-triggered against the watch: a missing
        one is created (409: it was, the watch had not caught up), one whose size or
        selector differs from the group's is patched (a person's edit, or a group size
        changed while the operator was down), one no group wants is deleted. Each write
        is idempotent, so a watch that lags a round only repeats a write."""
        kube = self.scene.deps.kube
        have = {
            str((o.get("metadata") or {}).get("name")): o.get("spec") or {}
            for o in observed
            if not (o.get("metadata") or {}).get("deletionTimestamp")
        }
        for pdb in wanted:
            spec = have.get(pdb["metadata"]["name"])
            if spec is None:
                kube.create(pdb)
            elif any(spec.get(k) != pdb["spec"][k] for k in ("minAvailable", "selector")):
                kube.patch(pdb)
        names = {p["metadata"]["name"] for p in wanted}
        for name in sorted(set(have) - names):
            kube.delete("PodDisruptionBudget", self.scene.namespace, name)

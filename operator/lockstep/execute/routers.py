"""Manager: a group in and out of service, and the router in front.

A group leaves or joins service by its readiness gate (`SetGate`) and, because
sglang-router does not follow readiness (`lockstep.clients.router_workers`,
docs/router.md), in every router replica's worker registry too: out of every router
before the gate turns false, back in after it turns true. Also the router's own objects
(`apply_router`: they follow `spec.router`) and the level-triggered sweep of the
registries (`sweep`: the router's own races can put back a worker lockstep removed)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lockstep.api import constants as c
from lockstep.clients.router_workers import (
    RouterBook,
    Sweep,
    admitted_urls,
    admitted_workers,
    pending_gates,
    router_bases,
    sweep_workers,
    sync_router_workers,
    user_urls,
)
from lockstep.core.builders import ROUTER_KINDS, build_router, router_name, spec_hash
from lockstep.core.reconcile import plan_router
from lockstep.core.recovery import SetGate
from lockstep.execute.scene import Scene

log = logging.getLogger(__name__)

# The router objects the operator watches (the others are applied when the spec changes).
WATCHED_ROUTER_KINDS = ("Deployment", "Service")


@dataclass
class RouterManager:
    """The gates, the routers' registries and the router's objects of one deployment.
    `book` is the routers' memory (control keeps one per deployment): readiness gates set
    and not yet in the cache the pods come from, the router registrations asked for."""

    scene: Scene
    book: RouterBook

    def set_gate(self, action: SetGate) -> None:
        """The readiness gate of the group's pods, with every router replica's registry."""
        reason = "GroupHealthy" if action.value else "GroupDrained"
        message = (
            "the group's deep probe passed"
            if action.value
            else "lockstep drained the group before restarting it"
        )
        if not action.value:  # out of every router first: no request lands in between
            self._sync(action, admit=False)
        for pod in action.pods:
            self.book.gates[pod.name] = action.value
            try:
                self.scene.deps.kube.set_pod_condition(
                    self.scene.namespace, pod.name, c.READINESS_GATE, action.value, reason, message
                )
            except Exception as err:  # a pod gone meanwhile: the planner re-checks
                log.warning("gate %s on %s: %s", action.value, pod.name, err)
        if action.value:
            self._sync(action, admit=True)

    def _sync(self, action: SetGate, *, admit: bool) -> None:
        """Remove the group's workers from every router replica, or add them back."""
        if not self.scene.pdd.spec.router.enabled:
            return
        names = {p.name for p in action.pods}
        pods = [p for p in self.scene.pods if p["metadata"]["name"] in names]
        verb = "admit" if admit else "drain"
        for problem in sync_router_workers(
            self.scene.deps.agents.http,
            pods,
            self.scene.router_pods(),
            admit=admit,
            jobs=self.book.jobs,
        ):
            log.warning("router %s of %s: %s", verb, sorted(names), problem)

    def sweep(self) -> Sweep:
        """Level-triggered, both ways: remove from every router replica the workers of no
        admitted serving pod (a pod gone, being deleted or drained) that no user flag
        names, and add back every admitted serving pod a replica does not list (its
        registration lost or failed); one Event each. Returns what it did."""
        scene, book = self.scene, self.book
        book.gates = pending_gates(scene.pods, book.gates)
        if not scene.pdd.spec.router.enabled:
            return Sweep()
        bases = router_bases(scene.router_pods())
        if not bases:
            return Sweep()
        keep = admitted_urls(scene.pods, book.gates) | user_urls(scene.pdd.spec.router.args)
        admitted = admitted_workers(scene.pods, book.gates)
        done = sweep_workers(scene.deps.agents.http, bases, keep, admitted, book.jobs)
        for base, url in done.removed:
            scene.events(
                "Normal",
                "RouterWorkerRemoved",
                f"router {base} listed {url}, which is no admitted serving pod's "
                "(gone, being deleted or drained): removed it",
            )
        for base, url, why in done.added:
            scene.events(
                "Warning",
                "RouterWorkerAdded",
                f"router {base} did not list the admitted serving pod {url} ({why}): "
                "registered it again",
            )
        for problem in done.problems:
            log.warning("router sweep of %s: %s", scene.pdd.metadata.name, problem)
        return done

    def apply(
        self,
        applied: str | None,
        services: Sequence[Mapping[str, Any]],
        deployments: Sequence[Mapping[str, Any]],
    ) -> str:
        """The router's objects follow `spec.router`: created when missing, patched when
        they drifted or the spec changed, deleted when the router is disabled. The
        Deployment and Service are watched (drift shows at once); the ServiceAccount, Role
        and RoleBinding are applied when the router spec changed from `applied` (the hash
        last applied; None: since the operator started). Returns the hash now applied."""
        kube, pdd, namespace = self.scene.deps.kube, self.scene.pdd, self.scene.namespace
        name = router_name(pdd)
        desired = build_router(pdd) if pdd.spec.router.enabled else []

        def live(objects: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
            found = next((o for o in objects if o["metadata"]["name"] == name), None)
            return dict(found) if found is not None else None

        observed = {("Deployment", name): live(deployments), ("Service", name): live(services)}
        plan = plan_router(desired, observed)
        digest = spec_hash(desired) if desired else "disabled"
        if applied != digest:
            for obj in desired:
                if obj["kind"] not in WATCHED_ROUTER_KINDS:
                    kube.apply(obj)
            if not desired:
                for kind in ROUTER_KINDS:
                    if kind not in WATCHED_ROUTER_KINDS:
                        kube.delete(kind, namespace, name)
        for obj in plan.create:
            if not kube.create(obj):  # the cache had not seen it yet
                kube.patch(obj)
        for obj in plan.patch:
            kube.patch(obj)
        for kind, obj_name in plan.delete:
            kube.delete(kind, namespace, obj_name)
        return digest

"""Manager: the per-role scale targets (`PDRoleScale`, `lockstep.core.rolescale`).

The missing ones are created and a person's count is written into one (THE RULE's step
2) before status records it, so a crash in between repeats the same; each one's status
(THE RULE's record, the serving groups, the ready ones, the selector) is written only
when it differs from what the watch shows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lockstep.core.builders import role_selector
from lockstep.core.recovery import Role
from lockstep.core.rolescale import Resolution, build_role_scale, role_scale_name, status_patch
from lockstep.execute.scene import Scene


@dataclass
class ScaleManager:
    scene: Scene

    def apply_targets(self, resolutions: Mapping[Role, Resolution]) -> None:
        """Create the missing scale targets; write a person's count into one."""
        kube, pdd, namespace = self.scene.deps.kube, self.scene.pdd, self.scene.namespace
        for role, res in resolutions.items():
            if res.create:
                obj = build_role_scale(
                    pdd.metadata.name,
                    namespace,
                    pdd.metadata.uid,
                    role,
                    res.replicas,
                    role_selector(pdd, role),
                )
                kube.create_role_scale(obj)
            elif res.scale_spec_patch is not None:
                kube.patch_role_scale(
                    namespace,
                    role_scale_name(pdd.metadata.name, role),
                    res.scale_spec_patch,
                    status=False,
                )

    def apply_status(
        self,
        scales: Sequence[Mapping[str, Any]],
        resolutions: Mapping[Role, Resolution],
        status: Mapping[str, Any],
    ) -> None:
        """Each scale target's status: THE RULE's record, the groups the role has
        (retiring ones not counted) and has ready, the serving pods' selector. Written only
        when it differs from what the watch shows."""
        pdd = self.scene.pdd
        for role, res in resolutions.items():
            groups = (status.get(role) or {}).get("groups") or []
            patch = status_patch(
                res,
                # What the autoscaler scales: the serving groups (spares are extra).
                replicas=sum(
                    1 for g in groups if g.get("state") != "Retiring" and not g.get("spare")
                ),
                ready_groups=int((status.get(role) or {}).get("readyGroups", 0)),
                selector=role_selector(pdd, role),
            )
            want = role_scale_name(pdd.metadata.name, role)
            live = next((o for o in scales if (o.get("metadata") or {}).get("name") == want), None)
            shown = (live or {}).get("status") or {}
            if res.create or any(shown.get(k) != v for k, v in patch["status"].items()):
                self.scene.deps.kube.patch_role_scale(
                    self.scene.namespace, want, patch, status=True
                )

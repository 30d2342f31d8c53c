"""A role's shape: how many groups it runs this round, and which of them serve.

One value per role, computed once per round (`deployment_shape`, from the spec and each
role's resolved count, `lockstep.core.rolescale.resolve`) and handed to everything that
needs a count: the planner (groups beyond `runs` retire, the first `serving` serve), the
reconcile plan and the stale-template check (groups `0..runs-1` exist), status (the
serving count and the spares), the metrics and `lockstep render` (which renders what the
operator runs). Nothing else computes "replicas plus spares, none while paused".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lockstep.api import constants as c
from lockstep.api.models import PDDeploymentSpec
from lockstep.core.rolescale import SOURCE_DEPLOYMENT, Source


@dataclass(frozen=True)
class RoleShape:
    """One role's groups: `replicas`, the serving count wanted (its scale target's, by
    THE RULE; `source` says whose), and `spares`, warm spare groups beyond them. A paused
    deployment runs and serves none (`runs`, `serving` and `warm` are 0); `replicas` still
    says what the count is."""

    replicas: int
    spares: int = 0
    paused: bool = False
    source: Source = SOURCE_DEPLOYMENT

    @property
    def serving(self) -> int:
        """The groups that serve (indexes 0..serving-1); 0 while paused."""
        return 0 if self.paused else self.replicas

    @property
    def warm(self) -> int:
        """The warm spare groups the role keeps; 0 while paused."""
        return 0 if self.paused else self.spares

    @property
    def runs(self) -> int:
        """The groups the role runs, spares included (indexes 0..runs-1); groups beyond
        retire (drained first)."""
        return self.serving + self.warm


def deployment_shape(
    spec: PDDeploymentSpec, counts: Mapping[str, tuple[int, Source]] | None = None
) -> dict[str, RoleShape]:
    """Each role's shape: `counts` per role is its resolved serving count and whose it is
    (default: the spec's replicas, the PDDeployment's)."""
    out = {}
    for role in c.ROLES:
        r = spec.role(role)
        replicas, source = (counts or {}).get(role, (r.replicas, SOURCE_DEPLOYMENT))
        out[role] = RoleShape(replicas, r.spares, spec.paused, source)
    return out

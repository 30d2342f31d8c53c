"""What a scenario is: everything the shared harness needs to know about one incident
drill, as data and hooks. Each module of `lockstep_dev.drills.scenarios` defines one
`SCENARIO`; the registry (`lockstep_dev.drills.registry`) maps names to them. The harness
(`lockstep_dev.drills.harness.Drill`) never asks which scenario it runs: it reads these
fields and calls these hooks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from lockstep_dev.drills.deployment import AFFECTED, RecoveryMode, base_health
from lockstep_dev.localcluster.engines import EngineName

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

Hook = Callable[["Drill"], None]
Overrides = Callable[["Drill"], dict[str, Any]]

STANDIN_ONLY: tuple[EngineName, ...] = ("standin",)
BOTH_ENGINES: tuple[EngineName, ...] = ("standin", "sglang")


def step_bounds_overrides(drill: Drill) -> dict[str, Any]:
    """The deployment's `health.stepBounds` from the drill's `step_bounds` (nothing when
    it has none: the drill deployment's own). Every scenario's spec but the maintenance
    drills' and the baseline's starts from this."""
    if drill.step_bounds is None:
        return {}
    return {"health": {**base_health(), "stepBounds": drill.step_bounds}}


@dataclass(frozen=True)
class Scenario:
    """One incident drill.

    `act` runs once every group is healthy and traffic flows: it injects the fault,
    waits with hard bounds and judges (`Drill.conclude`). The rest are what differs from
    the plain drill: the spec keys it overrides (a fresh dict each call), the
    `DevCluster` options it needs (a caller's own win), whether its promises need the
    router in front or the pods of a restart to be new, what it does to the cluster
    before the deployment exists (`prepare`), what it samples each time the harness polls
    while waiting (`watch`), and which groups the fault goes into (their failed requests
    are not the other groups')."""

    name: str
    act: Hook
    engines: tuple[EngineName, ...] = STANDIN_ONLY
    overrides: Overrides = step_bounds_overrides
    cluster_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    router: bool = False
    recovery_mode: RecoveryMode | None = None
    prepare: Hook | None = None
    watch: Hook | None = None
    faulted: tuple[str, ...] = (AFFECTED,)

    @property
    def needs_nodes(self) -> bool:
        """It needs more nodes than the default cluster's (in labelled pools)."""
        return "nodes" in self.cluster_options

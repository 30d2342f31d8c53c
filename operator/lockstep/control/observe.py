"""Observe: what a round sees of one deployment, read once (`observe_deployment`).

The deployment's pods, Services, budgets, scale targets and the cluster's nodes come from
the watch-fed caches (the caller passes them); the group records from the runtime's
memory; the evidence store's entries; each role's shape (its resolved count,
`rolescale.resolve`, THE RULE; its spares; none while paused), computed here once and
handed to the judge, the reconcile plan, status and the metrics; each running group's
kept runtime and the groups whose pod template changed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lockstep.api.models import PDDeployment, RuntimeSpec
from lockstep.control.runtime import DeploymentKey, Memory, Runtime
from lockstep.core.evidence import EvidenceEntry
from lockstep.core.maintenance import NodeState
from lockstep.core.policy import PolicyResult
from lockstep.core.reconcile import kept_runtimes, pods_by_group, stale_groups
from lockstep.core.recovery import Role
from lockstep.core.rolescale import Resolution, resolve, role_scale_name
from lockstep.core.shape import RoleShape, deployment_shape
from lockstep.core.verdicts import StepBounds
from lockstep.execute import GroupId

ROLES: tuple[Role, ...] = ("prefill", "decode")


@dataclass
class Seen:
    """What a round observed of one deployment: the watch caches' objects, the evidence
    store's entries, each role's count as resolved (`resolutions`, for the scale targets)
    and shape, each group's kept runtime and the groups whose pod template changed."""

    key: DeploymentKey
    body: Mapping[str, Any]
    pdd: PDDeployment
    policy: PolicyResult
    now: float
    pods: list[dict[str, Any]]
    by_group: dict[GroupId, list[dict[str, Any]]]
    services: list[dict[str, Any]]
    deployments: list[dict[str, Any]]
    nodes: Mapping[str, NodeState]
    scales: list[dict[str, Any]]
    pdbs: list[dict[str, Any]]
    entries: Mapping[str, EvidenceEntry]
    resolutions: dict[Role, Resolution]
    shape: dict[str, RoleShape]
    stale: list[GroupId]
    runtimes: dict[GroupId, str] = field(default_factory=dict)  # `reconcile.kept_runtimes`

    @property
    def namespace(self) -> str:
        return self.key[0]

    @property
    def name(self) -> str:
        return self.key[1]


def observe_deployment(
    rt: Runtime,
    mem: Memory,
    key: DeploymentKey,
    body: Mapping[str, Any],
    pdd: PDDeployment,
    policy: PolicyResult,
    now: float,
    caches: Mapping[str, list[dict[str, Any]]],
    nodes: Mapping[str, NodeState],
    runtime: RuntimeSpec,
) -> Seen:
    """The round's one observation of a deployment. `caches`: its pods, services,
    deployments, scales and pdbs as the watch-fed caches hold them."""
    assert rt.evidence is not None
    pods, scales = caches["pods"], caches["scales"]
    resolutions = {
        role: resolve(pdd.spec.role(role).replicas, _scale_of(scales, key[1], role))
        for role in ROLES
    }
    shape = deployment_shape(
        pdd.spec, {role: (res.replicas, res.source) for role, res in resolutions.items()}
    )
    records = mem.records.values()
    epochs = {(str(r.role), r.index): r.epoch for r in records}
    slots = {(str(r.role), r.index): r.slot for r in records}
    # Each running group keeps the runtime it runs (an operator upgrade restarts nothing).
    runtimes = kept_runtimes(runtime, pods, epochs, slots)
    # Spec changes roll group by group (one restart request at a time), judged against
    # each group's own epoch and slot (the epoch is part of the pod template).
    stale = stale_groups(pdd, policy, pods, epochs, slots, shape, runtimes)
    return Seen(
        key,
        body,
        pdd,
        policy,
        now,
        pods,
        pods_by_group(pods),
        caches["services"],
        caches["deployments"],
        nodes,
        scales,
        caches["pdbs"],
        rt.evidence.entries(*key),
        resolutions,
        shape,
        stale,
        runtimes,
    )


def step_bounds(pdd: PDDeployment, watchdog: float | None = None) -> StepBounds:
    """The deployment's `spec.health.stepBounds` for a role whose SGLang runs with
    `watchdog` seconds (its `--watchdog-timeout`; None: spec.safety.watchdogTimeoutSeconds):
    the cap defaults to that watchdog, where SGLang ends a step. The policy refuses bounds
    above the watchdog (rule step-bounds), so none is clamped here."""
    spec = pdd.spec.health.step_bounds
    cap = spec.max_seconds or watchdog or pdd.spec.safety.watchdog_timeout_seconds
    return StepBounds(spec.multiplier, spec.min_seconds, cap)


def _scale_of(scales: Sequence[Mapping[str, Any]], name: str, role: str) -> dict[str, Any] | None:
    """The role's PDRoleScale as the watch holds it (None: not there yet)."""
    want = role_scale_name(name, role)
    found = next((s for s in scales if (s.get("metadata") or {}).get("name") == want), None)
    return dict(found) if found is not None else None

"""Pure reconcile planning: desired objects (builders) vs observed objects -> operations.

What this layer does *not* do is restart groups: a group with a missing or crashed pod
is a `RankDown` for the verdicts and the recovery state machine, which restart the whole
group; recreating the one missing pod here would rendezvous a fresh rank with wedged
peers. So pods are only created for groups the caller names (new groups, or the
`Creating` step of a recovery), always the whole group in one epoch, and never while
pods of another epoch of the group still exist.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment, RuntimeSpec
from lockstep.api.objects import label
from lockstep.core.builders import (
    build_group_pdb,
    build_group_pods,
    build_group_service,
    group_name,
    pod_slot,
    runtime_of,
)
from lockstep.core.policy import PolicyResult
from lockstep.core.shape import RoleShape, deployment_shape

Obj = dict[str, Any]
GroupId = tuple[str, int]  # role, group


@dataclass
class ReconcilePlan:
    """What to do to bring the observed objects to the desired ones."""

    create: list[Obj] = field(default_factory=list)
    patch: list[Obj] = field(default_factory=list)
    delete_pods: list[tuple[str, str]] = field(default_factory=list)  # name, uid
    delete_services: list[str] = field(default_factory=list)
    waiting_groups: list[GroupId] = field(default_factory=list)  # old-epoch pods remain
    # Every PodDisruptionBudget that should exist (one per group and name slot in use).
    pdbs: list[Obj] = field(default_factory=list)


def group_of(obj: Mapping[str, Any]) -> GroupId | None:
    """(role, group) from an object's labels."""
    role, group = label(obj, c.LABEL_ROLE), label(obj, c.LABEL_GROUP)
    if role is None or group is None or not group.isdigit():
        return None
    return role, int(group)


def pods_by_group(pods: Sequence[Obj]) -> dict[GroupId, list[Obj]]:
    """Observed pods keyed by (role, group)."""
    out: dict[GroupId, list[Obj]] = {}
    for pod in pods:
        gid = group_of(pod)
        if gid is not None:
            out.setdefault(gid, []).append(pod)
    return out


def plan_reconcile(
    pdd: PDDeployment,
    policy: PolicyResult,
    pods: Sequence[Obj],
    services: Sequence[Obj],
    epochs: Mapping[GroupId, int],
    create_groups: Collection[GroupId],
    avoid_nodes: Mapping[GroupId, Sequence[str]] | None = None,
    slots: Mapping[GroupId, int] | None = None,
    retiring: Collection[GroupId] = (),
    shape: Mapping[str, RoleShape] | None = None,
    unguarded: Collection[GroupId] = (),
    runtimes: Mapping[GroupId, str] | None = None,
) -> ReconcilePlan:
    """Plan the sync of pods, group Services and disruption budgets for one PDDeployment.

    `avoid_nodes`: per group being created, nodes its new pods should avoid if they can.
    `slots`: the name slot of each group's current epoch (default 0). Pods of the other
    slot (a make-before-break move's old pods) neither block creating the current epoch
    nor make the group stale: recovery deletes them when the move is done.
    `retiring`: groups beyond replicas that recovery drains before it deletes them (their
    pods, Service and disruption budgets stay until then). `shape`: each role's shape
    (`lockstep.core.shape`: the groups it runs; default: the spec's).
    `unguarded`: groups with no disruption budget (quarantined: they serve nothing, so a
    node drain must not wait for them). Deleting the budget, not lowering it, is what lets
    the drain through: with minAvailable 0 the real API server still refused (429) to
    evict a pod of a quarantined group none of whose pods was ready (its status:
    currentHealthy 0, desiredHealthy 0, disruptionsAllowed 0). `runtimes`: the runtime
    image each group keeps (`kept_runtimes`): a missing pod of an epoch is made with the
    runtime of the pods it joins.
    """
    plan = ReconcilePlan()
    observed = pods_by_group(pods)
    svc_by_name = {s["metadata"]["name"]: s for s in services}
    desired_groups: set[GroupId] = set()
    shape = shape or deployment_shape(pdd.spec)
    for role_name in c.ROLES:
        for group in range(shape[role_name].runs):
            gid = (role_name, group)
            desired_groups.add(gid)
            epoch = epochs.get(gid, 0)
            slot = (slots or {}).get(gid, 0)
            svc = build_group_service(pdd, role_name, group, epoch, slot)
            current = svc_by_name.get(svc["metadata"]["name"])
            if current is None:
                plan.create.append(svc)
            elif (current.get("spec") or {}).get("selector") != svc["spec"]["selector"]:
                plan.patch.append(svc)
            want = build_group_pods(
                pdd,
                role_name,
                group,
                epoch,
                policy.roles[role_name],
                avoid_nodes=(avoid_nodes or {}).get(gid, ()),
                slot=slot,
                runtime_image=(runtimes or {}).get(gid),
            )
            group_pods = observed.get(gid, [])
            in_use = {slot} | {pod_slot(p) for p in group_pods}
            if gid not in unguarded:
                plan.pdbs.extend(build_group_pdb(pdd, role_name, group, s) for s in sorted(in_use))
            other = group_name(pdd, role_name, group, 1 - slot)
            if other in svc_by_name and (1 - slot) not in in_use:
                plan.delete_services.append(other)  # the move that used it is done
            have = [p for p in group_pods if pod_slot(p) == slot]
            old = [p for p in have if label(p, c.LABEL_EPOCH) != str(epoch)]
            if gid in create_groups:
                if old:
                    plan.waiting_groups.append(gid)
                else:
                    names = {p["metadata"]["name"] for p in have}
                    plan.create.extend(p for p in want if p["metadata"]["name"] not in names)
    # Groups beyond replicas (paused, or a scale-down not drained by recovery): the whole
    # group goes.
    for gid in retiring:
        plan.pdbs.extend(
            build_group_pdb(pdd, gid[0], gid[1], s)
            for s in sorted({pod_slot(p) for p in observed.get(gid, [])})
        )
    for gid, have in sorted(observed.items()):
        if gid not in desired_groups and gid not in retiring:
            plan.delete_pods.extend((p["metadata"]["name"], p["metadata"]["uid"]) for p in have)
    for name, svc in sorted(svc_by_name.items()):
        svc_group = group_of(svc)
        if (
            svc_group is not None
            and svc_group not in desired_groups
            and svc_group not in retiring
            and name in (group_name(pdd, *svc_group), group_name(pdd, *svc_group, 1))
        ):
            plan.delete_services.append(name)
    return plan


def stale_groups(
    pdd: PDDeployment,
    policy: PolicyResult,
    pods: Sequence[Obj],
    epochs: Mapping[GroupId, int],
    slots: Mapping[GroupId, int] | None = None,
    shape: Mapping[str, RoleShape] | None = None,
    runtimes: Mapping[GroupId, str] | None = None,
) -> list[GroupId]:
    """The groups whose pod template changed (a spec change to roll out, one group at a
    time, by recovery): a pod of the group's current epoch and slot whose spec hash
    differs from the desired pod of the same name. Missing pods are the verdicts'
    business, and a group with pods of another epoch is not judged until they are gone.
    `runtimes`: the runtime image each group keeps (`kept_runtimes`), judged as its own."""
    observed = pods_by_group(pods)
    out: list[GroupId] = []
    shape = shape or deployment_shape(pdd.spec)
    for role_name in c.ROLES:
        for group in range(shape[role_name].runs):
            gid = (role_name, group)
            epoch, slot = epochs.get(gid, 0), (slots or {}).get(gid, 0)
            have = [p for p in observed.get(gid, []) if pod_slot(p) == slot]
            if not have or any(label(p, c.LABEL_EPOCH) != str(epoch) for p in have):
                continue
            want = build_group_pods(
                pdd,
                role_name,
                group,
                epoch,
                policy.roles[role_name],
                slot=slot,
                runtime_image=(runtimes or {}).get(gid),
            )
            desired_hash = {
                p["metadata"]["name"]: p["metadata"]["annotations"][c.ANNOTATION_SPEC_HASH]
                for p in want
            }
            if any(
                (p["metadata"].get("annotations") or {}).get(c.ANNOTATION_SPEC_HASH)
                != desired_hash.get(p["metadata"]["name"])
                for p in have
            ):
                out.append(gid)
    return out


def kept_runtimes(
    runtime: RuntimeSpec,
    pods: Sequence[Obj],
    epochs: Mapping[GroupId, int],
    slots: Mapping[GroupId, int] | None = None,
) -> dict[GroupId, str]:
    """The runtime image each running group keeps: the one its current pods were made
    with (`builders.runtime_of`), unless the spec names one (`spec.runtime.image`: then
    every group rolls onto it) or asks for the operator's now (`upgrade: Rolling`), or
    the runtime is built into the SGLang image. So a new operator version, whose own
    runtime image is the default, changes no running group's pods; a group recreated
    anyway (a failure, a move, a spec change) comes back on the operator's runtime.
    `runtime`: the spec's own (before the operator's default image fills it in)."""
    rt = runtime
    if not rt.inject or rt.image is not None or rt.upgrade == "Rolling":
        return {}
    out: dict[GroupId, str] = {}
    for gid, group in pods_by_group(pods).items():
        epoch, slot = epochs.get(gid, 0), (slots or {}).get(gid, 0)
        for p in group:
            image = runtime_of(p)
            if image and pod_slot(p) == slot and label(p, c.LABEL_EPOCH) == str(epoch):
                out[gid] = image
                break
    return out


@dataclass
class RouterPlan:
    """What to do to the router's objects (`builders.build_router`)."""

    create: list[Obj] = field(default_factory=list)
    patch: list[Obj] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)  # kind, name


def plan_router(
    desired: Sequence[Obj], observed: Mapping[tuple[str, str], Obj | None]
) -> RouterPlan:
    """Bring the router's watched objects to `desired` (empty: the router is disabled).

    `observed` maps (kind, name) of every watched router object the caller knows of to
    the live object (None: it does not exist). A desired one is created when missing,
    patched when its spec-hash annotation differs from the live one's (the spec changed,
    or someone replaced the object) or when a field a hand edit would change differs
    (`_shape`: replicas, selector, containers' images, commands and args, Service
    ports); a live one that is not desired (the router disabled) is
    deleted. Desired objects of kinds that are not in `observed` are left to the caller.
    """
    plan = RouterPlan()
    wanted = {(o["kind"], o["metadata"]["name"]): o for o in desired}
    for key, obj in wanted.items():
        if key not in observed:
            continue
        live = observed[key]
        if live is None:
            plan.create.append(obj)
        elif _spec_hash(live) != _spec_hash(obj) or _shape(live) != _shape(obj):
            plan.patch.append(obj)
    for key, live in sorted(observed.items()):
        if key not in wanted and live is not None:
            plan.delete.append(key)
    return plan


def _shape(obj: Mapping[str, Any]) -> Any:
    """The fields of a router Deployment or Service that a hand edit changes and the API
    server never defaults or rewrites (so a patched object compares equal at once and a
    patch cannot repeat forever)."""
    spec: Mapping[str, Any] = obj.get("spec") or {}
    if obj.get("kind") == "Service":
        ports = [
            (p.get("name"), p.get("port"), p.get("targetPort")) for p in spec.get("ports") or []
        ]
        return (dict(spec.get("selector") or {}), ports)
    pod = (spec.get("template") or {}).get("spec") or {}
    containers = [
        (c.get("name"), c.get("image"), c.get("command"), c.get("args"))
        for c in pod.get("containers") or []
    ]
    return (spec.get("replicas"), containers)


def _spec_hash(obj: Mapping[str, Any]) -> str | None:
    annotations: Mapping[str, str] = (obj.get("metadata") or {}).get("annotations") or {}
    return annotations.get(c.ANNOTATION_SPEC_HASH)

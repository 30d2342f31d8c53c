"""Act: every change of the round goes through the executor (`lockstep.execute`).

`act` carries out the plans in order: the scale targets, each group's actions (spares
admitted first), the new epochs with the reconcile plan (`reconcile.plan_reconcile`,
once, over the roles' shapes), the disruption budgets and the router's objects and
registries. What the pods and the incident history show that a person should hear of is
told in Events here too: a runtime that refused to start, a suspect node (cordoned, with
`spec.recovery.suspectNodes.cordon`, by the executor's node manager)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lockstep.control.judge import Judged
from lockstep.control.observe import Seen
from lockstep.control.runtime import Memory
from lockstep.core.reconcile import plan_reconcile
from lockstep.core.records import Incidents, record_key
from lockstep.core.recovery import (
    Action,
    GroupRecord,
    Role,
    RolePlan,
    needs,
    reconciler_may_create_pods,
    retired,
)
from lockstep.core.suspects import cordon_decisions, suspect_nodes
from lockstep.core.verdicts import EndedKVJudgement, PairJudgement, pod_view_from_k8s
from lockstep.execute import Execution, GroupId

# How often, at most, a deployment's router registries are swept (one GET per replica).
ROUTER_SWEEP_SECONDS = 5.0
# The frees of ended KV kept per group epoch (`verdicts.ended_kv` weighs the last three).
KEPT_FREES = 8


@dataclass
class Done:
    """What the round's execution leaves to record."""

    records: dict[str, GroupRecord]
    actions: list[Action]
    requeue: float | None


def act(
    mem: Memory,
    seen: Seen,
    judged: Mapping[Role, Judged],
    plans: Mapping[Role, RolePlan],
    exe: Execution,
    pairs: PairJudgement | None = None,
    kv: EndedKVJudgement | None = None,
) -> Done:
    """Every change of the round, through the executor: the scale targets, each group's
    actions in order, the new epochs, the reconcile plan, the disruption budgets, the
    router's objects and registries."""
    exe.scale.apply_targets(seen.resolutions)
    tell_refusals(mem, seen, exe)
    if pairs is not None:
        tell_pairs(mem, pairs, exe)
    if kv is not None:
        free_ended_kv(mem, seen, kv, exe)
    records: dict[str, GroupRecord] = {}
    actions: list[Action] = []
    requeue: float | None = None
    retiring: set[GroupId] = set()
    for role, plan in plans.items():
        j = judged[role]
        for g, gp in plan.order():
            exe.execute(role, g, gp.actions)
            actions.extend(gp.actions)
            if g >= j.replicas:
                if retired(gp.record, j.inputs[g].pods):
                    continue  # left for good: forget it
                retiring.add((role, g))
            records[record_key(role, g)] = gp.record
            if gp.requeue_after is not None:
                requeue = gp.requeue_after if requeue is None else min(requeue, gp.requeue_after)
            exe.pods.keep(
                (role, g),
                gp.record.epoch,
                gp.record.slot,
                create=g < j.replicas
                and reconciler_may_create_pods(gp.record)
                and not seen.by_group.get((role, g)),
            )
    if mem.router_swept_at is None or seen.now - mem.router_swept_at >= ROUTER_SWEEP_SECONDS:
        # The routers' registries, level-triggered (`router_workers`: the router's own
        # races can put back a worker lockstep removed).
        exe.routers.sweep()
        mem.router_swept_at = seen.now
    pods = exe.pods
    pods.new_epochs()
    # Pods deleted this round are still in the cache: the reconcile plan creates nothing
    # for a group while pods of another epoch exist, so the next round (woken by the
    # deletes' watch events) creates the new epoch.
    reconcile = plan_reconcile(
        seen.pdd,
        seen.policy,
        seen.pods,
        seen.services,
        pods.epochs,
        pods.create_groups,
        pods.avoid_nodes,
        pods.slots,
        retiring,
        seen.shape,
        unguarded={(r.role, r.index) for r in records.values() if not needs(r).guarded},
        runtimes=seen.runtimes,
    )
    pods.apply_reconcile(reconcile)
    pods.apply_pdbs(reconcile.pdbs, seen.pdbs)
    mem.router = exe.routers.apply(mem.router, seen.services, seen.deployments)
    return Done(records, actions, requeue)


def tell_refusals(mem: Memory, seen: Seen, exe: Execution) -> None:
    """A `RuntimeRefused` Event for each pod whose runtime refused to start, once per
    container restart (the container's termination message says why; status shows it
    too)."""
    told = set()
    for (role, g), group in sorted(seen.by_group.items()):
        for pod in group:
            view = pod_view_from_k8s(pod)
            if view.refusal is None:
                continue
            key = (view.uid, view.refusal_restart)
            told.add(key)
            if key not in mem.refusals:
                exe.events(
                    "Warning",
                    view.refusal.split(":", 1)[0],
                    f"{role} group {g}: pod {view.name}: {view.refusal}",
                )
    mem.refusals = told


def tell_pairs(mem: Memory, pairs: PairJudgement, exe: Execution) -> None:
    """A warning Event for each failing pair no group's verdict explains, once while it
    fails: a link at fault (both groups pass with other peers: their nodes are named, no
    group is restarted), or a pair whose side cannot be told yet."""
    failing = {key for key, _, _ in pairs.links} | set(pairs.unexplained)
    for (p, d), node_p, node_d in pairs.links:
        if (p, d) not in mem.pairs_told:
            exe.events(
                "Warning",
                "PairLinkFailing",
                f"prefill/{p} -> decode/{d}: the KV hand-off fails between node "
                f"{node_p or '?'} and node {node_d or '?'} while both groups pass with other "
                "peers: the link between them, not either group (nothing restarted)",
            )
    for p, d in pairs.unexplained:
        if (p, d) not in mem.pairs_told:
            exe.events(
                "Warning",
                "PairFailing",
                f"prefill/{p} -> decode/{d}: the KV hand-off failed; the tries so far do "
                "not tell which side is at fault",
            )
    mem.pairs_told = failing


def free_ended_kv(mem: Memory, seen: Seen, kv: EndedKVJudgement, exe: Execution) -> None:
    """Each group's ended-KV figure exported, and the KV the judge says to free freed
    through the leader's runtime (`RequestManager.free_ended_kv`: an Event says what);
    the answer is kept for the judge's next look."""
    metric = exe.scene.deps.metrics.ended_kv_tokens
    for (role, g), reading in (kv.held or {}).items():
        metric.labels(seen.namespace, seen.name, role, str(g)).set(reading.tokens)
    for role, g in kv.free:
        rec = mem.records.get(record_key(role, g))
        if rec is None:
            continue
        held = (kv.held or {}).get((role, g))
        frees = mem.kv_frees.setdefault((role, g, rec.epoch), [])
        frees.append(exe.requests.free_ended_kv(role, g, rec.epoch, held, seen.now))
        del frees[:-KEPT_FREES]  # the judge weighs the last few (`MAX_FREES` in a window)


def tell_suspects(mem: Memory, seen: Seen, incidents: Incidents, exe: Execution) -> None:
    """A NodeSuspect Event for each node that became suspect (`suspects`: the outlier of
    several incidents), and, with spec.recovery.suspectNodes.cordon, the node cordoned
    before a restart places a group there (never past maxCordoned; never undone here)."""
    spec = seen.pdd.spec.recovery.suspect_nodes
    found = suspect_nodes(incidents.values(), seen.now, spec)
    owner = f"{seen.namespace}/{seen.name}"
    # A cordon refused (RBAC) is told once, not asked again every round.
    cordon, held = cordon_decisions(
        [s for s in found if s.node not in mem.cordon_failed], seen.nodes, owner, spec
    )
    mem.cordon_failed |= exe.nodes.cordon(cordon, spec.window_seconds)
    for s in found:
        if s.node in mem.suspects or s in cordon:
            continue
        why = next((w for h, w in held if h == s), None)
        tail = (
            f"; not cordoned ({why})"
            if why
            else "; not cordoned (spec.recovery.suspectNodes.cordon is off)"
            if not spec.cordon
            else ""
        )
        exe.events("Warning", "NodeSuspect", s.text(spec.window_seconds) + tail)
    mem.suspects = {s.node for s in found}

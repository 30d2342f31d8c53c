"""The round: observe, judge, plan, act, record, one call each (see the package
docstring), for one PDDeployment, never two rounds of one deployment at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lockstep.api.models import InvalidPDDeployment, parse_pddeployment, with_runtime_image
from lockstep.control.act import act
from lockstep.control.judge import judge_kv, judge_pairs, judge_role
from lockstep.control.observe import ROLES, observe_deployment
from lockstep.control.record import RoundResult, patch_status, record
from lockstep.control.runtime import DeploymentKey, Memory, Runtime
from lockstep.core.maintenance import NodeState
from lockstep.core.policy import evaluate
from lockstep.core.records import (
    ANNOTATION_INCIDENTS,
    ANNOTATION_RECORDS,
    load_incidents,
    load_records,
)
from lockstep.core.recovery import RoleSettings, plan_role
from lockstep.core.status import invalid_status
from lockstep.execute import EventSink, Execution


def run_round(
    rt: Runtime,
    body: Mapping[str, Any],
    pods: Sequence[dict[str, Any]],
    services: Sequence[dict[str, Any]],
    events: EventSink,
    deployments: Sequence[dict[str, Any]] = (),
    nodes: Mapping[str, NodeState] | None = None,
    scales: Sequence[dict[str, Any]] = (),
    pdbs: Sequence[dict[str, Any]] = (),
) -> RoundResult | None:
    """One control round for the PDDeployment `body` (see the package docstring).

    `pods`, `services` and `deployments` are the deployment's (every object labelled
    with it), as the watch-fed caches hold them; `nodes` the cluster's nodes as the node
    watch last saw them (maintenance: cordons and taints); `scales` its PDRoleScales (the
    per-role scale targets, `lockstep.core.rolescale`); `pdbs` its PodDisruptionBudgets
    as the watch last saw them. Rounds of one deployment never overlap.
    """
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "default")), str(meta["name"])
    if meta.get("deletionTimestamp"):
        return None
    if rt.may_act is not None and not rt.may_act():
        return None  # not the leader (any more): nothing to decide, nothing to write
    caches = {
        "pods": list(pods),
        "services": list(services),
        "deployments": list(deployments),
        "scales": list(scales),
        "pdbs": list(pdbs),
    }
    with rt.lock_for(namespace, name):
        return _run_round(rt, body, namespace, name, caches, events, nodes or {})


def _memory(rt: Runtime, key: DeploymentKey, body: Mapping[str, Any]) -> Memory:
    mem = rt.memory.get(key)
    if mem is None:
        # First round since the operator started: the object's annotations are the memory.
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        mem = Memory(
            records=load_records(body),
            incidents=load_incidents(body),
            persisted=(
                str(annotations.get(ANNOTATION_RECORDS, "")),
                str(annotations.get(ANNOTATION_INCIDENTS, "")),
            ),
            status=dict(body.get("status") or {}) or None,
        )
        rt.memory[key] = mem
    return mem


def _run_round(
    rt: Runtime,
    body: Mapping[str, Any],
    namespace: str,
    name: str,
    caches: Mapping[str, list[dict[str, Any]]],
    events: EventSink,
    nodes: Mapping[str, NodeState],
) -> RoundResult:
    now = rt.clock()
    meta = body.get("metadata") or {}
    key: DeploymentKey = (namespace, name, str(meta.get("uid", "")))
    mem = _memory(rt, key, body)
    mem.captures.begin()
    old_conditions = list((mem.status or {}).get("conditions") or [])
    try:
        parsed = parse_pddeployment(body)
    except InvalidPDDeployment as err:
        status = invalid_status(meta.get("generation"), old_conditions, str(err), now)
        writes = patch_status(rt, mem, namespace, name, status, now)
        return RoundResult(status, {}, None, [], writes)
    pdd = with_runtime_image(parsed, rt.runtime_image)
    policy = evaluate(pdd.spec)
    if not policy.accepted:
        rejected = "; ".join(str(f) for f in policy.findings if f.action == "rejected")
        status = invalid_status(pdd.metadata.generation, old_conditions, rejected, now, policy)
        writes = patch_status(rt, mem, namespace, name, status, now)
        return RoundResult(status, {}, None, [], writes)

    seen = observe_deployment(
        rt, mem, key, body, pdd, policy, now, caches, nodes, parsed.spec.runtime
    )
    pairs, kv = judge_pairs(rt, mem, seen), judge_kv(rt, mem, seen)
    judged = {role: judge_role(rt, mem, seen, role, pairs, kv) for role in ROLES}
    plans = {
        role: plan_role(
            RoleSettings.from_spec(pdd.spec, role), j.records, j.inputs, now=now, serving=j.serving
        )
        for role, j in judged.items()
    }
    assert rt.deps is not None
    exe = Execution(
        rt.deps,
        pdd,
        namespace,
        events,
        caches["pods"],
        routers=mem.routers,
        captures=mem.captures,
        entries=seen.entries,
        incidents_oldest_first=list(mem.incidents),  # in the order opened
        incident_epochs={
            r.incident.id: r.incident.epoch for r in mem.records.values() if r.incident
        },
    )
    done = act(mem, seen, judged, plans, exe, pairs, kv)
    return record(rt, mem, seen, exe, done, old_conditions)

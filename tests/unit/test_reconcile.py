"""Reconcile planning: groups are created whole, never patched pod by pod."""

from __future__ import annotations

from typing import Any

from factories import load_example, pdd_obj

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment, parse_pddeployment
from lockstep.core.builders import build_all
from lockstep.core.policy import evaluate
from lockstep.core.reconcile import plan_reconcile, stale_groups


def deepseek() -> PDDeployment:
    obj = load_example("deepseek-v3")
    obj["metadata"]["uid"] = "uid-1"
    return parse_pddeployment(obj)


def observed(
    pdd: PDDeployment, epochs: dict[tuple[str, int], int] | None = None
) -> list[dict[str, Any]]:
    """What the API server would hold after applying everything (with uids)."""
    objs = build_all(pdd, epochs=epochs)
    for i, o in enumerate(objs):
        o["metadata"]["uid"] = f"u{i}"
    return objs


def split(objs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return [o for o in objs if o["kind"] == "Pod"], [
        o for o in objs if o["kind"] == "Service" and c.LABEL_GROUP in o["metadata"]["labels"]
    ]


def test_fresh_deployment_creates_every_group_whole() -> None:
    pdd = deepseek()
    groups = {("prefill", 0), ("prefill", 1), ("decode", 0)}
    plan = plan_reconcile(pdd, evaluate(pdd.spec), [], [], {}, groups)
    pods = [o["metadata"]["name"] for o in plan.create if o["kind"] == "Pod"]
    assert sorted(pods) == [
        "deepseek-v3-decode-0-0",
        "deepseek-v3-decode-0-1",
        "deepseek-v3-prefill-0-0",
        "deepseek-v3-prefill-1-0",
    ]
    assert sum(o["kind"] == "Service" for o in plan.create) == 3


def test_missing_pod_of_a_running_group_is_not_recreated_alone() -> None:
    pdd = deepseek()
    pods, services = split(observed(pdd))
    pods = [p for p in pods if p["metadata"]["name"] != "deepseek-v3-decode-0-1"]
    plan = plan_reconcile(pdd, evaluate(pdd.spec), pods, services, {}, set())
    assert plan.create == [] and plan.delete_pods == []


def test_new_epoch_waits_until_old_pods_are_gone() -> None:
    pdd = deepseek()
    pods, services = split(observed(pdd))
    plan = plan_reconcile(
        pdd, evaluate(pdd.spec), pods, services, {("decode", 0): 1}, {("decode", 0)}
    )
    assert ("decode", 0) in plan.waiting_groups
    assert not [o for o in plan.create if o["kind"] == "Pod"]
    # The group Service moves to the new epoch's selector at once.
    svc = next(o for o in plan.patch if o["metadata"]["name"] == "deepseek-v3-decode-0")
    assert svc["spec"]["selector"][c.LABEL_EPOCH] == "1"
    gone = [
        p
        for p in pods
        if p["metadata"]["labels"][c.LABEL_GROUP] != "0"
        or p["metadata"]["labels"][c.LABEL_ROLE] != "decode"
    ]
    plan = plan_reconcile(
        pdd, evaluate(pdd.spec), gone, services, {("decode", 0): 1}, {("decode", 0)}
    )
    created = [o for o in plan.create if o["kind"] == "Pod"]
    assert [p["metadata"]["labels"][c.LABEL_EPOCH] for p in created] == ["1", "1"]


def test_scale_down_deletes_whole_groups_with_uids() -> None:
    pdd = deepseek()
    pods, services = split(observed(pdd))
    obj = load_example("deepseek-v3")
    obj["metadata"]["uid"] = "uid-1"
    obj["spec"]["prefill"]["replicas"] = 1
    smaller = parse_pddeployment(obj)
    plan = plan_reconcile(smaller, evaluate(smaller.spec), pods, services, {}, set())
    assert [n for n, _ in plan.delete_pods] == ["deepseek-v3-prefill-1-0"]
    assert all(uid.startswith("u") for _, uid in plan.delete_pods)
    assert plan.delete_services == ["deepseek-v3-prefill-1"]


def test_changed_pod_template_marks_groups_stale_without_touching_them() -> None:
    pdd = parse_pddeployment(pdd_obj())
    pods, services = split(observed(pdd))
    changed = parse_pddeployment(
        pdd_obj(decode={"tp": 1, "gpusPerPod": 1, "args": ["--trust-remote-code"]})
    )
    plan = plan_reconcile(changed, evaluate(changed.spec), pods, services, {}, set())
    assert stale_groups(changed, evaluate(changed.spec), pods, {}) == [("decode", 0)]
    assert plan.create == [] and plan.delete_pods == [] and plan.patch == []


def test_paused_deployment_removes_groups() -> None:
    pdd = parse_pddeployment(pdd_obj())
    pods, services = split(observed(pdd))
    paused = parse_pddeployment(pdd_obj(paused=True))
    plan = plan_reconcile(paused, evaluate(paused.spec), pods, services, {}, set())
    assert len(plan.delete_pods) == 2


def test_a_missing_pod_or_a_later_epoch_is_not_staleness() -> None:
    pdd = deepseek()
    pods, _ = split(observed(pdd, epochs={("decode", 0): 3}))
    assert stale_groups(pdd, evaluate(pdd.spec), pods, {("decode", 0): 3}) == []
    fewer = [p for p in pods if p["metadata"]["name"] != "deepseek-v3-decode-0-1"]
    assert stale_groups(pdd, evaluate(pdd.spec), fewer, {("decode", 0): 3}) == []
    # The epoch the records say is what the pods are judged against: not a later one.
    assert stale_groups(pdd, evaluate(pdd.spec), pods, {("decode", 0): 4}) == []


def test_router_objects_follow_the_spec_drift_and_enabled() -> None:
    from lockstep.core.builders import build_router, router_name
    from lockstep.core.reconcile import plan_router

    pdd = parse_pddeployment(load_example("pd-small"))
    name = router_name(pdd)
    desired = build_router(pdd)
    by_kind = {o["kind"]: o for o in desired}
    watched = {("Deployment", name): None, ("Service", name): None}
    # Missing: created (only the watched kinds are this plan's business).
    plan = plan_router(desired, watched)
    assert [o["kind"] for o in plan.create] == ["Deployment", "Service"]
    assert not plan.patch and not plan.delete
    # As built: nothing to do.
    live = {("Deployment", name): by_kind["Deployment"], ("Service", name): by_kind["Service"]}
    assert plan_router(desired, live) == type(plan)()
    # A changed router spec (another policy): the Deployment is patched, the Service not.
    obj = load_example("pd-small")
    obj["spec"]["router"] = {**obj["spec"].get("router", {}), "policy": "random"}
    changed = build_router(parse_pddeployment(obj))
    plan = plan_router(changed, live)
    assert [o["kind"] for o in plan.patch] == ["Deployment"]
    assert "random" in plan.patch[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    # Someone edited the live Service (its hash no longer matches): patched back.
    edited = {
        **by_kind["Service"],
        "metadata": {**by_kind["Service"]["metadata"], "annotations": {}},
    }
    plan = plan_router(desired, {**live, ("Service", name): edited})
    assert [o["kind"] for o in plan.patch] == ["Service"]
    # A hand edit that keeps the annotation (kubectl scale): patched back too.
    import copy

    scaled = copy.deepcopy(by_kind["Deployment"])
    scaled["spec"]["replicas"] = 5
    plan = plan_router(desired, {**live, ("Deployment", name): scaled})
    assert [o["kind"] for o in plan.patch] == ["Deployment"]
    # What the API server adds (defaults, status, extra metadata) is not a drift: a
    # patched object compares equal, so a patch is never repeated round after round.
    defaulted = copy.deepcopy(by_kind["Deployment"])
    defaulted["spec"]["strategy"] = {"type": "RollingUpdate"}
    defaulted["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/x"
    defaulted["status"] = {"replicas": 1}
    assert plan_router(desired, {**live, ("Deployment", name): defaulted}) == type(plan)()
    # Disabled: whatever is live goes.
    plan = plan_router([], live)
    assert plan.delete == [("Deployment", name), ("Service", name)]
    assert plan_router([], watched) == type(plan)()


def test_every_group_keeps_all_its_pods_against_evictions_but_a_quarantined_one() -> None:
    """A serving group's budget refuses any eviction (minAvailable = its pod count); a
    quarantined group has none, so a node drain evicts its pods: it serves nothing and
    waits for a person."""
    pdd = deepseek()
    pods, services = split(observed(pdd))

    def budgets(unguarded: set[tuple[str, int]]) -> dict[str, int]:
        plan = plan_reconcile(
            pdd, evaluate(pdd.spec), pods, services, {}, set(), unguarded=unguarded
        )
        return {b["metadata"]["name"]: b["spec"]["minAvailable"] for b in plan.pdbs}

    assert budgets(set()) == {
        "deepseek-v3-prefill-0": 1,
        "deepseek-v3-prefill-1": 1,
        "deepseek-v3-decode-0": 2,
    }
    assert budgets({("decode", 0)}) == {"deepseek-v3-prefill-0": 1, "deepseek-v3-prefill-1": 1}

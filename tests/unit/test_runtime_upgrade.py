"""An operator upgrade restarts no group (`reconcile.kept_runtimes`): each running group
keeps the runtime its pods were made with until it is recreated anyway, unless the spec
names a runtime image or asks for a rolling upgrade."""

from __future__ import annotations

from typing import Any

from factories import pdd_obj

from lockstep.api.models import PDDeployment, parse_pddeployment, with_runtime_image
from lockstep.core.builders import build_group_pods, group_runtime, runtime_of
from lockstep.core.policy import evaluate
from lockstep.core.reconcile import kept_runtimes, plan_reconcile, stale_groups

OLD = "ghcr.io/lockstep-dev/operator:0.1.0"
NEW = "ghcr.io/lockstep-dev/operator:0.2.0"
DECODE = ("decode", 0)


def spec(**runtime: Any) -> PDDeployment:
    return parse_pddeployment(pdd_obj(decode={"tp": 2, "gpusPerPod": 1, "podsPerGroup": 2},
                                      runtime=runtime))  # fmt: skip


def running(pdd: PDDeployment, image: str) -> list[dict[str, Any]]:
    """The pods of every group as the operator of `image` made them."""
    made = with_runtime_image(pdd, image)
    policy = evaluate(made.spec)
    return [
        *build_group_pods(made, "prefill", 0, 0, policy.roles["prefill"]),
        *build_group_pods(made, "decode", 0, 0, policy.roles["decode"]),
    ]


def judged(pdd: PDDeployment, pods: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """The groups the new operator (`NEW`) would roll."""
    upgraded = with_runtime_image(pdd, NEW)
    kept = kept_runtimes(pdd.spec.runtime, pods, {}, {})
    return stale_groups(upgraded, evaluate(upgraded.spec), pods, {}, {}, None, kept)


def test_a_new_operator_version_rolls_no_group_by_default() -> None:
    pdd = spec()
    pods = running(pdd, OLD)
    assert {runtime_of(p) for p in pods} == {OLD}
    assert kept_runtimes(pdd.spec.runtime, pods, {}, {}) == {("prefill", 0): OLD, DECODE: OLD}
    assert judged(pdd, pods) == []
    assert group_runtime(pods) == OLD
    # Without the kept runtimes the same pods would all be stale: the default moved.
    upgraded = with_runtime_image(pdd, NEW)
    stale = stale_groups(upgraded, evaluate(upgraded.spec), pods, {}, {})
    assert sorted(stale) == [DECODE, ("prefill", 0)]


def test_a_named_runtime_image_or_a_rolling_upgrade_rolls_every_group() -> None:
    for pdd in (spec(image=NEW), spec(upgrade="Rolling")):
        assert kept_runtimes(pdd.spec.runtime, running(pdd, OLD), {}, {}) == {}
        assert sorted(judged(pdd, running(spec(), OLD))) == [DECODE, ("prefill", 0)]


def test_a_runtime_built_into_the_image_keeps_nothing() -> None:
    pdd = spec(inject=False)
    pods = running(pdd, OLD)
    assert kept_runtimes(pdd.spec.runtime, pods, {}, {}) == {}
    assert group_runtime(pods) == "registry.local/sglang:0.5.23-lockstep (built in)"


def test_a_missing_pod_joins_its_group_on_the_groups_runtime() -> None:
    pdd = spec()
    pods = running(pdd, OLD)
    rank1 = [p for p in pods if p["metadata"]["name"].endswith("decode-0-1")]
    left = [p for p in pods if p not in rank1]
    upgraded = with_runtime_image(pdd, NEW)
    kept = kept_runtimes(pdd.spec.runtime, left, {}, {})
    plan = plan_reconcile(upgraded, evaluate(upgraded.spec), left, [], {}, {DECODE}, runtimes=kept)
    (made,) = [p for p in plan.create if p.get("kind") == "Pod"]
    assert made["metadata"]["name"] == rank1[0]["metadata"]["name"]
    assert runtime_of(made) == OLD
    # A whole new epoch (no pod of the group left: recreated anyway) is the operator's.
    fresh = plan_reconcile(upgraded, evaluate(upgraded.spec), [], [], {}, {DECODE})
    assert {runtime_of(p) for p in fresh.create if p.get("kind") == "Pod"} == {NEW}


def test_a_rollout_takes_one_group_of_the_deployment_out_at_a_time() -> None:
    """`recovery.next_rollout`: the one group to roll now, across both roles; spares
    first (they serve nothing), then decode, then prefill; nothing while a group of
    either role is not Healthy."""
    from lockstep.core.recovery import GroupRecord, Step, next_rollout

    def _rolling_group(role: str, stale: Any, records: Any) -> int | None:
        # The group of `role` the judge rolls this round (None: none of this role).
        chosen = next_rollout(stale, records)
        return chosen[1] if chosen is not None and chosen[0] == role else None

    stale = [("prefill", 0), ("decode", 0), ("decode", 1)]
    records = [
        GroupRecord(role="prefill", index=0, step=Step.HEALTHY),
        GroupRecord(role="decode", index=0, step=Step.HEALTHY),
        GroupRecord(role="decode", index=1, step=Step.HEALTHY, spare=True),
    ]
    assert _rolling_group("decode", stale, records) == 1  # the spare
    assert _rolling_group("prefill", stale, records) is None
    assert _rolling_group("decode", stale[:2], records) == 0
    assert _rolling_group("prefill", stale[:1], records) == 0
    # A decode group restarting holds the prefill's roll back.
    busy = [records[0], records[1].model_copy(update={"step": Step.DRAINING}), records[2]]
    assert _rolling_group("prefill", stale[:1], busy) is None
    assert _rolling_group("decode", [], records) is None

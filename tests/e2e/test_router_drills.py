"""Drills with the real sglang-router in front (as the operator renders it: PD mode,
Kubernetes service discovery with its own ServiceAccount and RBAC), every request going
through it. What a user would notice is judged from the stand-ins' request logs: while
a broken group is drained the router sends it nothing and requests keep succeeding
through the other groups; once re-admitted it gets requests again."""

from __future__ import annotations

import pytest

from lockstep.dev.drills import DrillResult, run_drill


def router_drill(scenario: str) -> DrillResult:
    result = run_drill(scenario, router=True)
    print(result.to_json())
    assert result.passed, f"{scenario} via the router: {result.reason}\n{result.to_json()}"
    return result


@pytest.mark.timeout(420)
def test_desync_drain_keeps_the_router_off_the_group_until_it_is_readmitted() -> None:
    r = router_drill("desync")
    assert r.verdict == "Desynced" and r.restarts["decode/0"] == 1
    assert r.affected_received_while_drained == 0
    assert r.others_received_while_drained > 0
    assert r.router_failed_after_drain == 0
    assert r.affected_received_after_readmission > 0
    assert r.router_stale_workers == []


@pytest.mark.timeout(420)
def test_hung_group_still_serving_http_gets_no_request_once_drained() -> None:
    # A hung group's HTTP server still accepts requests (they time out inside): only the
    # router's registry, not readiness, keeps them away while it is drained.
    r = router_drill("hang")
    assert r.verdict == "Hung" and r.restarts["decode/0"] == 1
    assert r.affected_received_while_drained == 0
    assert r.router_failed_after_drain == 0
    assert r.affected_received_after_readmission > 0
    assert r.router_stale_workers == []

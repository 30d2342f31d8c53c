"""Operator high availability on the local cluster: the chart installed with
`ha.enabled` (two replicas electing a leader through a Lease, the self-signed webhook
shared through a Secret), the API server's audit log on. The standby killed changes
nothing; the leader stopped for 30 s is taken over after the lease duration and, woken,
writes nothing and restarts as a standby; the leader killed mid-recovery leaves the
recovery to its successor, one restart; both replicas alive past two minutes, a desync is
recovered (kopf's peering paused every replica after about 30 s)."""

from __future__ import annotations

import pytest

from lockstep_dev.drills import Drill


@pytest.mark.timeout(600)
def test_two_replicas_one_leader_takeovers_without_double_action() -> None:
    result = Drill("ha").run()
    print(result.to_json())
    assert result.passed, f"{result.reason}\n{result.to_json()}"
    ha = result.ha
    assert ha["writes_after_waking"] == 0 and ha["writes_while_leading"] > 0
    assert ha["takeover_after_stop_s"] <= 20 and ha["takeover_after_kill_s"] <= 20
    assert ha["steady_after_s"] >= 120
    # Two desyncs, each restarted once, whoever led.
    assert result.restarts["decode/0"] == 2 and result.restarts["decode/1"] == 0

"""Incident drills on the real SGLang 0.5.23 server (the local cluster's `sglang` engine).

Every SGLang pod of the drill deployment runs the product's own launcher and the real
server on CPU (two prefill groups of TP1, two decode groups of TP2, each spanning two
pods; PD over mooncake TCP), behind the real sglang-router, with the real operator. One
cluster, two incidents in decode group 0, then two in the PD path, each recovered before
the next: a desync
forced into one rank's decisions (restarted in place), then one rank's real scheduler
process stopped with SIGSTOP, as a wedged GPU process is met (judged RankDown from /proc
and named with its pod and node as the only outlier; the group failed again within the
escalation window: recreated). For each,
as a user of the served model sees it (a client that waits two minutes): every request
the incident caught ended 200 and none waited more than 15 s past the verdict; a long
stream on the group ended with SGLang's own abort event; the groups that stayed hold
what they held before (SGLang's /v1/loads). The deployment asks for suspect nodes after
2 incidents with the cordon off (the default): the stopped rank's node hosted both
incidents' outliers, so it is named (NodesSuspect, a NodeSuspect Event saying the cordon
is off) and no node is cordoned. Then prefill/0's KV sender stops sending
(`transfer-stall`) and prefill/1's bootstrap server stops answering (`bootstrap-down`),
each through lockstep's hooks in the real server while its deep probe passes: each is
judged `TransferBroken` from the pair probe, restarted alone (the decode groups and the
other prefill group keep their epochs), and every request it caught ended 200 through
the router. Then decode/0 loses the abort of streams its client cancelled (`kv-leak`):
the KV it holds for them shows in its deep probe's report and the operator frees it
through SGLang's abort (an `EndedKVFreed` Event, no incident, no restart). Last, three
rounds of 24 streams through the router cancelled together (an abort storm) leave
nothing held on any group and no verdict. A second cluster runs a
warm spare beside
one serving decode group: a desync there is answered by the spare in seconds. A killed
rank on the real engine is measured by benchmarks/failover.py (docs/failover.md); the stand-in
drills (test_drills.py, test_router_drills.py) cover the other scenarios; where the two
engines differ, the stand-in is wrong.
"""

from __future__ import annotations

import pytest

from lockstep_dev.drills import Drill
from lockstep_dev.drills.failover import holds_no_more


@pytest.mark.timeout(2400)
def test_real_servers_recover_from_a_desync_and_a_stopped_rank_through_the_router() -> None:
    result = Drill("sequence", engine="sglang", suspect_nodes={"incidents": 2}).run()
    print(result.to_json())
    assert result.passed, f"{result.reason}\n{result.to_json()}"
    desync, stopped, stall, down, leak, storm = result.steps
    assert (desync["verdict"], desync["restart_mode"]) == ("Desynced", "InPlace")
    assert (stopped["verdict"], stopped["restart_mode"]) == ("RankDown", "Recreate")
    # The stopped rank alone is named, with its pod, its node and its process state.
    (outlier,) = stopped["outliers"]
    assert outlier["rank"] == 1 and outlier["pod"] == "drill-decode-0-1", outlier
    assert "stopped" in outlier["why"] and outlier["node"], outlier
    # Its node hosted a desynced rank too: suspect, told, and (cordon off) not cordoned.
    assert result.suspects["nodes"] == {outlier["node"]: [desync["incident"], stopped["incident"]]}
    assert result.suspects["cordoned"] == []
    for step in (desync, stopped):
        # A desync acts at once; a stopped rank after three failed probes (2 s apart).
        assert step["time_to_detect_s"] < 20, step
        # Nothing reached the drained group, and nothing failed once it was drained.
        assert step["affected_received_while_drained"] == 0, step
        assert step["router_failed_after_drain"] == 0, step
        # No request lost to the incident, none waiting long, no stream cut silently.
        fo = step["failover"]
        assert fo["caught"] > 0 and fo["caught_ok"] == fo["caught"], step
        assert fo["longest_wait_past_verdict_s"] <= 15.0, step
        # Each stream decode/0 held ended with the engine's abort, every other completed.
        assert any(s["held"] for s in fo["streams"]), step
        assert all(s["how"] == ("aborted" if s["held"] else "completed") for s in fo["streams"]), (
            step
        )
        # The groups that stayed hold no more than while idle (a pair-probe try may
        # have been in flight at either read).
        for key in ("prefill/0", "decode/1"):
            assert holds_no_more(fo["loads_after"][key], fo["loads_before"][key]), step
    # The PD path: the prefill group at fault alone judged and restarted, found by the
    # pair probe long before SGLang's own 300 s waits, nothing lost through the router.
    for step, key in ((stall, "prefill/0"), (down, "prefill/1")):
        assert step["group"] == key and step["verdict"] == "TransferBroken", step
        assert step["blamed"] == [key] and step["restarted"] == [key], step
        assert step["time_to_detect_s"] is not None and step["time_to_detect_s"] < 30, step
        fo = step["failover"]
        assert fo["caught_ok"] == fo["caught"], step
        assert fo["longest_wait_past_verdict_s"] <= 15.0, step
    # kv-leak in decode/0: streams the client left, kept generating for nobody, found in
    # its deep probe's report and freed through SGLang's abort (no incident, no restart).
    assert leak["fault"] == "kv-leak" and leak["leaked_tokens"] > 0, leak
    assert leak["time_to_free_s"] <= 30.0 and leak["blamed"] == [] and leak["events"], leak
    assert not any(leak["ended_kv_after"].values()), leak
    # The abort storm: streams cancelled together at the prefill, in the hand-off and
    # mid-stream leave nothing held on any group, and nothing is judged.
    assert storm["fault"] == "abort-storm" and storm["blamed"] == [], storm
    assert sum(r["waiting"] + r["streaming"] for r in storm["rounds"]) > 0, storm
    assert all(not any(any(v.values()) for v in r["held_after"].values()) for r in storm["rounds"])
    # The other decode group served throughout (the router's requests all landed there).
    assert result.requests["router"]["sent"] > result.requests["router"]["failed"]


@pytest.mark.timeout(1500)
def test_a_real_warm_spare_takes_a_desynced_groups_place_before_it_restarts() -> None:
    # decode serves one real TP2 group beside one real TP2 spare: the spare is admitted
    # seconds after the verdict (not after the broken group's restart, 90 s and more),
    # the desynced group restarts into the spare, and no request reaches it from the
    # verdict on.
    result = Drill("spares", engine="sglang").run()
    print(result.to_json())
    assert result.passed, f"{result.reason}\n{result.to_json()}"
    (desync,) = result.steps
    assert desync["verdict_to_full_capacity_s"] <= 15.0
    assert desync["spares_after"] == [desync["group"]] != [desync["spare_before"]]
    assert desync["requests_to_the_group_after_verdict"] == 0
    assert desync["requests_failed"] == 0

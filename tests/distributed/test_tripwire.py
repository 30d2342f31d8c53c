"""The batch-vs-idle divergence of SGLang's PD decode loop, on real gloo groups.

Without the decision consensus the group hangs for good (the ranks sit in different
collectives and the rank state says which); with it every rank ends within seconds,
non-zero, with evidence naming the diverging decision.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from dist_support import RankGroup, wait_until

from lockstep_sglang.agent import PodAgent
from lockstep_sglang.consensus import DIVERGENCE_EXIT_CODE

DIVERGE_AT = "40"


def _stuck_in(group: RankGroup, expected: dict[int, tuple[str, str]]) -> bool:
    states = group.states()
    for rank, (op, pg) in expected.items():
        c = states.get(rank, {}).get("collective")
        if not c or (c["op"], c["group"]) != (op, pg):
            return False
    return True


TOKEN = "operator-token"


def _http(url: str, body: bytes | None = None) -> Any:
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    req.add_header("Authorization", f"Bearer {TOKEN}")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_divergence_hangs_without_consensus_and_rank_state_shows_where(
    launch_ranks: Callable[..., RankGroup],
) -> None:
    group = launch_ranks(2, "--diverge-at", DIVERGE_AT)
    group.wait_event(1, "diverged", timeout=60)
    # Rank 0 ran its batch and waits in the device all-reduce; rank 1 idled and waits
    # in the next iteration's request broadcast.
    expected = {0: ("all_reduce", "tp:device"), 1: ("broadcast_pyobj", "tp:cpu")}
    wait_until(lambda: _stuck_in(group, expected), 10, "both ranks stuck in their collectives")
    before = group.states()
    time.sleep(3.0)
    after = group.states()
    assert group.alive() == [True, True], "a hung rank exited on its own"
    for rank in (0, 1):
        assert after[rank]["iteration"] == before[rank]["iteration"], "the loop made progress"
        assert after[rank]["collective"] == before[rank]["collective"]
        assert after[rank]["alive"] is True
        assert after[rank]["consensus_failure"] is None
    # The diverging decisions are visible too: rank 0 ran a batch, rank 1 idled.
    decisions = {r: after[r]["last_decision"] for r in (0, 1)}
    assert decisions[0] is not None and decisions[0]["kind"] == "batch"
    assert decisions[1] is not None and decisions[1]["kind"] == "idle"
    assert decisions[0]["seq"] == decisions[1]["seq"] == int(DIVERGE_AT)

    # The pod agent serves the same picture over HTTP, and stacks of the stuck ranks.
    server, _ = PodAgent(group.state_dir, token=TOKEN).serve_in_thread("127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        ranks = _http(f"{base}/ranks")
        assert ranks["schema"] == "lockstep.dev/rank-state/v1"
        served = {s["rank"]: s["collective"] for s in ranks["ranks"]}
        assert (served[0]["op"], served[0]["group"]) == expected[0]
        assert (served[1]["op"], served[1]["group"]) == expected[1]
        stacks = _http(f"{base}/stacks", json.dumps({"timeout_s": 20}).encode())
        by_rank = {s["rank"]: s for s in stacks["stacks"]}
        assert by_rank[0]["ok"], by_rank[0]["error"]
        assert by_rank[1]["ok"], by_rank[1]["error"]
        assert "all_reduce" in by_rank[0]["stack"]
        assert "broadcast" in by_rank[1]["stack"]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("world", "slow_rank"),
    [(2, None), (4, None), (4, 1), (4, 3)],
    ids=["2", "4", "4-rank1-writes-slowly", "4-rank3-writes-slowly"],
)
def test_consensus_ends_every_rank_fast_with_evidence(
    launch_ranks: Callable[..., RankGroup], world: int, slow_rank: int | None
) -> None:
    # A rank slow to write its evidence (CI saw rank 1 of 4 exit 1 with none: rank 0
    # exited first, which broke the collective rank 1's scheduler waited in, and its
    # interpreter ended before its checker wrote) still leaves it: every rank waits at
    # the evidence barrier before it exits.
    slow = [] if slow_rank is None else ["--slow-evidence-rank", str(slow_rank)]
    group = launch_ranks(world, "--consensus", "--diverge-at", DIVERGE_AT, *slow)
    codes = group.wait_exit(timeout=90)
    assert codes == [DIVERGENCE_EXIT_CODE] * world, [group.stderr(r)[-1500:] for r in range(world)]
    diverged_at = group.wait_event(world - 1, "diverged", timeout=1)["t"]
    states = group.states()
    for rank in range(world):
        failure = states[rank]["consensus_failure"]
        assert failure is not None, f"rank {rank} left no evidence: {group.stderr(rank)[-1500:]}"
        # Detected within seconds of the diverging decision, not at a gloo timeout.
        assert failure["detected_at"] - diverged_at < 5.0
        first = failure["first_divergence"]
        assert first is not None
        events = first["events"]
        assert set(events) == {str(r) for r in range(world)}
        for peer in range(world - 1):
            assert (events[str(peer)] or "").startswith("lockstep decision batch mode=DECODE")
        assert (events[str(world - 1)] or "").startswith("lockstep decision idle")
        assert "TP ranks diverged" in group.stderr(rank)
        assert "event #" in group.stderr(rank)

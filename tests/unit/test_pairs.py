"""The PD path as a unit of health (issue 37): which pairs the pair probe tries each
period, and the judge that says from their pattern which side is at fault."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from dataclasses import replace
from typing import Any

import httpx
import pytest

from lockstep.clients.pair_prober import PairBook, PairProber, PairTargets
from lockstep.core.pairs import (
    PROBE_RID_PREFIX,
    PairEnd,
    PairResult,
    full_from_loads,
    plan_pairs,
    side_state,
)
from lockstep.core.verdicts import Signal, Verdict, classify_pairs

pytestmark = pytest.mark.unit

WINDOW = 60.0


@pytest.mark.parametrize(("n", "m"), [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (3, 5), (8, 8)])
def test_a_period_tries_max_n_m_pairs_covering_every_group_and_peers_rotate(n: int, m: int) -> None:
    prefills, decodes = list(range(n)), list(range(m))
    met: set[tuple[int, int]] = set()
    for turn in range(n * m):
        pairs = plan_pairs(prefills, decodes, turn)
        assert len(pairs) <= max(n, m)
        assert {p for p, _ in pairs} == set(prefills) and {d for _, d in pairs} == set(decodes)
        met |= set(pairs)
    # Over enough periods every group meets every peer.
    assert met == set(itertools.product(prefills, decodes))


def test_no_pair_without_both_roles() -> None:
    assert plan_pairs([0], [], 0) == [] and plan_pairs([], [0, 1], 3) == []


def tried(p: int, d: int, ok: bool, period: float, error: str = "timed out") -> PairResult:
    """A try of the period that began at `period` (it ended a little later)."""
    at = period + (0.05 if ok else 4.0)
    return PairResult(
        p, d, 0, 0, ok, at, 0.01 if ok else None, decode_error=None if ok else error,
        room=int(at * 100), started=period,
    )  # fmt: skip


EPOCHS = {("prefill", 0): 0, ("prefill", 1): 0, ("decode", 0): 0, ("decode", 1): 0}
DEEP: dict[tuple[str, int], float | None] = dict.fromkeys(EPOCHS, 100.0)  # TP paths pass


def test_a_prefill_failing_with_both_decodes_in_two_periods_is_at_fault_and_they_are_not() -> None:
    # Two prefill groups, two decode groups: each period pairs each group once, rotating.
    first = [tried(0, 0, False, 1.0), tried(1, 1, True, 1.0)]
    judged = classify_pairs(first, EPOCHS, 5.5, WINDOW, deep=DEEP)
    assert judged.verdicts == {} and judged.unexplained == () and judged.links == ()
    again = [*first, tried(0, 1, False, 5.0), tried(1, 0, True, 5.0)]
    judged = classify_pairs(again, EPOCHS, 9.5, WINDOW, deep=DEEP)
    assert set(judged.verdicts) == {("prefill", 0)}
    v = judged.verdicts[("prefill", 0)]
    assert v.verdict is Verdict.TRANSFER_BROKEN and v.immediate and v.epoch == 0
    assert Signal.PAIR_FAILED in v.signals and "decode/0, decode/1" in v.reason
    assert judged.links == () and judged.unexplained == ()


def test_one_failed_period_is_not_enough_even_with_every_peer() -> None:
    # One prefill, two decodes: one period tries both; one slow period is not a verdict.
    judged = classify_pairs(
        [tried(0, 0, False, 1.0), tried(0, 1, False, 1.0)], EPOCHS, 6, WINDOW, deep=DEEP
    )
    assert judged.verdicts == {} and judged.unexplained == ()
    judged = classify_pairs(
        [tried(0, 0, False, 1.0), tried(0, 1, True, 1.0)], EPOCHS, 6, WINDOW, deep=DEEP
    )
    assert judged.verdicts == {}


def test_a_decode_failing_with_a_prefill_that_passes_elsewhere_is_at_fault_on_the_second_period() -> (
    None
):
    # The failed try ends last (at its deadline): the prefill still passes by its period.
    first = [tried(0, 0, False, 1.0), tried(0, 1, True, 1.0)]
    assert classify_pairs(first, EPOCHS, 5.5, WINDOW, deep=DEEP).verdicts == {}
    again = [*first, tried(0, 0, False, 5.0), tried(0, 1, True, 5.0)]
    judged = classify_pairs(again, EPOCHS, 9.5, WINDOW, deep=DEEP)
    assert set(judged.verdicts) == {("decode", 0)}
    assert "prefill/0" in judged.verdicts[("decode", 0)].reason


def test_a_single_pair_failing_while_both_pass_elsewhere_is_the_link() -> None:
    results = [
        tried(0, 0, False, 1.0),
        tried(1, 1, True, 1.0),
        tried(0, 1, True, 5.0),
        tried(1, 0, True, 5.0),
    ]
    nodes = {("prefill", 0): "node-a", ("decode", 0): "node-b"}
    judged = classify_pairs(results, EPOCHS, 6.0, WINDOW, nodes, deep=DEEP)
    assert judged.verdicts == {} and judged.links == (((0, 0), "node-a", "node-b"),)
    # The same pair failing again (each of its groups passing in the period between)
    # is still the link, never either group.
    more = [*results, tried(0, 0, False, 6.0), tried(1, 1, True, 6.0)]
    more += [tried(0, 1, True, 10.0), tried(1, 0, True, 10.0)]
    judged = classify_pairs(more, EPOCHS, 11.0, WINDOW, nodes, deep=DEEP)
    assert judged.verdicts == {} and judged.links == (((0, 0), "node-a", "node-b"),)


def test_a_group_that_failed_its_first_period_is_not_a_link_yet() -> None:
    # Before the fault both passed; now prefill/0 failed once: not named a link.
    results = [tried(0, 0, True, 1.0), tried(1, 1, True, 1.0), tried(0, 1, False, 2.0)]
    results.append(tried(1, 0, True, 2.0))
    judged = classify_pairs(results, EPOCHS, 6.5, WINDOW, deep=DEEP)
    assert judged.links == () and judged.verdicts == {}


def test_one_of_each_role_failing_is_unexplained_not_acted_on() -> None:
    epochs = {("prefill", 0): 0, ("decode", 0): 0}
    judged = classify_pairs([tried(0, 0, False, 1.0)], epochs, 5.5, WINDOW, deep=DEEP)
    assert judged.unexplained == ()  # once: not told yet
    judged = classify_pairs(
        [tried(0, 0, False, t) for t in (1.0, 5.0, 9.0)], epochs, 14, WINDOW, deep=DEEP
    )
    assert judged.verdicts == {} and judged.unexplained == ((0, 0),)


def test_a_pass_after_the_failures_clears_the_group_and_old_epochs_and_tries_do_not_count() -> None:
    broken = [tried(0, 0, False, 1.0), tried(0, 1, False, 1.0)]
    broken += [tried(0, 1, False, 5.0), tried(0, 0, False, 5.0)]
    assert set(classify_pairs(broken, EPOCHS, 9.5, WINDOW, deep=DEEP).verdicts) == {("prefill", 0)}
    healed = [*broken, tried(0, 0, True, 9.0), tried(0, 1, True, 9.0)]
    assert classify_pairs(healed, EPOCHS, 9.5, WINDOW, deep=DEEP).verdicts == {}
    restarted = {**EPOCHS, ("prefill", 0): 1}  # the prefill's next epoch runs now
    assert classify_pairs(broken, restarted, 9.5, WINDOW, deep=DEEP).verdicts == {}
    assert classify_pairs(broken, EPOCHS, 9.0 + WINDOW + 1, WINDOW, deep=DEEP).verdicts == {}


def test_a_hung_decode_is_left_to_the_tp_judge_and_its_prefill_is_not_blamed() -> None:
    # One prefill, two decodes; decode/1 hangs: its deep probe fails and every pair it is
    # in fails too. It must be judged Hung by the TP judge, not TransferBroken here.
    epochs = {("prefill", 0): 0, ("decode", 0): 0, ("decode", 1): 0}
    results = [tried(0, 0, True, t) for t in (1.0, 5.0)]
    results += [tried(0, 1, False, t) for t in (1.0, 5.0)]
    blind = dict.fromkeys(epochs, 100.0)
    assert set(classify_pairs(results, epochs, 9.5, WINDOW, deep=blind).verdicts) == {("decode", 1)}
    hung = {**blind, ("decode", 1): None}
    judged = classify_pairs(results, epochs, 9.5, WINDOW, deep=hung)
    assert judged.verdicts == {} and judged.links == () and judged.unexplained == ()


def test_a_group_at_fault_waits_for_a_deep_probe_that_began_after_its_last_failed_period() -> None:
    broken = [tried(0, 0, False, 1.0), tried(0, 1, False, 1.0)]
    broken += [tried(0, 1, False, 5.0), tried(0, 0, False, 5.0)]
    before = {**DEEP, ("prefill", 0): 4.0}  # passed, but before the second failed period
    judged = classify_pairs(broken, EPOCHS, 9.5, WINDOW, deep=before)
    assert judged.verdicts == {} and judged.unexplained == () and judged.links == ()
    after = {**DEEP, ("prefill", 0): 6.0}
    judged = classify_pairs(broken, EPOCHS, 9.5, WINDOW, deep=after)
    assert set(judged.verdicts) == {("prefill", 0)}
    unprobed = {g: t for g, t in DEEP.items() if g != ("prefill", 0)}  # no deep probe yet
    assert classify_pairs(broken, EPOCHS, 9.5, WINDOW, deep=unprobed).verdicts == {}


def test_a_prefill_is_not_blamed_for_failures_a_broken_decode_peer_caused() -> None:
    # decode/0's rank is stopped: its tries are out (it fails its deep probe, then it is in
    # an incident), but prefill/0's sender is held up by it, so prefill/0 also fails with
    # decode/1, which passes with prefill/1. Without the decode role's state that reads as
    # prefill/0 at fault; while a decode is broken it waits, and after decode/0 is back
    # only failures of periods that began after that count.
    results = [tried(0, 1, False, 1.0), tried(1, 1, True, 1.0)]
    results += [tried(0, 1, False, 5.0), tried(1, 1, True, 5.0)]
    epochs = {("prefill", 0): 0, ("prefill", 1): 0, ("decode", 1): 0}
    deep = dict.fromkeys(epochs, 100.0)
    assert set(classify_pairs(results, epochs, 9.5, WINDOW, deep=deep).verdicts) == {
        ("prefill", 0)
    }  # what the judge made of it before
    broken = {"decode": None, "prefill": 0.0}
    judged = classify_pairs(results, epochs, 9.5, WINDOW, deep=deep, settled=broken)
    assert judged.verdicts == {} and judged.links == () and judged.unexplained == ()
    back = {"decode": 6.0, "prefill": 0.0}  # decode/0 re-admitted at 6.0
    judged = classify_pairs(results, epochs, 9.5, WINDOW, deep=deep, settled=back)
    assert judged.verdicts == {}
    # A prefill that stays broken after that is judged on its own failures.
    later = [*results, tried(0, 1, False, 7.0), tried(1, 1, True, 7.0)]
    later += [tried(0, 1, False, 11.0), tried(1, 1, True, 11.0)]
    judged = classify_pairs(later, epochs, 15.5, WINDOW, deep=deep, settled=back)
    assert set(judged.verdicts) == {("prefill", 0)}
    assert judged.verdicts[("prefill", 0)].evidence["failures"] == 2


def test_a_group_busy_with_long_steps_is_not_blamed_for_its_slow_pairs() -> None:
    # decode/1 runs legitimately long model steps: its one-token tries miss the deadline
    # and one of its deep probes failed (a step in progress), though the newest passed.
    epochs = {("prefill", 0): 0, ("decode", 0): 0, ("decode", 1): 0}
    results = [tried(0, 0, True, t) for t in (1.0, 5.0)]
    results += [tried(0, 1, False, t) for t in (1.0, 5.0)]
    deep = dict.fromkeys(epochs, 100.0)
    busy = {("decode", 1): 3.0}
    judged = classify_pairs(results, epochs, 9.5, WINDOW, deep=deep, deep_failed=busy)
    assert judged.verdicts == {} and judged.unexplained == ()
    # A deep probe that failed before the pair's failures began does not excuse it.
    earlier = {("decode", 1): 0.5}
    judged = classify_pairs(results, epochs, 9.5, WINDOW, deep=deep, deep_failed=earlier)
    assert set(judged.verdicts) == {("decode", 1)}


# ------------------------------------------------------------------ the pair prober


def _prober(handler: Any, clock: list[float]) -> tuple[PairProber, PairBook]:
    book = PairBook()
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    prober = PairProber(
        book, client, clock=lambda: clock[0], wall_clock=lambda: 1000.0 + clock[0],
        rng=random.Random(7),
    )  # fmt: skip
    return prober, book


def _targets(prefills: int = 1, decodes: int = 2) -> PairTargets:
    return PairTargets(
        ("ns", "d"),
        tuple(PairEnd(i, 1, f"10.0.0.{i + 1}", f"node-p{i}", 8998) for i in range(prefills)),
        tuple(PairEnd(i, 1, f"10.0.1.{i + 1}", f"node-d{i}") for i in range(decodes)),
        period=3.0,
        timeout=2.0,
        token="tok",
    )


def test_a_try_sends_both_halves_the_prefills_bootstrap_and_one_token() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    asked: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        if req.method == "GET":
            asked.append(str(req.url))
            return httpx.Response(200, text="OK")
        seen.append((str(req.url), json.loads(req.content)))
        return httpx.Response(200, json={"text": "x"})

    prober, _ = _prober(handler, [0.0])
    t = _targets(1, 1)
    result = asyncio.run(prober.try_pair(t, t.prefills[0], t.decodes[0]))
    assert result.ok and result.key == (0, 0) and result.latency_s is not None
    urls = sorted(u for u, _ in seen)
    assert urls == ["http://10.0.0.1:30000/generate", "http://10.0.1.1:30000/generate"]
    # Beside the two halves, the prefill's bootstrap server (SGLang's heartbeat route).
    assert asked == ["http://10.0.0.1:8998/health"]
    bodies = [b for _, b in seen]
    assert bodies[0] == bodies[1]  # one request, both halves, as the router sends it
    body = bodies[0]
    assert body["bootstrap_host"] == "10.0.0.1" and body["bootstrap_port"] == 8998
    assert body["bootstrap_room"] == result.room
    assert body["rid"] == f"{PROBE_RID_PREFIX}{result.room}"
    assert body["sampling_params"]["max_new_tokens"] == 1


def test_a_bootstrap_server_that_does_not_answer_fails_a_try_whose_hand_off_passed() -> None:
    # A real decode hands off through the route it cached at its first room, so the
    # halves pass; its own heartbeat drops the prefill soon after, and a decode that
    # restarts cannot reach it: the try fails on the prefill's side, both halves ended.
    ended: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/health":
            raise httpx.RemoteProtocolError("disconnected", request=req)
        if req.url.path == "/lockstep/abort":
            ended.append(req.url.host)
            return httpx.Response(200, json={"aborted": []})
        if req.url.path == "/v1/loads":
            return httpx.Response(200, json={"loads": [{"token_usage": 0.1}]})
        return httpx.Response(200, json={"text": "x"})

    prober, _ = _prober(handler, [0.0])
    t = _targets(1, 1)
    result = asyncio.run(prober.try_pair(t, t.prefills[0], t.decodes[0]))
    assert not result.ok and result.decode_error is None, result
    assert result.prefill_error == (
        "bootstrap server 10.0.0.1:8998 not answering (RemoteProtocolError)"
    )
    assert sorted(ended) == ["10.0.0.1", "10.0.1.1"]


def test_a_failed_try_asks_the_bootstrap_and_ends_both_halves_of_its_room() -> None:
    seen: list[tuple[str, str, dict[str, Any] | None]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content) if req.content else None
        seen.append((req.method, str(req.url), body))
        if req.url.path == "/generate":
            raise httpx.ReadTimeout("slow", request=req)
        if req.url.path == "/health":
            raise httpx.ConnectError("refused", request=req)
        if req.url.path == "/v1/loads":
            return httpx.Response(200, json={"loads": [{"token_usage": 0.1}]})
        assert req.headers["Authorization"] == "Bearer tok"
        return httpx.Response(200, json={"aborted": []})

    prober, _ = _prober(handler, [0.0])
    t = _targets(1, 1)
    result = asyncio.run(prober.try_pair(t, t.prefills[0], t.decodes[0]))
    assert not result.ok and result.latency_s is None
    assert result.decode_error == "no answer within 2s"
    assert result.prefill_error is not None
    assert result.prefill_error.startswith("bootstrap server 10.0.0.1:8998 not answering")
    aborts = [(u, b) for m, u, b in seen if u.endswith("/lockstep/abort")]
    assert sorted(u for u, _ in aborts) == [
        "http://10.0.0.1:30000/lockstep/abort",
        "http://10.0.1.1:30000/lockstep/abort",
    ]
    assert all(b is not None and b["rooms"] == [result.room] for _, b in aborts)
    assert ("GET", "http://10.0.0.1:8998/health", None) in seen
    assert result.full is None  # both leaders had room: the failure counts


def test_a_failed_try_keeps_both_sides_of_the_hand_off_and_the_verdict_shows_them() -> None:
    # SGLang 0.5.23's /v1/loads shape: each leader's PD queues and the KV it holds.
    def load(mode: str, **queues: int) -> dict[str, Any]:
        disagg = {"mode": mode, **{f"{mode}_{k}_queue_reqs": v for k, v in queues.items()}}
        return {"loads": [{"num_used_tokens": 64, "max_total_num_tokens": 4096,
                           "token_usage": 0.02, "disaggregation": disagg}]}  # fmt: skip

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/generate":
            raise httpx.ReadTimeout("slow", request=req)
        if req.url.path == "/v1/loads":
            if req.url.host == "10.0.0.1":
                return httpx.Response(200, json=load("prefill", bootstrap=0, inflight=3))
            return httpx.Response(200, json=load("decode", prealloc=0, transfer=2, retracted=0))
        if req.url.path == "/health":
            return httpx.Response(200, text="OK")
        return httpx.Response(200, json={"aborted": []})

    prober, _ = _prober(handler, [0.0])
    t = _targets(1, 1)
    result = asyncio.run(prober.try_pair(t, t.prefills[0], t.decodes[0]))
    assert result.prefill_state == (
        "prefill: 0 waiting for their decode, 3 sending KV, KV 64 of 4096 tokens held"
    )
    assert result.decode_state == (
        "decode: 0 waiting for KV memory or their prefill, 2 waiting for KV, 0 retracted, "
        "KV 64 of 4096 tokens held"
    )
    # The verdict's evidence carries both sides of every failed hand-off it counted.
    first = replace(result, started=1.0, at=5.0, decode=0)
    again = replace(result, started=5.0, at=9.0, decode=1)
    epochs = dict.fromkeys(EPOCHS, 1)  # the targets' epoch
    judged = classify_pairs([first, again], epochs, 9.5, WINDOW, deep=DEEP)
    sides = judged.verdicts[("prefill", 0)].evidence["sides"]
    assert sides == [
        f"prefill/0 -> decode/{d}: {result.prefill_state}; {result.decode_state}" for d in (0, 1)
    ]
    # A leader that does not answer /v1/loads, or an older SGLang without the section.
    assert side_state("decode", None) is None
    assert side_state("decode", {"loads": [{"token_usage": 0.1}]}) is None


def test_periods_run_at_their_period_and_again_at_once_after_a_failure() -> None:
    clock = [0.0]
    failing = {"on": False}

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/generate" and failing["on"] and req.url.host == "10.0.0.1":
            return httpx.Response(500, json={"error": "transfer failed"})
        return httpx.Response(200, json={})

    prober, book = _prober(handler, clock)
    book.set_targets(_targets(1, 2), ("ns", "d"))
    sem = asyncio.Semaphore(4)

    async def period() -> list[PairTargets]:
        due = prober.due()
        for t in due:
            prober._inflight.add(t.key)
            await prober._period(sem, t)
        return due

    assert len(asyncio.run(period())) == 1  # the first is due at once: max(1, 2) tries
    assert [r.key for r in book.results("ns", "d")] == [(0, 0), (0, 1)]
    clock[0] = 1.0
    assert asyncio.run(period()) == []  # not yet: the period is about 3 s
    clock[0] = 4.0
    failing["on"] = True
    assert len(asyncio.run(period())) == 1
    assert [r.ok for r in book.results("ns", "d")][-2:] == [False, False]
    # After a failure the next period is due at once (the judge needs a second try).
    assert len(asyncio.run(period())) == 1
    book.forget("ns", "d")
    assert book.results("ns", "d") == [] and prober.due() == []


def test_a_full_decode_failing_its_only_peer_is_capacity_not_a_broken_path() -> None:
    # One prefill, two decodes (the real-engine drill's shape): decode/1 is full of long
    # streams and cannot take the probe in time, twice, while prefill/0 passes with
    # decode/0. A CI run judged that decode/1 TransferBroken; a full decode is not broken.
    full = "decode full: 1 request(s) waiting for KV memory"
    epochs = {("prefill", 0): 0, ("decode", 0): 0, ("decode", 1): 0}
    deep: dict[tuple[str, int], float | None] = dict.fromkeys(epochs, 100.0)

    def busy(period: float) -> PairResult:
        r = tried(0, 1, False, period)
        return PairResult(**{**r.__dict__, "full": full})

    tries = [tried(0, 0, True, 1.0), busy(1.0), tried(0, 0, True, 5.0), busy(5.0)]
    judged = classify_pairs(tries, epochs, 9.5, WINDOW, deep=deep)
    assert judged.verdicts == {} and judged.links == () and judged.unexplained == ()
    # The same failures with room to spare are the decode's.
    plain = [tried(0, 0, True, 1.0), tried(0, 1, False, 1.0), tried(0, 0, True, 5.0)]
    plain.append(tried(0, 1, False, 5.0))
    assert set(classify_pairs(plain, epochs, 9.5, WINDOW, deep=deep).verdicts) == {("decode", 1)}


def test_a_full_leader_is_read_from_sglangs_loads() -> None:
    def loads(**load: Any) -> dict[str, Any]:
        return {"loads": [{"num_running_reqs": 2, "max_running_requests": 8, **load}]}

    assert full_from_loads("decode", loads(token_usage=0.4)) is None
    assert full_from_loads("decode", loads(token_usage=0.95)) == "decode full: KV 95% used"
    assert full_from_loads("decode", loads(num_running_reqs=8)) == (
        "decode full: 8 of 8 requests running"
    )
    waiting = loads(token_usage=0.6, queues={"waiting": 0, "prealloc_ready": 2})
    assert full_from_loads("decode", waiting) == "decode full: 2 request(s) waiting for KV memory"
    # No answer, the stand-in's shape without the fields, a malformed body: not full.
    assert full_from_loads("decode", None) is None
    assert full_from_loads("prefill", {"loads": [{"num_running_reqs": 3}]}) is None
    assert full_from_loads("prefill", {"loads": "x"}) is None


def test_a_failed_try_on_a_full_decode_says_so() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/generate":
            raise httpx.ReadTimeout("slow", request=req)
        if req.url.path == "/v1/loads" and req.url.host == "10.0.1.1":
            return httpx.Response(200, json={"loads": [{"token_usage": 0.97}]})
        return httpx.Response(200, json={})

    prober, _ = _prober(handler, [0.0])
    t = _targets(1, 1)
    result = asyncio.run(prober.try_pair(t, t.prefills[0], t.decodes[0]))
    assert not result.ok and result.full == "decode full: KV 97% used"


def test_a_role_is_settled_since_its_last_group_came_back_and_not_while_one_is_broken() -> None:
    from lockstep.control.judge import settled_roles
    from lockstep.core.recovery import GroupRecord, IncidentRecord, Step

    incident = IncidentRecord(
        id="decode-1-1", epoch=0, reason="RankDown", first_failure_at=60.0, detected_at=62.0
    )

    def rec(role: str, index: int, step: Step, since: float, **more: object) -> GroupRecord:
        return GroupRecord(role=role, index=index, step=step, step_since=since, **more)

    healthy = [rec("prefill", 0, Step.HEALTHY, 10.0), rec("decode", 0, Step.HEALTHY, 30.0)]
    healthy += [rec("decode", 1, Step.HEALTHY, 50.0)]
    deep: dict[tuple[str, int], float | None] = {("decode", 0): 60.0, ("decode", 1): 61.0}
    assert settled_roles(healthy, deep) == {"prefill": 10.0, "decode": 50.0}
    # A decode in an incident (draining, restarting, coming back) unsettles the role, and
    # so does a failing one before any verdict; a spare counts for nothing.
    for step in (Step.DRAINING, Step.RESTARTING_IN_PLACE, Step.WAITING_PROBE, Step.READMITTING):
        broken = [*healthy[:2], rec("decode", 1, step, 70.0, incident=incident)]
        assert settled_roles(broken, deep)["decode"] is None, step
    suspect = [*healthy[:2], rec("decode", 1, Step.SUSPECT, 70.0)]
    assert settled_roles(suspect, deep)["decode"] is None
    assert settled_roles(healthy, {**deep, ("decode", 0): None})["decode"] is None
    spare = [*healthy, rec("decode", 2, Step.DRAINING, 80.0, spare=True, incident=incident)]
    assert settled_roles(spare, deep) == {"prefill": 10.0, "decode": 50.0}
    # A drain for maintenance is no incident; quarantine lasts: neither holds the other
    # role's verdicts.
    moving = [*healthy, rec("decode", 2, Step.DRAINING, 80.0)]
    assert settled_roles(moving, deep) == {"prefill": 10.0, "decode": 50.0}
    kept = [*healthy, rec("decode", 2, Step.QUARANTINED, 80.0, incident=incident)]
    assert settled_roles(kept, deep) == {"prefill": 10.0, "decode": 50.0}

"""KV held by ended requests (`lockstep.core.verdicts.ended_kv`): held past the bound for
the grace, it is freed once; a free that could not bring it down, or a group freed again
and again, is judged KVLeak; a transient or a free that worked is not."""

from __future__ import annotations

import pytest

from lockstep.core.verdicts import (
    EndedKVJudgement,
    KVFree,
    KVReading,
    Verdict,
    judge_ended_kv,
    reading_from_probe,
)

pytestmark = pytest.mark.unit

D0 = ("decode", 0)
EPOCHS = {D0: 2, ("prefill", 0): 1}
GRACE = 10.0


def readings(*pairs: tuple[float, int]) -> list[KVReading]:
    return [
        KVReading(at, tokens, requests=1 if tokens else 0, oldest_s=3.0) for at, tokens in pairs
    ]


def judge(
    rs: list[KVReading], frees: list[KVFree] | None = None, now: float = 100.0
) -> EndedKVJudgement:
    return judge_ended_kv({D0: rs}, {D0: frees or []}, EPOCHS, now, 0, GRACE)


def test_kv_held_past_the_grace_in_every_reading_is_freed_once() -> None:
    held = readings((85, 40), (90, 40), (95, 64), (100, 64))
    j = judge(held)
    assert j.free == (D0,) and not j.verdicts
    assert j.held is not None and j.held[D0].tokens == 64
    # Asked once: while its answer is fresh, nothing more is asked or judged.
    j = judge(held, [KVFree(100.5, None)], now=101.0)
    assert j.free == () and not j.verdicts


def test_a_transient_or_a_reading_at_the_bound_in_the_run_is_not_freed() -> None:
    assert judge(readings((95, 40), (100, 40))).free == ()  # 5 s < grace
    assert judge(readings((80, 40), (88, 0), (92, 40), (100, 40))).free == ()  # run began at 92
    assert judge(readings((80, 40), (90, 40), (100, 0))).free == ()  # let go by itself


def test_a_free_that_worked_ends_the_run_and_new_kv_waits_a_grace_again() -> None:
    held = readings((70, 40), (80, 40), (85, 40), (90, 40), (95, 30), (100, 30))
    worked = [KVFree(82.0, 0, 40)]
    # Still above the bound after a free that left nothing: what is held is new, and it
    # has been held since the free for 18 s: freed again, not judged.
    j = judge(held, worked)
    assert j.free == (D0,) and not j.verdicts
    # Within a grace of the free: nothing.
    assert judge(held, worked, now=90.0).free == ()


def test_a_free_that_could_not_bring_it_down_is_kvleak_after_a_grace() -> None:
    held = readings((70, 40), (80, 40), (90, 40), (100, 40))
    stuck = [KVFree(85.0, 40, 0)]
    j = judge(held, stuck, now=94.0)
    assert j.free == () and not j.verdicts  # not yet: a grace after the free
    j = judge(held, stuck, now=100.0)
    assert j.verdicts is not None and set(j.verdicts) == {D0}
    v = j.verdicts[D0]
    assert v.verdict is Verdict.KV_LEAK and v.immediate and v.epoch == 2
    assert "holds 40 KV tokens" in v.reason and "left 40 tokens held" in v.reason
    # A free that did not answer counts the same.
    silent = judge(held, [KVFree(85.0, None)], now=100.0)
    assert silent.verdicts and "did not answer" in silent.verdicts[D0].reason


def test_a_group_that_keeps_leaking_after_frees_is_kvleak() -> None:
    held = readings((80, 40), (90, 40), (100, 40))
    frees = [KVFree(40.0, 0, 40), KVFree(60.0, 0, 40), KVFree(75.0, 0, 40)]
    j = judge(held, frees)
    assert j.verdicts and "freed 3 times lately" in j.verdicts[D0].reason
    # Frees long ago (outside ten graces) do not count.
    old = [KVFree(-50.0, 0, 40), KVFree(-40.0, 0, 40), KVFree(75.0, 0, 40)]
    j = judge(held, old)
    assert not j.verdicts and j.free == (D0,)


def test_a_group_out_of_service_or_without_readings_is_not_judged() -> None:
    j = judge_ended_kv({("decode", 5): readings((80, 40), (100, 40))}, {}, EPOCHS, 100.0, 0, GRACE)
    assert j.free == () and not j.verdicts
    assert judge_ended_kv({D0: []}, {}, EPOCHS, 100.0, 0, GRACE).free == ()
    # A bound: held below it is never freed.
    j = judge_ended_kv({D0: readings((80, 40), (100, 40))}, {}, EPOCHS, 100.0, 64, GRACE)
    assert j.free == ()


def test_the_probe_body_s_report_is_read_and_a_bad_one_ignored() -> None:
    r = reading_from_probe(5.0, {"ok": True, "kv": {"tokens": 12, "requests": 2, "oldest_s": 1.5}})
    assert r == KVReading(5.0, 12, 2, 1.5)
    assert reading_from_probe(5.0, {"ok": True}) is None  # a runtime that does not report it
    assert reading_from_probe(5.0, None) is None
    assert reading_from_probe(5.0, {"kv": {"tokens": "12"}}) is None
    assert reading_from_probe(5.0, {"kv": {"tokens": True}}) is None
    assert reading_from_probe(5.0, {"kv": {"tokens": -1}}) is None

"""The KV of ended requests on the real server's side (`lockstep_sglang.held_kv`): what a
scheduler holds, put beside what the HTTP side still waits for; the free aborts what
nobody waits for, and reports what is left once the scheduler answered again. (The real
SGLang classes are checked in tests/sglang, the whole path on a real pair in
tests/realsglang/test_pd.py.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS
from typing import Any

import pytest

from lockstep_sglang.ended_kv import EndedKV
from lockstep_sglang.held_kv import SGLangEndedKV, held_requests, settle

pytestmark = pytest.mark.unit


def req(rid: str, allocated: int, protected: int = 0, room: int | None = None) -> NS:
    return NS(
        rid=rid,
        kv=NS(kv_allocated_len=allocated, cache_protected_len=protected),
        bootstrap_room=room,
    )


def test_every_queue_a_scheduler_holds_requests_in_is_read() -> None:
    decode = NS(
        waiting_queue=[req("w", 10)],
        running_batch=NS(reqs=[req("r", 30, protected=8, room=7)]),
        disagg_decode_prealloc_queue=NS(queue=[NS(req=req("p", 0))], retracted_queue=[req("x", 5)]),
        disagg_decode_transfer_queue=NS(queue=[NS(req=req("t", 12, room=9))]),
    )
    assert held_requests(decode) == {
        "w": (10, None),
        "r": (22, 7),  # its own KV: the prefix cache holds the first 8
        "x": (5, None),
        "p": (0, None),
        "t": (12, 9),
    }
    prefill = NS(
        waiting_queue=[],
        running_batch=NS(reqs=None),
        disagg_prefill_bootstrap_queue=NS(queue=[req("b", 4)]),
        disagg_prefill_inflight_queue=[req("i", 6, room=3)],
    )
    assert held_requests(prefill) == {"b": (4, None), "i": (6, 3)}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def book_with(states: dict[str, Any]) -> tuple[SGLangEndedKV, list[str], Clock]:
    aborted: list[str] = []
    clock = Clock()
    tm = NS(rid_to_state=states)
    return SGLangEndedKV(lambda: tm, lambda _tm, rid: aborted.append(rid), clock), aborted, clock


def test_a_held_request_nobody_waits_for_is_ended_from_the_first_answer_that_showed_it() -> None:
    live, left = NS(abort_sent=False), NS(abort_sent=True)
    book, _, clock = book_with({"live": live, "cancelled": left})
    held = {"live": (50, 1), "cancelled": (20, 2), "gone": (30, 3), "empty": (0, 4)}
    book.observe("probe-1", held)
    assert book.ended_kv() == EndedKV(tokens=50, requests=2, oldest_s=0.0, rooms=(2, 3))
    clock.now += 4
    book.observe("probe-2", held)
    assert book.ended_kv().oldest_s == 4.0  # counted from the first answer, not the newest
    # The scheduler let go of one: it no longer counts; the HTTP side waits for none.
    book.observe("probe-3", {"live": (50, 1), "gone": (30, 3)})
    assert book.ended_kv() == EndedKV(tokens=30, requests=1, oldest_s=4.0, rooms=(3,))


def test_answers_of_one_probe_add_up_and_a_newer_probe_replaces_them() -> None:
    book, _, _ = book_with({})
    book.observe("probe-1", {"a": (5, None)})
    book.observe("probe-1", {"b": (7, None)})  # a second DP replica's answer
    assert book.ended_kv().tokens == 12
    book.observe("probe-2", {"b": (7, None)})
    assert book.ended_kv().tokens == 7


def test_the_free_aborts_each_ended_request_and_reports_what_the_next_answers_show() -> None:
    book, aborted, _ = book_with({"live": NS(abort_sent=False)})
    assert book.free_ended_kv("nothing ended") == EndedKV()
    book.observe("probe-1", {"live": (9, None), "a": (5, 1), "b": (7, 2)})
    freed = book.free_ended_kv("test")
    assert (freed.tokens, freed.requests, sorted(aborted)) == (12, 2, ["a", "b"])
    assert book.asked == {"a", "b"}
    answers = iter([{"live": (9, None), "b": (7, 2)}, {"live": (9, None)}])
    probes: list[float] = []

    async def probe(timeout_s: float) -> None:
        probes.append(timeout_s)
        book.observe(f"probe-{len(probes) + 1}", next(answers))

    asyncio.run(settle(book, probe, within_s=5.0))
    assert len(probes) == 2 and book.asked == set() and book.ended_kv() == EndedKV()


def test_a_free_the_scheduler_ignores_leaves_what_it_could_not_free() -> None:
    book, _, clock = book_with({})
    book.observe("probe-1", {"a": (5, None)})
    book.free_ended_kv("test")
    calls = 0

    async def probe(timeout_s: float) -> None:
        nonlocal calls
        calls += 1
        clock.now += 1.0
        book.observe(f"probe-{calls + 1}", {"a": (5, None)})

    asyncio.run(settle(book, probe, within_s=2.5, clock=clock))
    assert calls == 3 and book.asked == {"a"} and book.ended_kv().tokens == 5

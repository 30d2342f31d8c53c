"""The prober: periods, jitter, startup grace, concurrency, failure evidence."""

from __future__ import annotations

import asyncio
import json
import random

import httpx

from lockstep.clients.agent_client import RanksAnswer
from lockstep.clients.prober import ProbeBook, Prober, ProbeSample, ProbeTarget

KEY = ("ns", "m", "decode", 0)


def target(key: tuple[str, str, str, int] = KEY, **kw: object) -> ProbeTarget:
    args: dict[str, object] = {
        "key": key,
        "epoch": 1,
        "probe_url": f"http://10.0.0.{key[3] + 1}:30000/lockstep/probe",
        "agents": (
            ("p0", f"http://10.0.0.{key[3] + 1}:8999"),
            ("p1", f"http://10.0.1.{key[3] + 1}:8999"),
        ),
        "period": 5.0,
        "timeout": 1.0,
    }
    args.update(kw)
    return ProbeTarget(**args)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(handler: httpx.MockTransport, clock: Clock, book: ProbeBook) -> Prober:
    client = httpx.AsyncClient(transport=handler)
    return Prober(book, client, clock=clock, rng=random.Random(1))


def test_due_targets_respect_period_jitter_and_grace() -> None:
    clock, book = Clock(), ProbeBook()
    book.set_targets("ns", "m", [target(), target(("ns", "m", "decode", 1), not_before=1010.0)])
    prober = make(httpx.MockTransport(lambda r: httpx.Response(200)), clock, book)
    assert [t.key for t in prober.due_targets()] == [KEY]  # group 1 is in startup grace
    assert prober.due_targets() == []  # not due again before its period
    clock.now += 5.0 * 1.1 + 0.01
    assert [t.key for t in prober.due_targets()] == [KEY]
    clock.now = 1010.0
    assert ("ns", "m", "decode", 1) in [t.key for t in prober.due_targets()]


def test_jitter_spreads_groups_within_ten_percent() -> None:
    clock, book = Clock(), ProbeBook()
    book.set_targets("ns", "m", [target(("ns", "m", "decode", i)) for i in range(50)])
    prober = make(httpx.MockTransport(lambda r: httpx.Response(200)), clock, book)
    prober.due_targets()
    nexts = sorted(prober._due.values())
    assert 1000 + 4.5 <= nexts[0] < nexts[-1] <= 1000 + 5.5
    assert len(set(nexts)) == 50


def test_failed_probe_reads_every_agent() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if request.url.path == "/lockstep/probe":
            return httpx.Response(504, json={"ok": False, "error": "collective timed out"})
        rank = 0 if request.url.host == "10.0.0.1" else 1
        return httpx.Response(200, json={"ranks": [{"rank": rank, "iteration": 7}]})

    clock, book = Clock(), ProbeBook()
    book.set_targets("ns", "m", [target()])
    prober = make(httpx.MockTransport(handler), clock, book)
    sample = asyncio.run(prober.probe(target()))
    assert not sample.ok and "collective timed out" in (sample.error or "")
    assert [(a.pod, a.body["ranks"][0]["rank"]) for a in sample.agents] == [("p0", 0), ("p1", 1)]
    assert "http://10.0.1.1:8999/ranks" in seen


def test_unreachable_agents_are_reported_not_raised() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    prober = make(httpx.MockTransport(handler), Clock(), ProbeBook())
    sample = asyncio.run(prober.probe(target()))
    assert not sample.ok
    assert [a.body for a in sample.agents] == [None, None]
    assert "ConnectError" in (sample.agents[0].error or "")


def test_ok_probe_records_latency_and_detail() -> None:
    handler = httpx.MockTransport(
        lambda r: httpx.Response(200, content=json.dumps({"ok": True, "cpu_ms": 1.5}))
    )
    prober = make(handler, Clock(), ProbeBook())
    sample = asyncio.run(prober.probe(target()))
    assert sample.ok and sample.detail == {"ok": True, "cpu_ms": 1.5} and sample.agents == ()


def test_book_drops_samples_of_an_old_epoch_and_gone_groups() -> None:
    book = ProbeBook()
    book.set_targets("ns", "m", [target()])
    book.record(ProbeSample(KEY, 1, 1.0, True))
    book.record(ProbeSample(KEY, 0, 2.0, False))  # late sample of an old epoch
    assert [s.time for s in book.samples(KEY)] == [1.0]
    book.set_targets("ns", "m", [target(epoch=2)])
    assert book.samples(KEY) == []
    book.forget("ns", "m")
    assert book.targets() == []


def test_run_loop_probes_all_groups_with_bounded_concurrency() -> None:
    active = 0
    peak = 0

    async def main() -> list[ProbeSample]:
        nonlocal active, peak
        lock = asyncio.Lock()

        async def handler(request: httpx.Request) -> httpx.Response:
            nonlocal active, peak
            async with lock:
                active += 1
                peak = max(peak, active)
            await asyncio.sleep(0.01)
            async with lock:
                active -= 1
            return httpx.Response(200, json={"ok": True})

        book = ProbeBook()
        book.set_targets("ns", "m", [target(("ns", "m", "decode", i)) for i in range(20)])
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        got: list[ProbeSample] = []
        prober = Prober(book, client, concurrency=4, tick=0.01, on_sample=got.append)
        stop = asyncio.Event()
        task = asyncio.create_task(prober.run(stop))
        for _ in range(500):
            if len(got) >= 20:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5)
        await client.aclose()
        return got

    got = asyncio.run(main())
    assert len({s.key for s in got}) == 20
    assert peak <= 4


def test_book_keeps_agent_answers_of_the_newest_sample_only() -> None:
    book = ProbeBook()
    book.set_targets("ns", "m", [target()])
    answer = (RanksAnswer("p0", {"ranks": []}),)
    book.record(ProbeSample(KEY, 1, 1.0, False, agents=answer))
    book.record(ProbeSample(KEY, 1, 2.0, False, agents=answer))
    first, second = book.samples(KEY)
    assert first.agents == () and second.agents == answer

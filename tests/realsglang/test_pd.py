"""Prefill/decode disaggregation on the real SGLang 0.5.23 server with lockstep's hooks:
a prefill and a decode server (mooncake over TCP) behind the real sglang-router, and the
operator's pair probe on the same pair."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest
from server import HOST, TOKEN, RealServer, free_port, wait_for

from lockstep.clients.pair_prober import PairBook, PairProber, PairTargets
from lockstep.core.pairs import PairEnd, PairResult, full_from_loads
from lockstep_sglang import timeline

pytestmark = pytest.mark.timeout(420)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_prefill_and_a_decode_behind_the_real_router_serve_end_to_end_with_the_hooks(
    real_server: Callable[..., RealServer], real_router: Callable[..., str]
) -> None:
    # The prefill starts SGLang's subprocesses as SGLang does (spawned, as its pod asks),
    # the decode forks them from its engine process (the default): the pair serves either way.
    prefill = real_server(
        tp=1, mode="prefill", cores=[0], env={"LOCKSTEP_SUBPROCESS_START": "spawn"}
    )
    decode = real_server(tp=1, mode="decode", cores=[1])
    prefill.wait_ready()
    decode.wait_ready()
    assert _start_methods(prefill) == [
        ("spawn", "SGLang's own spawn, as the pod asks (LOCKSTEP_SUBPROCESS_START=spawn)")
    ]
    assert [method for method, _ in _start_methods(decode)] == ["fork"]
    # A PD server alone refuses a request without its peer's bootstrap.
    alone = decode.generate("no prefill", max_new_tokens=4)
    assert alone.status_code == 400, alone.text
    router = real_router(prefill, decode)
    body = {
        "text": "the quick brown fox",
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
    }
    resp = httpx.post(f"{router}/generate", json=body, timeout=60, trust_env=False)
    assert resp.status_code == 200, resp.text
    assert resp.json()["meta_info"]["completion_tokens"] == 8
    # Both sides ran lockstep's runtime: each published its rank state and decisions, and
    # the deep probe still passes on both.
    for server in (prefill, decode):
        (rank,) = server.ranks()["ranks"]
        assert rank["alive"] and rank["last_decision"] is not None
        assert server.probe().status_code == 200
    kinds = {r["last_decision"]["kind"] for s in (prefill, decode) for r in s.ranks()["ranks"]}
    assert kinds <= {"batch", "idle"}

    # The operator's pair probe on the same pair: its own one-token request to both
    # leaders at once, as the router pairs one; it passes and leaves nothing held.
    p_end = PairEnd(0, 0, HOST, bootstrap_port=prefill.bootstrap_port, port=prefill.port)
    d_end = PairEnd(0, 0, HOST, port=decode.port)
    tried = _try_pair(p_end, d_end)
    assert tried.ok and tried.latency_s is not None, tried
    print(f"pair probe on the real engine: {tried.latency_s * 1000:.0f} ms")
    wait_for(lambda: _held(prefill) == [] and _held(decode) == [], 30, "nothing held")
    # The decode sent to a bootstrap server that does not answer: the try fails, names the
    # bootstrap server, and ends both halves of its room (the prefill half would otherwise
    # wait SGLang's 300 s for a decode that never comes).
    silent = _try_pair(replace(p_end, bootstrap_port=free_port()), d_end)
    assert not silent.ok and "not answering" in (silent.prefill_error or ""), silent
    wait_for(lambda: _held(prefill) == [] and _held(decode) == [], 30, "nothing held")
    wait_for(lambda: _busy(_load(prefill)) == 0 == _busy(_load(decode)), 60, "both idle")
    assert _try_pair(p_end, d_end).ok

    # The PD path's drill faults, through lockstep's hooks in the real prefill: its TP
    # collectives, HTTP server and deep probe stay fine while the hand-off fails.
    # transfer-stall: the prefill computes, its KV sender sends nothing for the new room.
    _inject(prefill, "transfer-stall")
    stalled = _try_pair(p_end, d_end)
    print(f"transfer-stall: {stalled}")
    assert not stalled.ok and stalled.decode_error is not None, stalled
    assert "not answering" not in (stalled.prefill_error or ""), stalled
    # Both sides as the real SGLang tells them (/v1/loads): the prefill holds the room,
    # the decode waits for its KV.
    assert (stalled.prefill_state or "").startswith("prefill: "), stalled
    assert "waiting for KV" in (stalled.decode_state or ""), stalled
    assert prefill.probe().status_code == 200 and decode.probe().status_code == 200
    assert "the KV of room" in prefill.tail(200) and f"{stalled.room}" in prefill.tail(200)
    wait_for(lambda: _held(prefill) == [] and _held(decode) == [], 30, "nothing held")
    # bootstrap-down: the prefill's bootstrap server closes every connection unanswered.
    _inject(prefill, "bootstrap-down")
    down = _try_pair(p_end, d_end)
    print(f"bootstrap-down: {down}")
    assert not down.ok and "not answering" in (down.prefill_error or ""), down
    assert prefill.probe().status_code == 200 and decode.probe().status_code == 200
    wait_for(lambda: _held(prefill) == [] and _held(decode) == [], 30, "nothing held")
    # Cleared, the same pair hands off again.
    prefill.inject("none")
    wait_for(lambda: _try_pair(p_end, d_end).ok, 60, "the pair hands off again")

    # The KV of ended requests (`lockstep_sglang.held_kv`), what the deep probe's body
    # carries. Streams through the router the client cancels: the decode lets go of them.
    assert _ended_kv(decode)["tokens"] == 0 == _ended_kv(prefill)["tokens"]
    cancelled = _cancel_streams(router, decode)
    wait_for(lambda: _busy(_load(decode)) == 0, 30, "the decode let go of the cancelled")
    assert _ended_kv(decode)["tokens"] == 0, cancelled
    # kv-leak in the decode: its HTTP process loses the abort of each cancelled stream;
    # the scheduler keeps generating for nobody, and the probe says what they hold.
    _inject(decode, "kv-leak")
    _cancel_streams(router, decode)
    first = wait_for(lambda: _ended_kv(decode)["tokens"] > 0 and _ended_kv(decode), 15, "leak")
    time.sleep(2.0)
    later = _ended_kv(decode)
    print(f"kv-leak: {first} then {later}")
    assert later["tokens"] > 0 and later["oldest_s"] >= first["oldest_s"] + 1.5, later
    assert later["requests"] <= _busy(_load(decode)), later
    assert "the abort of request" in decode.tail(200)
    assert _ended_kv(prefill)["tokens"] == 0
    # The operator's free: the scheduler's own abort of each, then what is left.
    freed = decode.http.post(
        f"{decode.url}/lockstep/kv/free", json={"reason": "test"}, headers=AUTH, timeout=10
    )
    assert freed.status_code == 200, freed.text
    print(f"free: {freed.json()}")
    assert freed.json()["tokens"] > 0 and freed.json()["left"]["tokens"] == 0, freed.json()
    wait_for(lambda: _busy(_load(decode)) == 0, 10, "the decode freed what they held")
    assert _ended_kv(decode)["tokens"] == 0
    decode.inject("none")
    resp = httpx.post(f"{router}/generate", json=body, timeout=60, trust_env=False)
    assert resp.status_code == 200, resp.text


def _inject(server: RealServer, kind: str) -> None:
    """A PD fault, in force once this returns: each process re-reads the fault file at
    most every 50 ms (`faults.watcher_from_env`), and a try's room reaches the sender
    within 30 ms (in CI a try sent at once passed under `transfer-stall`)."""
    server.inject(kind)
    time.sleep(0.2)


def _ended_kv(server: RealServer) -> dict[str, Any]:
    """The KV of ended requests, as the deep probe's body reports it to the operator."""
    resp = server.probe()
    assert resp.status_code == 200, resp.text
    kv: dict[str, Any] = resp.json()["kv"]
    return kv


def _cancel_streams(router: str, decode: RealServer, n: int = 4) -> dict[str, Any]:
    """`n` long streams through the router, cancelled by the client together once the
    decode runs them all (each would run 1,800 tokens)."""

    async def go() -> dict[str, Any]:
        body = {
            "text": "a stream the client gives up on",
            "stream": True,
            "sampling_params": {"max_new_tokens": 1800, "ignore_eos": True},
        }
        got = [0] * n

        async def one(client: httpx.AsyncClient, i: int) -> None:
            async with client.stream("POST", f"{router}/generate", json=body) as resp:
                async for line in resp.aiter_lines():
                    got[i] += line.startswith("data: ")

        async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
            tasks = [asyncio.create_task(one(client, i)) for i in range(n)]
            deadline = time.monotonic() + 60
            while not all(got) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            running = _load(decode)["num_running_reqs"]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        assert all(got), got
        return {"events": got, "running": running}

    return asyncio.run(go())


def _try_pair(p: PairEnd, d: PairEnd, timeout_s: float = 4.0) -> PairResult:
    """One try of the operator's pair probe (its defaults' deadline)."""

    async def go() -> PairResult:
        async with httpx.AsyncClient(trust_env=False) as client:
            targets = PairTargets(("ns", "d"), (), (), period=3.0, timeout=timeout_s, token=TOKEN)
            return await PairProber(PairBook(), client).try_pair(targets, p, d)

    return asyncio.run(go())


def _start_methods(server: RealServer) -> list[tuple[str, str]]:
    """How each start of the server's engine started SGLang's subprocesses (its timeline)."""
    marks = timeline.read(server.state_dir)
    return [(m["method"], m["why"]) for m in marks if m["event"] == "subprocess_start"]


def _held(server: RealServer) -> list[dict[str, Any]]:
    resp = server.http.get(f"{server.url}/lockstep/requests", headers=AUTH, timeout=10)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["requests"])


def _abort(server: RealServer, **order: Any) -> dict[str, Any]:
    resp = server.http.post(f"{server.url}/lockstep/abort", json=order, headers=AUTH, timeout=10)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def _load(server: RealServer) -> dict[str, Any]:
    load: dict[str, Any] = server.http.get(f"{server.url}/v1/loads", timeout=10).json()["loads"][0]
    return load


def _busy(load: dict[str, Any]) -> int:
    return int(load["num_running_reqs"]) + int(load["num_waiting_reqs"])


def _in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        began = time.monotonic()
        try:
            out["result"] = fn()
        except Exception as exc:
            out["result"] = exc
        out["took"] = time.monotonic() - began

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_halves_caught_by_an_incident_end_at_once_and_free_what_they_held(
    real_server: Callable[..., RealServer], real_router: Callable[..., str]
) -> None:
    """The real engine's side of "no request lost to an incident": a prefill half whose
    decode never comes and a decode half whose prefill never sends are listed by room and
    ended with 503 on the operator's word, the scheduler frees what they held; a stream
    through the router ends with SGLang's abort event; the fenced server refuses new work.
    """
    prefill = real_server(tp=1, mode="prefill", cores=[0])
    decode = real_server(tp=1, mode="decode", cores=[1])
    prefill.wait_ready()
    decode.wait_ready()
    assert prefill.http.get(f"{prefill.url}/lockstep/requests", timeout=10).status_code == 401
    idle_p, idle_d = _load(prefill), _load(decode)
    # What the pair probe reads of a failed try's halves (`full_from_loads`): the real
    # server's loads carry each field it weighs, and an idle server is not full.
    for idle in (idle_p, idle_d):
        assert {"num_running_reqs", "max_running_requests", "token_usage"} <= idle.keys(), idle
        assert "prealloc_ready" in idle["queues"], idle
    assert full_from_loads("decode", {"loads": [idle_d]}) is None
    assert full_from_loads("prefill", {"loads": [idle_p]}) is None
    host = "127.0.0.1"

    def pd(server: RealServer, room: int) -> httpx.Response:
        body = {
            "text": f"half of room {room}",
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
            "bootstrap_host": host,
            "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": room,
        }
        return server.http.post(f"{server.url}/generate", json=body, timeout=120)

    # A prefill half whose decode never bootstraps: SGLang holds it 300 s.
    orphan, got = _in_background(lambda: pd(prefill, 9101))
    wait_for(lambda: [r["room"] for r in _held(prefill)] == [9101], 30, "the prefill half held")
    wait_for(lambda: _busy(_load(prefill)) > _busy(idle_p), 30, "the prefill holding it")
    ended = _abort(prefill, rooms=[9101], reason="decode/0 is out of service")
    assert [r["room"] for r in ended["aborted"]] == [9101]
    orphan.join(10)
    assert isinstance(got["result"], httpx.Response), got
    assert got["result"].status_code == 503 and got["took"] < 60, got
    wait_for(lambda: _busy(_load(prefill)) == _busy(idle_p), 30, "the prefill freed it")

    # A decode half whose prefill never sends the KV (a wedged prefill whose bootstrap
    # server still answers: SGLang's heartbeat does not help): ended by its peer address.
    stuck, got = _in_background(lambda: pd(decode, 9102))
    wait_for(lambda: [r["room"] for r in _held(decode)] == [9102], 30, "the decode half held")
    (listed,) = _held(decode)
    assert listed["bootstrap"] == f"{host}:{prefill.bootstrap_port}"
    assert [r["room"] for r in _abort(decode, peers=[host])["aborted"]] == [9102]
    stuck.join(10)
    assert isinstance(got["result"], httpx.Response) and got["result"].status_code == 503, got
    wait_for(lambda: _busy(_load(decode)) == _busy(idle_d), 60, "the decode freed it")
    # Its KV slots follow, but not always in the same round: an aborted half already in
    # SGLang's transfer queue keeps its pages until the prefill acknowledges the abort or
    # SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT (30 s) passes, since a
    # remote write may still reach them (CI once read 12 tokens still held here).
    wait_for(
        lambda: _load(decode)["num_used_tokens"] == idle_d["num_used_tokens"],
        60,
        "the decode freed its KV slots",
    )

    # A stream through the real router, cut by the incident: SGLang's abort event, then
    # [DONE]; never a clean-looking truncated 200.
    router = real_router(prefill, decode)
    lines: list[str] = []
    first = threading.Event()

    def read_stream() -> int:
        body = {
            "text": "a long answer",
            "stream": True,
            "sampling_params": {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True},
        }
        with httpx.stream(
            "POST", f"{router}/generate", json=body, timeout=120, trust_env=False
        ) as resp:
            for line in resp.iter_lines():
                lines.append(line)
                if line.startswith("data: {"):
                    first.set()
            return resp.status_code

    streaming, got = _in_background(read_stream)
    assert first.wait(120), "the stream started"
    ended = _abort(decode, all=True, reason="decode/0 judged Hung")
    assert ended["fenced"] == "decode/0 judged Hung" and len(ended["aborted"]) == 1
    streaming.join(30)
    assert got["result"] == 200, got
    data = [line[len("data: ") :] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]", data[-3:]
    finish = json.loads(data[-2])["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and finish["status_code"] == 503, finish
    # Fenced: the router's health check and any new request get 503 at once.
    assert decode.http.get(f"{decode.url}/health", timeout=10).status_code == 503
    assert decode.generate("after the fence").status_code == 503

"""KV held by ended requests, on real stand-in PD pods (their own processes): a decode
under `kv-leak` keeps the KV of a PD request that ended unanswered; the runtime reports it
(`GET /lockstep/kv`, `/v1/loads`, the deep probe's body) without listing it as a request,
and `POST /lockstep/kv/free` (the operator's `AgentClient.free_ended_kv`) gives it back;
without the fault the same request leaves nothing behind."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from dist_support import wait_until
from test_pair_probe import held, put_fault
from test_standin import AGENT_TOKEN, Launcher, StandinPod, launcher
from test_standin_pd import pair, serving, start

from lockstep.clients.agent_client import AgentClient

__all__ = ["launcher"]  # the fixture, used by name


def kv(pod: StandinPod, token: str = AGENT_TOKEN) -> httpx.Response:
    return pod.http.get(
        f"{pod.base}/lockstep/kv", headers={"Authorization": f"Bearer {token}"}, timeout=5
    )


def used_tokens(pod: StandinPod) -> int:
    load: dict[str, Any] = pod.get("/v1/loads").json()["loads"][0]
    return int(load["num_used_tokens"])


@pytest.mark.timeout(150)
def test_a_leaking_decode_reports_the_kv_of_ended_requests_and_the_free_gives_it_back(
    launcher: Launcher,
) -> None:
    prefill, decode = start(launcher, "prefill", 0), start(launcher, "decode", 1)
    wait_until(lambda: serving(prefill) and serving(decode), 60, "both pods serving", step=0.2)
    assert kv(decode).json() == {"tokens": 0, "requests": 0, "oldest_s": 0.0, "rooms": []}
    assert kv(decode, "wrong").status_code == 401

    # No fault: a decode half whose prefill half never came fails after the waiting
    # timeout (3 s here) and frees what it reserved.
    lone = pair(prefill, decode, "lonely prompt", 11, send_prefill=False)["decode"]
    assert isinstance(lone, httpx.Response) and lone.status_code == 500, lone
    assert kv(decode).json()["tokens"] == 0 and used_tokens(decode) == 0

    # kv-leak: the same failure keeps its KV.
    put_fault(decode, "kv-leak")
    leaked = pair(prefill, decode, "leaky prompt", 12, send_prefill=False)["decode"]
    assert isinstance(leaked, httpx.Response) and leaked.status_code == 500, leaked
    report = kv(decode).json()
    assert report["requests"] == 1 and report["rooms"] == [12] and report["tokens"] > 0, report
    assert used_tokens(decode) == report["tokens"]  # still in the pool
    assert held(decode) == []  # no request anyone could end: only KV held
    probe = decode.get("/lockstep/probe?timeout=5")
    assert probe.status_code == 200 and probe.json()["kv"]["tokens"] == report["tokens"]
    # A request that answers is not affected by the fault.
    ok = pair(prefill, decode, "fine prompt", 13)
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in ok.values()), ok
    assert kv(decode).json()["requests"] == 1

    # The operator's free, through its client: freed by the abort path, nothing left.
    with httpx.Client(trust_env=False) as http:
        agents = AgentClient(http)
        assert isinstance(agents.free_ended_kv(decode.ip, "wrong", "test"), str)  # 401
        answer = agents.free_ended_kv(decode.ip, AGENT_TOKEN, "lockstep test: free")
    assert answer == (report["tokens"], 1, 0), answer
    wait_until(lambda: kv(decode).json()["tokens"] == 0, 5, "the KV freed", step=0.1)
    assert used_tokens(decode) == 0
    put_fault(decode, None)

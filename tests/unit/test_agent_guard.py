"""The pod agent's guard: every route but /healthz is the operator's (its bearer token),
and each has a request budget. The real `PodAgent` behind its real HTTP server, and the
operator's real clients (`AgentClient`, the prober's `read_ranks_async`) against it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lockstep.clients import agent_client
from lockstep.clients.agent_client import AgentClient, read_ranks_async
from lockstep_sglang.agent import RATE_LIMITS, PodAgent, TokenBucket

pytestmark = pytest.mark.unit

TOKEN = "s3cret-from-the-operator"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def serve(agent: PodAgent) -> Iterator[str]:
    server, _ = agent.serve_in_thread("127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[str]:
    yield from serve(PodAgent(tmp_path, token=TOKEN, environ={}, epoch="2", rate_limits={}))


def test_ranks_and_stacks_need_the_token_and_healthz_does_not(guarded: str) -> None:
    base = f"http://{guarded}"
    with httpx.Client() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            ranks = http.get(f"{base}/ranks", headers=headers)
            stacks = http.post(f"{base}/stacks", headers=headers)
            for answer in (ranks, stacks):
                assert answer.status_code == 401, answer.text
                assert answer.headers["www-authenticate"].startswith("Bearer")
                assert "pid" not in answer.text and "stack" not in answer.json()
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert http.get(f"{base}/ranks", headers=auth).json()["epoch"] == "2"
        assert http.post(f"{base}/stacks", headers=auth).json()["stacks"] == []
        # What a kubelet readiness probe reaches: no token, nothing revealed.
        assert http.get(f"{base}/healthz").json() == {"ok": True}


def test_an_agent_without_a_token_serves_nobody(tmp_path: Path) -> None:
    for host in serve(PodAgent(tmp_path, environ={}, rate_limits={})):
        with httpx.Client() as http:
            for answer in (
                http.get(f"http://{host}/ranks", headers={"Authorization": "Bearer guess"}),
                http.post(f"http://{host}/stacks"),
            ):
                assert answer.status_code == 403
                assert "LOCKSTEP_AGENT_TOKEN" in answer.json()["error"]


def test_the_operators_clients_send_the_token(
    guarded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ip, port = guarded.split(":")
    # AgentClient speaks to the agent port of a pod IP: point it at this server's port.
    monkeypatch.setattr(agent_client, "agent_url", lambda pod_ip: f"http://{pod_ip}:{port}")
    with httpx.Client() as http:
        client = AgentClient(http)
        answer = client.ranks("p", ip, TOKEN)
        assert answer.error is None and answer.body is not None
        assert answer.body["epoch"] == "2"
        assert client.ranks("p", ip, "wrong").error == "HTTP 401"
        assert client.evidence(ip, "/stacks", TOKEN).startswith('{"now"')
        assert client.evidence(ip, "/ranks", "wrong").startswith("HTTP 401:")

    async def prober_read() -> tuple[str | None, str | None]:
        async with httpx.AsyncClient() as client:
            good = await read_ranks_async(client, "p", f"http://{guarded}", 2.0, TOKEN)
            bad = await read_ranks_async(client, "p", f"http://{guarded}", 2.0, "")
        return good.error, bad.error

    assert asyncio.run(prober_read()) == (None, "HTTP 401")


def test_each_route_has_a_budget_that_counts_refused_requests_too(tmp_path: Path) -> None:
    clock = Clock()
    agent = PodAgent(tmp_path, token=TOKEN, environ={}, monotonic=clock)
    rate, burst = RATE_LIMITS["/ranks"]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for host in serve(agent):
        with httpx.Client() as http:
            # Guessing the token spends the budget the operator would need.
            wrong = [http.get(f"http://{host}/ranks").status_code for _ in range(int(burst))]
            assert wrong == [401] * int(burst)
            over = http.get(f"http://{host}/ranks", headers=auth)
            assert over.status_code == 429
            assert int(over.headers["retry-after"]) >= 1
            assert "try again" in over.json()["error"]
            # Other routes have their own budget; /healthz has none.
            assert http.post(f"http://{host}/stacks", headers=auth).status_code == 200
            assert all(http.get(f"http://{host}/healthz").status_code == 200 for _ in range(50))
            # Refilled at `rate` per second.
            clock.now += 1.5 / rate
            assert http.get(f"http://{host}/ranks", headers=auth).status_code == 200
            assert http.get(f"http://{host}/ranks", headers=auth).status_code == 429
            # A stack dump pauses the ranks: two at once, then one per 1/rate seconds.
            stacks_rate, stacks_burst = RATE_LIMITS["/stacks"]
            answers = [
                http.post(f"http://{host}/stacks", headers=auth).status_code
                for _ in range(int(stacks_burst) + 1)
            ]
            assert answers.count(429) >= 2 and answers[0] == 200
            clock.now += 1.5 / stacks_rate
            assert http.post(f"http://{host}/stacks", headers=auth).status_code == 200


def test_token_bucket_refills_and_caps_at_its_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2.0, burst=3.0, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)
    clock.now += 100.0  # a long quiet spell refills to the burst, not beyond
    assert [bucket.take() == 0.0 for _ in range(4)] == [True, True, True, False]

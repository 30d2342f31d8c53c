"""Prefill/decode disaggregation on the real SGLang 0.5.23 server with lockstep's hooks:
a prefill and a decode server (mooncake over TCP) behind the real sglang-router."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from server import RealServer

pytestmark = pytest.mark.timeout(420)


def test_a_prefill_and_a_decode_behind_the_real_router_serve_end_to_end_with_the_hooks(
    real_server: Callable[..., RealServer], real_router: Callable[..., str]
) -> None:
    prefill = real_server(tp=1, mode="prefill", cores=[0])
    decode = real_server(tp=1, mode="decode", cores=[1])
    prefill.wait_ready()
    decode.wait_ready()
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

"""The operator's pair probe against real stand-in PD pods (their own processes, their
bootstrap server, the runtime's abort route): a healthy pair passes; a prefill whose KV
sender stalls (`transfer-stall`) or whose bootstrap server stops answering
(`bootstrap-down`) fails the try while its deep-probe side (`/health`) stays fine, the
failure says which; and a failed try leaves nothing held on either side (the probe ends
both halves of its room through `POST /lockstep/abort`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from dist_support import wait_until
from test_standin import AGENT_TOKEN, Launcher, StandinPod, launcher
from test_standin_pd import BOOTSTRAP_PORT, serving, start

from lockstep.clients.pair_prober import PairBook, PairProber, PairTargets
from lockstep.core.pairs import PROBE_RID_PREFIX, PairEnd, PairResult

__all__ = ["launcher"]  # the fixture, used by name

TIMEOUT_S = 2.0


def held(pod: StandinPod) -> list[dict[str, Any]]:
    resp = pod.http.get(
        f"{pod.base}/lockstep/requests",
        headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
        timeout=5,
    )
    resp.raise_for_status()
    requests: list[dict[str, Any]] = resp.json()["requests"]
    return requests


def put_fault(pod: StandinPod, kind: str | None) -> None:
    path: Path = pod.pod_dir / "fault.json"
    if kind is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kind": kind, "ranks": None, "epoch": "3"}))
    tmp.replace(path)


def try_pair(prefill: StandinPod, decode: StandinPod) -> PairResult:
    async def go() -> PairResult:
        async with httpx.AsyncClient(trust_env=False) as client:
            prober = PairProber(PairBook(), client)
            targets = PairTargets(
                ("ns", "d"), (), (), period=1.0, timeout=TIMEOUT_S, token=AGENT_TOKEN
            )
            p = PairEnd(0, 3, prefill.ip, "node-a", BOOTSTRAP_PORT)
            d = PairEnd(0, 3, decode.ip, "node-b")
            return await prober.try_pair(targets, p, d)

    return asyncio.run(go())


@pytest.mark.timeout(150)
def test_the_pair_probe_finds_a_stalled_sender_and_a_silent_bootstrap_and_leaves_nothing_held(
    launcher: Launcher,
) -> None:
    prefill, decode = start(launcher, "prefill", 0), start(launcher, "decode", 1)
    wait_until(lambda: serving(prefill) and serving(decode), 60, "both pods serving", step=0.2)

    ok = try_pair(prefill, decode)
    assert ok.ok and ok.error is None, ok
    assert ok.latency_s is not None and ok.latency_s < TIMEOUT_S
    assert held(prefill) == [] and held(decode) == []
    # Both halves reached the servers as the probe's own requests (its rid prefix).
    log = [json.loads(x) for x in (decode.pod_dir / "requests.jsonl").read_text().splitlines()]
    assert any(str(e.get("rid", "")).startswith(PROBE_RID_PREFIX) for e in log), log[-3:]

    # transfer-stall: the prefill computes but never hands the KV over; its HTTP server
    # and health stay fine, the decode waits for KV that never comes.
    put_fault(prefill, "transfer-stall")
    stalled = try_pair(prefill, decode)
    assert not stalled.ok, stalled
    assert stalled.decode_error == f"no answer within {TIMEOUT_S:g}s", stalled
    assert stalled.prefill_error == f"no answer within {TIMEOUT_S:g}s", stalled
    assert prefill.get("/health").status_code == 200
    # The probe ended both halves of its room: neither side holds it.
    wait_until(lambda: held(prefill) == [] and held(decode) == [], 10, "nothing held", step=0.2)

    # bootstrap-down: the prefill's bootstrap server closes every connection unanswered.
    put_fault(prefill, "bootstrap-down")
    silent = try_pair(prefill, decode)
    assert not silent.ok, silent
    assert silent.prefill_error is not None
    assert f"bootstrap server {prefill.ip}:{BOOTSTRAP_PORT} not answering" in silent.prefill_error
    assert prefill.get("/health").status_code == 200
    wait_until(lambda: held(prefill) == [] and held(decode) == [], 10, "nothing held", step=0.2)

    # The fault gone, the pair passes again.
    put_fault(prefill, None)
    again = wait_until(lambda: try_pair(prefill, decode).ok, 20, "the pair passes again")
    assert again

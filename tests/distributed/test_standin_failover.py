"""Requests caught by an incident, on the stand-in (real pods of real gloo ranks): the
halves a PD pair holds are listed by room and ended at once with 503 on the operator's
word (``POST /lockstep/abort``, token-guarded), what they held is freed (``/v1/loads``),
a stream ends with SGLang's abort event instead of a cut, a fenced server refuses new
work, and when the group goes down the runtime ends everything it holds by itself."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import httpx
import pytest
from dist_support import wait_until
from test_standin import AGENT_TOKEN, HTTP_PORT, Launcher, StandinPod, launcher
from test_standin_pd import BOOTSTRAP_PORT, serving, start

__all__ = ["launcher"]  # the fixture, used by name

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}
# Long PD waits here: what ends a half is lockstep's abort, not SGLang's timeouts.
LONG_WAITS = {
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "120",
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "120",
    # 20 ms a token: a 400-token stream runs for seconds.
    "LOCKSTEP_STANDIN_STEP_S": "0.02",
}


class Background:
    """One request on its own thread; `result` once it ended, with how long it took."""

    def __init__(self, fn: Any) -> None:
        self.result: Any = None
        self.took: float | None = None

        def run() -> None:
            began = time.monotonic()
            try:
                self.result = fn()
            except Exception as exc:  # an httpx error is an outcome too
                self.result = exc
            self.took = time.monotonic() - began

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"still waiting after {timeout}s"
        return self.result


def held(pod: StandinPod) -> list[dict[str, Any]]:
    resp = pod.http.get(f"{pod.base}/lockstep/requests", headers=AUTH, timeout=5)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["requests"])


def abort(pod: StandinPod, **order: Any) -> dict[str, Any]:
    resp = pod.http.post(f"{pod.base}/lockstep/abort", json=order, headers=AUTH, timeout=5)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def load(pod: StandinPod) -> dict[str, Any]:
    body: dict[str, Any] = pod.get("/v1/loads").json()["loads"][0]
    return body


def pd_body(prefill: StandinPod, prompt: str, room: int, tokens: int = 4) -> dict[str, Any]:
    return {
        "text": prompt,
        "sampling_params": {"max_new_tokens": tokens},
        "bootstrap_host": prefill.ip,
        "bootstrap_port": BOOTSTRAP_PORT,
        "bootstrap_room": room,
    }


def events(lines: list[str]) -> list[Any]:
    """The SSE data payloads of a stream ("[DONE]" kept as the string)."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream(pod: StandinPod, path: str, body: dict[str, Any], started: threading.Event) -> Any:
    """Read a whole SSE response; `started` is set at its first event."""
    lines: list[str] = []
    with pod.http.stream("POST", f"{pod.base}{path}", json=body, timeout=60) as resp:
        status = resp.status_code
        for line in resp.iter_lines():
            lines.append(line)
            if line.startswith("data: "):
                started.set()
    return status, events(lines)


@pytest.mark.timeout(180)
def test_the_operator_ends_the_halves_a_pair_holds_and_what_they_held_is_freed(
    launcher: Launcher,
) -> None:
    prefill = start(launcher, "prefill", 0, LONG_WAITS)
    decode = start(launcher, "decode", 1, LONG_WAITS)
    wait_until(lambda: serving(prefill) and serving(decode), 60, "both pods serving", step=0.2)
    idle = load(prefill)
    assert (idle["num_waiting_reqs"], idle["num_used_tokens"]) == (0, 0)

    # The routes are the operator's: no token, no answer.
    assert prefill.get("/lockstep/requests").status_code == 401
    no_token = prefill.http.post(f"{prefill.base}/lockstep/abort", json={"all": True}, timeout=5)
    assert no_token.status_code == 401

    # A prefill half whose decode never comes (the decode died before its bootstrap):
    # without lockstep it holds its KV until the bootstrap timeout.
    orphan = Background(lambda: prefill.post("/generate", pd_body(prefill, "orphan", 8101)))
    wait_until(lambda: [r["room"] for r in held(prefill)] == [8101], 10, "the half held")
    assert load(prefill)["num_used_tokens"] > 0
    # A decode half waiting for KV its prefill never sends (a wedged prefill: its
    # bootstrap server still answers, so the heartbeat does not help).
    stuck = Background(lambda: decode.post("/generate", pd_body(prefill, "stuck", 8102)))
    wait_until(lambda: [r["room"] for r in held(decode)] == [8102], 10, "the decode half held")
    (listed,) = held(decode)
    assert listed["bootstrap"] == f"{prefill.ip}:{BOOTSTRAP_PORT}" and listed["age_s"] >= 0

    # The operator ends the prefill's half by room, the decode's by its prefill's address.
    ended = abort(prefill, rooms=[8101], reason="decode/0 is out of service")
    assert [r["room"] for r in ended["aborted"]] == [8101] and ended["fenced"] is None
    got = orphan.join(5)
    assert isinstance(got, httpx.Response) and got.status_code == 503, got
    assert "decode/0 is out of service" in got.json()["error"]["message"]
    assert [r["room"] for r in abort(decode, peers=[prefill.ip])["aborted"]] == [8102]
    got = stuck.join(5)
    assert isinstance(got, httpx.Response) and got.status_code == 503, got

    # Nothing stays held; the servers still serve (no fence without "all").
    wait_until(lambda: held(prefill) == [] and held(decode) == [], 5, "nothing held")
    after = load(prefill)
    assert (after["num_waiting_reqs"], after["num_used_tokens"]) == (0, 0)
    assert load(decode)["num_waiting_reqs"] == 0
    both: dict[str, httpx.Response] = {}
    pair = [
        Background(lambda: both.setdefault("p", prefill.post("/generate", pd_body(prefill, "ok", 8103)))),
        Background(lambda: both.setdefault("d", decode.post("/generate", pd_body(prefill, "ok", 8103)))),
    ]  # fmt: skip
    for job in pair:
        job.join(30)
    assert both["p"].status_code == 200 and both["d"].status_code == 200


@pytest.mark.timeout(180)
def test_a_stream_ends_with_the_abort_event_and_a_fenced_server_refuses_new_work(
    launcher: Launcher,
) -> None:
    (pod,) = launcher.group(tp=2, nnodes=1, **LONG_WAITS)
    wait_until(lambda: serving(pod), 60, "serving", step=0.2)

    first, second = threading.Event(), threading.Event()
    gen = Background(
        lambda: stream(
            pod, "/generate",
            {"text": "long", "stream": True, "sampling_params": {"max_new_tokens": 400}}, first,
        )
    )  # fmt: skip
    oai = Background(
        lambda: stream(
            pod, "/v1/completions", {"prompt": "long too", "stream": True, "max_tokens": 400},
            second,
        )
    )  # fmt: skip
    assert first.wait(20) and second.wait(20), "both streams under way"
    ended = abort(pod, all=True, reason="decode/0 judged Desynced")
    assert len(ended["aborted"]) == 2 and ended["fenced"] == "decode/0 judged Desynced"

    status, evs = gen.join(10)
    assert status == 200 and evs[-1] == "[DONE]"
    last = evs[-2]["meta_info"]
    assert last["finish_reason"]["type"] == "abort"
    assert last["finish_reason"]["status_code"] == 503
    assert 0 < last["completion_tokens"] < 400  # it was cut, and says so
    status, evs = oai.join(10)
    assert status == 200 and evs[-1] == "[DONE]"
    assert evs[-2]["error"]["code"] == 503 and evs[-2]["error"]["type"] == "SERVICE_UNAVAILABLE"

    # Fenced: new work and the router's health check get 503 at once.
    refused = pod.post("/generate", {"text": "new", "sampling_params": {"max_new_tokens": 2}})
    assert refused.status_code == 503 and "decode/0 judged Desynced" in refused.text
    assert pod.get("/health").status_code == 503
    assert held(pod) == []


@pytest.mark.timeout(180)
def test_a_group_that_goes_down_ends_its_streams_itself(launcher: Launcher) -> None:
    (pod,) = launcher.group(tp=2, nnodes=1, **LONG_WAITS)
    wait_until(lambda: serving(pod), 60, "serving", step=0.2)
    started = threading.Event()
    job = Background(
        lambda: stream(
            pod, "/generate",
            {"text": "cut", "stream": True, "sampling_params": {"max_new_tokens": 400}}, started,
        )
    )  # fmt: skip
    plain = Background(
        lambda: pod.post("/generate", {"text": "plain", "sampling_params": {"max_new_tokens": 400}})
    )
    assert started.wait(20)
    time.sleep(0.5)
    # A rank dies (not rank 0): the group is down; no operator anywhere.
    os.kill(pod.rank_pids()[1], signal.SIGKILL)
    status, evs = job.join(15)
    assert status == 200 and evs[-1] == "[DONE]", evs[-3:]
    assert evs[-2]["meta_info"]["finish_reason"]["status_code"] == 503
    got = plain.join(15)
    assert isinstance(got, httpx.Response) and got.status_code == 503, got
    assert job.took is not None and job.took < 12
    assert HTTP_PORT  # the pod's HTTP port closes once the answers left

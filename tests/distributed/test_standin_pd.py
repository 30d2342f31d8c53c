"""The stand-in as a PD pair, the way sglang-router drives one: the same request to a
prefill and a decode pod with the prefill pod's bootstrap coordinates and a room; the
decode pod answers only after the prefill pod handed the KV over, the prefill pod only
once the decode took it (as SGLang's halves wait for each other), and every request is in
each pod's request log. Then what lockstep's runtime does about halves caught by an
incident: listed by room, ended at once with 503 on the operator's word, streams ended
with SGLang's abort event, new work refused once the group is fenced, and everything held
ended by the runtime itself when its group goes down."""

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
from test_standin import HTTP_PORT, Launcher, StandinPod, launcher

from lockstep_standin.protocol import expected_text

__all__ = ["launcher"]  # the fixture, used by name

BOOTSTRAP_PORT = 8998


def start(
    launcher: Launcher, mode: str, index: int, env: dict[str, str] | None = None
) -> StandinPod:
    ip = f"{launcher.net}.{40 + index}"
    argv = [
        "--model-path", "/models/tiny", "--disaggregation-mode", mode, "--tp-size", "1",
        "--host", "0.0.0.0", "--port", str(HTTP_PORT),
        "--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT),
        "--served-model-name", "tiny",
    ]  # fmt: skip
    # SGLang's PD waits (300 s by default), short here: a half without its peer fails.
    env = {
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "3",
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "3",
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
        **(env or {}),
    }
    return launcher.pod(ip, argv, env, name=f"tiny-{mode}-0-0")


def serving(pod: StandinPod) -> bool:
    assert pod.proc.poll() is None, f"pod exited early:\n{pod.output()[-3000:]}"
    try:
        return pod.get("/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def pair(
    prefill: StandinPod, decode: StandinPod, prompt: str, room: int, *, send_prefill: bool = True
) -> dict[str, httpx.Response | Exception]:
    """Send one PD request to both sides at once, as the router does."""
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": 6},
        "bootstrap_host": prefill.ip,
        "bootstrap_port": BOOTSTRAP_PORT,
        "bootstrap_room": room,
    }
    out: dict[str, httpx.Response | Exception] = {}

    def one(side: str, pod: StandinPod) -> None:
        try:
            out[side] = pod.post("/generate", body, timeout=15)
        except httpx.HTTPError as exc:
            out[side] = exc

    threads = [threading.Thread(target=one, args=("decode", decode))]
    if send_prefill:
        threads.append(threading.Thread(target=one, args=("prefill", prefill)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def logged(pod: StandinPod) -> list[dict[str, Any]]:
    path = pod.pod_dir / "requests.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(120)
def test_decode_answers_only_with_the_prefill_side_handing_over_the_kv(
    launcher: Launcher,
) -> None:
    prefill, decode = start(launcher, "prefill", 0), start(launcher, "decode", 1)
    wait_until(lambda: serving(prefill) and serving(decode), 60, "both pods serving", step=0.2)
    assert decode.get("/model_info").json()["served_model_name"] == "tiny"
    assert decode.get("/server_info").json()["disaggregation_mode"] == "decode"

    done = pair(prefill, decode, "hello pd", 7001)
    d, p = done["decode"], done["prefill"]
    assert isinstance(d, httpx.Response) and d.status_code == 200, d
    assert d.json()["text"] == expected_text("hello pd", 6)
    assert d.json()["meta_info"]["bootstrap_room"] == 7001
    assert isinstance(p, httpx.Response) and p.status_code == 200, p
    assert len(p.json()["output_ids"]) == 1  # prefill computes the first token only

    # Without its prefill half the decode side never gets the KV: it fails after
    # SGLANG_DISAGGREGATION_WAITING_TIMEOUT, with SGLang's status for a failed transfer.
    alone = pair(prefill, decode, "orphan", 7002, send_prefill=False)["decode"]
    assert isinstance(alone, httpx.Response) and alone.status_code == 500
    assert "7002" in alone.json()["error"]["message"]
    # Without its decode half the prefill side holds its KV until its bootstrap timeout.
    waited = time.monotonic()
    lonely = prefill.post(
        "/generate",
        {"text": "no decode", "bootstrap_host": prefill.ip, "bootstrap_port": BOOTSTRAP_PORT,
         "bootstrap_room": 7004, "sampling_params": {"max_new_tokens": 4}},
    )  # fmt: skip
    assert lonely.status_code == 500 and "Bootstrapping" in lonely.json()["error"]["message"]
    assert time.monotonic() - waited >= 3.0

    # Both logs name every request of the pair, with its room.
    rooms = {(e["event"], e["room"]) for e in logged(decode)}
    assert {("received", 7001), ("answered", 7001), ("received", 7002), ("failed", 7002)} <= rooms
    assert {("received", 7001), ("answered", 7001)} <= {
        (e["event"], e["room"]) for e in logged(prefill)
    }

    # A plain request (no room) still runs on the decode pod alone.
    plain = decode.post("/generate", {"text": "solo", "sampling_params": {"max_new_tokens": 3}})
    assert plain.status_code == 200 and plain.json()["text"] == expected_text("solo", 3)

    # The prefill side gone: PD requests fail on the decode side too, once its heartbeat
    # to the prefill's bootstrap server failed twice.
    os.killpg(prefill.proc.pid, signal.SIGKILL)
    prefill.proc.wait(10)
    gone = pair(prefill, decode, "after", 7003)["decode"]
    assert isinstance(gone, httpx.Response) and gone.status_code == 500
    assert "Lost connection with prefill" in gone.json()["error"]["message"]

"""The operator's `EndRequests` carried out by the real executor against real stand-in
pods: a decode group judged broken has its own requests ended (fenced), the prefill half
orphaned by it ended on the healthy prefill, and a live pair of the other decode group
left alone; one Event says what ended where."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from dist_support import wait_until
from factories import load_example
from test_standin import AGENT_TOKEN, Launcher, StandinPod, launcher
from test_standin_failover import LONG_WAITS, Background, held, pd_body, stream
from test_standin_pd import serving, start

from lockstep.api import constants as c
from lockstep.api.models import parse_pddeployment
from lockstep.clients.agent_client import AgentClient
from lockstep.clients.metrics import Metrics
from lockstep.core.recovery import EndRequests, PodRef
from lockstep.execute import Deps, Execution

__all__ = ["launcher"]  # the fixture, used by name


class Secrets:
    """The one Kubernetes call the executor makes here: the agent-token Secret."""

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        return AGENT_TOKEN if name.endswith("-agent-token") else None


def pod(p: StandinPod, role: str, group: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"qwen-small-{role}-{group}-0",
            "uid": f"uid-{role}-{group}",
            "labels": {c.LABEL_ROLE: role, c.LABEL_GROUP: str(group), c.LABEL_RANK: "0"},
        },
        "status": {"podIP": p.ip},
    }


@pytest.mark.timeout(180)
def test_a_broken_decode_groups_requests_and_its_orphaned_halves_end_and_live_pairs_stay(
    launcher: Launcher,
) -> None:
    prefill = start(launcher, "prefill", 0, LONG_WAITS)
    broken = start(launcher, "decode", 1, LONG_WAITS)
    healthy = start(launcher, "decode", 2, LONG_WAITS)
    wait_until(lambda: all(serving(p) for p in (prefill, broken, healthy)), 60, "serving", step=0.2)
    # A live pair on the healthy decode, long enough to be in flight during the sweep.
    live: dict[str, httpx.Response] = {}
    pair = [
        Background(lambda: live.setdefault("p", prefill.post("/generate", pd_body(prefill, "live", 501, tokens=300)))),
        Background(lambda: live.setdefault("d", healthy.post("/generate", pd_body(prefill, "live", 501, tokens=300)))),
    ]  # fmt: skip
    # A prefill half whose decode half went to the broken group and never bootstrapped.
    orphan = Background(lambda: prefill.post("/generate", pd_body(prefill, "orphan", 502)))
    # A stream the broken group itself serves.
    began = threading.Event()
    cut = Background(
        lambda: stream(
            broken, "/generate",
            {"text": "cut", "stream": True, "sampling_params": {"max_new_tokens": 400}}, began,
        )
    )  # fmt: skip
    assert began.wait(20)
    wait_until(lambda: [r["room"] for r in held(healthy)] == [501], 20, "the live pair")
    wait_until(lambda: 502 in [r["room"] for r in held(prefill)], 20, "the orphan")

    events: list[tuple[str, str, str]] = []
    pdd = parse_pddeployment(load_example("pd-small"))
    pods = [pod(prefill, "prefill", 0), pod(broken, "decode", 0), pod(healthy, "decode", 1)]
    with httpx.Client(trust_env=False) as http:
        deps = Deps(kube=Secrets(), agents=AgentClient(http), metrics=Metrics())  # type: ignore[arg-type]
        run = Execution(deps, pdd, "ns", lambda *e: events.append(e), pods)
        ref = PodRef(name="qwen-small-decode-0-0", uid="uid-decode-0")
        run.execute("decode", 0, [EndRequests((ref,), "decode/0 (Desynced) is being restarted")])

    status, evs = cut.join(10)
    assert status == 200 and evs[-2]["meta_info"]["finish_reason"]["status_code"] == 503
    got = orphan.join(10)
    assert isinstance(got, httpx.Response) and got.status_code == 503, got
    assert "decode/0 (Desynced) is being restarted" in got.text
    for job in pair:
        job.join(60)
    assert live["p"].status_code == 200 and live["d"].status_code == 200
    (event,) = events
    assert event[:2] == ("Normal", "RequestsEnded")
    assert "ended 1 request(s) it held" in event[2] and "qwen-small-prefill-0-0: 1" in event[2]
    # The broken group is fenced; the others serve.
    assert broken.post("/generate", {"text": "x"}).status_code == 503
    assert (
        healthy.post(
            "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}
        ).status_code
        == 200
    )

"""One judge per round: `control.observe_group` builds one observation of a group (the
newest probe sample, else the pods when they alone show a rank down, and the rank states
an evidence capture read) and `classify_group` judges it once. The real pod agent's
answers are served to the real agent client over an httpx transport."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from lockstep.clients.agent_client import AgentClient, report_from_text
from lockstep.clients.metrics import Metrics
from lockstep.clients.prober import ProbeBook
from lockstep.control import Runtime, observe_group
from lockstep.core.recovery import IncidentRecord, Step, new_group_record
from lockstep.core.verdicts import Signal, Verdict
from lockstep_sglang.agent import PodAgent
from lockstep_sglang.rank_state import RankStateWriter, archive_previous, mark_incarnation

pytestmark = pytest.mark.unit

KEY = ("ns", "m", "decode", 0)
FAILURE: dict[str, Any] = {
    "detected_at": 5.0,
    "rank": 1,
    "events_checked": 9,
    "local_hash": "ab",
    "first_divergence": {"index": 8, "events": {"0": "batch", "1": "idle"}},
    "recent_events": {},
}


def pod(rank: int, restarts: int = 0) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"m-decode-0-{rank}",
            "uid": f"u{rank}",
            "labels": {"lockstep.dev/epoch": "0", "lockstep.dev/rank": str(rank)},
        },
        "status": {
            "phase": "Running",
            "podIP": f"127.0.9.{rank + 1}",
            "containerStatuses": [{"state": {"running": {}}, "restartCount": restarts}],
        },
    }


def agent_answer(tmp: Path, rank: int, diverged: bool) -> dict[str, Any]:
    """What the real pod agent of a rank serves: a live incarnation of epoch 0, after a
    crashed one of the same epoch that caught a divergence when `diverged`."""
    state = tmp / f"state-{rank}"
    state.mkdir()
    mark_incarnation(state, "0")
    crashed = RankStateWriter.create(state, rank=rank, tp_rank=rank)
    if diverged:
        crashed.record_failure({**FAILURE, "rank": rank})
    crashed.close()
    archive_previous(state)
    mark_incarnation(state, "0")
    live = RankStateWriter.create(state, rank=rank, tp_rank=rank)
    live.begin_iteration()
    body: dict[str, Any] = json.loads(json.dumps(PodAgent(state, epoch="0", environ={}).ranks()))
    live.close()
    return body


def runtime(answers: dict[str, dict[str, Any]], asked: list[str]) -> Runtime:
    def serve(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        return httpx.Response(200, json=answers[request.url.host])

    http = httpx.Client(transport=httpx.MockTransport(serve))
    rt = Runtime(kube=None, book=ProbeBook(), metrics=Metrics(), http=http)  # type: ignore[arg-type]
    assert rt.deps is not None
    rt.deps.agents = AgentClient(http)
    return rt


def record(step: Step = Step.HEALTHY) -> Any:
    return new_group_record("decode", 0, now=0.0).model_copy(
        update={"step": step, "restart_baseline": {"u0": 0, "u1": 0}}
    )


def test_pods_that_look_fine_without_a_new_probe_are_not_news_and_no_agent_is_asked(
    tmp_path: Path,
) -> None:
    asked: list[str] = []
    rt = runtime({}, asked)
    assert observe_group(rt, KEY, record(), [pod(0), pod(1)], 2, now=10.0) is None
    assert asked == []


def test_a_rank_down_on_a_consensus_divergence_is_judged_a_desync_in_one_go(
    tmp_path: Path,
) -> None:
    answers = {
        "127.0.9.1": agent_answer(tmp_path, 0, diverged=False),
        "127.0.9.2": agent_answer(tmp_path, 1, diverged=True),
    }
    asked: list[str] = []
    rt = runtime(answers, asked)
    v = observe_group(rt, KEY, record(), [pod(0), pod(1, restarts=1)], 2, now=10.0)
    assert v is not None and v.verdict is Verdict.DESYNCED and v.immediate
    assert Signal.CONSENSUS_FAILURE in v.signals and v.culprits == {"m-decode-0-1"}
    assert v.reason.startswith("rank 1 (m-decode-0-1) reported a consensus failure")
    assert sorted(asked) == ["127.0.9.1", "127.0.9.2"]


def test_a_rank_down_without_a_divergence_stays_rank_down(tmp_path: Path) -> None:
    answers = {
        "127.0.9.1": agent_answer(tmp_path, 0, diverged=False),
        "127.0.9.2": agent_answer(tmp_path, 1, diverged=False),
    }
    rt = runtime(answers, [])
    v = observe_group(rt, KEY, record(), [pod(0), pod(1, restarts=1)], 2, now=10.0)
    assert v is not None and v.verdict is Verdict.RANK_DOWN
    assert v.reason == "pod m-decode-0-1 restarted (restart count 0 -> 1)"


def test_the_rank_states_a_capture_read_are_judged_with_the_next_observation(
    tmp_path: Path,
) -> None:
    """The capture's parsed answers take the agents' place: no agent is asked again, and
    the divergence they show is the round's verdict (the planner refines from it)."""
    text = json.dumps(agent_answer(tmp_path, 1, diverged=True))
    captured = (report_from_text("m-decode-0-1", text, 0),)
    asked: list[str] = []
    rt = runtime({}, asked)
    capturing = record(Step.CAPTURING_EVIDENCE).model_copy(
        update={
            "incident": IncidentRecord(
                id="decode-0-1",
                verdict=Verdict.RANK_DOWN,
                epoch=0,
                reason="r",
                first_failure_at=1.0,
                detected_at=2.0,
            )
        }
    )
    v = observe_group(rt, KEY, capturing, [pod(0), pod(1)], 2, now=10.0, captured=captured)
    assert v is not None and v.verdict is Verdict.DESYNCED
    assert Signal.CONSENSUS_FAILURE in v.signals and asked == []

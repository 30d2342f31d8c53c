"""The pod agent's client: parsing `lockstep.dev/rank-state/v1` (against the real
`PodAgent`'s answer too) and what the control round takes from a crashed incarnation."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from lockstep.clients.agent_client import (
    AgentDataError,
    captured_ranks,
    captured_stacks,
    rank_state_from_json,
    report_from_ranks,
    report_from_text,
)
from lockstep.core.verdicts import (
    MAX_EVIDENCE_TEXT,
    Collective,
    Decision,
    RankState,
    divergence_cause,
)
from lockstep_sglang.agent import PodAgent
from lockstep_sglang.rank_state import RankStateWriter, archive_previous, mark_incarnation

AGENT_JSON: dict[str, Any] = {
    "rank": 3,
    "tp_rank": 3,
    "pid": 4242,
    "alive": True,
    "started_at": 10.0,
    "updated_at": 20.5,
    "iteration": 77,
    "last_decision": {
        "kind": "batch",
        "forward_mode": "DECODE",
        "batch_size": 8,
        "rids_hash": "9f3a",
        "seq": 41,
    },
    "collective": {"op": "all_reduce", "group": "tp:cpu", "seq": 12, "since": 19.0},
    "consensus_failure": None,
}


def test_rank_state_from_json() -> None:
    got = rank_state_from_json(AGENT_JSON, pod="p-1")
    assert got == RankState(
        pod="p-1",
        rank=3,
        iteration=77,
        tp_rank=3,
        pid=4242,
        alive=True,
        last_decision=Decision("batch", 41, "DECODE", 8, "9f3a"),
        collective=Collective("all_reduce", "tp:cpu", 12, 19.0),
        consensus_failure=None,
        updated_at=20.5,
    )


def test_rank_state_idle_and_outside_collectives() -> None:
    obj = {**AGENT_JSON, "last_decision": None, "collective": None}
    obj.pop("alive")
    got = rank_state_from_json(obj, pod="p")
    assert (got.last_decision, got.collective, got.alive) == (None, None, True)


def test_rank_state_of_an_exited_rank() -> None:
    got = rank_state_from_json({**AGENT_JSON, "alive": False}, pod="p")
    assert got.alive is False


def test_rank_state_carries_the_os_process_state() -> None:
    got = rank_state_from_json({**AGENT_JSON, "process": "stopped"}, pod="p")
    assert (got.alive, got.process) == (True, "stopped")
    # An older agent does not say: nothing is assumed.
    assert rank_state_from_json(AGENT_JSON, pod="p").process is None


def test_consensus_failure_object_is_summarised() -> None:
    failure = {
        "detected_at": 1.0,
        "rank": 3,
        "events_checked": 120,
        "local_hash": "aa",
        "first_divergence": {"index": 119, "events": {"0": "batch:8", "3": "idle"}},
        "recent_events": {"0": ["x"] * 1000},
    }
    got = rank_state_from_json({**AGENT_JSON, "consensus_failure": failure}, pod="p")
    assert got.consensus_failure is not None
    assert "120 events" in got.consensus_failure
    assert "119" in got.consensus_failure
    assert len(got.consensus_failure) <= MAX_EVIDENCE_TEXT
    plain = rank_state_from_json({**AGENT_JSON, "consensus_failure": "boom"}, pod="p")
    assert plain.consensus_failure == "boom"


@pytest.mark.parametrize(
    "broken",
    [
        {k: v for k, v in AGENT_JSON.items() if k != "rank"},
        {**AGENT_JSON, "iteration": "many"},
        {**AGENT_JSON, "iteration": True},
        {**AGENT_JSON, "collective": {"op": "x"}},
        {**AGENT_JSON, "last_decision": "batch"},
    ],
    ids=["no-rank", "text-iteration", "bool-iteration", "partial-collective", "bad-decision"],
)
def test_malformed_rank_state_is_refused(broken: dict[str, Any]) -> None:
    with pytest.raises(AgentDataError, match="p-9"):
        rank_state_from_json(broken, pod="p-9")


def test_agent_report_accepts_a_list_or_a_wrapper_and_never_raises() -> None:
    listed = report_from_ranks("p", [AGENT_JSON], 0)
    wrapped = report_from_ranks("p", {"ranks": [AGENT_JSON]}, 0)
    assert listed == wrapped
    assert listed.ranks is not None and listed.ranks[0].rank == 3
    # Garbage is an agent that did not answer usefully, with the reason.
    bad = report_from_ranks("p", {"ranks": [{"rank": "x"}]}, 0)
    assert bad.ranks is None and bad.error is not None and "p" in bad.error
    gone = report_from_ranks("p", None, 0, "ConnectError: refused")
    assert gone.ranks is None and gone.error == "ConnectError: refused"


def rank(n: int, failure: bool) -> dict[str, Any]:
    return {
        "rank": n,
        "tp_rank": n,
        "pid": 100 + n,
        "alive": False,
        "iteration": 7,
        "updated_at": 1.0,
        "last_decision": None,
        "collective": None,
        "consensus_failure": (
            {"detected_at": 1.0, "first_divergence": {"events": {"0": "a", "1": "b"}}}
            if failure
            else None
        ),
    }


def answer(previous_epoch: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"epoch": "3", "ranks": [], "previous": [rank(1, True)]}
    if previous_epoch is not None:
        body["previous_epoch"] = previous_epoch
    return body


def consensus_cause(text: str, epoch: int) -> str | None:
    """The cause an evidence capture of `text` (a raw `GET /ranks` answer) keeps."""
    return divergence_cause(report_from_text("p-1", text, epoch).ranks or ())


def test_a_crash_in_this_epoch_is_evidence_of_a_divergence() -> None:
    report = report_from_ranks("p-1", answer("3"), 3)
    assert report.ranks and report.ranks[0].consensus_failure is not None
    assert consensus_cause(json.dumps(answer("3")), 3) is not None


def test_a_capture_that_got_no_rank_states_is_an_unreachable_agent_saying_why() -> None:
    for text in ("unreachable (ConnectError: refused)", "HTTP 401: {}", '{"ranks": [{"ra'):
        report = report_from_text("p-1", text, 3)
        assert report.ranks is None and report.error is not None
    assert "ConnectError" in (report_from_text("p-1", "unreachable (ConnectError)", 3).error or "")


def test_the_incarnation_an_in_place_restart_ended_is_not_this_epochs_failure() -> None:
    report = report_from_ranks("p-1", answer("2"), 3)
    assert report.ranks == ()
    assert consensus_cause(json.dumps(answer("2")), 3) is None


def test_a_runtime_that_does_not_say_its_previous_epoch_is_taken_at_its_word() -> None:
    report = report_from_ranks("p-1", answer(None), 3)
    assert report.ranks and report.ranks[0].consensus_failure is not None


def test_the_real_pod_agents_answer_parses_field_for_field(tmp_path: Path) -> None:
    """Contract: the runtime's own writer and agent produce what this client reads."""
    state = tmp_path / "state"
    state.mkdir()
    # A crashed incarnation of epoch 4 whose rank 1 caught a divergence...
    mark_incarnation(state, "4")
    crashed = RankStateWriter.create(state, rank=1, tp_rank=1)
    crashed.record_failure(
        {
            "detected_at": 5.0,
            "rank": 1,
            "events_checked": 9,
            "local_hash": "ab",
            "first_divergence": {"index": 8, "events": {"0": "batch", "1": "idle"}},
            "recent_events": {},
        }
    )
    crashed.close()
    archive_previous(state)
    # ... and the live incarnation of the same epoch, mid-collective.
    mark_incarnation(state, "4")
    live = RankStateWriter.create(state, rank=0, tp_rank=0)
    live.begin_iteration()
    live.begin_iteration()
    live.record_decision(kind="batch", forward_mode="DECODE", batch_size=3, rids_hash="feed", seq=2)
    with live.step():
        pass  # one model step done
    live.begin_step()  # and the next one running
    live.enter_collective(b"broadcast_pyobj", b"tp:cpu")
    body = PodAgent(state, epoch="4", environ={}).ranks()
    report = report_from_ranks("pod-a", json.loads(json.dumps(body)), 4)
    assert report.error is None and report.ranks is not None
    by_rank = {r.rank: r for r in report.ranks}
    assert set(by_rank) == {0, 1}
    mine = by_rank[0]
    assert (mine.pod, mine.tp_rank, mine.pid, mine.alive) == ("pod-a", 0, os.getpid(), True)
    assert mine.iteration == 2
    assert mine.last_decision == Decision("batch", 2, "DECODE", 3, "feed")
    assert mine.collective is not None and mine.collective.key == ("broadcast_pyobj", "tp:cpu", 1)
    # The running step's age, by the pod's own clock; the finished one's duration.
    assert mine.step_age_s is not None and 0.0 <= mine.step_age_s < 5.0
    assert len(mine.recent_steps_s) == 1 and mine.recent_steps_s[0] < 5.0
    # The crashed incarnation's divergence counts: it ran this epoch.
    assert by_rank[1].consensus_failure is not None and "index 8" in by_rank[1].consensus_failure
    assert consensus_cause(json.dumps(body), 4) is not None
    # Read as the next epoch's group, that old failure is not evidence.
    assert {r.rank for r in report_from_ranks("pod-a", body, 5).ranks or ()} == {0}
    live.close()


def test_captured_answers_of_the_real_pod_agent_read_back_for_kubectl_lockstep(
    tmp_path: Path,
) -> None:
    """Contract: what the operator captures into evidence (the agent's raw `GET /ranks`
    and `POST /stacks` answers) is what `kubectl lockstep evidence` reads."""
    state = tmp_path / "state"
    state.mkdir()
    mark_incarnation(state, "2")
    live = RankStateWriter.create(state, rank=0, tp_rank=0)
    live.begin_iteration()
    live.record_decision(kind="idle", forward_mode=None, batch_size=0, rids_hash="", seq=1)
    live.enter_collective(b"all_reduce", b"tp:cpu")
    agent = PodAgent(state, epoch="2", environ={}, py_spy="/nonexistent/py-spy")
    ranks = captured_ranks(json.dumps(agent.ranks()), "pod-a")
    assert (ranks.epoch, ranks.previous, ranks.engine_exit) == ("2", (), None)
    assert ranks.now is not None and ranks.hostname
    (rank,) = ranks.ranks
    assert (rank.rank, rank.pid, rank.iteration) == (0, os.getpid(), 1)
    assert rank.collective is not None and rank.collective.key == ("all_reduce", "tp:cpu", 1)
    (dump,) = captured_stacks(json.dumps(agent.stacks(timeout_s=1.0)), "pod-a")
    assert (dump.rank, dump.pid, dump.ok) == (0, os.getpid(), False)
    assert dump.error  # py-spy could not run: the answer says why
    live.close()
    for broken in ("unreachable (ConnectError: refused)", "HTTP 401: {}", '{"ranks": [{"ra'):
        with pytest.raises(AgentDataError):
            captured_ranks(broken, "pod-a")
        with pytest.raises(AgentDataError):
            captured_stacks(broken, "pod-a")

"""What the control round takes from pod agents' `/ranks` answers: a crashed incarnation's
consensus failure counts only when that incarnation ran the group's current epoch."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from lockstep.control import _agent_report, _consensus_cause


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


def test_a_crash_in_this_epoch_is_evidence_of_a_divergence() -> None:
    report = _agent_report("p-1", answer("3"), None, 3)
    assert report.ranks and report.ranks[0].consensus_failure is not None
    assert _consensus_cause([json.dumps(answer("3"))], 3) is not None


def test_the_incarnation_an_in_place_restart_ended_is_not_this_epochs_failure() -> None:
    report = _agent_report("p-1", answer("2"), None, 3)
    assert report.ranks == ()
    assert _consensus_cause([json.dumps(answer("2"))], 3) is None


def test_a_runtime_that_does_not_say_its_previous_epoch_is_taken_at_its_word() -> None:
    report = _agent_report("p-1", answer(None), None, 3)
    assert report.ranks and report.ranks[0].consensus_failure is not None


class SecretStore:
    """The two calls `agent_token` makes, against a dict of Secrets."""

    def __init__(self) -> None:
        self.secrets: dict[str, str] = {}
        self.reads = 0

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        self.reads += 1
        return self.secrets.get(name)

    def create(self, obj: dict[str, Any]) -> bool:
        name = obj["metadata"]["name"]
        if name in self.secrets:
            return False
        self.secrets[name] = obj["stringData"]["token"]
        return True


def test_the_token_secret_is_made_once_and_made_again_if_deleted() -> None:
    from factories import load_example

    from lockstep.control import agent_token
    from lockstep.models import parse_pddeployment

    store = SecretStore()
    rt = SimpleNamespace(kube=store, agent_tokens={})
    pdd = parse_pddeployment(load_example("pd-small"))
    first = agent_token(rt, pdd, "ns")  # type: ignore[arg-type]
    assert len(first) >= 32 and store.secrets == {"qwen-small-agent-token": first}
    assert agent_token(rt, pdd, "ns") == first and store.reads == 1  # type: ignore[arg-type]
    # Someone deleted the Secret: before pods are created it is read afresh and made again.
    store.secrets.clear()
    second = agent_token(rt, pdd, "ns", fresh=True)  # type: ignore[arg-type]
    assert second != first and store.secrets == {"qwen-small-agent-token": second}
    # Someone replaced it: followed.
    store.secrets["qwen-small-agent-token"] = "rotated"
    assert agent_token(rt, pdd, "ns", fresh=True) == "rotated"  # type: ignore[arg-type]

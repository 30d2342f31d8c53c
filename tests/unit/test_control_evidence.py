"""The control round's pod-agent restart token: read from its Secret, made once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


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

    from lockstep.api.models import parse_pddeployment
    from lockstep.execute import agent_token

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

"""What every manager of the executor shares: the I/O kept across rounds (`Deps`) and one
round's view of one deployment (`Scene`: the spec, its namespace, the Event sink and the
deployment's pods as the watch-fed cache holds them)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lockstep.api import constants as c
from lockstep.api import objects
from lockstep.api.models import PDDeployment
from lockstep.clients.agent_client import AgentClient
from lockstep.clients.kube import Kube
from lockstep.clients.metrics import Metrics
from lockstep.core.builders import agent_token_secret_name, build_agent_token_secret

EventSink = Callable[[str, str, str], None]  # type (Normal|Warning), reason, message
GroupId = tuple[str, int]
# Pods whose in-place restart could not be asked, per (ns, name, role, group, epoch):
# pod UID -> (why, the agent could not be reached at all).
RestartFailures = dict[tuple[str, str, str, int, int], dict[str, tuple[str, bool]]]


@dataclass
class Deps:
    """What the executor shares across rounds (owned by the control runtime)."""

    kube: Kube
    agents: AgentClient
    metrics: Metrics
    restart_failures: RestartFailures = field(default_factory=dict)
    # The agent-token of each deployment (by namespace, name, uid), read or made once.
    agent_tokens: dict[tuple[str, str, str], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def token_key(pdd: PDDeployment, namespace: str) -> tuple[str, str, str]:
    return (namespace, pdd.metadata.name, pdd.metadata.uid or "")


def agent_token(deps: Deps, pdd: PDDeployment, namespace: str, *, fresh: bool = False) -> str:
    """The deployment's pod-agent restart token: read from its Secret, or made (a fresh
    random token in a new Secret owned by the PDDeployment) when there is none. `fresh`:
    read the Secret even if the token is cached (before pods are created: a deleted
    Secret is made again, a replaced one is followed)."""
    key = token_key(pdd, namespace)
    token = None if fresh else deps.agent_tokens.get(key)
    if token is not None:
        return token
    name = agent_token_secret_name(pdd)
    token = deps.kube.read_secret_key(namespace, name, c.AGENT_TOKEN_KEY)
    if token is None:
        made = secrets.token_urlsafe(32)
        if deps.kube.create(build_agent_token_secret(pdd, made)):
            token = made
        else:  # created meanwhile (another round, a peer): use that one
            token = deps.kube.read_secret_key(namespace, name, c.AGENT_TOKEN_KEY)
            if token is None:
                raise RuntimeError(f"Secret {namespace}/{name} vanished while being made")
    deps.agent_tokens[key] = token
    return token


def short(err: Exception) -> str:
    """An error as one short line (an API error by its HTTP status)."""
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(err).__name__}: {err}"[:200]


@dataclass
class Scene:
    """One round's view of one PDDeployment, as every manager acts on it."""

    deps: Deps
    pdd: PDDeployment
    namespace: str
    events: EventSink
    pods: Sequence[Mapping[str, Any]]  # the deployment's pods (cache snapshot), any kind

    def token(self, *, fresh: bool = False) -> str:
        """The deployment's pod-agent token (`agent_token`)."""
        return agent_token(self.deps, self.pdd, self.namespace, fresh=fresh)

    def forget_token(self) -> None:
        """The agents refused the token (the Secret may have been replaced): read it
        again next time."""
        self.deps.agent_tokens.pop(token_key(self.pdd, self.namespace), None)

    def pod_ips(self) -> dict[str, str | None]:
        """Each pod's IP by name (None: none yet)."""
        return {
            str(objects.meta(p).get("name")): (p.get("status") or {}).get("podIP")
            for p in self.pods
        }

    def router_pods(self) -> list[Mapping[str, Any]]:
        """The pods of the deployment's router."""
        return [p for p in self.pods if objects.label(p, c.LABEL_COMPONENT) == "router"]

"""What the control rounds share (`Runtime`: I/O, the probe book, metrics, each
deployment's memory) and what the operator remembers of one deployment between rounds
(`Memory`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from lockstep.clients.agent_client import AgentClient
from lockstep.clients.kube import Kube
from lockstep.clients.metrics import Metrics
from lockstep.clients.pair_prober import PairBook
from lockstep.clients.prober import ProbeBook
from lockstep.clients.router_workers import RouterBook
from lockstep.core.evidence import CaptureBook, EvidenceStore
from lockstep.core.records import Incidents
from lockstep.core.recovery import GroupRecord
from lockstep.core.verdicts import KVFree, RankState
from lockstep.execute import Deps

DeploymentKey = tuple[str, str, str]  # namespace, name, uid
GroupKey = tuple[str, str, str, int]  # namespace, name, role, group


@dataclass
class Memory:
    """What the operator remembers of one deployment between rounds.

    The records and the incident history are the ones last persisted (the object's
    annotations say the same once the watch has caught up); the status is the one last
    patched, and when.
    """

    records: dict[str, GroupRecord]
    incidents: Incidents
    persisted: tuple[str, str]  # the two annotations' values as last written
    status: dict[str, Any] | None = None
    status_at: float | None = None
    router: str | None = None  # the router objects' hash as last applied
    router_swept_at: float | None = None  # the last sweep of the routers' registries
    # Gates set but not yet in the cache, and the router registrations asked for.
    routers: RouterBook = field(default_factory=RouterBook)
    # Runtime refusals already told in an Event: (pod UID, container restart count).
    refusals: set[tuple[str, int]] = field(default_factory=set)
    # Suspect nodes already told in an Event (`suspects`), and cordons the API refused.
    suspects: set[str] = field(default_factory=set)
    cordon_failed: set[str] = field(default_factory=set)
    # Failing pairs already told in an Event (links at fault, or not explained yet).
    pairs_told: set[tuple[int, int]] = field(default_factory=set)
    # The frees of KV held by ended requests asked of each (role, group, epoch).
    kv_frees: dict[tuple[str, int, int], list[KVFree]] = field(default_factory=dict)
    # The evidence captures of the open incidents (what each read), from the round that
    # read it while its group waits in CapturingEvidence.
    captures: CaptureBook = field(default_factory=CaptureBook)


@dataclass
class Runtime:
    """What every control round shares: I/O, the probe book, metrics, memory."""

    kube: Kube
    book: ProbeBook
    metrics: Metrics
    http: httpx.Client
    clock: Callable[[], float] = time.time
    probe_clock_offset: Callable[[], float] = lambda: time.time() - time.monotonic()
    evidence: EvidenceStore | None = None
    # spec.runtime.image when a PDDeployment leaves it unset (None: the builders' default).
    runtime_image: str | None = None
    # The pair probe's targets and results (the KV hand-off between groups).
    pairs: PairBook = field(default_factory=PairBook)
    # Rank states each group's next failed sample is judged against for progress.
    previous_ranks: dict[GroupKey, tuple[RankState, ...]] = field(default_factory=dict)
    # Keys of deployments whose groups the book probes (forget them when deleted).
    known: set[tuple[str, str]] = field(default_factory=set)
    memory: dict[DeploymentKey, Memory] = field(default_factory=dict)
    # Groups not settled (not Healthy, or failing): an ok probe of them wakes the round.
    unsettled: set[GroupKey] = field(default_factory=set)
    deps: Deps | None = None
    # With leader election: this replica's identity and since when it leads (status shows
    # it), and whether it may act now (the fence; None: a single replica, always).
    leader: tuple[str, str | None] | None = None
    may_act: Callable[[], bool] | None = None
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.deps is None:
            self.deps = Deps(self.kube, AgentClient(self.http), self.metrics)
        if self.evidence is None:
            self.evidence = EvidenceStore(self.kube)

    @property
    def agents(self) -> AgentClient:
        """The pod agents' client (over the shared HTTP client)."""
        assert self.deps is not None
        return self.deps.agents

    def lock_for(self, namespace: str, name: str) -> threading.Lock:
        """The lock that serialises the rounds of one deployment."""
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """A deployment is gone: drop its targets, memory and evidence."""
        self.book.forget(namespace, name)
        self.pairs.forget(namespace, name)
        self.known.discard((namespace, name))
        for key in [k for k in self.memory if k[:2] == (namespace, name)]:
            del self.memory[key]
        self.unsettled = {k for k in self.unsettled if k[:2] != (namespace, name)}
        if self.evidence is not None:
            self.evidence.forget(namespace, name)


def settled(rt: Runtime, key: GroupKey) -> bool:
    """Whether a group is Healthy and not failing (a passing probe of it changes nothing)."""
    return key not in rt.unsettled

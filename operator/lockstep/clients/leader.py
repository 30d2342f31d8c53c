"""Leader election for several operator replicas: one `coordination.k8s.io` Lease, as
kube-controller-manager, kube-scheduler and controller-runtime elect their leader.

Why a Lease and not kopf's peering: kopf's peering is a pause mechanism (replicas of equal
priority pause each other, all of them: the chart's replicas did exactly that), it has no
expiry a paused leader could be measured against, and nothing fences a replica that wakes
up believing it still acts. A Lease has the three properties an election needs:

- one holder at a time: every acquisition and renewal is an update with the Lease's
  `resourceVersion` as precondition, so of two replicas writing at once one gets 409;
- expiry measured by the candidates: a standby takes the Lease over only after it saw
  the same record (holder, renew time, resourceVersion) unchanged for `leaseDurationSeconds`
  on its own monotonic clock (clock skew between nodes does not matter);
- fencing by the holder itself: a leader acts only while its last successful renewal
  *started* less than `renew_deadline` ago (monotonic), and `renew_deadline` is shorter than
  the lease duration, so it stops before anyone can take over. A leader that was paused
  (SIGSTOP, a long GC, a partition from the API server) finds on waking that its deadline
  passed: it refuses every write from then on (:meth:`LeaderElector.check`, which the
  operator's Kubernetes and HTTP clients call before every write) and ends its process
  (the kubelet restarts it as a standby), without renewing.

The defaults are controller-runtime's: 15 s lease, 10 s renew deadline, 2 s retry.

The decision is pure (:func:`decide`: the current record, who I am, what I observed and
when, in; what to write, out) and tested with an injected clock; :class:`LeaderElector`
is the thin loop around it, on its own thread so a busy event loop cannot delay a renewal.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


class NotLeader(RuntimeError):
    """A write refused: this replica does not hold the lease (or no longer knows it does)."""


@dataclass(frozen=True)
class ElectionConfig:
    """The Lease and the timings (seconds)."""

    namespace: str
    name: str
    identity: str
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration "
                f"(got {self.retry_period_s}, {self.renew_deadline_s}, {self.lease_duration_s})"
            )
        if not self.identity:
            raise ValueError("leader election needs an identity (the pod's name)")


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says (None fields: not set)."""

    holder: str | None = None
    acquire_time: dt.datetime | None = None
    renew_time: dt.datetime | None = None
    duration_s: float | None = None
    transitions: int = 0
    resource_version: str | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        """What must change for a candidate to see the holder alive."""
        return (self.holder, self.renew_time, self.resource_version)


@dataclass(frozen=True)
class Observation:
    """The last record a replica saw, and when it first saw it (its monotonic clock)."""

    key: tuple[Any, ...]
    since: float


@dataclass(frozen=True)
class Decision:
    """What to do now: write `record` (acquire or renew) or wait."""

    write: LeaseRecord | None
    observation: Observation
    takeover_from: str | None = None  # an acquisition from another holder


def decide(
    current: LeaseRecord | None,
    cfg: ElectionConfig,
    seen: Observation | None,
    now_mono: float,
    now_wall: dt.datetime,
) -> Decision:
    """Acquire, renew or wait, from the Lease as read now (None: it does not exist)."""
    if current is None:
        obs = Observation((), now_mono)
        new = LeaseRecord(cfg.identity, now_wall, now_wall, cfg.lease_duration_s, 0)
        return Decision(new, obs)
    obs = (
        seen if seen is not None and seen.key == current.key else Observation(current.key, now_mono)
    )
    holder = current.holder or None
    mine = holder == cfg.identity
    duration = current.duration_s or cfg.lease_duration_s
    if holder is not None and not mine and now_mono < obs.since + duration:
        return Decision(None, obs)  # held, and seen alive within its duration
    new = replace(
        current,
        holder=cfg.identity,
        renew_time=now_wall,
        duration_s=cfg.lease_duration_s,
        acquire_time=current.acquire_time if mine else now_wall,
        transitions=current.transitions + (1 if holder is not None and not mine else 0),
    )
    return Decision(new, obs, takeover_from=None if mine else holder)


class LeaseIO:
    """Read and write the Lease (the only Kubernetes calls of the election)."""

    def __init__(self, api: k8s.ApiClient, cfg: ElectionConfig) -> None:
        self.coord = k8s.CoordinationV1Api(api)
        self.core = k8s.CoreV1Api(api)
        self.cfg = cfg

    def read(self) -> LeaseRecord | None:
        try:
            lease = self.coord.read_namespaced_lease(self.cfg.name, self.cfg.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        spec = lease.spec
        return LeaseRecord(
            holder=spec.holder_identity if spec else None,
            acquire_time=spec.acquire_time if spec else None,
            renew_time=spec.renew_time if spec else None,
            duration_s=float(spec.lease_duration_seconds)
            if spec and spec.lease_duration_seconds
            else None,
            transitions=int(spec.lease_transitions or 0) if spec else 0,
            resource_version=lease.metadata.resource_version if lease.metadata else None,
        )

    def _body(self, rec: LeaseRecord) -> k8s.V1Lease:
        return k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(
                name=self.cfg.name,
                namespace=self.cfg.namespace,
                resource_version=rec.resource_version,
                labels={"app.kubernetes.io/component": "leader-election"},
            ),
            spec=k8s.V1LeaseSpec(
                holder_identity=rec.holder or None,
                acquire_time=rec.acquire_time,
                renew_time=rec.renew_time,
                lease_duration_seconds=int(rec.duration_s or self.cfg.lease_duration_s),
                lease_transitions=rec.transitions,
            ),
        )

    def write(self, rec: LeaseRecord, *, create: bool) -> bool:
        """Create, or replace under the read `resourceVersion`; False on a conflict."""
        try:
            if create:
                self.coord.create_namespaced_lease(self.cfg.namespace, self._body(rec))
            else:
                self.coord.replace_namespaced_lease(
                    self.cfg.name, self.cfg.namespace, self._body(rec)
                )
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    def event(self, reason: str, message: str) -> None:
        """An Event on the Lease (kube-controller-manager posts one on each election)."""
        now = dt.datetime.now(dt.UTC)
        body = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(generate_name=f"{self.cfg.name}."),
            involved_object=k8s.V1ObjectReference(
                api_version="coordination.k8s.io/v1",
                kind="Lease",
                name=self.cfg.name,
                namespace=self.cfg.namespace,
            ),
            reason=reason,
            message=message,
            type="Normal",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=k8s.V1EventSource(component="lockstep-operator", host=self.cfg.identity),
        )
        try:
            self.core.create_namespaced_event(self.cfg.namespace, body)
        except ApiException as err:  # an Event is news, never a reason to fail
            log.warning("event %s on the lease: HTTP %s", reason, err.status)


class LeaderElector:
    """Campaigns for the Lease on its own thread; `leading` while it holds it.

    `on_started(identity, previous_holder)` runs (on the election thread) once this
    replica becomes the leader; `on_lost(why)` once it loses the Lease or can no longer
    prove it holds it; the operator's `on_lost` ends the process. `check()` is the fence.
    """

    def __init__(
        self,
        io: LeaseIO,
        cfg: ElectionConfig,
        *,
        on_started: Callable[[str, str | None], None] = lambda *_: None,
        on_lost: Callable[[str], None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self.io = io
        self.cfg = cfg
        self.on_started = on_started
        self.on_lost = on_lost
        self._clock = clock
        self._wall = wall
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self.leading = threading.Event()
        self.lost = threading.Event()
        self.renewed_at: float | None = None  # monotonic start of the last renewal
        self.since: dt.datetime | None = None  # when this replica became the leader
        self._seen: Observation | None = None
        self._thread: threading.Thread | None = None

    # -- the fence

    def holds(self) -> bool:
        """Whether this replica may act now (its last renewal started within the
        renew deadline, on its own monotonic clock)."""
        at = self.renewed_at
        return (
            self.leading.is_set()
            and not self.lost.is_set()
            and at is not None
            and self._clock() - at < self.cfg.renew_deadline_s
        )

    def check(self) -> None:
        """Raise `NotLeader` unless this replica may act now (call before every write)."""
        if not self.holds():
            raise NotLeader(
                f"{self.cfg.identity} does not hold the lease "
                f"{self.cfg.namespace}/{self.cfg.name}: refusing to write"
            )

    # -- the loop

    def start(self) -> LeaderElector:
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def step(self) -> None:
        """One attempt to acquire or renew (the loop's body; tests drive it)."""
        started = self._clock()
        if self.leading.is_set() and not self.holds():
            # Asleep past the deadline (a pause): another replica may lead by now. Do not
            # renew; give up.
            self._lose(f"no renewal for {started - (self.renewed_at or started):.1f}s")
            return
        try:
            current = self.io.read()
            if (
                self.leading.is_set()
                and current is not None
                and current.holder != self.cfg.identity
            ):
                self._lose(f"the lease is held by {current.holder or 'nobody'} now")
                return
            decision = decide(current, self.cfg, self._seen, started, self._wall())
            self._seen = decision.observation
            wrote = decision.write is not None and self.io.write(
                decision.write, create=current is None
            )
        except Exception as err:  # the API server unreachable: try again, bounded below
            log.warning("leader election: %s", err)
            wrote = False
            decision = None
        if wrote and decision is not None and decision.write is not None:
            self.renewed_at = started
            if not self.leading.is_set():
                self.since = decision.write.acquire_time or self._wall()
                self.leading.set()
                log.info(
                    "leader election: %s leads %s/%s%s",
                    self.cfg.identity,
                    self.cfg.namespace,
                    self.cfg.name,
                    f" (took over from {decision.takeover_from})" if decision.takeover_from else "",
                )
                self.on_started(self.cfg.identity, decision.takeover_from)
            return
        if self.leading.is_set() and not self.holds():
            self._lose("the lease could not be renewed within the renew deadline")

    def _lose(self, why: str) -> None:
        if self.lost.is_set():
            return
        self.lost.set()
        self.leading.clear()
        log.error("leader election: %s lost the lease: %s", self.cfg.identity, why)
        self.on_lost(why)

    def run(self) -> None:
        while not self._stop.is_set() and not self.lost.is_set():
            self.step()
            if self.lost.is_set():
                return
            pause = self.cfg.retry_period_s
            if not self.leading.is_set():
                pause *= 1.0 + random.uniform(0.0, 0.2)  # standbys do not ask in lockstep
            self._sleep(pause)

    def release(self) -> None:
        """Give the Lease up (an orderly stop): the standby takes over at once instead of
        after the lease duration. Only while this replica still holds it."""
        if not self.holds():
            return
        self.leading.clear()
        with contextlib.suppress(Exception):
            current = self.io.read()
            if current is not None and current.holder == self.cfg.identity:
                self.io.write(replace(current, holder=None, duration_s=1.0), create=False)
                log.info("leader election: %s released the lease", self.cfg.identity)

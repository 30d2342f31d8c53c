"""Leader election (`lockstep.clients.leader`) with an injected clock: one holder at a time, a
standby takes over only after the lease duration without a renewal it could see, and a
leader that cannot prove it renewed within the renew deadline (a pause) refuses to write
and gives up without renewing. The real API server's side: tests/controlplane."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from lockstep.clients.leader import (
    ElectionConfig,
    LeaderElector,
    LeaseRecord,
    NotLeader,
    Observation,
    decide,
)

pytestmark = pytest.mark.unit

WALL = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def cfg(identity: str) -> ElectionConfig:
    return ElectionConfig("ns", "lockstep", identity)


class FakeLease:
    """A Lease with the API server's one rule that matters: an update must carry the
    resourceVersion it read (else 409)."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.writes: list[str | None] = []

    def read(self) -> LeaseRecord | None:
        return self.record

    def write(self, rec: LeaseRecord, *, create: bool) -> bool:
        if create and self.record is not None:
            return False
        if not create and (self.record is None or rec.resource_version != str(self.version)):
            return False
        self.version += 1
        self.record = replace(rec, resource_version=str(self.version))
        self.writes.append(rec.holder)
        return True

    def event(self, reason: str, message: str) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(name: str, lease: FakeLease, clock: Clock, lost: list[str]) -> LeaderElector:
    return LeaderElector(
        lease,  # type: ignore[arg-type]
        cfg(name),
        on_lost=lost.append,
        clock=clock,
        wall=lambda: WALL + dt.timedelta(seconds=clock.now),
    )


def test_the_first_replica_creates_the_lease_and_the_other_stands_by() -> None:
    lease, clock, lost = FakeLease(), Clock(), []
    a, b = elector("a", lease, clock, lost), elector("b", lease, clock, lost)
    a.step()
    b.step()
    assert a.holds() and not b.holds()
    assert lease.record is not None and lease.record.holder == "a"
    # Renewals keep it: b never takes over while a renews.
    for _ in range(20):
        clock.now += 2
        a.step()
        b.step()
        assert a.holds() and not b.leading.is_set()
    with pytest.raises(NotLeader):
        b.check()
    a.check()
    assert set(lease.writes) == {"a"} and lost == []


def test_a_standby_takes_over_only_after_the_lease_duration_without_renewal() -> None:
    lease, clock, lost = FakeLease(), Clock(), []
    a, b = elector("a", lease, clock, lost), elector("b", lease, clock, lost)
    a.step()
    b.step()
    # a dies: nobody renews. b sees the same record until the lease duration is over.
    for _ in range(7):
        clock.now += 2
        b.step()
    assert not b.leading.is_set()  # 14 s < 15 s
    clock.now += 2
    b.step()
    assert b.holds()
    assert lease.record is not None and lease.record.holder == "b"
    assert lease.record.transitions == 1


def test_a_paused_leader_stops_before_anyone_can_take_over_and_never_renews() -> None:
    lease, clock, lost = FakeLease(), Clock(), []
    a, b = elector("a", lease, clock, lost), elector("b", lease, clock, lost)
    a.step()
    b.step()
    # a freezes (SIGSTOP) right after a renewal.
    clock.now += 9.9
    a.check()  # still within its renew deadline (10 s) ...
    clock.now += 0.2
    with pytest.raises(NotLeader):  # ... and not after, whatever happens next
        a.check()
    # The standby needs the whole lease duration (15 s) to take over: a stopped acting
    # 5 s before.
    clock.now += 5
    b.step()
    assert b.holds()
    # a wakes: it does not renew (the record is b's), it gives up.
    writes = list(lease.writes)
    a.step()
    assert lost and "no renewal" in lost[0]
    assert lease.writes == writes and not a.holds()
    with pytest.raises(NotLeader):
        a.check()


def test_a_leader_that_finds_another_holder_gives_up_at_once() -> None:
    lease, clock, lost = FakeLease(), Clock(), []
    a = elector("a", lease, clock, lost)
    a.step()
    assert lease.record is not None
    lease.record = replace(lease.record, holder="x")  # someone else holds it
    clock.now += 2
    a.step()
    assert lost == ["the lease is held by x now"] and not a.holds()


def test_a_released_lease_is_taken_at_once() -> None:
    lease, clock, lost = FakeLease(), Clock(), []
    a, b = elector("a", lease, clock, lost), elector("b", lease, clock, lost)
    a.step()
    b.step()
    a.release()
    assert lease.record is not None and lease.record.holder is None
    clock.now += 2
    b.step()
    assert b.holds()


def test_decide_is_pure_and_a_concurrent_writer_loses_on_the_version() -> None:
    c = cfg("b")
    held = LeaseRecord("a", WALL, WALL, 15.0, 3, "7")
    # Held and just seen: wait.
    d = decide(held, c, None, 100.0, WALL)
    assert d.write is None and d.observation == Observation(held.key, 100.0)
    # Seen unchanged for the lease duration: acquire, one more transition, same version.
    d = decide(held, c, d.observation, 115.0, WALL)
    assert d.write is not None and d.takeover_from == "a"
    assert (d.write.holder, d.write.transitions, d.write.resource_version) == ("b", 4, "7")
    lease = FakeLease()
    lease.record, lease.version = replace(held, resource_version="8"), 8
    assert lease.write(d.write, create=False) is False  # someone renewed meanwhile


@pytest.mark.parametrize(
    ("retry", "deadline", "duration"), [(2, 10, 10), (10, 10, 15), (0, 5, 15), (2, 16, 15)]
)
def test_timings_that_cannot_fence_are_refused(
    retry: float, deadline: float, duration: float
) -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        ElectionConfig("ns", "l", "me", duration, deadline, retry)

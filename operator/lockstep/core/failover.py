"""Which requests to end, where, when a group leaves service: pure.

When a group is judged broken (or a planned drain runs out of time) the requests it holds
must not wait on it, and neither may the other halves of its PD pairs that healthy peers
hold for it. sglang-router 0.3.2 waits for both halves of every attempt and retries an
attempt that ended 5xx on a freshly chosen pair (docs/router.md), so ending every such
half at once with 503, after the group left every router, turns a hang of minutes into a
retry on a healthy pair. The runtime on each leader lists what it holds and ends what it
is told (`lockstep_sglang.failover`: ``GET /lockstep/requests``, ``POST /lockstep/abort``);
this module decides what to tell whom:

- the group's own leaders: everything (``all``), fenced (new work refused);
- a broken **prefill** group's decode peers: every request whose ``bootstrap_host`` is one
  of the group's pod IPs (a decode half waits for that prefill's KV; SGLang's heartbeat
  catches a dead prefill after seconds, never a wedged one);
- a broken **decode** group's prefill peers: a prefill half does not know its decode
  until the decode bootstraps, so the halves to end are (a) the rooms the broken group's
  leader said it held, and (b) every room a prefill holds that no other decode leader
  holds (its decode half is gone: the dead group's, or one the router sent to the dead
  group before it left the routers). A room younger than :data:`ORPHAN_GRACE_SECONDS` is
  left alone (both halves are sent in the same instant, but not received in it), and so
  is every room while some decode leader could not be asked (its halves are unknown).

Lists are read prefills first, then decodes: a room listed on a prefill has its decode
half listed by then if it has one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# A prefill half with no decode half on any live decode, this long after it arrived, is
# orphaned (the router sends both halves of an attempt at once).
ORPHAN_GRACE_SECONDS = 0.5


@dataclass(frozen=True)
class HeldRequest:
    """One request a leader holds (as its runtime lists it)."""

    rid: str
    room: int | None = None
    bootstrap_host: str | None = None  # on a decode: its prefill's address
    age_s: float = 0.0
    stream: bool = False


@dataclass(frozen=True)
class Leader:
    """A leader pod of another group, and what it holds (None: it did not answer)."""

    name: str
    role: str
    ip: str
    held: tuple[HeldRequest, ...] | None


@dataclass(frozen=True)
class EndOrder:
    """What one leader is told to end (the body of ``POST /lockstep/abort``)."""

    rooms: frozenset[int] = frozenset()
    peers: frozenset[str] = frozenset()

    def body(self, reason: str) -> dict[str, object]:
        return {"rooms": sorted(self.rooms), "peers": sorted(self.peers), "reason": reason}

    def __bool__(self) -> bool:
        return bool(self.rooms or self.peers)


@dataclass
class PeerPlan:
    """The orders for the peers, and the rooms left for a second look (too young)."""

    orders: dict[str, EndOrder] = field(default_factory=dict)  # leader name -> order
    young: dict[str, frozenset[int]] = field(default_factory=dict)  # leader -> rooms
    unknown: list[str] = field(default_factory=list)  # decode leaders that did not answer


def plan_peers(
    role: str,
    group_ips: Iterable[str],
    group_rooms: Iterable[int],
    leaders: Sequence[Leader],
    grace_s: float = ORPHAN_GRACE_SECONDS,
) -> PeerPlan:
    """What the PD peers of a group of `role` (its pods at `group_ips`; its leader held
    `group_rooms`) are told to end. `leaders`: every other group's leader, prefills listed
    before decodes."""
    plan = PeerPlan()
    if role == "prefill":
        ips = frozenset(group_ips)
        for leader in leaders:
            if leader.role != "decode":
                continue
            if leader.held is None:
                # Not listed: tell it anyway, it matches by address itself.
                plan.orders[leader.name] = EndOrder(peers=ips)
                continue
            if any(r.bootstrap_host in ips for r in leader.held):
                plan.orders[leader.name] = EndOrder(peers=ips)
        return plan
    known = frozenset(group_rooms)
    decodes = [leader for leader in leaders if leader.role == "decode"]
    plan.unknown = [leader.name for leader in decodes if leader.held is None]
    elsewhere = _rooms(leader.held for leader in decodes if leader.held is not None)
    for leader in leaders:
        if leader.role != "prefill" or leader.held is None:
            continue
        rooms: set[int] = set()
        young: set[int] = set()
        for r in leader.held:
            if r.room is None:
                continue
            if r.room in known:
                rooms.add(r.room)
            elif plan.unknown or r.room in elsewhere:
                continue
            elif r.age_s >= grace_s:
                rooms.add(r.room)
            else:
                young.add(r.room)
        if rooms:
            plan.orders[leader.name] = EndOrder(rooms=frozenset(rooms))
        if young:
            plan.young[leader.name] = frozenset(young)
    return plan


def still_orphaned(
    young: Mapping[str, frozenset[int]], decodes: Sequence[Leader]
) -> dict[str, EndOrder]:
    """The second look at rooms that were too young: those no decode leader holds now
    (nothing when a decode leader did not answer)."""
    if any(leader.held is None for leader in decodes):
        return {}
    elsewhere = _rooms(leader.held for leader in decodes if leader.held is not None)
    out: dict[str, EndOrder] = {}
    for name, rooms in young.items():
        gone = frozenset(rooms - elsewhere)
        if gone:
            out[name] = EndOrder(rooms=gone)
    return out


def _rooms(lists: Iterable[tuple[HeldRequest, ...]]) -> set[int]:
    return {r.room for held in lists for r in held if r.room is not None}

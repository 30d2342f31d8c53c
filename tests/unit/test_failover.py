"""Which requests to end, where, when a group leaves service (`lockstep.core.failover`), and the
operator's side of the runtime's failover routes checked against the runtime's own code
(`lockstep_sglang.failover`): what it lists parses here, what the operator sends selects
there what it means to."""

from __future__ import annotations

import pytest

from lockstep.clients.agent_client import held_from_json
from lockstep.core.failover import (
    ORPHAN_GRACE_SECONDS,
    EndOrder,
    HeldRequest,
    Leader,
    plan_peers,
    still_orphaned,
)
from lockstep_sglang import failover as runtime

pytestmark = pytest.mark.unit

OLD = ORPHAN_GRACE_SECONDS + 1.0
YOUNG = ORPHAN_GRACE_SECONDS / 10


def r(room: int | None, *, host: str | None = None, age: float = OLD) -> HeldRequest:
    return HeldRequest(rid=f"rid-{room}", room=room, bootstrap_host=host, age_s=age)


def prefill(name: str, *held: HeldRequest, ip: str = "10.0.0.1") -> Leader:
    return Leader(name, "prefill", ip, tuple(held))


def decode(name: str, *held: HeldRequest, ip: str = "10.0.1.1") -> Leader:
    return Leader(name, "decode", ip, tuple(held))


def test_a_broken_prefills_decode_peers_end_what_waits_for_its_kv() -> None:
    leaders = [
        decode("d0", r(1, host="10.0.0.7"), r(2, host="10.0.0.9")),
        decode("d1", r(3, host="10.0.0.9")),
        Leader("d2", "decode", "10.0.1.3", None),  # did not answer: told anyway
        prefill("p1", r(4)),
    ]
    plan = plan_peers("prefill", {"10.0.0.7", "10.0.0.8"}, {1}, leaders)
    assert plan.orders == {
        "d0": EndOrder(peers=frozenset({"10.0.0.7", "10.0.0.8"})),
        "d2": EndOrder(peers=frozenset({"10.0.0.7", "10.0.0.8"})),
    }
    assert not plan.young and not plan.unknown


def test_a_broken_decodes_prefill_peers_end_its_rooms_and_the_orphans() -> None:
    leaders = [
        prefill("p0", r(10), r(11), r(12), r(13, age=YOUNG)),
        prefill("p1", r(20), r(None)),
        decode("d1", r(11), r(20)),  # live pairs: never ended
    ]
    # The broken decode's leader said it held room 10 (and 99, gone from every prefill).
    plan = plan_peers("decode", {"10.0.1.0"}, {10, 99}, leaders)
    assert plan.orders == {"p0": EndOrder(rooms=frozenset({10, 12}))}
    # Room 13 arrived too recently to tell: a second look.
    assert plan.young == {"p0": frozenset({13})}
    # The second look ends it only if no decode holds it by then.
    assert still_orphaned(plan.young, [decode("d1", r(11), r(20))]) == {
        "p0": EndOrder(rooms=frozenset({13}))
    }
    assert still_orphaned(plan.young, [decode("d1", r(13))]) == {}


def test_with_a_decode_leader_unheard_only_the_broken_groups_own_rooms_end() -> None:
    leaders = [
        prefill("p0", r(10), r(12)),
        decode("d1", r(11)),
        Leader("d2", "decode", "10.0.1.2", None),  # room 12 may be its
    ]
    plan = plan_peers("decode", {"10.0.1.0"}, {10}, leaders)
    assert plan.orders == {"p0": EndOrder(rooms=frozenset({10}))}
    assert plan.unknown == ["d2"] and not plan.young
    assert still_orphaned({"p0": frozenset({12})}, leaders[1:]) == {}


def test_nothing_held_nothing_told() -> None:
    plan = plan_peers("decode", {"10.0.1.0"}, set(), [prefill("p0"), decode("d1")])
    assert plan.orders == {} and plan.young == {}
    plan = plan_peers("prefill", {"10.0.0.1"}, set(), [decode("d1", r(5, host="10.0.0.2"))])
    assert plan.orders == {}


# -- the operator against the runtime's own code -----------------------------------


def test_the_runtimes_listing_parses_as_the_operator_reads_it() -> None:
    held = [
        runtime.HeldRequest("a", room=7, bootstrap="10.0.0.7:8998", age_s=1.25, stream=True),
        runtime.HeldRequest("b"),
        runtime.HeldRequest("c", room=9, bootstrap="[fd00::7]:8998"),
    ]
    body = runtime.Failover(book=_Book(held), token="t").requests()
    parsed = held_from_json(body["requests"])
    assert parsed == (
        HeldRequest("a", 7, "10.0.0.7", 1.25, True),
        HeldRequest("b", None, None, 0.0, False),
        HeldRequest("c", 9, "fd00::7", 0.0, False),
    )
    with pytest.raises(ValueError):
        held_from_json([{"room": 1}])


def test_the_operators_orders_select_on_the_runtime_what_they_mean() -> None:
    held = [
        runtime.HeldRequest("on-p7", room=1, bootstrap="10.0.0.7:8998"),
        runtime.HeldRequest("on-p9", room=2, bootstrap="10.0.0.9:8998"),
        runtime.HeldRequest("room-3", room=3),
        runtime.HeldRequest("plain"),
    ]
    book = _Book(held)
    failover = runtime.Failover(book=book, token="t")
    by_peer = EndOrder(peers=frozenset({"10.0.0.7"})).body("p7 broke")
    answer = failover.abort(runtime.AbortOrder.from_json(by_peer))
    assert [a["rid"] for a in answer["aborted"]] == ["on-p7"] and answer["fenced"] is None
    by_room = EndOrder(rooms=frozenset({3, 4})).body("decode broke")
    assert [a["rid"] for a in failover.abort(runtime.AbortOrder.from_json(by_room))["aborted"]] == [
        "room-3"
    ]
    # The group's own leader: everything, fenced.
    everything = {"all": True, "fence": True, "reason": "decode/0 Desynced"}
    answer = failover.abort(runtime.AbortOrder.from_json(everything))
    assert {a["rid"] for a in answer["aborted"]} == {"on-p9", "plain"}
    assert answer["fenced"] == "decode/0 Desynced" and failover.fence.closed
    assert book.ended == [["on-p7"], ["room-3"], ["on-p9", "plain"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({"rooms": ["7"]}, "rooms"),
        ({"peers": [7]}, "peers"),
        ({"all": "yes"}, "all"),
        ({"reason": 3}, "reason"),
        ({"room": [1]}, "room"),
    ],
)
def test_a_malformed_order_is_refused_naming_the_field(body: object, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        runtime.AbortOrder.from_json(body)


def test_the_routes_need_the_operators_token() -> None:
    failover = runtime.Failover(book=_Book([]), token="secret")
    assert failover.authorized("Bearer secret") is None
    assert failover.authorized("Bearer wrong") == (401, {"error": "missing or wrong bearer token"})
    assert failover.authorized(None) is not None
    unset = runtime.Failover(book=_Book([]), token="")
    refused = unset.authorized("Bearer ")
    assert refused is not None and refused[0] == 403


class _Book:
    """A runtime book that remembers what it ended (the engines' books are exercised on
    real servers: tests/distributed, tests/realsglang)."""

    def __init__(self, held: list[runtime.HeldRequest]) -> None:
        self._held = list(held)
        self.ended: list[list[str]] = []

    def held(self) -> list[runtime.HeldRequest]:
        return list(self._held)

    def end(self, rids: list[str], message: str) -> None:  # type: ignore[override]
        self.ended.append(list(rids))
        self._held = [h for h in self._held if h.rid not in rids]

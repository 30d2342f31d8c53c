"""The collective probe on a real gloo TP group: healthy, stuck, and nothing left behind."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import zmq
from dist_support import RankGroup, wait_until

from lockstep_sglang.probe import ProbeGate, ProbeOutcome, ProbeReply, ProbeRequest


@contextmanager
def tokenizer_side(group: RankGroup) -> Iterator[Callable[..., ProbeOutcome]]:
    """Plays SGLang's tokenizer: pushes into rank 0, delivers replies to a ProbeGate."""
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(f"ipc://{group.workdir / 'inbox'}")
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"ipc://{group.workdir / 'outbox'}")
    pull.setsockopt(zmq.RCVTIMEO, 100)
    sent: list[ProbeRequest] = []

    def send(req: ProbeRequest) -> None:
        sent.append(req)
        push.send_pyobj({"type": "probe", "req": req})

    gate = ProbeGate(send)
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            try:
                reply = pull.recv_pyobj()
            except zmq.Again:
                continue
            assert isinstance(reply, ProbeReply)
            gate.deliver(reply)

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()

    def probe(timeout_s: float, callers: int = 1) -> list[ProbeOutcome]:
        async def run() -> list[ProbeOutcome]:
            return list(await asyncio.gather(*(gate.probe(timeout_s) for _ in range(callers))))

        return asyncio.run(run())

    probe.gate = gate  # type: ignore[attr-defined]
    probe.sent = sent  # type: ignore[attr-defined]
    probe.control = push.send_pyobj  # type: ignore[attr-defined]
    try:
        yield probe
    finally:
        stop.set()
        receiver.join(5)
        ctx.destroy(linger=0)


def test_probe_succeeds_times_out_when_a_rank_is_stuck_and_leaves_nothing_queued(
    launch_ranks: Callable[..., RankGroup],
) -> None:
    group = launch_ranks(2, "--consensus")
    for rank in (0, 1):
        group.wait_event(rank, "ready", timeout=60)
    with tokenizer_side(group) as probe:
        (healthy,) = probe(10.0)
        assert healthy["status"] == "ok", healthy
        (reply,) = healthy["replies"]
        assert set(reply["groups_ms"]) == {"tp:cpu", "tp:device"}
        assert all(ms >= 0 for ms in reply["groups_ms"].values())

        # Rank 1 enters a collective its peer never issues; rank 0 goes on to its next
        # TP collective (which one depends on where in its iteration the stall came)
        # and waits there. The rank state shows the two ranks in different collectives.
        probe.control({"type": "stall", "rank": 1})

        def stuck() -> bool:
            states = group.states()
            c0, c1 = states[0]["collective"], states[1]["collective"]
            return (
                c0 is not None
                and c0["group"] in {"tp:cpu", "tp:device"}
                and c1 is not None
                and (c1["op"], c1["group"]) == ("all_reduce", "side:cpu")
            )

        wait_until(stuck, 10, "rank 0 in a TP collective and rank 1 in the side one")

        (alone,) = probe(1.0)
        assert alone["status"] == "timeout" and not alone["joined"]
        assert not probe.gate.in_flight, "a timed-out probe must free the slot"
        # Two callers at once share one probe: only one request goes out.
        first, second = probe(1.0, callers=2)
        assert {first["status"], second["status"]} == {"timeout"}
        assert sorted([first["joined"], second["joined"]]) == [False, True]
        assert len(probe.sent) == 3  # healthy + alone + the shared one

        (group.workdir / "release").touch()
        group.wait_event(1, "unstall", timeout=10)
        (recovered,) = probe(10.0)
        assert recovered["status"] == "ok", recovered
        probe.control({"type": "stop"})
        assert group.wait_exit(timeout=30) == [0, 0], group.stderr(0)[-2000:]

    # The two probes that timed out never ran a collective on any rank: rank 0 dropped
    # them before the broadcast once the group moved again.
    ran = {r: [e["rid"] for e in group.events(r) if e["kind"] == "probe"] for r in (0, 1)}
    assert ran[0] == ran[1] == [healthy["rid"], recovered["rid"]]
    stopped = group.event(0, "stopped")
    assert stopped is not None and stopped["dropped_expired"] == 2
    assert probe.gate.late_replies == 0


def test_gloo_groups_give_up_at_the_configured_bound(
    launch_ranks: Callable[..., RankGroup],
) -> None:
    group = launch_ranks(2, "--scenario", "gloo-timeout", "--gloo-timeout", "2")
    assert group.wait_exit(timeout=60) == [0, 0], group.stderr(1)[-2000:]
    results = {r: json.loads((group.workdir / f"gloo-{r}.json").read_text()) for r in (0, 1)}
    for r in (0, 1):
        # Unset timeouts (torch's 30 min) and explicit long ones (SGLang's 2 h) are capped.
        assert results[r]["unset_s"] == 2.0
        assert results[r]["two_hours_s"] == 2.0
    assert results[1]["raised"], "the waiting rank should have been released by the timeout"
    assert 1.5 <= results[1]["waited_s"] <= 6.0

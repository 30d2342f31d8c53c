"""The KV of ended requests, on the `pd-path` drill's cluster: `kv-leak` and the abort storm.

`kv-leak` in decode/0 (its leader keeps the KV of PD requests that end unanswered), then
an abort wave through the router (many streams cancelled by the client at once): decode/0
holds KV for ended requests, the operator sees it in the deep probes' reports and has the
runtime free it (Event `EndedKVFreed`) within `FREED_WITHIN_S` of the first reading that
showed it; nothing restarts (the free worked), no incident opens.

The abort storm (no fault): `STORM_ROUNDS` waves of `STORM_STREAMS` streams through the
router, cancelled at once at different depths (some still at the prefill or in the KV
hand-off, some mid-stream); after each round, once the drill's own traffic is quiet,
every leader holds nothing (no request, no KV, none for ended requests); no verdict, no
restart, and the requests sent after it are served."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lockstep_dev.drills.deployment import NAMESPACE
from lockstep_dev.drills.failover import STREAM_TOKENS, loads
from lockstep_dev.drills.restart import Checks
from lockstep_dev.traffic import ROUTER, abort_wave, router_endpoint

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

LEAKY = "decode/0"
# The bound, from the first reading that showed the leaked KV to its free.
FREED_WITHIN_S = 30.0
# The kv-leak wave, per engine: streams, when the client cancels them, tokens each asks
# for. On the real engine the leak is a stream the decode keeps generating for nobody,
# so its streams are long (the tiny model's context is 2,048 tokens) and cancelled once
# under way (their first token came after up to ~1.5 s in a storm here).
LEAK_WAVE = {"standin": (16, 0.8, STREAM_TOKENS["standin"]), "sglang": (8, 4.0, 1800)}
STORM_ROUNDS = 3
STORM_STREAMS = 24
# How long after sending each round is cancelled, per engine. The stand-in's first
# token came 0.11-0.35 s after sending here (its prefill and hand-off take milliseconds;
# at 0.3 s a faster CI machine caught none before it), so its first round is cancelled
# at 0.05 s, while the streams still wait for their first token.
STORM_DEPTHS_S = {"standin": (0.05, 0.8, 1.5), "sglang": (0.3, 0.8, 1.5)}
QUIET_S = 20.0  # how long the leaders get to let go of a round


def ended_kv(drill: Drill) -> dict[str, int]:
    """KV tokens each leader holds for ended requests (its runtime's report)."""
    return {k: v.get("ended_kv_tokens", 0) for k, v in loads(drill).items()}


def kv_events(drill: Drill) -> list[dict[str, Any]]:
    return [e for e in drill.cluster.events(NAMESPACE) if e.get("reason") == "EndedKVFreed"]


def _router(drill: Drill) -> str:
    url = router_endpoint(drill.cluster.pods(NAMESPACE, drill.selector)).get(ROUTER)
    if url is None:
        raise RuntimeError("no Ready router pod")
    return url


def kv_leak(drill: Drill, groups: tuple[str, ...]) -> Checks:
    """`kv-leak` in decode/0 and an abort wave: the leaked KV freed, nothing restarted."""
    epochs = {g: int(drill.group(g).get("epoch", 0)) for g in groups}
    seen = {g: drill.incident_count(g) for g in groups}
    told = {e["metadata"]["uid"] for e in kv_events(drill)}
    before = ended_kv(drill)
    drill.inject("kv-leak", LEAKY)
    injected = time.time()
    waves: list[dict[str, Any]] = []
    leaked_at: float | None = None
    leaked = 0
    for _ in range(3):  # the router may send none of a wave's streams to decode/0
        wave = abort_wave(_router(drill), *LEAK_WAVE[drill.engine])
        waves.append(wave.to_json())
        held: int | None = None
        deadline = time.time() + 5
        while time.time() < deadline and not held:
            held = ended_kv(drill).get(LEAKY) or None
            time.sleep(0.2)
        if held:
            leaked_at, leaked = time.time(), held
            break
    drill.note(f"kv-leak in {LEAKY}: {leaked} KV tokens held for ended requests")
    freed_at: float | None = None
    if leaked_at is not None:
        freed = drill.wait(
            lambda: ended_kv(drill).get(LEAKY) == 0 and time.time(),
            FREED_WITHIN_S + 30,
            f"the ended KV of {LEAKY} freed",
        )
        freed_at = float(freed)
    drill.inject("none", LEAKY)
    events = [str(e.get("message")) for e in kv_events(drill) if e["metadata"]["uid"] not in told]
    after = ended_kv(drill)
    to_free = None if freed_at is None or leaked_at is None else round(freed_at - leaked_at, 2)
    blamed = [g for g in groups if drill.incident_count(g) > seen[g]]
    moved = {g: (epochs[g], int(drill.group(g).get("epoch", 0))) for g in groups}
    checks: Checks = [
        (leaked_at is not None, f"{LEAKY} held KV for the wave's ended requests: {leaked}"),
        (
            to_free is not None and to_free <= FREED_WITHIN_S,
            f"freed {to_free}s after it was first seen (bound {FREED_WITHIN_S}s)",
        ),
        (bool(events), f"an EndedKVFreed Event told it: {events[:1]}"),
        (not blamed, f"no incident (the free worked): {blamed}"),
        (all(a == b for a, b in moved.values()), f"no group restarted: {moved}"),
        (not any(after.values()), f"no KV held for ended requests after it: {after}"),
    ]
    drill.result.steps.append(
        {
            "fault": "kv-leak",
            "group": LEAKY,
            "injected_at": round(injected, 3),
            "waves": waves,
            "leaked_tokens": leaked,
            "time_to_free_s": to_free,
            "ended_kv_before": before,
            "ended_kv_after": after,
            "events": events[:3],
            "blamed": blamed,
            "passed": all(ok for ok, _ in checks),
        }
    )
    return checks


def abort_storm(drill: Drill, groups: tuple[str, ...]) -> Checks:
    """Rounds of streams cancelled at once through the router: nothing held after each,
    no verdict, no restart, the next requests served."""
    epochs = {g: int(drill.group(g).get("epoch", 0)) for g in groups}
    seen = {g: drill.incident_count(g) for g in groups}
    began = time.time()
    rounds: list[dict[str, Any]] = []
    checks: Checks = []
    assert drill.traffic is not None
    for depth in STORM_DEPTHS_S[drill.engine][:STORM_ROUNDS]:
        # Streams the engine can serve whole (a real server ends one longer than its
        # context at once: a storm of those catches nothing).
        wave = abort_wave(_router(drill), STORM_STREAMS, depth, STREAM_TOKENS[drill.engine])
        quiet = drill.traffic.quiesce(QUIET_S)
        deadline = time.time() + QUIET_S
        held = loads(drill)
        while time.time() < deadline and any(
            v["requests"] or v["used_tokens"] or v.get("ended_kv_tokens") for v in held.values()
        ):
            time.sleep(0.25)
            held = loads(drill)
        drill.traffic.resume()
        left = {k: v for k, v in held.items() if any(v.values())}
        rounds.append({**wave.to_json(), "held_after": held, "quiet": quiet})
        checks.append(
            (
                not left,
                f"round cancelled after {depth}s ({wave.streaming} mid-stream, "
                f"{wave.waiting} before their first token): held after it {left}",
            )
        )
        checks.append(
            (
                2 * wave.finished < wave.sent and not wave.errors,
                f"round cancelled after {depth}s caught most streams under way: {wave.finished} "
                f"of {wave.sent} had ended before the cancel, errors {wave.errors[:3]}",
            )
        )
    served_since = time.time()
    drill.wait(
        lambda: (
            drill.traffic is not None
            and any(o.ok for o in drill.traffic.outcomes_between(served_since))
        ),
        30,
        "a request served after the storm",
    )
    failed = [o for o in drill.traffic.outcomes_between(began) if not o.ok]
    blamed = [g for g in groups if drill.incident_count(g) > seen[g]]
    moved = {g: (epochs[g], int(drill.group(g).get("epoch", 0))) for g in groups}
    checks += [
        (not blamed, f"no verdict in the storm: {blamed}"),
        (all(a == b for a, b in moved.values()), f"no group restarted: {moved}"),
        (not failed, f"the drill's own requests all served: {[o.error for o in failed][:3]}"),
    ]
    drill.result.steps.append(
        {
            "fault": "abort-storm",
            "rounds": rounds,
            "blamed": blamed,
            "traffic_failed": len(failed),
            "passed": all(ok for ok, _ in checks),
        }
    )
    return checks

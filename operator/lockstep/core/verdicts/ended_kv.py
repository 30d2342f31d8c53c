"""KV held by ended requests: when to free it, and when the group is at fault.

Every deep probe's answer carries what the group's leader still holds for requests whose
HTTP side ended (``kv``: tokens, requests, the oldest's age; the runtime's
`lockstep_sglang.ended_kv`). A healthy server holds such KV for a moment at most (the
abort frees it in the same step), so the judge looks for KV held *above the bound*
(`spec.health.endedKV.maxTokens`) in every reading for longer than the grace
(`graceSeconds`):

| what the readings show | decided | what the operator does |
| --- | --- | --- |
| above the bound in every reading of the last `grace` seconds, no free asked in that run | free | `POST /lockstep/kv/free` on the leader (the engine's abort frees it); Warning Event `EndedKVFreed` with what was freed |
| a free asked in this run could not bring it down (its answer left more than the bound, or it did not answer), `grace` ago | the group: `KVLeak` | an incident: the group is drained and restarted through the usual recovery |
| frees asked `MAX_FREES` times within `FREE_WINDOW_GRACES` graces (it keeps leaking) | the group: `KVLeak` | as above |

A reading of a newer epoch than the group runs counts for nothing; a group with no
reading (an engine whose runtime does not report it) is never judged here. Pure: the
caller passes the readings, the frees asked and the clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lockstep.core.verdicts.facts import GroupVerdict, Signal, Verdict, clip_evidence

GroupKey = tuple[str, int]  # (role, group)
MAX_FREES = 3  # frees within the window that make a group "keeps leaking"
FREE_WINDOW_GRACES = 10.0  # the window, in graces


@dataclass(frozen=True)
class KVReading:
    """One deep probe's ``kv`` report of a group's leader (`at`: wall seconds)."""

    at: float
    tokens: int
    requests: int = 0
    oldest_s: float = 0.0


@dataclass(frozen=True)
class KVFree:
    """A free the operator asked of a group: when, and what its answer left (None: it
    did not answer)."""

    at: float
    left_tokens: int | None
    freed_tokens: int = 0


@dataclass(frozen=True)
class EndedKVJudgement:
    """What to free now, which groups are at fault, and each group's newest reading."""

    free: tuple[GroupKey, ...] = ()
    verdicts: Mapping[GroupKey, GroupVerdict] | None = None
    held: Mapping[GroupKey, KVReading] | None = None


def reading_from_probe(at: float, detail: Mapping[str, object] | None) -> KVReading | None:
    """The ``kv`` report of one probe's body, or None when it carries none (or a bad one)."""
    kv = (detail or {}).get("kv")
    if not isinstance(kv, Mapping):
        return None
    tokens, requests, oldest = kv.get("tokens"), kv.get("requests", 0), kv.get("oldest_s", 0.0)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        return None
    return KVReading(
        at,
        tokens,
        requests if isinstance(requests, int) and not isinstance(requests, bool) else 0,
        float(oldest) if isinstance(oldest, int | float) and not isinstance(oldest, bool) else 0.0,
    )


def judge_ended_kv(
    readings: Mapping[GroupKey, Sequence[KVReading]],
    frees: Mapping[GroupKey, Sequence[KVFree]],
    epochs: Mapping[GroupKey, int],
    now: float,
    max_tokens: int,
    grace_s: float,
) -> EndedKVJudgement:
    """Each group's readings (oldest first, of the epoch it runs) and the frees asked of
    that epoch, judged by the table in the module docstring."""
    free: list[GroupKey] = []
    verdicts: dict[GroupKey, GroupVerdict] = {}
    held: dict[GroupKey, KVReading] = {}
    for key, rs in sorted(readings.items()):
        if not rs or key not in epochs:
            continue
        newest = rs[-1]
        held[key] = newest
        if newest.tokens <= max_tokens:
            continue
        # The run of readings above the bound that ends with the newest.
        since = newest.at
        for r in reversed(rs):
            if r.tokens <= max_tokens:
                break
            since = r.at
        asked = list(frees.get(key, ()))
        # A free that brought it down ends the run: what is held after it is new.
        worked = [f.at for f in asked if f.left_tokens is not None and f.left_tokens <= max_tokens]
        since = max([since, *(at for at in worked if at >= since)])
        if now - since < grace_s:
            continue
        in_run = [f for f in asked if f.at >= since and f.at not in worked]
        recent = [f for f in asked if now - f.at <= FREE_WINDOW_GRACES * grace_s]
        failed = next((f for f in in_run if now - f.at >= grace_s), None)
        if failed is not None or len(recent) >= MAX_FREES:
            verdicts[key] = _verdict(key, epochs[key], newest, failed, recent, max_tokens)
        elif not in_run:
            free.append(key)
    return EndedKVJudgement(tuple(free), verdicts, held)


def _verdict(
    key: GroupKey,
    epoch: int,
    newest: KVReading,
    failed: KVFree | None,
    recent: Sequence[KVFree],
    max_tokens: int,
) -> GroupVerdict:
    role, index = key
    held = (
        f"{role}/{index} holds {newest.tokens} KV tokens for {newest.requests} ended "
        f"request(s) (the oldest ended {newest.oldest_s:.0f}s ago; bound {max_tokens})"
    )
    if failed is not None:
        why = (
            "the runtime's free did not answer"
            if failed.left_tokens is None
            else f"the runtime's free left {failed.left_tokens} tokens held"
        )
    else:
        why = f"freed {len(recent)} times lately and leaking again"
    return GroupVerdict(
        verdict=Verdict.KV_LEAK,
        immediate=True,
        reason=clip_evidence(f"{held}: {why}"),
        epoch=epoch,
        observed_at=newest.at,
        signals=frozenset({Signal.ENDED_KV_HELD}),
        evidence={
            "ended_kv_tokens": newest.tokens,
            "ended_requests": newest.requests,
            "oldest_ended_s": round(newest.oldest_s, 3),
            "frees": [
                f"at {f.at:.3f}: freed {f.freed_tokens}, left "
                + ("no answer" if f.left_tokens is None else str(f.left_tokens))
                for f in recent
            ],
        },
        sample=f"kv-{role}-{index}-{newest.at:.3f}",
    )

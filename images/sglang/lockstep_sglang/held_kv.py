"""The KV of ended requests on the real SGLang server (the engine's side of
:mod:`lockstep_sglang.ended_kv`).

SGLang keeps what a request holds in two processes that each know half: the scheduler
holds the KV (waiting, running, in the PD queues), the HTTP process's tokenizer manager
knows whether anyone still waits for the answer. A request the client left is aborted
from the HTTP side (``TokenizerManager.abort_request`` sends ``AbortReq``; the request's
state is kept, ``abort_sent``, until the scheduler answers that it freed it). If that
abort is lost, or a PD queue never lets go of a request it was told to drop, the KV stays
held with nobody waiting, and nothing in SGLang reports it.

So the two halves are put together here:

- scheduler side, :func:`held_requests`: with every deep-probe answer, TP rank 0 lists
  the requests its scheduler holds and the KV tokens each holds of its own (outside the
  prefix cache), read between two loop iterations (the probe is a request);
- HTTP side, :class:`SGLangEndedKV`: each answer is compared with the tokenizer
  manager's request states. A held request is *ended* when the HTTP side has no state
  for it, or has sent its abort (``abort_sent``); it counts from the first answer that
  showed it so. A healthy server frees such a request within a loop iteration or two
  (the PD queues on their next poll), so only one held across readings matters; the
  operator judges that (``lockstep.core.verdicts.ended_kv``: the grace);
- the free: ``AbortReq`` for each ended request, sent to the scheduler directly (the
  tokenizer manager's ``abort_request`` sends nothing for a request whose abort it
  already sent), the same path a client's cancel takes from there; then fresh deep
  probes, for up to :data:`SETTLE_S`, to report what is left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lockstep_sglang.ended_kv import EndedKV

MAX_HELD_SHOWN = 4096  # requests one probe answer lists (a server holds far fewer)
SETTLE_S = 3.0  # how long a free waits for the scheduler to show what it freed
SETTLE_POLL_S = 0.2


def held_requests(scheduler: Any) -> dict[str, tuple[int, int | None]]:
    """Every request the scheduler holds: id -> (its own KV tokens, its bootstrap room).

    Waiting and running requests, and the PD queues: a prefill's bootstrap and in-flight
    queues, a decode's prealloc, retracted and transfer queues (names in
    ``hooks.SGLANG_READS``, checked against the real classes)."""
    reqs: list[Any] = [*getattr(scheduler, "waiting_queue", ())]
    reqs += list(getattr(getattr(scheduler, "running_batch", None), "reqs", None) or ())
    reqs += list(getattr(getattr(scheduler, "disagg_prefill_bootstrap_queue", None), "queue", ()))
    reqs += list(getattr(scheduler, "disagg_prefill_inflight_queue", None) or ())
    prealloc = getattr(scheduler, "disagg_decode_prealloc_queue", None)
    reqs += list(getattr(prealloc, "retracted_queue", ()))
    for queue in (prealloc, getattr(scheduler, "disagg_decode_transfer_queue", None)):
        reqs += [d.req for d in getattr(queue, "queue", ())]
    out: dict[str, tuple[int, int | None]] = {}
    for r in reqs:
        kv = getattr(r, "kv", None)
        own = int(getattr(kv, "kv_allocated_len", 0)) - int(getattr(kv, "cache_protected_len", 0))
        room = getattr(r, "bootstrap_room", None)
        rid = str(r.rid)
        out[rid] = (
            max(out.get(rid, (0, None))[0], own, 0),
            room if isinstance(room, int) else None,
        )
        if len(out) >= MAX_HELD_SHOWN:
            break
    return out


@dataclass(frozen=True)
class _Ended:
    tokens: int
    since: float  # monotonic: the first answer that showed it ended
    room: int | None


class SGLangEndedKV:
    """The :class:`lockstep_sglang.ended_kv.EndedKVBook` of the real server: fed by the
    deep probes' answers (:meth:`observe`), on the tokenizer manager's event loop."""

    def __init__(
        self,
        manager: Callable[[], Any],
        dispatch_abort: Callable[[Any, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._manager = manager
        self._dispatch_abort = dispatch_abort
        self._clock = clock
        self._ended: dict[str, _Ended] = {}
        self._answer: str | None = None  # the probe whose answers `_ended` is built from
        self._seen: dict[str, tuple[int, int | None]] = {}
        self.asked: set[str] = set()  # the ended requests the last free aborted

    def observe(self, probe_rid: str, held: Mapping[str, tuple[int, int | None]]) -> None:
        """One TP group's answer to a probe: what its scheduler holds now. The answers of
        one probe (one per DP replica) add up; a newer probe replaces them."""
        if probe_rid != self._answer:
            self._answer, self._seen = probe_rid, {}
        self._seen.update(held)
        tm = self._manager()
        states: Mapping[str, Any] = getattr(tm, "rid_to_state", None) or {}
        now = self._clock()
        ended: dict[str, _Ended] = {}
        for rid, (tokens, room) in self._seen.items():
            state = states.get(rid)
            if tokens <= 0 or (state is not None and not getattr(state, "abort_sent", False)):
                continue  # nothing held, or someone still waits for it
            before = self._ended.get(rid)
            ended[rid] = _Ended(tokens, now if before is None else before.since, room)
        self._ended = ended
        self.asked &= set(ended)

    def ended_kv(self) -> EndedKV:
        """KV held by ended requests, as the newest probe answer showed it."""
        return self._report(list(self._ended.values()))

    def free_ended_kv(self, reason: str) -> EndedKV:
        """Abort every ended request still holding KV in the scheduler."""
        tm = self._manager()
        ended = dict(self._ended)
        if tm is None or not ended:
            return EndedKV()
        for rid in ended:
            self._dispatch_abort(tm, rid)
        self.asked = set(ended)
        return self._report(list(ended.values()))

    def _report(self, ended: list[_Ended]) -> EndedKV:
        now = self._clock()
        return EndedKV(
            tokens=sum(e.tokens for e in ended),
            requests=len(ended),
            oldest_s=max((now - e.since for e in ended), default=0.0),
            rooms=tuple(e.room for e in sorted(ended, key=lambda e: e.since) if e.room is not None),
        )


async def settle(
    book: SGLangEndedKV,
    probe: Callable[[float], Awaitable[Any]],
    within_s: float = SETTLE_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """After a free: deep probes (each answer refreshes the book) until none of the
    requests it aborted is held any more, or ``within_s`` passed (what is left then is
    what the free could not free)."""
    deadline = clock() + within_s
    while book.asked and clock() < deadline:
        await asyncio.sleep(SETTLE_POLL_S)
        await probe(max(0.1, min(1.0, deadline - clock())))

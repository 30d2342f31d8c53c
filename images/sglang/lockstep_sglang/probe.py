"""Collective probe: a request every TP rank answers with a no-op all-reduce.

The operator's deep probe must prove that every rank of a group still issues the same
collectives, which ``/health`` cannot. A probe request rides the scheduler's normal
request fan-out (rank 0 pulls it, the TP CPU group broadcasts it), so every rank handles
it at the top of its loop; each runs a one-element all-reduce on the TP CPU group and on
the device group, and rank 0 replies with the latency per group. If any rank is stuck
elsewhere, the all-reduce (or the broadcast before it) does not complete and the caller's
hard timeout fires.

Three rules keep a probe from ever making things worse:

- at most one probe is in flight per server (:class:`ProbeGate`); a second caller joins
  the in-flight probe instead of queueing another;
- a probe carries a deadline, and the rank that pulls requests drops expired probes
  *before* the broadcast (:func:`drop_expired`), so one that timed out while the group
  was wedged is never run later — the drop is decided on one rank, so every rank agrees;
- the collectives are matched on every rank (the request reached all of them through the
  same broadcast), so a probe cannot itself desync a group.

This module is engine-agnostic (plain dataclasses, torch imported lazily); ``hooks``
carries them over SGLang's IPC as msgspec structs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypedDict, TypeVar

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """A probe on its way to the ranks; ``deadline`` is unix seconds."""

    rid: str
    deadline: float
    sent_at: float


@dataclass(frozen=True, slots=True)
class ProbeReply:
    """What rank 0 (of one TP group) answers."""

    rid: str
    ok: bool
    groups_ms: dict[str, float] = field(default_factory=dict)
    tp_rank: int = 0
    iteration: int = 0
    queued_ms: float = 0.0
    error: str | None = None


class ProbeGroup(NamedTuple):
    """A process group to probe; ``device`` is where its tensor lives (None: CPU)."""

    name: str
    group: ProcessGroup
    device: torch.device | None = None


class ProbeOutcome(TypedDict):
    """The JSON body of ``GET /lockstep/probe``."""

    ok: bool
    status: Literal["ok", "failed", "timeout"]
    rid: str
    latency_ms: float
    timeout_s: float
    joined: bool
    replies: list[dict[str, Any]]
    error: str | None


def drop_expired(
    reqs: Iterable[T],
    now: float,
    deadline_of: Callable[[T], float | None],
) -> list[T]:
    """``reqs`` without the probes whose deadline has passed (others untouched).

    ``deadline_of`` returns a probe's deadline, or ``None`` for anything else. Call it
    only on the rank that pulls requests, before they are broadcast.
    """
    kept: list[T] = []
    for req in reqs:
        deadline = deadline_of(req)
        if deadline is not None and deadline < now:
            continue
        kept.append(req)
    return kept


def run_collective_probe(groups: Sequence[ProbeGroup]) -> tuple[bool, dict[str, float], str | None]:
    """All-reduce a one on each group; every rank of every group must call this.

    Returns ``(ok, latency_ms per group, error)``; ``ok`` is False when the sum is not
    the group size (a rank took part with a different tensor: a desync).
    """
    import torch
    import torch.distributed as dist

    latencies: dict[str, float] = {}
    errors: list[str] = []
    for name, group, device in groups:
        size = dist.get_world_size(group)
        tensor = torch.ones(1, dtype=torch.int32, device=device)
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        value = int(tensor.item())  # .item() waits for a device all-reduce to finish
        latencies[name] = (time.perf_counter() - start) * 1000.0
        if value != size:
            errors.append(f"{name}: all-reduce of ones gave {value}, expected {size}")
    return (not errors, latencies, "; ".join(errors) or None)


class _Expired(Exception):
    """The probe's owner timed out; its request will not run."""


class _InFlight:
    __slots__ = ("future", "loop", "replies", "request", "started")

    def __init__(self, request: ProbeRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.loop = loop
        self.future: asyncio.Future[list[ProbeReply]] = loop.create_future()
        self.replies: list[ProbeReply] = []
        self.started = time.perf_counter()


class ProbeGate:
    """Sends probes and matches replies; at most one probe in flight.

    ``send`` hands a request to the scheduler (rank 0's input). ``deliver`` takes a
    reply from any thread. ``fan_out`` is how many replies make one answer (one per
    TP group behind this server).
    """

    def __init__(
        self,
        send: Callable[[ProbeRequest], None],
        *,
        fan_out: int = 1,
        clock: Callable[[], float] = time.time,
        max_timeout_s: float = MAX_TIMEOUT_S,
    ) -> None:
        self._send = send
        self._fan_out = max(1, fan_out)
        self._clock = clock
        self._max_timeout_s = max_timeout_s
        self._current: _InFlight | None = None
        self._ids = itertools.count(1)
        self._prefix = f"lockstep-probe-{os.getpid()}-{int(time.time())}"
        self.late_replies = 0

    @property
    def in_flight(self) -> bool:
        """Whether a probe is outstanding."""
        return self._current is not None

    async def probe(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> ProbeOutcome:
        """Run (or join) a probe and wait at most ``timeout_s`` for its answer."""
        timeout_s = min(max(timeout_s, 0.001), self._max_timeout_s)
        joined = self._current is not None
        current = self._current
        if current is None:
            now = self._clock()
            request = ProbeRequest(
                rid=f"{self._prefix}-{next(self._ids)}",
                deadline=now + timeout_s,
                sent_at=now,
            )
            current = _InFlight(request, asyncio.get_running_loop())
            self._current = current
            try:
                self._send(request)
            except Exception as exc:
                self._current = None
                return self._outcome(current, "failed", timeout_s, joined, [], f"send: {exc}")
        started = time.perf_counter()
        try:
            replies = await asyncio.wait_for(asyncio.shield(current.future), timeout_s)
        except (TimeoutError, _Expired):
            # Only the caller that started the probe frees the slot (a joiner with a
            # shorter timeout leaves it to the owner). Past the owner's deadline the
            # request is dropped before the broadcast, so joiners give up with it.
            if not joined and self._current is current:
                self._current = None
                if not current.future.done():
                    current.future.set_exception(_Expired())
                    current.future.exception()  # retrieved: no "never retrieved" warning
            return self._outcome(
                current, "timeout", timeout_s, joined, [], "no answer in time", started
            )
        ok = all(r.ok for r in replies)
        error = "; ".join(r.error for r in replies if r.error) or None
        return self._outcome(
            current, "ok" if ok else "failed", timeout_s, joined, replies, error, started
        )

    def _outcome(
        self,
        current: _InFlight,
        status: Literal["ok", "failed", "timeout"],
        timeout_s: float,
        joined: bool,
        replies: list[ProbeReply],
        error: str | None,
        started: float | None = None,
    ) -> ProbeOutcome:
        begin = current.started if started is None or not joined else started
        return {
            "ok": status == "ok",
            "status": status,
            "rid": current.request.rid,
            "latency_ms": round((time.perf_counter() - begin) * 1000.0, 3),
            "timeout_s": timeout_s,
            "joined": joined,
            "replies": [
                {
                    "ok": r.ok,
                    "tp_rank": r.tp_rank,
                    "iteration": r.iteration,
                    "queued_ms": round(r.queued_ms, 3),
                    "groups_ms": {k: round(v, 3) for k, v in r.groups_ms.items()},
                    "error": r.error,
                }
                for r in replies
            ],
            "error": error,
        }

    def deliver(self, reply: ProbeReply) -> None:
        """Hand a reply to the waiting probe; safe from any thread; stale ones are dropped."""
        current = self._current
        if current is None or current.request.rid != reply.rid:
            self.late_replies += 1
            return
        current.loop.call_soon_threadsafe(self._deliver_on_loop, current, reply)

    def _deliver_on_loop(self, current: _InFlight, reply: ProbeReply) -> None:
        if self._current is not current or current.future.done():
            self.late_replies += 1
            return
        current.replies.append(reply)
        if len(current.replies) >= self._fan_out:
            self._current = None
            current.future.set_result(list(current.replies))

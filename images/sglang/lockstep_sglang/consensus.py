"""Decision consensus ("tripwire"): make every TP rank prove it decided the same thing.

In SGLang's PD loops each TP rank decides per iteration, from rank-local state, whether
to run a batch (device collectives) or idle (none), and whether to poll a transfer queue
(a gloo all-reduce) or skip it because its local queue is empty. Nothing makes the ranks
agree; when they diverge one rank waits in a collective its peers never issue, forever.

The tripwire records each such decision as a short text event *before* the collective it
gates. A background thread compares the events across ranks on dedicated gloo groups and
ends the process on a mismatch, so a silent hang becomes a fast crash with evidence. The
recording runs on the scheduler thread and costs one formatted string and one queue put.

Two engines run the comparison, with the same rule and the same evidence:

- inside SGLang, SGLang's own checker (``sglang.srt.utils.rank_consensus_checker``):
  events go through its ``assert_same`` and its worker thread, and
  ``hooks`` replaces its ``_check_for_consensus`` with :func:`compare_and_fail`, which
  adds cross-rank evidence to what upstream logs;
- outside SGLang (the distributed tests, the CPU stand-in server), :class:`ConsensusChecker`,
  a small port of the same worker loop onto plain torch process groups, because SGLang's
  checker is process-global and built on its ``GroupCoordinator`` and env settings.

Events name only what every rank must share. Batch request ids are hashed order-
insensitively: ranks agree on the set of requests they run, while the order of ties in
a priority queue may use rank-local timestamps — comparing order would restart healthy
groups. Iteration counters are not compared either (a rank may run extra warm-up
iterations); the event *sequence* is what must match.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from lockstep_sglang.rank_state import (
    ConsensusFailureJSON,
    DivergenceJSON,
    RankStateWriter,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)

DEFAULT_PAUSE_S = 0.05  # longest wait between two comparisons (detection delay it adds)
DIVERGENCE_EXIT_CODE = 1  # what SGLang's own checker uses; the container restarts on it
# Evidence bounds: the log line and the failure file stay readable.
RECENT_EVENTS = 8
MAX_GATHERED_EVENTS = 2048
# SGLang's own events carry whole request reprs (``match_prefix called params=...``,
# several KB): evidence keeps the head of each, the comparison the whole text.
MAX_EVENT_CHARS = 300
# How long a rank that wrote its evidence waits for its peers to have written theirs
# before it exits (see fail_on_divergence).
EVIDENCE_BARRIER_S = 5.0

_EMPTY_RIDS = hashlib.blake2b(b"", digest_size=8).hexdigest()


def rids_hash(rids: Iterable[str]) -> str:
    """Stable, order-insensitive 64-bit hash (hex) of request ids.

    Python's ``hash`` is salted per process, so ranks would never agree on it.
    """
    ordered = sorted(rids)
    if not ordered:
        return _EMPTY_RIDS
    return hashlib.blake2b("\x00".join(map(str, ordered)).encode(), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class Decision:
    """One scheduling decision that every TP rank of a group must make identically."""

    kind: Literal["batch", "idle"]
    forward_mode: str | None
    batch_size: int
    rids_hash: str

    def event(self) -> str:
        """The consensus event text of this decision."""
        return (
            f"lockstep decision {self.kind} mode={self.forward_mode} "
            f"size={self.batch_size} rids={self.rids_hash}"
        )


IDLE = Decision("idle", None, 0, _EMPTY_RIDS)


def decision_of(batch: object | None) -> Decision:
    """The decision a loop makes from the batch it got (duck-typed ``ScheduleBatch``).

    Mirrors the loops' own test (``if batch:``): a falsy batch means idle.
    """
    if not batch:
        return IDLE
    reqs = getattr(batch, "reqs", None) or ()
    mode = getattr(batch, "forward_mode", None)
    mode_name = None if mode is None else str(getattr(mode, "name", mode))
    try:
        rids = [r.rid for r in reqs]
    except AttributeError:
        rids = [str(getattr(r, "rid", "")) for r in reqs]
    return Decision("batch", mode_name, len(reqs), rids_hash(rids))


def queue_poll_event(queue_name: str, length: int) -> str:
    """Event for "this rank is about to poll ``queue_name`` holding ``length`` entries".

    Recorded before the poll's all-reduce, which SGLang skips when the local queue is
    empty (sglang#36928): a rank with an empty queue and one without must not agree.
    """
    return f"lockstep {queue_name} poll n={length}"


def queue_pop_event(queue_name: str, rids: Sequence[str]) -> str:
    """Event for the requests a transfer/bootstrap queue released this iteration."""
    return f"lockstep {queue_name} pop n={len(rids)} rids={rids_hash(rids)}"


class DecisionRecorder:
    """Records decisions into a consensus sink and publishes them in the rank state.

    ``sink`` receives event text: SGLang's ``assert_same`` wrapper inside SGLang,
    :meth:`ConsensusChecker.record` elsewhere, or ``None`` (rank state only).
    """

    def __init__(
        self,
        sink: Callable[[str], None] | None,
        state: RankStateWriter | None = None,
    ) -> None:
        self._sink = sink
        self._state = state
        self.seq = 0

    def decision(self, batch: object | None) -> Decision:
        """Record the batch-vs-idle decision for ``batch`` and return it."""
        decision = decision_of(batch)
        self.seq += 1
        if self._state is not None:
            self._state.record_decision(
                kind=decision.kind,
                forward_mode=decision.forward_mode,
                batch_size=decision.batch_size,
                rids_hash=decision.rids_hash,
                seq=self.seq,
            )
        if self._sink is not None:
            self._sink(decision.event())
        return decision

    def queue_poll(self, queue_name: str, length: int) -> None:
        """Record that the rank is about to poll a queue of ``length`` entries."""
        if self._sink is not None:
            self._sink(queue_poll_event(queue_name, length))

    def queue_pop(self, queue_name: str, rids: Sequence[str]) -> None:
        """Record the request ids a queue released."""
        if self._sink is not None:
            self._sink(queue_pop_event(queue_name, rids))


@dataclass
class DivergenceReport:
    """What a rank knows when the consensus finds the ranks disagree."""

    rank: int
    events_checked: int
    local_hash: str
    detected_at: float = field(default_factory=time.time)
    first_divergence: DivergenceJSON | None = None
    recent_events: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> ConsensusFailureJSON:
        """The rank-state form (``consensus_failure``)."""
        return {
            "detected_at": self.detected_at,
            "rank": self.rank,
            "events_checked": self.events_checked,
            "local_hash": self.local_hash,
            "first_divergence": self.first_divergence,
            "recent_events": self.recent_events,
        }

    def summary(self) -> str:
        """One line naming the diverging decision on each rank."""
        if self.first_divergence is None:
            return f"rank {self.rank}: event hashes differ (peers' events unavailable)"
        per_rank = ", ".join(
            f"rank {r}: {e!r}" for r, e in sorted(self.first_divergence["events"].items())
        )
        return f"event #{self.first_divergence['index']} differs: {per_rank}"


def find_first_divergence(per_rank: Mapping[int, Sequence[str]]) -> DivergenceJSON | None:
    """The first index where the ranks' event sequences differ (a missing event counts)."""
    if len(per_rank) < 2:
        return None
    longest = max(len(events) for events in per_rank.values())
    for index in range(longest):
        seen = {
            r: (events[index] if index < len(events) else None) for r, events in per_rank.items()
        }
        if len(set(seen.values())) > 1:
            return {
                "index": index,
                "events": {
                    str(r): None if e is None else clip_event(e) for r, e in sorted(seen.items())
                },
            }
    return None


def clip_event(event: str) -> str:
    """An event's text as evidence shows it: at most :data:`MAX_EVENT_CHARS`."""
    if len(event) <= MAX_EVENT_CHARS:
        return event
    return f"{event[: MAX_EVENT_CHARS - 24]}... ({len(event)} chars)"


def _recent(per_rank: Mapping[int, Sequence[str]], index: int | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r, events in sorted(per_rank.items()):
        end = len(events) if index is None else min(len(events), index + 2)
        out[str(r)] = [clip_event(e) for e in events[max(0, end - RECENT_EVENTS) : end]]
    return out


def events_digest(events: Sequence[str]) -> bytes:
    """SHA-1 over the concatenated events: the same digest SGLang's checker compares."""
    hasher = hashlib.sha1()
    for msg in events:
        hasher.update(msg.encode("utf-8"))
    return hasher.digest()


def compare_across_ranks(
    events: Sequence[str], groups: Sequence[ProcessGroup]
) -> DivergenceReport | None:
    """Compare this rank's events with its peers'; ``None`` when every rank agrees.

    Every rank of ``groups`` must call this with the same number of events (the worker
    drains the group-wide minimum). On a mismatch every rank takes the evidence branch
    together, so the extra ``all_gather_object`` is a matched collective too.
    """
    import torch
    import torch.distributed as dist

    digest = events_digest(events)
    # One all-reduce instead of SGLang's MIN and MAX pair: MAX over (d, 255 - d) yields
    # both the largest digest and 255 minus the smallest.
    mine_bytes = torch.tensor(list(digest), dtype=torch.uint8)
    both = torch.cat([mine_bytes, 255 - mine_bytes])
    for group in groups:
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    width = len(digest)
    if torch.equal(both[:width], 255 - both[width:]):
        return None
    rank = dist.get_rank()
    per_rank: dict[int, list[str]] = {rank: list(events)}
    mine = list(events[-MAX_GATHERED_EVENTS:])
    for group in groups:
        try:
            gathered: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, (rank, mine), group=group)
        except Exception as exc:  # a peer may already be gone; keep local evidence
            logger.warning("lockstep: could not gather peers' events: %s", exc)
            continue
        for item in gathered:
            if item is not None:
                per_rank[int(item[0])] = list(item[1])
    first = find_first_divergence(per_rank)
    return DivergenceReport(
        rank=rank,
        events_checked=len(events),
        local_hash=digest.hex(),
        first_divergence=first,
        recent_events=_recent(per_rank, None if first is None else first["index"]),
    )


# The consensus comparison itself failed (see ConsensusChecker._run).
CHECK_FAILED_EXIT_CODE = 3


def wait_for_peers_evidence(groups: Sequence[ProcessGroup]) -> None:
    """A barrier over the checker's groups, bounded by EVIDENCE_BARRIER_S (every rank
    takes the evidence branch together, so this is matched).

    Without it the first rank to exit breaks the collective a slower peer's scheduler
    thread is waiting in; that thread raises, and the peer's interpreter ends (exit 1)
    before its checker thread has written the peer's evidence. Runs on its own daemon
    thread so a peer that never arrives costs EVIDENCE_BARRIER_S, not a gloo timeout.
    """
    if not groups:
        return
    reached = threading.Event()

    def barrier() -> None:
        import torch
        import torch.distributed as dist

        try:
            token = torch.zeros(1)
            for group in groups:
                dist.all_reduce(token, group=group)
            reached.set()
        except Exception as exc:  # a peer is gone: its evidence is written or lost anyway
            logger.warning("lockstep: the evidence barrier failed: %s", exc)

    threading.Thread(target=barrier, name="lockstep-evidence-barrier", daemon=True).start()
    if not reached.wait(EVIDENCE_BARRIER_S):
        logger.warning(
            "lockstep: not every peer confirmed its evidence within %.1f s; ending anyway",
            EVIDENCE_BARRIER_S,
        )


def fail_on_divergence(
    report: DivergenceReport,
    *,
    state: RankStateWriter | None,
    groups: Sequence[ProcessGroup] = (),
    log: logging.Logger = logger,
    exit_fn: Callable[[int], object] = os._exit,
) -> None:
    """Log and persist the evidence, wait (bounded) until the peers in ``groups`` have
    persisted theirs, then end the process.

    ``os._exit``, as SGLang's checker does: this runs on a background thread, where
    ``SystemExit`` would end only the thread while the scheduler thread stays wedged.
    """
    evidence = report.to_json()
    log.critical(
        "lockstep: TP ranks diverged; ending rank %d. %s evidence=%s",
        report.rank,
        report.summary(),
        json.dumps(evidence, sort_keys=True),
    )
    if state is not None:
        try:
            state.record_failure(evidence)
        except OSError as exc:
            log.error("lockstep: could not write failure evidence: %s", exc)
    for handler in [*log.handlers, *logging.getLogger().handlers]:
        handler.flush()
    wait_for_peers_evidence(groups)
    exit_fn(DIVERGENCE_EXIT_CODE)


def compare_and_fail(
    events: Sequence[str],
    groups: Sequence[ProcessGroup],
    *,
    state: RankStateWriter | None,
    pause_s: float = 0.0,
    exit_fn: Callable[[int], object] = os._exit,
) -> None:
    """Compare ``events`` across ranks and end the process on a divergence.

    ``pause_s``: sleep after a passing check. The comparing thread otherwise runs its
    collectives as fast as events arrive, taking CPU and network from the scheduler;
    pausing lets events pile up and be compared in one batch, for a detection delay of
    at most ``pause_s``.
    """
    started = time.monotonic()
    report = compare_across_ranks(events, groups)
    if report is not None:
        fail_on_divergence(report, state=state, groups=groups, exit_fn=exit_fn)
        return
    remaining = pause_s - (time.monotonic() - started)
    if remaining > 0:
        time.sleep(remaining)


def create_dedicated_groups(rank_sets: Sequence[Sequence[int]]) -> list[ProcessGroup]:
    """New gloo groups for the checker's own traffic, one per rank set this rank is in.

    Every rank of the world must call this with the same ``rank_sets`` (``new_group``
    is world-collective). Dedicated groups keep the checker's all-reduces from
    interleaving with the scheduler's collectives on the same communicator.
    """
    import torch.distributed as dist

    me = dist.get_rank()
    mine: list[ProcessGroup] = []
    for ranks in rank_sets:
        group = dist.new_group(list(ranks), backend="gloo")
        if me in ranks and len(ranks) > 1 and isinstance(group, dist.ProcessGroup):
            mine.append(group)
    return mine


class ConsensusChecker:
    """Cross-rank decision comparison for loops that run outside SGLang.

    The same worker loop as SGLang's ``rank_consensus_checker``: block for the first
    event, agree on the group-wide minimum queue length, drain exactly that many, and
    compare digests. Events must be recorded from the thread that called :meth:`start`
    (the scheduler thread), or peers would see them interleaved in a different order.
    """

    def __init__(
        self,
        groups: Sequence[ProcessGroup],
        *,
        state: RankStateWriter | None = None,
        on_divergence: Callable[[DivergenceReport], None] | None = None,
        pause_s: float = DEFAULT_PAUSE_S,
        exit_fn: Callable[[int], object] = os._exit,
    ) -> None:
        self._groups = list(groups)
        self._state = state
        self._pause_s = pause_s
        self._on_divergence = on_divergence
        self._exit_fn = exit_fn
        self._closing = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._owner: threading.Thread | None = None
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        """Bind to the calling (scheduler) thread and start the comparing thread."""
        self._owner = threading.current_thread()
        self._worker = threading.Thread(target=self._run, name="lockstep-consensus", daemon=True)
        self._worker.start()

    def record(self, event: str) -> None:
        """Queue one event for comparison (scheduler thread only)."""
        if self._owner is None:
            return
        if threading.current_thread() is not self._owner:
            raise RuntimeError("ConsensusChecker.record must be called from the scheduler thread")
        self._queue.put(event)

    def close(self, timeout: float = 5.0) -> None:
        """Compare what is queued, then stop the comparing thread."""
        if self._worker is None:
            return
        self._closing = True
        self._queue.put(None)
        self._worker.join(timeout)
        self._worker = None
        self._owner = None

    def _min_across_groups(self, value: int) -> int:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.int64)
        for group in self._groups:
            dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group)
        return int(tensor.item())

    def _run(self) -> None:
        try:
            self._compare_forever()
        except Exception as exc:
            if self._closing:
                return
            # A comparison collective failed (a peer is gone, stalled past the gloo
            # timeout, or its group broke). The checker can no longer vouch for the
            # group, and a silently dead thread would leave the rank running unguarded:
            # end the rank, as a divergence does, so the group restarts.
            logger.critical(
                "lockstep: the consensus check failed (%s: %s); ending the rank",
                type(exc).__name__,
                exc,
            )
            for handler in [*logger.handlers, *logging.getLogger().handlers]:
                handler.flush()
            self._exit_fn(CHECK_FAILED_EXIT_CODE)

    def _compare_forever(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            count = self._min_across_groups(self._queue.qsize())
            events = [first]
            stopping = False
            for _ in range(count):
                event = self._queue.get()
                if event is None:
                    stopping = True
                    break
                events.append(event)
            started = time.monotonic()
            report = compare_across_ranks(events, self._groups)
            if report is not None:
                if self._on_divergence is not None:
                    self._on_divergence(report)
                else:
                    fail_on_divergence(report, state=self._state, groups=self._groups)
                return
            if stopping:
                return
            # See compare_and_fail: batch the comparisons, bounded detection delay.
            remaining = self._pause_s - (time.monotonic() - started)
            if remaining > 0:
                time.sleep(remaining)

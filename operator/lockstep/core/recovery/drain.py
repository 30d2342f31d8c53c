"""Shared service: a drain on purpose (maintenance, scale-down). The pods left every
router; their leaders' in-flight requests finish, bounded by
`maintenance.drainTimeoutSeconds`; what still runs then is ended, retryable."""

from __future__ import annotations

from collections.abc import Sequence

from lockstep.core.recovery.actions import EndRequests, SetGate
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.record import refs
from lockstep.core.recovery.steps import (
    DRAIN_RECHECK_SECONDS,
    DRAIN_SETTLE_SECONDS,
    RECHECK_SECONDS,
    Reason,
)
from lockstep.core.verdicts import PodView


def gate_off(r: Round, pods: Sequence[PodView]) -> bool:
    """Take out of service (readiness gate false, out of every router) those of `pods`
    still in it, and look again soon; False when none was."""
    leave = [p for p in pods if not p.deleting and p.gate is not False]
    if leave:
        r.actions.append(SetGate(refs(leave), False))
        r.again_in(RECHECK_SECONDS)
    return bool(leave)


def drain_out(r: Round, pods: Sequence[PodView]) -> bool:
    """Leaving service on purpose: out of every router first (`gate_off`, until the drain
    starts), then `drained`. True once the group is drained."""
    if r.rec.drain.started_at is None and gate_off(r, pods):
        return False
    return drained(r, pods)


def drained(r: Round, pods: Sequence[PodView]) -> bool:
    """The pods left every router and their leaders hold no request any more, or
    drainTimeoutSeconds passed (then the rest are cut off, and the Event says so)."""
    if r.rec.drain.done:
        return True
    if r.rec.drain.started_at is None:
        _set(r, started_at=r.now)
        r.again_in(DRAIN_SETTLE_SECONDS)
        return False
    waited = r.now - r.rec.drain.started_at
    timeout = r.s.maintenance.drain_timeout_seconds
    leaders = [p for p in pods if p.rank == 0 and not p.deleting and p.container_running]
    holding = {p.name: r.inp.inflight.get(p.name) for p in leaders}
    busy = {name: n for name, n in holding.items() if n is None or n > 0}
    if waited < DRAIN_SETTLE_SECONDS or (busy and waited < timeout):
        r.again_in(DRAIN_RECHECK_SECONDS)
        return False
    _set(r, done=True)
    if busy:
        # What is still running ends retryable (the router retries it elsewhere)
        # before the pods go, never cut off silently.
        r.actions.append(
            EndRequests(
                refs(pods),
                f"{r.s.role}/{r.rec.index} is leaving service and its drain ran out of "
                f"time ({timeout}s); retry on another group",
            )
        )
        r.event(
            Reason.DRAINED,
            f"drain timed out after {timeout}s (maintenance.drainTimeoutSeconds) with "
            + ", ".join(f"{k}: {'unknown' if n is None else n}" for k, n in busy.items())
            + " request(s) in flight",
            warning=True,
        )
    else:
        r.event(
            Reason.DRAINED,
            f"out of every router; in-flight requests finished after {waited:.1f}s",
        )
    return True


def _set(r: Round, **changes: object) -> None:
    r.update(drain=r.rec.drain.model_copy(update=changes))

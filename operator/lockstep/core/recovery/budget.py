"""Shared service: the restart budget and backoff of a group (how many restarts in the
window, when the next may start, whether one may start now)."""

from __future__ import annotations

from lockstep.api.models import RecoverySpec
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.inputs import RoleSettings
from lockstep.core.recovery.record import GroupRecord
from lockstep.core.recovery.steps import MAX_RESTART_TIMES


def restarts_in_window(record: GroupRecord, recovery: RecoverySpec, now: float) -> int:
    """Restarts of the group within the budget window ending now."""
    window = recovery.budget.window_seconds
    return sum(1 for t in record.budget.restart_times if now - t < window)


def backoff_until(record: GroupRecord, recovery: RecoverySpec) -> float | None:
    """When the next restart of the group may start (None: at once)."""
    streak, last = record.budget.backoff_streak, record.budget.last_restart_at
    if streak == 0 or last is None:
        return None
    b = recovery.backoff
    # Cap the exponent: the delay saturates at max_seconds long before 2^32.
    delay = min(b.base_seconds << min(streak - 1, 32), b.max_seconds)
    return last + delay


def restart_allowed(record: GroupRecord, settings: RoleSettings, now: float) -> bool:
    """The group may take a slot now (budget left and backoff over, or a manual request)."""
    if record.manual.requested or record.maintenance:
        return True  # a person asked, or a move for maintenance: not a failure
    if restarts_in_window(record, settings.recovery, now) >= settings.recovery.budget.restarts:
        return False
    until = backoff_until(record, settings.recovery)
    return until is None or now >= until


def reset_streak(r: Round) -> None:
    """A group healthy for `backoff.resetAfterSeconds` starts its next streak afresh."""
    reset = r.s.recovery.backoff.reset_after_seconds
    since = r.rec.healthy_since
    if r.rec.budget.backoff_streak and since is not None and r.now - since >= reset:
        _set(r, backoff_streak=0)


def count_restart(r: Round) -> None:
    """A restart begins now: counted in the window and the backoff streak."""
    b = r.rec.budget
    window = r.s.recovery.budget.window_seconds
    times = (*(t for t in b.restart_times if r.now - t < window), r.now)
    _set(
        r,
        restarts=b.restarts + 1,
        restart_times=times[-MAX_RESTART_TIMES:],
        backoff_streak=b.backoff_streak + 1,
        last_restart_at=r.now,
    )


def fresh(r: Round) -> None:
    """A person asked after a quarantine: a fresh budget and no backoff."""
    _set(r, restart_times=(), backoff_streak=0)


def _set(r: Round, **changes: object) -> None:
    r.update(budget=r.rec.budget.model_copy(update=changes))

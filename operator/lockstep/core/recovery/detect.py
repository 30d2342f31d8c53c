"""Concern: detection. Each probe observation counted once; a failure of a group in
service makes it Suspect, and `failureThreshold` of them (or one immediate verdict) open
the incident and start recovery; a starting epoch passes its first deep probe or fails
its attempt. Owns the steps Starting, Healthy, Suspect, Observing, WaitingProbe."""

from __future__ import annotations

from lockstep.core.recovery import incidents
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.steps import (
    SUSPECT_EVENT_INTERVAL_SECONDS,
    VERDICT_REASON,
    Reason,
    Step,
)
from lockstep.core.verdicts import BROKEN_SIGNALS, GroupVerdict, Verdict, not_up_in_time


def _set(r: Round, **changes: object) -> None:
    r.update(detection=r.rec.detection.model_copy(update=changes))


def observe(r: Round) -> GroupVerdict | None:
    """This round's verdict, if it is news (`fresh_verdict`), remembered as the last."""
    v = fresh_verdict(r)
    if v is not None:
        _set(
            r,
            last_observed_at=v.observed_at,
            last_sample=v.sample or r.rec.detection.last_sample,
            last_verdict=v.verdict,
            last_reason=v.reason,
        )
    return v


def fresh_verdict(r: Round) -> GroupVerdict | None:
    # Count each observation once (the caller may plan several times per probe) and
    # drop verdicts about an epoch this record has already left behind.
    v = r.inp.verdict
    if v is None or v.epoch != r.rec.epoch:
        return None
    if v.sample is not None:
        # A probe sample counts once, by its identity (a timestamp recomputed from
        # two clocks drifts, and once made one sample count twice).
        return None if v.sample == r.rec.detection.last_sample else v
    last = r.rec.detection.last_observed_at
    if last is not None and v.observed_at <= last:
        return None
    return v


def count_failure(r: Round, v: GroupVerdict, *, in_service: bool) -> None:
    """A failed observation of a group in service: Suspect, or a verdict."""
    d = r.rec.detection
    failures = d.failures + 1
    first = d.first_failure_at if d.first_failure_at is not None else v.observed_at
    _set(r, failures=failures, first_failure_at=first)
    if v.immediate or failures >= r.s.health.failure_threshold:
        reach_verdict(r, v, leaving_service=in_service)
    elif r.rec.step is not Step.SUSPECT:
        r.goto(Step.SUSPECT)
        r.requeue = None
        last = r.rec.detection.last_suspect_event_at
        if last is None or r.now - last >= SUSPECT_EVENT_INTERVAL_SECONDS:
            # A Suspect that resolves on its own is status, not news: one warning
            # per group per interval (a verdict always gets its own Event).
            _set(r, last_suspect_event_at=r.now)
            r.event(
                Reason.SUSPECT,
                f"{v.verdict}: {v.reason} ({failures}/{r.s.health.failure_threshold})",
                warning=True,
            )


def reach_verdict(r: Round, v: GroupVerdict, *, leaving_service: bool) -> None:
    d = r.rec.detection
    first = d.first_failure_at if d.first_failure_at is not None else v.observed_at
    named = incidents.outliers_of(r, v)
    incidents.open_incident(
        r,
        v.verdict,
        v.reason,
        incidents.evidence_text(v) + "".join(f"\noutlier: {o.text}" for o in named),
        first_failure=first,
        culprits=v.culprits,
        outliers=named,
    )
    outlier = f"; outlier: {', '.join(o.text for o in named[:3])}" if named else ""
    r.event(
        VERDICT_REASON.get(v.verdict, Reason.UNRESPONSIVE),
        f"{v.verdict} in epoch {r.rec.epoch}: {v.reason}{outlier}",
        warning=True,
    )
    begin_recovery(r, leaving_service=leaving_service)


def begin_recovery(r: Round, *, leaving_service: bool, note: str = "") -> None:
    """Start draining, unless the policy or the role's last group in service forbid."""
    if r.s.recovery.policy == "ObserveOnly":
        incidents.set_action(r, "observed only (policy ObserveOnly)")
        r.goto(Step.OBSERVING)
        r.requeue = None
        return
    if leaving_service and not r.g.may_leave_service:
        if r.rec.step is not Step.SUSPECT:
            r.goto(Step.SUSPECT)
            r.requeue = None
        incidents.set_action(r, "deferred: last group of the role in service")
        r.defer(
            "last-in-service",
            "restart deferred: it is the last group of the role in service and another "
            "group is still coming back",
        )
        return
    incidents.set_action(r, f"drain and restart the whole group{note}")
    r.goto(Step.DRAINING, clear_failures=True)


def attempt_failed(r: Round, v: GroupVerdict) -> None:
    """The epoch being started did not come up: treat it as another failure."""
    reason = v.reason
    if r.rec.incident is None:
        incidents.open_incident(r, v.verdict, reason, "", first_failure=r.now)
        r.event(
            VERDICT_REASON.get(v.verdict, Reason.UNRESPONSIVE),
            f"epoch {r.rec.epoch} did not come up: {reason}",
            warning=True,
        )
        begin_recovery(r, leaving_service=False)
        return
    attempts = r.rec.incident.attempts
    r.event(
        Reason.RESTART_FAILED,
        f"epoch {r.rec.epoch} did not come up: {reason}",
        warning=True,
    )
    begin_recovery(r, leaving_service=False, note=f"; attempt {attempts} failed: {reason}")


def on_starting(r: Round, v: GroupVerdict | None) -> None:
    wait_first_pass(r, v)


def on_waiting_probe(r: Round, v: GroupVerdict | None) -> None:
    wait_first_pass(r, v)


def wait_first_pass(r: Round, v: GroupVerdict | None) -> None:
    if v is not None and v.verdict is Verdict.HEALTHY:
        r.goto(Step.READMITTING)
        return
    unplaced = any(p.node is None for p in r.current_pods() if not p.deleting)
    if v is not None and v.is_failure and v.signals & BROKEN_SIGNALS and not unplaced:
        # A pod the scheduler has not placed is no rank down: the epoch is placement's
        # (withdrawn whole at schedulingTimeoutSeconds, `placement.expired`).
        attempt_failed(r, v)
        return
    deadline = r.rec.epoch_started_at + r.s.health.startup_grace_seconds
    if r.now >= deadline:
        why = f"no deep probe passed within startupGraceSeconds={r.s.health.startup_grace_seconds}"
        if r.rec.detection.last_reason:
            why += f" (last: {r.rec.detection.last_reason})"
        attempt_failed(r, not_up_in_time(r.rec.epoch, r.now, why))
        return
    r.again_in(deadline - r.now)


def on_healthy(r: Round, v: GroupVerdict | None) -> None:
    if v is None:
        return
    if v.is_failure:
        # A spare serves nothing: it never holds the role's last-in-service guard.
        count_failure(r, v, in_service=not r.rec.spare)
    else:
        _set(r, failures=0, first_failure_at=None)


def on_suspect(r: Round, v: GroupVerdict | None) -> None:
    if r.rec.incident is not None:
        # A verdict was reached but the role's guard kept the group in service.
        if v is not None and not v.is_failure:
            r.goto(Step.READMITTING)
            return
        begin_recovery(r, leaving_service=not r.rec.spare)
        return
    if v is None:
        return
    if v.is_failure:
        count_failure(r, v, in_service=not r.rec.spare)
    else:
        # Slow is progress: a probe that times out under load never restarts a group.
        r.goto(Step.HEALTHY, clear_failures=True)
        r.requeue = None


def on_observing(r: Round, v: GroupVerdict | None) -> None:
    if v is not None and not v.is_failure:
        # Through Readmitting: a group that never passed a probe has no gate yet.
        r.goto(Step.READMITTING)
        return
    if r.s.recovery.policy != "ObserveOnly":
        begin_recovery(r, leaving_service=True)

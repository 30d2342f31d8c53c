"""Concern: the whole-group restart, from the drain to re-admission. Draining (out of
every router, the requests it holds and its peers' halves ended), evidence, the restart
slot with budget and backoff (or quarantine), then the epoch replaced (Deleting,
WaitingGone, Creating; or in place, `in_place`) and re-admitted."""

from __future__ import annotations

from lockstep.core.recovery import budget, drain, in_place, incidents, manual, placement
from lockstep.core.recovery.actions import (
    CaptureEvidence,
    CreateEpoch,
    DeletePods,
    EndRequests,
    SetGate,
    UpdateIncident,
)
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.record import refs
from lockstep.core.recovery.steps import (
    CAPTURE_TIMEOUT_SECONDS,
    DELETE_GRACE_SECONDS,
    FORCE_DELETE_AFTER_SECONDS,
    RECHECK_SECONDS,
    IncidentKind,
    Reason,
    Step,
)
from lockstep.core.verdicts import GroupVerdict, Signal, Verdict


def on_draining(r: Round, v: GroupVerdict | None) -> None:
    if drain.gate_off(r, r.pods()):
        if not r.rec.maintenance:
            # Out of the routers first (the action before), then nothing in flight
            # waits on the group: its requests and its peers' halves end, retryable.
            r.actions.append(EndRequests(refs(r.pods()), end_reason(r)))
        return
    if r.rec.maintenance:
        # Leaving service on purpose: the requests it holds finish first (bounded).
        if not drain.drained(r, r.pods()):
            return
        r.goto(Step.AWAITING_RESTART)
        return
    r.event(Reason.DRAINED, "out of the router (readiness gate false on every pod)")
    # Once more as the drain completes: halves the router placed in the instant before
    # it let go of the group are old enough now to be told from live ones.
    r.actions.append(EndRequests(refs(r.pods()), end_reason(r)))
    r.goto(Step.CAPTURING_EVIDENCE)


def end_reason(r: Round) -> str:
    inc = r.rec.incident
    what = inc.label if inc is not None else "out of service"
    return (
        f"{r.s.role}/{r.rec.index} ({what}) is being restarted by lockstep; retry on another group"
    )


def on_capturing_evidence(r: Round, v: GroupVerdict | None) -> None:
    incident = r.rec.incident
    diag = r.s.recovery.diagnostics
    if incident is None or not r.pods():
        r.goto(Step.AWAITING_RESTART)
        return
    captured = r.inp.captured
    if captured is not None and captured.incident_id == incident.id:
        if v is not None and Signal.CONSENSUS_FAILURE in v.signals:
            refine(r, v)
        r.goto(Step.AWAITING_RESTART)
        return
    if r.now - r.rec.step_since >= CAPTURE_TIMEOUT_SECONDS:
        # The capture never reached the evidence store: restart without it.
        r.event(
            Reason.EVIDENCE_MISSING,
            f"no evidence captured after {CAPTURE_TIMEOUT_SECONDS:.0f}s; restarting without",
            warning=True,
        )
        r.goto(Step.AWAITING_RESTART)
        return
    if not r.rec.capture_asked:
        r.actions.append(
            CaptureEvidence(
                incident.id,
                refs(r.pods()),
                diag.capture_stacks,
                diag.log_lines,
                diag.max_evidence_bytes,
                diag.full_captures,
            )
        )
        r.update(capture_asked=True)
        r.requeue = 0.0  # the capture is done in this round's I/O
    else:
        r.again_in(RECHECK_SECONDS)


def refine(r: Round, v: GroupVerdict) -> None:
    """The one place an incident changes after it opened: the captured rank states,
    judged with the group's next observation, show a consensus failure. Ranks that went
    down because the consensus caught a divergence are a desync (the exit was only its
    consequence); the cause is added to the evidence either way."""
    incident = r.rec.incident
    if incident is None:
        return
    changes: dict[str, object] = {
        "evidence": incidents.bound(
            f"cause: {v.reason}\n{incident.evidence}",
            r.s.recovery.diagnostics.max_evidence_bytes,
        )
    }
    if incident.verdict is Verdict.RANK_DOWN:
        changes["verdict"] = v.verdict
        changes["reason"] = v.reason
        r.update(detection=r.rec.detection.model_copy(update={"last_verdict": v.verdict}))
        r.event(
            Reason.DESYNCED,
            f"the ranks went down on a consensus divergence: {v.reason}",
            warning=True,
        )
    incident = incident.model_copy(update=changes)
    r.update(incident=incident)
    r.actions.append(UpdateIncident(incidents.incident_model(r, incident)))


def on_awaiting_restart(r: Round, v: GroupVerdict | None) -> None:
    rec, rs = r.rec, r.s.recovery
    if not rec.manual.requested:
        used = budget.restarts_in_window(rec, rs, r.now)
        if used >= rs.budget.restarts:
            why = (
                f"{used} restarts within {rs.budget.window_seconds}s "
                f"(budget {rs.budget.restarts}); restart by hand to retry (until then a "
                "node drain may evict its pods)"
            )
            incidents.set_action(r, f"quarantined: {why}")
            r.event(Reason.QUARANTINED, f"quarantined: {why}", warning=True)
            r.goto(Step.QUARANTINED)
            r.requeue = None
            return
        until = budget.backoff_until(rec, rs)
        if until is not None and r.now < until:
            r.defer("backoff", f"restart deferred by backoff for {until - r.now:.0f}s")
            r.again_in(until - r.now)
            return
    if not r.g.slot_granted:
        r.defer(
            "concurrency",
            f"restart deferred: {r.g.restarting} group(s) of the role restarting "
            f"(maxConcurrentGroupRestarts={rs.max_concurrent_group_restarts})",
        )
        return
    attempts = rec.incident.attempts + 1 if rec.incident else 1
    if rec.incident is not None:
        r.update(incident=rec.incident.model_copy(update={"attempts": attempts}))
    if rec.maintenance:
        # A move is not a failure: no restart counted, no backoff, never in place
        # (the same pods would stay on the node that is going away).
        incidents.set_action(
            r, f"recreate the whole group on other nodes (maintenance: {rec.maintenance})"
        )
        manual.done(r)
        in_place.recreate(r, set(), avoid=rec.move.nodes, other_slot=True)
        return
    why_not = in_place.why_not_in_place(r)
    budget.count_restart(r)
    manual.done(r)
    if why_not is None:
        in_place.restart_in_place(r, attempts)
        return
    culprits = set(rec.incident.culprits) if rec.incident else set()
    r.update(restart=r.rec.restart.model_copy(update={"mode": "Recreate"}))
    if rs.mode == "InPlace":
        incidents.note_escalation(r, why_not)
        incidents.set_action(
            r, f"restart the whole group (Recreate; attempt {attempts}): {why_not}"
        )
    else:
        incidents.set_action(r, f"restart the whole group (Recreate; attempt {attempts})")
    in_place.recreate(r, culprits)


def on_deleting(r: Round, v: GroupVerdict | None) -> None:
    if r.rec.restart.old_pods:
        r.actions.append(
            DeletePods(r.rec.restart.old_pods, DELETE_GRACE_SECONDS, restart=not r.rec.maintenance)
        )
    r.goto(Step.WAITING_GONE)


def on_waiting_gone(r: Round, v: GroupVerdict | None) -> None:
    target = r.rec.epoch + 1
    # Anything of another epoch must go before the new epoch rendezvouses, and so
    # must the pods snapshotted for deletion even if a lost in-place round relabelled
    # them with the target epoch; new pods of the target epoch are never deleted here.
    doomed = {ref.uid for ref in r.rec.restart.old_pods}
    left = [p for p in r.pods() if p.epoch != target or p.uid in doomed]
    if not left:
        r.goto(Step.CREATING, epoch=target)
        return
    alive = [p for p in left if not p.deleting]
    if alive:
        r.actions.append(
            DeletePods(refs(alive), DELETE_GRACE_SECONDS, restart=not r.rec.maintenance)
        )
    if not r.rec.restart.force_deleted and r.now - r.rec.step_since >= FORCE_DELETE_AFTER_SECONDS:
        r.actions.append(DeletePods(refs(left), 0))
        r.event(
            Reason.FORCE_DELETED,
            f"{len(left)} pod(s) still terminating after {FORCE_DELETE_AFTER_SECONDS}s: "
            "deleted with grace 0",
            warning=True,
        )
        r.update(restart=r.rec.restart.model_copy(update={"force_deleted": True}))
    r.again_in(RECHECK_SECONDS)


def on_creating(r: Round, v: GroupVerdict | None) -> None:
    have = [p for p in r.current_pods() if not p.deleting]
    if len(have) >= r.s.pods_per_group:
        in_place.restarted(r, have, "moved" if r.rec.maintenance else "restarted")
        return
    timeout = r.s.scheduling_timeout_seconds
    if r.now - r.rec.step_since >= timeout:
        placement.withdraw(
            r,
            f"{r.s.pods_per_group - len(have)} pod(s) of epoch {r.rec.epoch} could "
            f"not be created within schedulingTimeoutSeconds={timeout:g}",
        )
        return
    r.actions.append(CreateEpoch(r.rec.epoch, r.rec.restart.avoid_nodes, r.rec.slot))
    r.again_in(RECHECK_SECONDS)


def on_readmitting(r: Round, v: GroupVerdict | None) -> None:
    if r.rec.spare:
        stand_by(r)
        return
    todo = [p for p in r.current_pods() if not p.deleting and p.gate is not True]
    if todo:
        r.actions.append(SetGate(refs(todo), True))
        r.again_in(RECHECK_SECONDS)
        return
    if r.rec.incident is not None and r.rec.maintenance:
        done = (
            f"moved for maintenance ({r.rec.maintenance}) by draining first; "
            f"re-admitted in epoch {r.rec.epoch}"
        )
        incidents.close_incident(r, done)
        r.event(Reason.MOVED, done)
    elif r.rec.incident is not None:
        attempts = r.rec.incident.attempts
        escalation = r.rec.incident.escalation
        why = f"; {escalation}" if escalation and r.rec.restart.mode == "Recreate" else ""
        done = (
            f"restarted the whole group ({r.rec.restart.mode}, {attempts} attempt(s){why})"
            if attempts
            else f"no restart ({r.rec.incident.action or 'none'}); recovered by itself"
        )
        incidents.close_incident(r, f"{done}; re-admitted in epoch {r.rec.epoch}")
        r.event(Reason.READMITTED, f"{done}; re-admitted in epoch {r.rec.epoch}")
    else:
        r.event(Reason.READY, f"admitted in epoch {r.rec.epoch}")
    r.settle()
    r.requeue = None


def stand_by(r: Round) -> None:
    """A spare's deep probe passed: it stays out of every router (its gates false)."""
    todo = [p for p in r.current_pods() if not p.deleting and p.gate is True]
    if todo:  # it served before (a serving group that became the spare)
        r.actions.append(SetGate(refs(todo), False))
        r.again_in(RECHECK_SECONDS)
        return
    inc = r.rec.incident
    done = f"standing by as the role's spare in epoch {r.rec.epoch}"
    if inc is not None and inc.kind is IncidentKind.MAINTENANCE:
        done = f"moved for maintenance ({r.rec.maintenance}); {done}"
        incidents.close_incident(r, done)
    elif inc is not None:
        how = (
            f"restarted the whole group ({r.rec.restart.mode}, {inc.attempts} attempt(s))"
            if inc.attempts
            else f"no restart ({inc.action or 'none'}); recovered by itself"
        )
        done = f"{how}; {done}"
        incidents.close_incident(r, done)
    r.event(Reason.STANDBY, f"deep probe passed: {done}, out of every router")
    r.settle()
    r.requeue = None


def on_quarantined(r: Round, v: GroupVerdict | None) -> None:
    # Nothing until a manual request (handled before the step handlers run).
    return

"""Guard: a manual restart request (`kubectl annotate pdd NAME lockstep.dev/restart=
decode/0@id`) restarts one group once, past backoff, budget and the last-in-service guard
(a person asked), not past the concurrency limit. A spec change's rollout comes as such a
request (`GroupInput.template_changed`); the role's only group in service rolls
make-before-break instead (`move.make_before_break`), when maintenance allows it."""

from __future__ import annotations

from lockstep.core.recovery import budget, incidents
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.steps import RESTARTING_STEPS, IncidentKind, Reason, Step


def request(r: Round) -> bool:
    """Handle a new manual request; True when it decided this round."""
    req = r.inp.manual_request
    if not req or req == r.rec.manual.handled_request:
        return False
    _set(r, handled_request=req)
    if r.s.recovery.policy == "ObserveOnly":
        r.event(Reason.RESTART_REFUSED, f"request {req} refused: policy is ObserveOnly")
        return False
    if r.rec.step in RESTARTING_STEPS:
        r.event(Reason.RESTART_REQUESTED, f"request {req}: already restarting ({r.rec.step})")
        return False
    if r.rec.step in (Step.DRAINING, Step.CAPTURING_EVIDENCE, Step.AWAITING_RESTART):
        # Already on the way to a restart: the request lifts backoff and budget for it.
        # The role's slots were granted on the record without it: go on next round.
        _set(r, requested=True)
        r.event(Reason.RESTART_REQUESTED, f"request {req}: restart already under way")
        r.requeue = 0.0
        return True
    if r.inp.template_changed:
        _set(r, rollout=True)
    if r.rec.step is Step.QUARANTINED:
        # Quarantine lasts until a person asks; asking starts a fresh budget.
        budget.fresh(r)
    if r.rec.incident is None:
        incidents.open_incident(
            r, IncidentKind.MANUAL, f"manual restart request {req}", "", first_failure=r.now
        )
    incidents.set_action(r, f"drain and restart the whole group on request {req}")
    r.event(Reason.RESTART_REQUESTED, f"restart requested ({req})")
    _set(r, requested=True)
    r.goto(Step.DRAINING, clear_failures=True)
    return True


def rollout_beside(r: Round) -> str | None:
    """A spec change's rollout of the role's only group in service: taken (the request
    handled, the incident opened) and its reason returned, for the caller to roll it
    make-before-break (the new epoch starts beside it and takes over, so the role never
    stops serving). None: not such a rollout (a role with another group in service, or
    a ready spare, rolls by restarting; so does a spare, and any group when maintenance
    is not MakeBeforeBreak)."""
    req = r.inp.manual_request
    if (
        not r.inp.template_changed
        or not req
        or req == r.rec.manual.handled_request
        or r.s.recovery.policy == "ObserveOnly"
        or r.rec.step is not Step.HEALTHY
        or r.rec.spare
        or r.g.peer_in_service
        or r.s.maintenance.mode != "MakeBeforeBreak"
    ):
        return None
    _set(r, handled_request=req)
    why = f"spec change rollout {req}"
    incidents.open_incident(r, IncidentKind.MANUAL, why, "", first_failure=r.now)
    return why


def done(r: Round) -> None:
    """The restart a person asked for has begun: the request is carried out."""
    _set(r, requested=False, rollout=False)


def _set(r: Round, **changes: object) -> None:
    r.update(manual=r.rec.manual.model_copy(update=changes))

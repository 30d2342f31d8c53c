"""The effects recovery asks the I/O layer to carry out: frozen, and each safe to repeat
(see the package docstring's contract)."""

from __future__ import annotations

from dataclasses import dataclass

from lockstep.api.models import Incident
from lockstep.core.recovery.record import PodRef
from lockstep.core.recovery.steps import Reason


@dataclass(frozen=True)
class SetGate:
    """Set the `lockstep.dev/group-healthy` readiness-gate condition on these pods."""

    pods: tuple[PodRef, ...]
    value: bool


@dataclass(frozen=True)
class EndRequests:
    """End at once, with a retryable 503, every request the group's leaders hold (and
    fence them: new work refused), and the halves of its PD pairs that peers of the other
    role hold for it (`lockstep.core.failover`). Emitted after the group left every router
    (its `SetGate` false), so the router's retries go to healthy pairs; safe to repeat
    (what has ended is no longer held)."""

    pods: tuple[PodRef, ...]
    reason: str


@dataclass(frozen=True)
class CaptureEvidence:
    """Read rank states, stacks and last log lines of these pods into the incident."""

    incident_id: str
    pods: tuple[PodRef, ...]
    stacks: bool
    log_lines: int
    max_bytes: int
    full_captures: int = 0  # whole-capture slots (`lockstep.core.evidence.choose_full_slot`)


@dataclass(frozen=True)
class DeletePods:
    """Delete these pods, each with its UID as precondition (404/409 mean done).
    `restart`: the delete is part of a restart (counted in the restart metric); a move
    or a withdrawn epoch is not."""

    pods: tuple[PodRef, ...]
    grace_seconds: int
    restart: bool = True


@dataclass(frozen=True)
class RestartInPlace:
    """Restart these pods' containers in place into `epoch`: relabel each pod with the
    epoch (UID as precondition), then `POST /restart` to each pod agent once. A pod whose
    relabel or request fails is reported back in `GroupInput.restart_failures`."""

    pods: tuple[PodRef, ...]
    epoch: int
    reason: str


@dataclass(frozen=True)
class CreateEpoch:
    """Create every pod (and the headless Service) of the group in `epoch` (409 = done),
    preferring nodes other than `avoid_nodes`."""

    epoch: int
    avoid_nodes: tuple[str, ...] = ()
    slot: int = 0


@dataclass(frozen=True)
class OpenIncident:
    """Add the incident to status (upsert by id)."""

    incident: Incident


@dataclass(frozen=True)
class UpdateIncident:
    """Replace the incident with this id in status."""

    incident: Incident


@dataclass(frozen=True)
class CloseIncident:
    """Replace the incident with this id in status, now closed with its figures."""

    incident: Incident


@dataclass(frozen=True)
class EmitEvent:
    """An Event on the PDDeployment (and a metric named after the reason)."""

    reason: Reason
    message: str
    warning: bool = False


Action = (
    SetGate
    | EndRequests
    | CaptureEvidence
    | RestartInPlace
    | DeletePods
    | CreateEpoch
    | OpenIncident
    | UpdateIncident
    | CloseIncident
    | EmitEvent
)

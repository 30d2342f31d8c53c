"""What one round of recovery takes in (the facts of a group, the role's settings and
guards) and gives back (the next record, the actions, when to look again)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lockstep.api.models import HealthSpec, MaintenanceSpec, PDDeploymentSpec, RecoverySpec
from lockstep.core.recovery.actions import Action
from lockstep.core.recovery.record import GroupRecord
from lockstep.core.recovery.steps import Role, Step
from lockstep.core.verdicts import GroupVerdict, PodView


@dataclass(frozen=True)
class GroupInput:
    """This round's facts about one group.

    `pods`: every pod of the group the API server lists (any epoch). `verdict`: this
    round's classification, or None when the group was not probed this round.
    `manual_request`: the id of the group's restart request, if one is set.
    `restart_failures`: pod UID -> why its in-place restart into the record's epoch could
    not be asked (relabel refused, agent unreachable or refusing). `template_changed`:
    the manual request rolls out a new pod template (so the restart must recreate).
    `captured`: the open incident's evidence was captured.
    """

    pods: tuple[PodView, ...] = ()
    verdict: GroupVerdict | None = None
    manual_request: str | None = None
    restart_failures: Mapping[str, str] = field(default_factory=dict)
    # Of those, the pods whose agent could not be reached at all (no answer, not a "no").
    restart_unreachable: frozenset[str] = frozenset()
    # The manual request rolls a changed pod template out: only new pods apply it.
    template_changed: bool = False
    # What the evidence store holds for the record's open incident, once captured.
    captured: CapturedEvidence | None = None
    # Why the group must leave its nodes (a pod of its current epoch is on a node that
    # is cordoned or tainted for maintenance), and those nodes; None: it need not.
    maintenance: str | None = None
    maintenance_nodes: tuple[str, ...] = ()
    # Work requests each leader pod (by name) holds, for a group draining on purpose
    # (None: the leader did not answer).
    inflight: Mapping[str, int | None] = field(default_factory=dict)
    # The group is beyond the role's replicas: it leaves (drained first). See plan_role.
    retire: bool = False
    # A digest of what the scheduler can place (`maintenance.cluster_fingerprint`): a
    # group withdrawn as unplaceable tries again when it changes. None: not known (then
    # it tries again after backoff).
    cluster: str | None = None


@dataclass(frozen=True)
class CapturedEvidence:
    """The capture of an incident's evidence is done (`CaptureEvidence` executed), so the
    restart may go on. What the captured rank states show is not here: the I/O layer
    judges them with the group's next observation, and `verdict` says what they showed
    (a consensus failure in them refines a RankDown into a Desynced)."""

    incident_id: str


@dataclass(frozen=True)
class RoleSettings:
    """What recovery needs from the spec for one role."""

    role: Role
    pods_per_group: int
    health: HealthSpec = field(default_factory=HealthSpec)
    recovery: RecoverySpec = field(default_factory=RecoverySpec)
    maintenance: MaintenanceSpec = field(default_factory=MaintenanceSpec)
    scheduling_timeout_seconds: float = 300.0

    @classmethod
    def from_spec(cls, spec: PDDeploymentSpec, role: Role) -> RoleSettings:
        """The settings of `role` in a PDDeployment spec."""
        r = spec.role(role)
        return cls(
            role,
            r.pods_per_group,
            spec.health,
            spec.recovery,
            spec.maintenance,
            float(r.placement.scheduling_timeout_seconds),
        )


@dataclass(frozen=True)
class GroupPlan:
    """The next record of a group and what to do to get there.

    `requeue_after`: plan again after this many seconds even without a new observation
    (0: at once, a transition needs no I/O); None: the next probe round is soon enough.
    """

    record: GroupRecord
    actions: tuple[Action, ...] = ()
    requeue_after: float | None = None


@dataclass(frozen=True)
class RolePlan:
    """The plans of every group of a role."""

    groups: Mapping[int, GroupPlan]
    # Groups whose actions run before the others' (spares admitted this round: in every
    # router before a broken group's requests are ended and retried).
    first: frozenset[int] = frozenset()

    def order(self) -> list[tuple[int, GroupPlan]]:
        """The groups' plans in the order their actions run."""
        return sorted(self.groups.items(), key=lambda kv: (kv[0] not in self.first, kv[0]))

    @property
    def degraded(self) -> bool:
        """A group is quarantined: the caller sets the `Degraded` condition."""
        return any(p.record.step is Step.QUARANTINED for p in self.groups.values())

    @property
    def quarantined(self) -> list[int]:
        """The quarantined groups, for the Degraded condition's message."""
        return sorted(i for i, p in self.groups.items() if p.record.step is Step.QUARANTINED)


@dataclass(frozen=True)
class RoleGuards:
    """What the role's guard rails allow one group this round (see `plan_role`)."""

    slot_granted: bool
    may_leave_service: bool
    restarting: int
    # Another group of the role serves (in service, moving, or a ready spare that would
    # take over): a rollout may take this one out of service.
    peer_in_service: bool = True
    # Why a group beyond replicas may not start retiring now (None: it may).
    retire_blocked: str | None = None

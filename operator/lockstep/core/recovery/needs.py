"""What the I/O layer must read and do for each group this round, as recovery says it.

The control round knows no step: it asks `needs(record)` what a group's record calls for
(probe it, read its leaders' in-flight counts, judge the capture its incident waits on,
keep the answers of its in-place restart, count its pods as a change of the cluster, give
it a disruption budget), and `next_rollout` which stale group a spec change rolls now.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lockstep.core.recovery.record import GroupRecord
from lockstep.core.recovery.steps import Step

# Steps in which the group's pods are being replaced: nothing of the epoch to probe.
_NOT_PROBED = frozenset({Step.RESTARTING_IN_PLACE, Step.DELETING, Step.WAITING_GONE, Step.CREATING})
# Steps of a group still looking for room: its pods come and go with its placement
# attempts, which are no change of the cluster for another group waiting for room (two
# unplaceable groups would otherwise wake each other forever).
_PLACING = frozenset(
    {Step.STARTING, Step.CREATING, Step.WAITING_PROBE, Step.UNSCHEDULABLE, Step.MOVING}
)
# Steps in which a group leaving service on purpose waits for its leaders' requests: a
# maintenance drain or hand-over, a scale-down, a serving group standing down to a spare.
_MAINTENANCE_DRAIN = frozenset({Step.DRAINING, Step.HANDING_OVER})
_LEAVING = frozenset({Step.RETIRING, Step.STANDING_DOWN})
# The order a spec change rolls the roles in (spares of either role before both).
ROLLOUT_ORDER = ("decode", "prefill")


@dataclass(frozen=True)
class GroupNeeds:
    """What one group's record asks of this round's I/O."""

    probe: bool  # the prober probes the group's current epoch
    inflight: bool  # read each leader's in-flight requests (a drain on purpose)
    capture: bool  # the open incident waits on its evidence capture: judge what it read
    restart_answers: bool  # an in-place restart was asked: keep what the agents answered
    placing: bool  # being placed: its pods are no change of the cluster for the others
    guarded: bool  # has a disruption budget (not quarantined, not a spare)
    settled: bool  # Healthy and not failing: a passing probe changes nothing
    quarantined: bool  # waits for a person (the Degraded condition, the metric)
    pair_probe: bool  # serving and Healthy: its KV hand-off with the other role is tried
    # Failing or in an open incident (Suspect, or from the verdict to re-admission; not
    # quarantined, which lasts): its peers' pair failures with other groups may be its
    # doing (`verdicts.pairs`).
    breaks_peers: bool


def needs(record: GroupRecord) -> GroupNeeds:
    """What `record` asks of this round (see `GroupNeeds`)."""
    step = record.step
    return GroupNeeds(
        probe=step not in _NOT_PROBED,
        inflight=(bool(record.maintenance) and step in _MAINTENANCE_DRAIN) or step in _LEAVING,
        capture=record.incident is not None and step is Step.CAPTURING_EVIDENCE,
        restart_answers=step is Step.RESTARTING_IN_PLACE,
        placing=step in _PLACING,
        # A quarantined group serves nothing and waits for a person, a spare serves
        # nothing: neither has a budget, so a drain takes their pods rather than wait
        # (the eviction API refuses a pod of a budget none of whose pods is ready).
        guarded=step is not Step.QUARANTINED and not record.spare,
        settled=step is Step.HEALTHY and not record.detection.failures,
        quarantined=step is Step.QUARANTINED,
        pair_probe=step is Step.HEALTHY and not record.spare,
        breaks_peers=not record.spare
        and (
            step is Step.SUSPECT
            or (record.incident is not None and step not in (Step.HEALTHY, Step.QUARANTINED))
        ),
    )


def next_rollout(
    stale: Sequence[tuple[str, int]], records: Iterable[GroupRecord]
) -> tuple[str, int] | None:
    """The one stale group of the deployment to roll now (a spec change, one group at a
    time): never while any group of either role is not Healthy, so a rollout takes one
    group out of service at a time. Spares roll first (they serve nothing), then decode
    before prefill (`ROLLOUT_ORDER`), lowest index first."""
    records = list(records)
    if not stale or any(rec.step is not Step.HEALTHY for rec in records):
        return None
    spare = {(str(rec.role), rec.index) for rec in records if rec.spare}
    order = {role: i for i, role in enumerate(ROLLOUT_ORDER)}
    return min(stale, key=lambda gid: (gid not in spare, order.get(gid[0], 0), gid[1]))

"""Shared service: whole-or-nothing placement. An epoch not wholly bound to nodes within
`schedulingTimeoutSeconds` is withdrawn whole (not a restart): its pods are deleted, so a
half-placed group holds no GPU. The next attempt waits until the cluster changes
(`GroupInput.cluster`: a node added, uncordoned or untainted, its GPUs, a pod gone), or
`UNPLACED_RETRY_SECONDS` for what lockstep cannot see; without that knowledge, it retries
after backoff. So a group that cannot be placed creates no pods while nothing changed."""

from __future__ import annotations

from collections.abc import Sequence

from lockstep.core.recovery import incidents
from lockstep.core.recovery.actions import (
    DeletePods,
)
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.record import Placement, refs
from lockstep.core.recovery.steps import (
    DELETE_GRACE_SECONDS,
    RECHECK_SECONDS,
    UNPLACED_RETRY_SECONDS,
    Reason,
    Step,
)
from lockstep.core.verdicts import GroupVerdict, PodView


def expired(r: Round) -> bool:
    """The current epoch's pods are not all bound to nodes in time: withdraw it
    (True). Counted from the epoch's start; the scheduler's reason is kept."""
    pods = [p for p in r.current_pods() if not p.deleting]
    unplaced = [p for p in pods if p.node is None]
    if not unplaced:
        if r.rec.placement.unschedulable:
            _set(r, unschedulable=None)
        return False
    why = unplaced_reason(unplaced)
    if why != r.rec.placement.unschedulable:
        _set(r, unschedulable=why)
    timeout = r.s.scheduling_timeout_seconds
    deadline = r.rec.epoch_started_at + timeout
    if r.now < deadline:
        r.again_in(deadline - r.now)
        return False
    withdraw(
        r,
        f"{len(unplaced)} of {r.s.pods_per_group} pod(s) of epoch {r.rec.epoch} not "
        f"placed within schedulingTimeoutSeconds={timeout:g}: {why}",
    )
    return True


def withdraw(r: Round, why: str) -> None:
    """Delete every pod of the group (a half-placed group holds GPUs and serves
    nothing) and retry a fresh epoch after backoff; not a restart."""
    n = r.rec.placement.withdrawals + 1
    b = r.s.recovery.backoff
    delay = max(min(b.base_seconds << min(n - 1, 32), b.max_seconds), RECHECK_SECONDS)
    if r.inp.cluster is not None:
        delay = max(delay, UNPLACED_RETRY_SECONDS)
        when = f"trying again when the cluster changes (at the latest in {delay:g}s)"
    else:
        when = f"retrying in {delay:g}s"
    r.event(
        Reason.UNSCHEDULABLE,
        f"epoch {r.rec.epoch} withdrawn whole: {why}; {when} (withdrawal {n})",
        warning=True,
    )
    incidents.set_action(r, f"epoch {r.rec.epoch} withdrawn (unschedulable): {why}")
    pods = r.pods()
    if pods:
        r.actions.append(DeletePods(refs(pods), DELETE_GRACE_SECONDS, restart=False))
    r.goto(
        Step.UNSCHEDULABLE,
        placement=Placement(
            withdrawals=n, withdrawn=refs(pods), retry_at=r.now + delay, unschedulable=why
        ),
    )
    r.requeue = RECHECK_SECONDS


def on_unschedulable(r: Round, v: GroupVerdict | None) -> None:
    doomed = {ref.uid for ref in r.rec.placement.withdrawn}
    left = [p for p in r.pods() if p.uid in doomed or p.epoch == r.rec.epoch]
    alive = [p for p in left if not p.deleting]
    if alive:
        r.actions.append(DeletePods(refs(alive), DELETE_GRACE_SECONDS, restart=False))
    if left:
        r.again_in(RECHECK_SECONDS)
        return
    retry_at = r.rec.placement.retry_at or r.now
    seen, now_seen = r.rec.placement.cluster, r.inp.cluster
    if now_seen is not None and seen is None:
        _set(r, cluster=now_seen)  # the cluster with the withdrawn pods gone
    elif now_seen is not None and now_seen != seen:
        r.event(Reason.UNSCHEDULABLE, "the cluster changed (a node or a pod): placing it again")
        retry_at = r.now
    if r.now < retry_at:
        r.again_in(retry_at - r.now)
        return
    r.goto(
        Step.CREATING,
        epoch=r.rec.epoch + 1,
        placement=r.rec.placement.model_copy(update={"withdrawn": (), "cluster": None}),
    )


def _set(r: Round, **changes: object) -> None:
    r.update(placement=r.rec.placement.model_copy(update=changes))


def unplaced_reason(pods: Sequence[PodView]) -> str:
    """The scheduler's own words for pods it did not place (or that it has not yet)."""
    for p in pods:
        if p.unschedulable:
            return f"{p.name}: {p.unschedulable}"
    return f"{', '.join(p.name for p in pods[:4])} not scheduled yet"

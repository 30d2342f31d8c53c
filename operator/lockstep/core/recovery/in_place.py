"""Concern: how a restart replaces the group's epoch. In place (every pod agent asked
to restart its container into the next epoch at the same moment), escalated to a
recreate when an agent refuses or stays silent, a pod vanishes or a container does not
come back; or a recreate (every pod deleted under its UID, new pods preferring other
nodes than the culprits')."""

from __future__ import annotations

from collections.abc import Sequence

from lockstep.core.recovery import incidents
from lockstep.core.recovery.actions import (
    RestartInPlace,
)
from lockstep.core.recovery.core import Round
from lockstep.core.recovery.record import baseline, refs
from lockstep.core.recovery.steps import RECHECK_SECONDS, SILENT_AGENT_SECONDS, Reason, Step
from lockstep.core.verdicts import GroupVerdict, PodView


def why_not_in_place(r: Round) -> str | None:
    """Why this attempt must recreate the group (None: restart it in place)."""
    rs, rec = r.s.recovery, r.rec
    if rs.mode == "Recreate":
        return "recovery.mode is Recreate"
    if rec.manual.rollout:
        return "a new pod template is rolled out (only new pods apply it)"
    window = rs.in_place.escalation_window_seconds
    last = rec.restart.last_in_place_at
    if last is not None and r.now - last < window:
        return (
            f"failed again {r.now - last:.0f}s after an in-place "
            f"restart (inPlace.escalationWindowSeconds={window})"
        )
    pods = in_place_pods(r)
    if len(pods) < r.s.pods_per_group:
        return f"{r.s.pods_per_group - len(pods)} pod(s) of the group are gone or going"
    bad = [p.name for p in pods if p.evicted or p.phase in ("Failed", "Succeeded")]
    if bad:
        return f"pod(s) {', '.join(bad)} cannot restart in place (evicted or ended)"
    return None


def in_place_pods(r: Round) -> list[PodView]:
    """The pods an in-place restart asks: those of the current epoch, and those an
    earlier round already relabelled with the next one (its record was lost)."""
    epochs = (r.rec.epoch, r.rec.epoch + 1)
    pods = (p for p in r.pods() if p.epoch in epochs and not p.deleting)
    return sorted(pods, key=lambda p: p.name)


def restart_in_place(r: Round, attempts: int) -> None:
    pods = in_place_pods(r)
    target = r.rec.epoch + 1
    r.update(restart=r.rec.restart.model_copy(update={"mode": "InPlace"}))
    # A pod relabelled by a lost round may have restarted already: count from the
    # epoch's baseline for it (a restart since then is taken as the one asked for).
    # A container that is down (restarting after its ranks exited, as they do on a
    # divergence) has no agent to ask yet: it is asked once it runs again.
    running = [p for p in pods if p.container_running]
    asked = {
        p.uid: (
            p.restart_count
            if p.epoch == r.rec.epoch
            else r.rec.restart_baseline.get(p.uid, p.restart_count)
        )
        for p in running
    }
    reason = r.rec.incident.id if r.rec.incident else "restart"
    incidents.set_action(
        r, f"restart the whole group in place into epoch {target} (attempt {attempts})"
    )
    r.event(
        Reason.RESTARTING_IN_PLACE,
        f"asking the agents of {len(pods)} pod(s) to restart into epoch {target}",
    )
    if running:
        r.actions.append(RestartInPlace(refs(running), target, reason))
    r.goto(
        Step.RESTARTING_IN_PLACE,
        epoch=target,
        restart=r.rec.restart.model_copy(
            update={
                "mode": "InPlace",
                "old_pods": refs(pods),
                "asked_counts": asked,
                "last_in_place_at": r.now,
                "avoid_nodes": (),
            }
        ),
    )
    r.requeue = RECHECK_SECONDS


def recreate(
    r: Round,
    culprits: set[str],
    *,
    avoid: Sequence[str] = (),
    other_slot: bool = False,
) -> None:
    """Delete the group's pods, then create the next epoch (avoiding the culprits' nodes
    and `avoid` when it can). `other_slot`: under the group's other pod names (a move
    off a node being drained: `kubectl drain` retries its evictions by pod name, and would
    evict a new pod that took an old one's name)."""
    # Snapshot the pods to delete before the first delete: every retry of the delete
    # then names the same UIDs, whatever the API server shows by then.
    nodes = {p.node for p in r.pods() if p.name in culprits and p.node} | set(avoid)
    slot = r.rec.slot
    if other_slot:  # the slot none of the pods being deleted has (a failed move's too)
        used = {p.slot for p in r.pods()}
        slot = next((s for s in (1 - r.rec.slot, r.rec.slot) if s not in used), 1 - slot)
    r.goto(
        Step.DELETING,
        slot=slot,
        restart=r.rec.restart.model_copy(
            update={
                "mode": "Recreate",
                "old_pods": refs(r.pods()),
                "force_deleted": False,
                "avoid_nodes": tuple(sorted(nodes)),
            }
        ),
    )


def on_restarting_in_place(r: Round, v: GroupVerdict | None) -> None:
    by_uid = {p.uid: p for p in r.pods()}
    old = r.rec.restart.old_pods
    asked = dict(r.rec.restart.asked_counts)
    failures = r.inp.restart_failures
    gone = [ref.name for ref in old if ref.uid not in by_uid or by_uid[ref.uid].deleting]
    if gone:
        escalate(r, f"pod(s) {', '.join(gone)} went away during the in-place restart", set(gone))
        return
    refused = {
        ref.name: failures[ref.uid]
        for ref in old
        if ref.uid in asked and ref.uid in failures and ref.uid not in r.inp.restart_unreachable
    }
    silent = {
        ref.name: failures[ref.uid]
        for ref in old
        if ref.uid in asked and ref.uid in failures and ref.uid in r.inp.restart_unreachable
    }
    if silent and r.now - r.rec.step_since >= SILENT_AGENT_SECONDS:
        refused.update(silent)
    if refused:
        escalate(
            r,
            "the agent of "
            + "; ".join(
                f"{name} did not accept the restart ({why})"
                for name, why in sorted(refused.items())
            ),
            set(refused),
        )
        return
    # An agent not answering yet (its container was just starting again) is asked
    # again next round; one that stays silent escalates after SILENT_AGENT_SECONDS.
    retry = {ref.uid for ref in old if ref.name in silent}
    ask = [
        by_uid[ref.uid]
        for ref in old
        if ref.uid not in asked and ref.uid not in retry and by_uid[ref.uid].container_running
    ]
    if ask:
        reason = r.rec.incident.id if r.rec.incident else "restart"
        r.actions.append(RestartInPlace(refs(ask), r.rec.epoch, reason))
        asked.update({p.uid: p.restart_count for p in ask})
    if retry or ask:
        kept = {u: n for u, n in asked.items() if u not in retry}
        r.update(restart=r.rec.restart.model_copy(update={"asked_counts": kept}))
    asked = dict(r.rec.restart.asked_counts)
    waiting = [
        ref.name
        for ref in old
        if ref.uid not in asked
        or by_uid[ref.uid].restart_count <= asked[ref.uid]
        or by_uid[ref.uid].epoch != r.rec.epoch
        # The count moves when the old container ends; the new one may still wait.
        or not by_uid[ref.uid].container_running
    ]
    if not waiting:
        restarted(r, [by_uid[ref.uid] for ref in old], "restarted in place")
        return
    timeout = r.s.recovery.in_place.restart_timeout_seconds
    if r.now - r.rec.step_since >= timeout:
        escalate(
            r,
            f"container(s) of {', '.join(waiting)} did not restart within "
            f"inPlace.restartTimeoutSeconds={timeout}",
            set(waiting),
        )
        return
    r.again_in(min(RECHECK_SECONDS, r.rec.step_since + timeout - r.now))


def restarted(r: Round, pods: Sequence[PodView], what: str) -> None:
    """Every pod of the new epoch is there: wait for its deep probe."""
    attempts = r.rec.incident.attempts if r.rec.incident else 0
    r.event(
        Reason.RESTARTED,
        f"{what} as epoch {r.rec.epoch} ({r.rec.restart.mode}, attempt {attempts})",
    )
    r.goto(
        Step.WAITING_PROBE,
        epoch_started_at=r.now,
        clear_failures=True,
        restart_baseline=baseline(pods, r.rec.epoch),
    )
    r.requeue = None


def escalate(r: Round, why: str, culprits: set[str]) -> None:
    """An in-place restart that cannot finish: recreate the group instead (the same
    attempt: the restart was counted when it began)."""
    attempts = r.rec.incident.attempts if r.rec.incident else 0
    r.update(restart=r.rec.restart.model_copy(update={"mode": "Recreate"}))
    incidents.note_escalation(r, f"in-place restart escalated: {why}")
    incidents.set_action(r, f"in-place restart escalated to Recreate (attempt {attempts}): {why}")
    r.event(Reason.ESCALATED, f"in-place restart escalated to Recreate: {why}", warning=True)
    recreate(r, culprits)

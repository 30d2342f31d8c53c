"""The group's pods as the judge sees them: each pod's view from the Kubernetes object
(`pod_view_from_k8s`: readiness gate, container restarts, a runtime's refusal, whether
the scheduler could place it), and the pod-level facts (`pods_down`, `not_up_in_time`,
why the pods of an epoch cannot be a working group)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lockstep.api import constants as c
from lockstep.api.objects import labels, meta
from lockstep.core.verdicts.facts import (
    GroupObservation,
    GroupVerdict,
    PodView,
    Signal,
    Verdict,
    clip_evidence,
)

# ----------------------------------------------------------------------- from Kubernetes


def pod_view_from_k8s(pod: Mapping[str, Any]) -> PodView:
    """The facts `classify_group` and the recovery planner need from a Kubernetes Pod dict.

    Restart counts are summed over every container (an init or sidecar restart breaks the
    rendezvous just the same); "running" means every regular container is running.
    """
    m, pod_labels = meta(pod), labels(pod)
    status = pod.get("status") or {}
    conditions = {
        cond.get("type"): cond
        for cond in status.get("conditions") or []
        if isinstance(cond, Mapping)
    }
    statuses = [s for s in status.get("containerStatuses") or [] if isinstance(s, Mapping)]
    phase = str(status.get("phase") or "Pending")
    disruption = conditions.get("DisruptionTarget", {})
    gate = conditions.get(c.READINESS_GATE)
    return PodView(
        name=str(m.get("name", "")),
        uid=str(m.get("uid", "")),
        epoch=_label_int(pod_labels, c.LABEL_EPOCH),
        rank=_label_int(pod_labels, c.LABEL_RANK),
        phase=phase,
        deleting=m.get("deletionTimestamp") is not None,
        # Kubelet eviction leaves reason Evicted; API-initiated eviction and preemption
        # set the DisruptionTarget condition before the pod goes.
        evicted=status.get("reason") == "Evicted" or disruption.get("status") == "True",
        container_running=bool(statuses)
        and all("running" in (s.get("state") or {}) for s in statuses),
        restart_count=sum(
            _int(s.get("restartCount", 0))
            for s in [*statuses, *(status.get("initContainerStatuses") or [])]
            if isinstance(s, Mapping)
        ),
        ready=conditions.get("Ready", {}).get("status") == "True",
        gate=None if gate is None else gate.get("status") == "True",
        node=(pod.get("spec") or {}).get("nodeName") or None,
        unschedulable=_unschedulable(conditions.get("PodScheduled")),
        slot=1 if pod_labels.get(c.LABEL_SLOT) == "1" else 0,
        **_refusal([*(status.get("initContainerStatuses") or []), *statuses]),
    )


# The termination messages of lockstep's runtime refusing to start
# (`lockstep_sglang.termination`, `lockstep_sglang.install`).
REFUSAL_REASONS = ("RuntimeRefused", "RuntimeInstallFailed")


def _refusal(statuses: Sequence[Any]) -> dict[str, Any]:
    """`refusal` and `refusal_restart` of a pod: the newest termination message of a
    container whose runtime refused to start (its state or its last state)."""
    for s in statuses:
        if not isinstance(s, Mapping):
            continue
        for key in ("state", "lastState"):
            ended = (s.get(key) or {}).get("terminated") or {}
            message = str(ended.get("message") or "").strip()
            if message.split(":", 1)[0] in REFUSAL_REASONS:
                return {
                    "refusal": clip_evidence(message.splitlines()[0]),
                    "refusal_restart": _int(s.get("restartCount", 0)),
                }
    return {}


def _unschedulable(cond: Mapping[str, Any] | None) -> str | None:
    if not cond or cond.get("status") != "False":
        return None
    return clip_evidence(f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or ''}")


def not_up_in_time(epoch: int, now: float, why: str) -> GroupVerdict:
    """A starting epoch that passed no deep probe within its startup grace: Unknown (no
    rank state said what is wrong), decided by the recovery planner's deadline."""
    return GroupVerdict(
        verdict=Verdict.UNKNOWN,
        immediate=True,
        reason=clip_evidence(why),
        epoch=epoch,
        observed_at=now,
        evidence={"startup": clip_evidence(why)},
    )


def pods_down(obs: GroupObservation) -> bool:
    """The pods alone show a rank down (missing, deleted, evicted, failed, restarted, not
    running): worth a judgement even without a new probe sample."""
    return bool(_pod_problems(obs, set(), []))


# ---------------------------------------------------------------------------- helpers


def _pod_problems(obs: GroupObservation, signals: set[Signal], culprits: list[str]) -> list[str]:
    """Why the pods of the current epoch cannot be a working group (empty: they can);
    the pods at fault are appended to `culprits`."""
    problems: list[str] = []
    current = [p for p in obs.pods if p.epoch == obs.epoch]
    if len(current) < obs.expected_pods:
        signals.add(Signal.POD_MISSING)
        have = sorted(p.rank for p in current if p.rank is not None)
        problems.append(
            f"{obs.expected_pods - len(current)} of {obs.expected_pods} pods missing "
            f"(ranks present: {have})"
        )
    for pod in current:
        baseline = obs.restart_baseline.get(pod.uid, 0)
        if pod.deleting:
            signals.add(Signal.POD_DELETED)
            problems.append(f"pod {pod.name} is being deleted")
            culprits.append(pod.name)
        elif pod.evicted:
            signals.add(Signal.POD_EVICTED)
            problems.append(f"pod {pod.name} was evicted")
            culprits.append(pod.name)
        elif pod.phase in ("Failed", "Succeeded"):
            signals.add(Signal.POD_FAILED)
            problems.append(f"pod {pod.name} is {pod.phase}")
            culprits.append(pod.name)
        elif pod.restart_count > baseline:
            signals.add(Signal.CONTAINER_RESTARTED)
            problems.append(
                f"pod {pod.name} restarted (restart count {baseline} -> {pod.restart_count})"
            )
            culprits.append(pod.name)
        elif not pod.container_running:
            # A pod that never ran (scheduling, image pull) is starting, not down: the
            # planner's startup deadline covers it.
            if pod.phase == "Pending":
                signals.add(Signal.POD_NOT_STARTED)
            else:
                signals.add(Signal.CONTAINER_NOT_RUNNING)
                problems.append(f"pod {pod.name}: container not running")
                culprits.append(pod.name)
    return problems


def _int(value: Any) -> int:
    # bool is an int in Python; a rank or counter given as true/false is malformed.
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)


def _label_int(labels: Mapping[str, Any], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, TypeError, ValueError):
        return None

"""A pod's status as a kubelet reports it: container statuses, conditions, phase, and
the status patch that carries them.

Stands in for the real kubelet's status computation (`generateAPIPodStatus` and
`getPhase` in `pkg/kubelet/kubelet_pods.go`, the conditions of `pkg/kubelet/status`) and
its status manager (`pkg/kubelet/status/status_manager.go`: send what changed, patch the
status subresource with the pod's UID as a precondition, send an unchanged status again
now and then). Conditions are merged by type: the kubelet writes only the ones it owns
(PodScheduled, Initialized, ContainersReady, Ready), so the conditions of readiness gates
(the operator's) are never overwritten.

Everything but `PodStatusManager.report` (one PATCH) is pure; the caller says what time it
is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from lockstep_dev.localcluster.kubelet.common import FIELD_MANAGER, HOST_IP, Obj, checked, rfc3339

RESEND_SECONDS = 30.0
"""An unchanged status is sent again after this long, in case another writer replaced it."""

Transitions = dict[str, tuple[bool, str]]
"""Condition type -> (whether it holds, when that last changed as an RFC 3339 time)."""


def exit_code(returncode: int) -> tuple[int, int | None]:
    """`(exitCode, signal)` as a container runtime reports them (128 + signal)."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


# Where a container's process writes its termination message (the runtime's variable).
TERMINATION_ENV = "LOCKSTEP_TERMINATION_LOG"
TERMINATION_MAX_BYTES = 4096  # the kubelet's cap


def termination_message(path: Path) -> str | None:
    """The termination message a container's process left (None: none, or unreadable)."""
    try:
        data = path.read_bytes()[:TERMINATION_MAX_BYTES]
    except OSError:
        return None
    text = data.decode(errors="replace").strip()
    return text or None


def terminated_state(
    returncode: int, *, started_at: str, finished_at: str, pid: int, message: str | None = None
) -> Obj:
    """A container's `terminated` state for a process that exited with `returncode`
    (a subprocess's: negative for a signal), with its termination message if it left
    one."""
    code, sig = exit_code(returncode)
    terminated: Obj = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": started_at,
        "finishedAt": finished_at,
        "containerID": f"process://{pid}",
    }
    if sig is not None:
        terminated["signal"] = sig
    if message:
        terminated["message"] = message
    return terminated


@dataclass(frozen=True)
class ContainerView:
    """What a pod status needs to know about one container."""

    name: str
    image: str
    state: Obj
    last_state: Obj
    restart_count: int
    ready: bool
    started: bool
    container_id: str = ""

    def status(self) -> Obj:
        out: Obj = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "state": self.state,
            "lastState": self.last_state,
            "restartCount": self.restart_count,
            "ready": self.ready,
            "started": self.started,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def pod_phase(containers: Sequence[ContainerView], restart_policy: str) -> str:
    """Pending until a container has started; Succeeded/Failed once every container is
    terminated for good (only without restartPolicy Always); Running otherwise."""
    if (
        containers
        and restart_policy != "Always"
        and all("terminated" in c.state for c in containers)
    ):
        ok = all(c.state["terminated"]["exitCode"] == 0 for c in containers)
        return "Succeeded" if ok else "Failed"
    if any(c.started or c.restart_count > 0 or c.last_state for c in containers):
        return "Running"
    return "Pending"


def gate_states(pod: Mapping[str, Any]) -> dict[str, bool]:
    """Each readiness gate of the pod and whether its condition is True."""
    conditions = {
        c["type"]: c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    }
    gates = (pod.get("spec") or {}).get("readinessGates") or []
    return {g["conditionType"]: conditions.get(g["conditionType"], False) for g in gates}


def pod_conditions(
    pod: Mapping[str, Any],
    containers: Sequence[ContainerView],
    pending_init: Sequence[str] = (),
) -> list[tuple[str, bool, str, str]]:
    """`(type, status, reason, message)` of the conditions a kubelet owns. Initialized
    waits for every init container (`pending_init`: those not completed yet); Ready
    needs every container ready and every readiness gate True; the gates' own
    conditions belong to whoever sets them and are never written here."""
    not_ready = [c.name for c in containers if not c.ready]
    containers_ready = not not_ready
    gates = gate_states(pod)
    false_gates = sorted(g for g, ok in gates.items() if not ok)
    if not containers_ready:
        reason, message = "ContainersNotReady", f"containers with unready status: {not_ready}"
    elif false_gates:
        reason = "ReadinessGatesNotReady"
        message = f"corresponding condition of pod readiness gate {false_gates} is not True"
    else:
        reason, message = "", ""
    ready = containers_ready and not false_gates
    initialized = not pending_init
    init_message = "" if initialized else f"containers with incomplete status: {list(pending_init)}"
    return [
        ("PodScheduled", True, "", ""),
        (
            "Initialized",
            initialized,
            "" if initialized else "ContainersNotInitialized",
            init_message,
        ),
        ("ContainersReady", containers_ready, "" if containers_ready else reason, ""),
        ("Ready", ready, reason, message),
    ]


def condition_objects(
    conditions: Sequence[tuple[str, bool, str, str]],
    transitions: Mapping[str, tuple[bool, str]],
    now: str,
) -> tuple[list[Obj], Transitions]:
    """The status conditions for `pod_conditions`' tuples, and the transitions after them:
    a condition keeps its `lastTransitionTime` until it changes (`now` then)."""
    after = dict(transitions)
    out: list[Obj] = []
    for kind, holds, reason, message in conditions:
        previous = after.get(kind)
        if previous is None or previous[0] != holds:
            after[kind] = (holds, now)
        condition: Obj = {
            "type": kind,
            "status": "True" if holds else "False",
            "lastProbeTime": None,
            "lastTransitionTime": after[kind][1],
        }
        # null deletes a field in a strategic merge patch: a condition that holds
        # again keeps no stale reason or message from when it did not.
        condition["reason"] = reason or None
        condition["message"] = message or None
        out.append(condition)
    return out, after


def build_pod_status(
    pod: Mapping[str, Any],
    containers: Sequence[ContainerView],
    init_containers: Sequence[ContainerView],
    pending_init: Sequence[str],
    *,
    restart_policy: str,
    pod_ip: str,
    start_time: str,
    transitions: Mapping[str, tuple[bool, str]],
    now: str,
) -> tuple[Obj, Transitions]:
    """The status a kubelet reports for `pod` (its phase, addresses, conditions and
    container statuses), and the condition transitions after it. `pending_init`: the
    init containers that have not completed yet."""
    conditions, after = condition_objects(
        pod_conditions(pod, containers, pending_init), transitions, now
    )
    status: Obj = {
        "phase": pod_phase(containers, restart_policy),
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start_time,
        "conditions": conditions,
        "containerStatuses": [v.status() for v in containers],
    }
    if init_containers:
        status["initContainerStatuses"] = [v.status() for v in init_containers]
    return status, after


class PodStatusManager:
    """Reports the status of one pod incarnation: patches it when it changed, and again
    every `RESEND_SECONDS` when it did not."""

    def __init__(
        self, namespace: str, name: str, uid: str, *, pod_ip: str, restart_policy: str
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.uid = uid
        self.pod_ip = pod_ip
        self.restart_policy = restart_policy
        self.start_time = rfc3339(time.time())
        self._transitions: Transitions = {}
        self._last_sent: Obj | None = None
        self._last_sent_at = 0.0

    def report(
        self,
        http: httpx.Client,
        pod: Mapping[str, Any],
        containers: Sequence[ContainerView],
        init_containers: Sequence[ContainerView],
        pending_init: Sequence[str],
    ) -> None:
        """Patch the pod's status when it changed (or is due again); a pod that is gone,
        or is another incarnation now (404, 409), is left alone."""
        status, self._transitions = build_pod_status(
            pod,
            containers,
            init_containers,
            pending_init,
            restart_policy=self.restart_policy,
            pod_ip=self.pod_ip,
            start_time=self.start_time,
            transitions=self._transitions,
            now=rfc3339(time.time()),
        )
        # Unchanged status is sent again now and then, in case another writer replaced it.
        if status == self._last_sent and time.monotonic() - self._last_sent_at < RESEND_SECONDS:
            return
        # The uid in the patch is a precondition: a pod recreated under the same name
        # (the next epoch) never receives this incarnation's status.
        response = http.patch(
            f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status",
            headers={"Content-Type": "application/strategic-merge-patch+json"},
            params={"fieldManager": FIELD_MANAGER},
            json={"metadata": {"uid": self.uid}, "status": status},
        )
        if response.status_code in (404, 409):
            return
        checked(response, f"status of pod {self.namespace}/{self.name}")
        self._last_sent = status
        self._last_sent_at = time.monotonic()

"""What a drill measures: `DrillResult` and the figures computed into it.

Every drill returns figures: verdict, time to detect (from the injection and from the
first failed probe), time to recover, requests sent and failed per group (and for the
affected group before and after its drain), restarts per group, the time the affected
group spent in each recovery step, and the incidents. `passed` is True only when the
scenario's expected outcome happened.

Through the router (`router=True`) the figures also say, from the stand-ins' request
logs, how many requests the router sent to the affected group while it was drained (must
be none), to the other groups meanwhile, and to the affected group after its
re-admission (must be some), and how many requests failed through the router before the
drain (the detection window) and after it (must be none).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lockstep.api import constants as c
from lockstep.api.objects import parse_time
from lockstep_dev.drills.deployment import AFFECTED, NAME, NAMESPACE
from lockstep_dev.traffic import ROUTER, Arrival, Traffic, request_log_arrivals


def ts(rfc3339: str | None) -> float | None:
    """RFC 3339 (as the operator writes it) to a UNIX time."""
    return parse_time(rfc3339)


@dataclass
class DrillResult:
    """What a drill saw; `passed` says whether the expected outcome happened."""

    scenario: str
    passed: bool = False
    reason: str = ""
    engine: str = "standin"
    time_to_ready_s: float | None = None  # apply -> every group healthy (and routed)
    # apply -> each group Healthy in status (sampled every ~0.25 s)
    ready_s: dict[str, float] = field(default_factory=dict)
    memory_mib: dict[str, float] = field(default_factory=dict)  # PSS per pod, once ready
    verdict: str | None = None
    injected_at: float | None = None
    time_to_detect_s: float | None = None  # injection -> verdict
    probe_time_to_detect_s: float | None = None  # first failed probe -> verdict (operator)
    time_to_recover_s: float | None = None  # verdict -> re-admission (operator share)
    requests: dict[str, dict[str, int]] = field(default_factory=dict)
    affected_failed_before_drain: int = 0
    affected_failed_after_drain: int = 0
    other_groups_failed: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    # The spec's recovery.mode, and how the affected group was actually restarted.
    recovery_mode: str = "InPlace"
    restart_mode: str | None = None
    # Seconds the affected group spent in each recovery step after the injection (from
    # the records sampled every ~0.25 s while waiting; steps shorter than that may miss).
    phases: dict[str, float] = field(default_factory=dict)
    incidents: list[dict[str, Any]] = field(default_factory=list)
    # The `sequence` scenario: the figures of each incident, in order.
    steps: list[dict[str, Any]] = field(default_factory=list)
    # Warning Events on the deployment during the slow drill (must be 0).
    warning_events: int = 0
    # The slow drill, per step length: {"step_s", "observed_s", "restarts",
    # "warning_events", "incidents", "states", "failed_probes_seen", "messages"} (the
    # group states, failed probes and status messages seen while the steps ran).
    slow: list[dict[str, Any]] = field(default_factory=list)
    # Every failed request (latency: how long the client waited), seconds after the
    # first injection.
    failed_requests: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    # Through the router (router=True): requests failed, from the stand-ins' logs which
    # groups received what, and the drain window those counts refer to.
    router: bool = False
    router_failed_before_drain: int = 0
    router_failed_after_drain: int = 0
    affected_received_while_drained: int = 0
    affected_received_after_readmission: int = 0
    others_received_while_drained: int = 0
    drained_for_s: float | None = None
    router_stale_workers: list[str] = field(default_factory=list)  # URLs of no live pod
    # The maintenance drills (node-drain, unplaceable): their figures (see the scenario).
    maintenance: dict[str, Any] = field(default_factory=dict)
    # The scale drill: one entry per `kubectl scale` of a role's PDRoleScale.
    scaling: list[dict[str, Any]] = field(default_factory=list)
    # Through the router, per incident: the requests it caught and how they ended, the
    # longest wait past the verdict, the streams it caught, the serving groups' loads.
    failover: list[dict[str, Any]] = field(default_factory=list)
    # The ha drill: takeover times and writes from a woken former leader.
    ha: dict[str, Any] = field(default_factory=dict)
    # A drill with recovery.suspectNodes (`drills.suspects`): {"nodes": suspect node ->
    # the incidents whose outlier ran there, "cordoned": the nodes the deployment
    # cordoned, "cordoned_at": when the first suspect node was (its NodeCordoned Event)}.
    suspects: dict[str, Any] = field(default_factory=dict)
    # The pd-path drill's healthy run before its faults (`soak_s`): verdicts, the pair
    # probe's Events and tries, and the probe requests each group served.
    soak: dict[str, Any] = field(default_factory=dict)
    # A drill watched by a real Prometheus (`prometheus=`, `drills.monitoring`): the
    # alerts that fired (seconds after the injection), the dashboard's queries.
    prometheus: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def judge_incident(r: DrillResult, inc: Mapping[str, Any]) -> None:
    """The incident's verdict, restart mode and times into the result."""
    if not inc:
        return
    r.verdict = inc["verdict"]
    r.restart_mode = inc.get("restartMode")
    detected = ts(inc.get("detectedTime"))
    if detected is not None and r.injected_at is not None:
        r.time_to_detect_s = round(detected - r.injected_at, 3)
    r.probe_time_to_detect_s = inc.get("timeToDetectSeconds")
    r.time_to_recover_s = inc.get("timeToRecoverSeconds")


def restarts(status: Mapping[str, Any]) -> dict[str, int]:
    """Restarts per group, from the deployment's status."""
    out = {}
    for role in c.ROLES:
        for g in (status.get(role) or {}).get("groups") or []:
            out[f"{role}/{g['index']}"] = int(g.get("restarts", 0))
    return out


def phases(
    samples: Sequence[tuple[float, Mapping[str, str]]], injected_at: float | None
) -> dict[str, float]:
    """Time in each step of the affected group from the first step change after the
    injection until it was Healthy again (summed when a step recurs), from the
    (time, group -> step) samples."""
    if injected_at is None:
        return {}
    out: dict[str, float] = {}
    last: tuple[float, str] | None = None
    for at, steps in samples:
        if at < injected_at:
            continue
        step = steps.get(AFFECTED, "Healthy")
        if last is not None and step != last[1]:
            if last[1] != "Healthy":
                out[last[1]] = round(out.get(last[1], 0.0) + at - last[0], 2)
            last = (at, step)
            if step == "Healthy":
                break
        elif last is None:
            last = (at, step)
    return out


def failed_requests(traffic: Traffic, origin: float) -> list[dict[str, Any]]:
    """Every failed request with its latency (hanging ones end at the client's
    timeout), relative to `origin` (the first injection); at most the last 50."""
    failed = traffic.failures()
    return [
        {
            "group": o.group,
            "sent_s": round(o.sent_at - origin, 2),
            "latency_s": round(o.latency_s, 2),
            "error": (o.error or "")[:160],
        }
        for o in failed[-50:]
    ]


def group_figures(
    r: DrillResult, traffic: Traffic, drained_at: float | None, faulted: Sequence[str]
) -> None:
    """Requests straight to each group's leader: sent and failed per group, failed on
    the groups the fault did not go into, and on the affected group around its drain."""
    r.requests = {
        k: {"sent": s.sent, "failed": s.failed} for k, s in sorted(traffic.stats().items())
    }
    r.other_groups_failed = sum(s.failed for k, s in traffic.stats().items() if k not in faulted)
    if r.injected_at is not None:
        drained = drained_at or time.time()
        before = traffic.stats(r.injected_at, drained).get(AFFECTED)
        after = traffic.stats(drained).get(AFFECTED)
        r.affected_failed_before_drain = before.failed if before else 0
        r.affected_failed_after_drain = after.failed if after else 0


def router_figures(
    r: DrillResult,
    traffic: Traffic,
    drained_at: float | None,
    readmitted_at: float | None,
    kubelet_root: Path,
) -> None:
    """Failures through the router around the drain, and which groups the router sent
    requests to while the affected one was drained (from the stand-ins' logs)."""
    r.requests = {
        k: {"sent": s.sent, "failed": s.failed} for k, s in sorted(traffic.stats().items())
    }
    if r.injected_at is None:
        return
    drained = drained_at or time.time()
    before = traffic.stats(r.injected_at, drained).get(ROUTER)
    after = traffic.stats(drained).get(ROUTER)
    r.router_failed_before_drain = before.failed if before else 0
    r.router_failed_after_drain = after.failed if after else 0
    # Requests through the router after the drain reached the other groups or failed.
    r.other_groups_failed = r.router_failed_after_drain
    if drained_at is None:
        return
    readmitted = readmitted_at or time.time()
    r.drained_for_s = round(readmitted - drained_at, 3)
    arrivals = request_log_arrivals(kubelet_root, NAMESPACE, NAME)
    role, index = AFFECTED.split("/")

    def affected(a: Arrival) -> bool:
        return bool(a.role == role and a.group == int(index))

    during = [a for a in arrivals if drained_at <= a.at < readmitted]
    r.affected_received_while_drained = sum(1 for a in during if affected(a))
    r.others_received_while_drained = sum(
        1 for a in during if not affected(a) and a.role == "decode"
    )
    if readmitted_at is not None:
        r.affected_received_after_readmission = sum(
            1 for a in arrivals if affected(a) and a.at >= readmitted_at
        )


def group_seconds_short(samples: Sequence[tuple[float, int]], since: float = 0.0) -> float:
    """Capacity lost: the groups a role served below its wanted count, integrated over
    time, from (time, groups short) samples at or after `since`."""
    mine = [(t, n) for t, n in samples if t >= since]
    return sum(n * (nxt - at) for (at, n), (nxt, _) in itertools.pairwise(mine))


def out_of_service(samples: Sequence[tuple[float, bool]]) -> float:
    """Seconds without a serving leader, from (time, serving) samples."""
    total = 0.0
    for (at, serving), (nxt, _) in itertools.pairwise(samples):
        if not serving:
            total += nxt - at
    if samples and not samples[-1][1]:
        total += 1e-3  # ended out of service: never 0
    return total

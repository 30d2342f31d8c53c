"""One incident in decode/0 recovered by a whole-group restart, and the checks it must
pass: the verdict, the restart in the expected mode (the same pods each restarted once
more in place, or every pod replaced), and through the router, that the router sent the
drained group nothing and sends it requests again, and what the requests it caught saw
(`lockstep_dev.drills.failover`). Most scenarios are one or more of these."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

from lockstep.api import constants as c
from lockstep.clients.router_workers import serving_workers
from lockstep_dev.drills.deployment import AFFECTED, NAME, NAMESPACE, RecoveryMode
from lockstep_dev.drills.failover import CaughtStreams, failover_checks, streams_on
from lockstep_dev.faults import FaultKind, highest_rank
from lockstep_dev.traffic import ROUTER, router_endpoint

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

Checks = list[tuple[bool, str]]


def expect_restart(
    drill: Drill, verdict: str, kind: FaultKind, mode: RecoveryMode | None = None
) -> None:
    """Inject, wait for the verdict and the re-admission, and judge the restart: in
    `mode` (default: the deployment's), the same pods each restarted once more in
    place, or every pod replaced."""
    drill.conclude(restart_checks(drill, verdict, kind, mode))


def restart_checks(
    drill: Drill,
    verdict: str,
    kind: FaultKind,
    mode: RecoveryMode | None = None,
    step_seconds: float | None = None,
) -> Checks:
    """One incident of `expect_restart`: inject, wait, and the checks it must pass."""
    mode = mode or drill.recovery_mode
    before = drill.uids(AFFECTED)
    counts = restart_counts(drill, AFFECTED)
    epoch = int(drill.group(AFFECTED).get("epoch", 0))
    seen = drill.incident_count(AFFECTED)
    drill.drained_at = drill.readmitted_at = None
    # The pod every fault but `slow` goes into (the group's last), its node and rank.
    victim = drill.group_pods(AFFECTED)[-1]
    # Through the router, the incident also catches a long stream on decode/0.
    streams = streams_on(drill, AFFECTED) if drill.router else CaughtStreams()
    drill.result.injected_at = time.time()
    drill.first_injection = drill.first_injection or drill.result.injected_at
    if step_seconds is None:
        drill.inject(kind)
    else:
        drill.inject(kind, step_seconds=step_seconds)
    drill.wait(
        lambda: drill.incident(AFFECTED, closed=False, after=seen),
        # A stuck step is Hung only past the step bound (minSeconds: 90 by default).
        60 if step_seconds is None else 240,
        "a verdict on decode/0",
    )
    opened = drill.incident(AFFECTED, closed=False, after=seen) or {}
    drill.note(f"verdict {opened.get('verdict')}: drain, evidence, whole-group restart")
    inc = drill.wait(
        lambda: drill.incident(AFFECTED, after=seen), drill.timeout_s, "decode/0 re-admitted"
    )
    if inc.get("verdict") != opened.get("verdict"):
        drill.note(
            f"verdict refined to {inc.get('verdict')} from the captured evidence: "
            f"{str(inc.get('evidence', '')).splitlines()[0][:160]}"
        )
    drill.note(f"decode/0 re-admitted in epoch {drill.group(AFFECTED).get('epoch')}")
    drill.judge_incident(inc)
    after = drill.uids(AFFECTED)
    checks = [
        (inc["verdict"] == verdict, f"verdict {inc['verdict']}, expected {verdict}"),
        (
            inc.get("restartMode") == mode,
            f"restarted {inc.get('restartMode')}, expected {mode}",
        ),
    ]
    checks += outlier_checks(kind, inc, victim)
    if mode == "InPlace":
        now = restart_counts(drill, AFFECTED)
        checks += [
            (int(drill.group(AFFECTED)["epoch"]) == epoch + 1, "the group is in the next epoch"),
            (after == before, "the same pods (UIDs) came back"),
            (
                # Exactly once: the ranks' own exit after a divergence holds the
                # container (the launcher's hold) until the operator's restart.
                all(now.get(uid, 0) == n + 1 for uid, n in counts.items()),
                f"every container restarted exactly once (restart counts {counts} -> {now})",
            ),
        ]
    else:
        # An escalated in-place attempt took one epoch; the recreate the next.
        checks += [
            (int(drill.group(AFFECTED)["epoch"]) > epoch, "the group is in a later epoch"),
            (len(after) == 2 and not after & before, "every pod of the group was recreated"),
        ]
    if drill.router:
        checks += router_checks(drill)
        checks += failover_checks(drill, inc, streams)
    return checks


def outlier_checks(kind: FaultKind, inc: Mapping[str, Any], victim: Mapping[str, Any]) -> Checks:
    """The incident names where the fault went, with its pod and node: a stopped rank
    as the only outlier (its process stopped), a rank stuck in the kernel likewise (in
    uninterruptible sleep), a killed rank among them (gone), a deleted pod as the only one; a desync's and a hang's outliers are told, not judged
    here."""
    pod, node = victim["metadata"]["name"], victim["spec"].get("nodeName")
    rank = highest_rank(dict(victim))
    named = [
        (o.get("pod"), o.get("rank"), o.get("node"), str(o.get("why", "")))
        for o in inc.get("outliers") or []
    ]
    if kind == "stall-rank":
        ok = [(p, r, n) for p, r, n, _ in named] == [(pod, rank, node)] and "stopped" in named[0][3]
        return [(ok, f"outliers {named}, expected rank {rank} of {pod} on {node}, stopped")]
    if kind == "stuck-in-kernel":
        # Named by /proc (uninterruptible sleep), not by the step bound or a collective.
        ok = [(p, r, n) for p, r, n, _ in named] == [(pod, rank, node)] and (
            "uninterruptible" in named[0][3]
        )
        return [(ok, f"outliers {named}, expected rank {rank} of {pod} on {node}, in D")]
    if kind == "kill-rank":
        # Its peers exit once their collective breaks: they may be named gone beside it.
        ok = any((p, r, n) == (pod, rank, node) and "gone" in w for p, r, n, w in named)
        return [(ok, f"outliers {named}, expected rank {rank} of {pod} on {node}, gone")]
    if kind == "delete-pod":
        ok = [(p, n) for p, _, n, _ in named] == [(pod, node)]
        return [(ok, f"outliers {named}, expected pod {pod} on {node} alone")]
    return []


def restart_counts(drill: Drill, key: str) -> dict[str, int]:
    """Container restarts of each pod (by UID) of a group."""
    role, index = key.split("/")
    sel = f"{c.LABEL_DEPLOYMENT}={NAME},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index}"
    return {
        p["metadata"]["uid"]: sum(
            int(s.get("restartCount", 0))
            for s in (p.get("status") or {}).get("containerStatuses") or []
        )
        for p in drill.cluster.pods(NAMESPACE, sel)
    }


def stale_router_workers(drill: Drill) -> list[str]:
    """Workers the router lists that are no live serving pod's (a deleted pod's)."""
    pods = drill.cluster.pods(NAMESPACE, drill.selector)
    url = router_endpoint(pods).get(ROUTER)
    if url is None:
        return ["(no Ready router to ask)"]
    live = {
        w.url
        for w in serving_workers(p for p in pods if not p["metadata"].get("deletionTimestamp"))
    }
    workers = httpx.get(f"{url}/workers", timeout=5, trust_env=False).json()["workers"]
    return sorted(str(w["url"]) for w in workers if w["url"] not in live)


def router_view(drill: Drill, lines: int = 12) -> str:
    """What the router made of decode/0, for a failed check: its registry (url, healthy)
    and the last lines of its log that name decode/0's serving pod."""
    pods = drill.cluster.pods(NAMESPACE, drill.selector)
    role, index = AFFECTED.split("/")
    leaders = [
        w.url
        for w in serving_workers(
            p
            for p in pods
            if p["metadata"]["labels"].get(c.LABEL_ROLE) == role
            and p["metadata"]["labels"].get(c.LABEL_GROUP) == index
        )
    ]
    url = router_endpoint(pods).get(ROUTER)
    try:
        listing = httpx.get(f"{url}/workers", timeout=5, trust_env=False).json()["workers"]
        registry = [(w.get("url"), w.get("is_healthy")) for w in listing]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
        registry = [(f"(router {url}: {type(err).__name__})", None)]
    hosts = [u.removeprefix("http://") for u in leaders]
    said: list[str] = []
    for directory in sorted((drill.workdir / "kubelet" / "pods").glob(f"{NAMESPACE}_*-router-*")):
        log = directory / "container.log"
        if log.exists():
            text = log.read_text(errors="replace").splitlines()
            said += [line[-300:] for line in text if any(h in line for h in hosts)]
    return (
        f"decode/0 serves at {leaders}; the router lists {registry}; "
        f"its log on decode/0: {said[-lines:]}"
    )


def router_checks(drill: Drill) -> Checks:
    """After the group is back: the router must send it requests again (bounded wait),
    and must have sent it none while it was drained."""
    drill.readmitted_at = drill.readmission_time()
    if drill.readmitted_at is None:
        return [(False, "no readmission time found on decode/0's rank-0 pod")]

    def received_again() -> bool:
        drill.figures_now()
        return drill.result.affected_received_after_readmission > 0

    try:
        drill.wait(received_again, 30, "decode/0 receiving requests through the router again")
    except TimeoutError as err:
        return [(False, f"{err}; {router_view(drill)}")]
    drill.note("the router sends decode/0 requests again")
    r = drill.result
    r.router_stale_workers = stale_router_workers(drill)
    return [
        (
            not r.router_stale_workers,
            f"the router still lists workers of pods that are gone: {r.router_stale_workers}",
        ),
        (
            r.affected_received_while_drained == 0,
            f"the router sent {r.affected_received_while_drained} request(s) to decode/0 "
            "while it was drained",
        ),
        (r.others_received_while_drained > 0, "the other decode group served meanwhile"),
    ]

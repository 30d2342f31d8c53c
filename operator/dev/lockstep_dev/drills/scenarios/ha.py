"""The `ha` drill: two operator replicas installed by the chart with `ha.enabled`, on one
local cluster, the API server's audit log on. In order:

1. both replicas up, one holding the chart's Lease; both serve the webhook with one
   certificate (a dry-run create through the API server, and each replica's TLS
   certificate compared);
2. the standby SIGKILLed: nothing changes (the same leader, no restart, no incident);
3. the leader SIGSTOPped for 30 s: the standby takes over after the lease duration; the
   woken replica writes nothing (no write with its User-Agent in the audit log after it
   woke) and ends itself (its container restarts, as a standby);
4. a desync, and the leader SIGKILLed mid-recovery: a replica takes over within the
   lease duration and a few seconds (the standby, or the killed pod's own restarted
   container, whichever renews the Lease first: a restarted container's predecessor is
   gone, so it may take the Lease at once) and finishes the recovery: the group
   restarted exactly once;
5. both replicas alive for more than two minutes (kopf's peering paused every replica
   after about 30 s; a Lease must not): a desync is recovered, exactly one more restart.

Figures: takeover after the leader's kill and after its stop (seconds), writes accepted
from the woken replica (0), restart counts per phase.
"""

from __future__ import annotations

import os
import signal
import ssl
import time
from typing import TYPE_CHECKING, Any

from lockstep.api.objects import parse_time
from lockstep_dev.cluster import ChartOperator, restart_count
from lockstep_dev.drills.scenario import Scenario
from lockstep_dev.localcluster.audit import parse_audit_log

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

HA_VALUES = {"ha": {"enabled": True, "replicas": 2}}
STOPPED_S = 30.0
LEASE_S = 15.0
STEADY_S = 120.0  # kopf's peering had paused both replicas long before this


def run_ha(drill: Drill) -> None:
    operator = drill.cluster.operator
    assert isinstance(operator, ChartOperator)
    r = drill.result
    checks: list[tuple[bool, str]] = []
    figures: dict[str, Any] = {}
    r.ha = figures

    # 1. Both up; one leads; one certificate.
    drill.wait(lambda: len(operator.ready_pods()) == 2, 120, "both operator replicas Ready")
    both_up = time.time()
    leader = drill.wait(operator.leader, 60, "a leader in the Lease")
    names = sorted(p["metadata"]["name"] for p in operator.ready_pods())
    standby = next(n for n in names if n != leader)
    drill.note(f"operator replicas {names}: {leader} leads, {standby} stands by")
    operator.wait_webhook(60)
    certs = {_webhook_cert(p) for p in operator.ready_pods()}
    checks.append((len(certs) == 1, f"both replicas serve one webhook certificate ({len(certs)})"))

    # 2. The standby killed: nothing changes.
    restarts = drill.group("decode/0").get("restarts", 0)
    before = restart_count(operator.pod_named(standby) or {})
    os.kill(_pid(operator, standby), signal.SIGKILL)
    drill.note(f"standby {standby} killed (SIGKILL)")
    drill.wait(
        lambda: (
            restart_count(operator.pod_named(standby) or {}) > before
            and len(operator.ready_pods()) == 2
        ),
        120,
        "the standby back",
    )
    checks += [
        (operator.leader() == leader, f"the leader stayed {leader} ({operator.leader()})"),
        (drill.group("decode/0").get("restarts", 0) == restarts, "no restart"),
        (not drill.status().get("openIncidents"), "no incident"),
    ]

    # 3. The leader stopped, then woken: the standby leads; the woken replica does nothing.
    pid = _pid(operator, leader)
    stopped_restarts = restart_count(operator.pod_named(leader) or {})
    os.kill(pid, signal.SIGSTOP)
    stopped = time.time()
    drill.note(f"leader {leader} stopped (SIGSTOP)")
    drill.wait(lambda: operator.leader() == standby, LEASE_S + 20, f"{standby} to take over")
    figures["takeover_after_stop_s"] = round(time.time() - stopped, 1)
    drill.note(f"{standby} took over {figures['takeover_after_stop_s']}s after the stop")
    time.sleep(max(0.0, STOPPED_S - (time.time() - stopped)))
    woke = time.time()
    os.kill(pid, signal.SIGCONT)
    drill.note(f"{leader} woken (SIGCONT) after {woke - stopped:.0f}s")
    drill.wait(
        lambda: restart_count(operator.pod_named(leader) or {}) > stopped_restarts,
        60,
        f"{leader} to end itself (lease lost) and be restarted",
    )
    drill.wait(lambda: len(operator.ready_pods()) == 2, 120, "both replicas Ready again")
    writes = _writes_by(drill, leader, since=woke)
    figures["writes_after_waking"] = len(writes)
    # Not vacuous: while it led, the audit log attributes its writes (Lease renewals) to it.
    figures["writes_while_leading"] = len(_writes_by(drill, leader, since=both_up, until=stopped))
    checks += [
        (figures["writes_while_leading"] > 0, "the audit log shows the leader's own writes"),
        (figures["takeover_after_stop_s"] <= LEASE_S + 5, "the standby took over in time"),
        (not writes, f"the woken replica wrote nothing: {writes[:5]}"),
        (operator.leader() == standby, "the new leader kept the lease"),
        (drill.group("decode/0").get("restarts", 0) == restarts, "still no restart"),
    ]
    leader, standby = standby, leader

    # 4. A desync, and the leader killed mid-recovery: the standby finishes it.
    seen = drill.incident_count("decode/0")
    drill.result.injected_at = time.time()
    drill.inject("desync")
    drill.wait(
        lambda: (
            drill.records().get("decode/0", {}).get("step")
            in ("CapturingEvidence", "AwaitingRestart", "RestartingInPlace", "WaitingProbe")
        ),
        60,
        "the recovery under way",
    )
    step = drill.records()["decode/0"]["step"]
    os.kill(_pid(operator, leader), signal.SIGKILL)
    killed = time.time()
    drill.note(f"leader {leader} killed (SIGKILL) in step {step}")
    # Whoever comes first: the standby after the lease duration, or the killed pod's
    # restarted container (same pod, so its predecessor is surely gone: it takes the lease
    # at once). Either acts once it renewed the Lease after the kill.
    drill.wait(lambda: _renewed_after(operator, killed), LEASE_S + 20, "a replica to take over")
    figures["takeover_after_kill_s"] = round(time.time() - killed, 1)
    new_leader = operator.leader()
    inc = drill.wait(lambda: drill.incident("decode/0", after=seen), drill.timeout_s, "recovered")
    figures["recovered_after_kill_s"] = round(time.time() - killed, 1)
    drill.note(
        f"{new_leader} took over {figures['takeover_after_kill_s']}s after the kill and "
        f"finished the recovery ({inc.get('verdict')}, {inc.get('restartMode')})"
    )
    checks += [
        (figures["takeover_after_kill_s"] <= LEASE_S + 5, "takeover within the lease + 5 s"),
        (
            drill.group("decode/0").get("restarts", 0) == restarts + 1,
            f"exactly one restart ({restarts} -> {drill.group('decode/0').get('restarts')})",
        ),
    ]

    # 5. Both alive for two minutes: one acts; a desync is recovered.
    drill.wait(lambda: len(operator.ready_pods()) == 2, 120, "both replicas Ready again")
    time.sleep(max(0.0, STEADY_S - (time.time() - both_up)))
    seen = drill.incident_count("decode/0")
    drill.inject("desync")
    inc = drill.wait(lambda: drill.incident("decode/0", after=seen), drill.timeout_s, "recovered")
    drill.judge_incident(inc)
    figures["steady_after_s"] = round(time.time() - both_up, 1)
    checks += [
        (inc.get("verdict") == "Desynced", f"verdict {inc.get('verdict')}"),
        (
            drill.group("decode/0").get("restarts", 0) == restarts + 2,
            f"exactly one more restart ({drill.group('decode/0').get('restarts')})",
        ),
        (
            (drill.status().get("operator") or {}).get("leader") == operator.leader(),
            f"status names the leader: {drill.status().get('operator')}",
        ),
    ]
    drill.conclude(checks)


def _renewed_after(operator: ChartOperator, t: float) -> bool:
    """The Lease was renewed (by a live replica) after `t`."""
    at = parse_time(operator.lease().get("renewTime"))
    return at is not None and at > t and operator.leader() is not None


def _pid(operator: ChartOperator, name: str) -> int:
    pod = operator.pod_named(name)
    pid = operator.pid(pod) if pod is not None else None
    if pid is None:
        raise RuntimeError(f"no process for operator pod {name}")
    return pid


def _webhook_cert(pod: dict[str, Any]) -> str:
    ip = (pod.get("status") or {}).get("podIP")
    port = next(
        p["containerPort"]
        for c in pod["spec"]["containers"]
        for p in c.get("ports") or []
        if p.get("name") == "webhook"
    )
    return ssl.get_server_certificate((str(ip), int(port)), timeout=10)


def _writes_by(drill: Drill, pod: str, *, since: float, until: float | None = None) -> list[str]:
    """Writes the API server accepted from the replica `pod` (its User-Agent) in
    [since, until)."""
    log = drill.cluster.cp.audit_log if drill.cluster.cp is not None else None
    if log is None:
        raise RuntimeError("the ha drill needs the API server's audit log")
    events = parse_audit_log(log.read_text().splitlines())
    return [
        str(e)
        for e in events
        if e.write
        and f"({pod})" in e.user_agent
        and e.received_at is not None
        and e.received_at >= since
        and (until is None or e.received_at < until)
        and 200 <= e.code < 300
    ]


# Two operator replicas electing a leader; the audit log says who wrote what.
SCENARIO = Scenario("ha", run_ha, cluster_options={"chart_values": HA_VALUES, "audit_log": True})

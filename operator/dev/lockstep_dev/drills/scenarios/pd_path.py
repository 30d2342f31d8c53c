"""`pd-path`: the KV hand-off between prefill and decode breaks while every TP collective
passes, through the router, with two prefill groups and two decode groups.

Two incidents on one cluster, each recovered before the next: `transfer-stall` in
prefill/0 (its KV sender stops sending for new rooms; its deep probe stays fine), then
`bootstrap-down` in prefill/1 (its bootstrap server stops answering). For each: the pair
probe's tries fail with every decode peer, so the prefill group is judged
`TransferBroken` (not a decode group, not a link); only that prefill group restarts, the
decode groups and the other prefill group keep their epochs and have no incident; every
request the incident caught (a prefill half that never handed its KV over, a decode half
waiting for it) ended 200 through the router, none waiting long past the verdict; the
groups that stayed hold nothing of it. The time from the fault to the verdict is a figure
(`steps[].time_to_detect_s`); its check is behavioural: found by the pair probe, long
before SGLang's own waits (300 s) would end anything."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lockstep_dev.drills.deployment import NAMESPACE
from lockstep_dev.drills.failover import failover_checks
from lockstep_dev.drills.figures import ts
from lockstep_dev.drills.restart import Checks, stale_router_workers
from lockstep_dev.drills.scenario import Scenario
from lockstep_dev.faults import FaultKind

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

INCIDENTS: tuple[tuple[str, FaultKind], ...] = (
    ("prefill/0", "transfer-stall"),
    ("prefill/1", "bootstrap-down"),
)
GROUPS = ("prefill/0", "prefill/1", "decode/0", "decode/1")
# Far below SGLang's own PD waits (SGLANG_DISAGGREGATION_*_TIMEOUT, 300 s): what the
# pair probe's deadline and its second try make of it, with a noisy machine's margin.
FOUND_BY_THE_PROBE_S = 30.0


def overrides(drill: Drill) -> dict[str, Any]:
    return {
        "prefill": {"replicas": 2, "tp": 1, "gpusPerPod": 1},
        "recovery": {"budget": {"restarts": 4, "windowSeconds": 3600}},
    }


def act(drill: Drill) -> None:
    checks: Checks = []
    for key, kind in INCIDENTS:
        step = incident(drill, key, kind)
        checks += [(ok, f"{kind} in {key}: {why}") for ok, why in step]
        if not all(ok for ok, _ in step) and not drill.keep_going:
            break
    drill.conclude(checks)


def incident(drill: Drill, key: str, kind: FaultKind) -> Checks:
    """One PD-path fault in prefill group `key`, recovered; the checks it must pass."""
    epochs = {g: int(drill.group(g).get("epoch", 0)) for g in GROUPS}
    seen = {g: drill.incident_count(g) for g in GROUPS}
    drill.watched = key
    drill.drained_at = drill.readmitted_at = None
    injected = drill.result.injected_at = time.time()
    drill.first_injection = drill.first_injection or injected
    drill.inject(kind, key)
    opened = drill.wait(
        lambda: drill.incident(key, closed=False, after=seen[key]), 60, f"a verdict on {key}"
    )
    drill.note(f"verdict {opened.get('verdict')} on {key}: {evidence_line(opened)}")
    inc = drill.wait(
        lambda: drill.incident(key, after=seen[key]), drill.timeout_s, f"{key} re-admitted"
    )
    drill.note(f"{key} re-admitted in epoch {drill.group(key).get('epoch')}")
    drill.judge_incident(inc)
    detected = ts(inc.get("detectedTime"))
    to_detect = None if detected is None else round(detected - injected, 2)
    others = [g for g in GROUPS if g != key]
    moved = {g: (epochs[g], int(drill.group(g).get("epoch", 0))) for g in others}
    blamed = [g for g in GROUPS if drill.incident_count(g) > seen[g]]
    checks: Checks = [
        (
            inc.get("verdict") == "TransferBroken",
            f"verdict {inc.get('verdict')}, expected TransferBroken",
        ),
        (blamed == [key], f"incidents opened in {blamed}, expected {key} alone"),
        (int(drill.group(key).get("epoch", 0)) > epochs[key], f"{key} restarted"),
        (all(a == b for a, b in moved.values()), f"the other groups kept their epochs: {moved}"),
        (
            to_detect is not None and to_detect <= FOUND_BY_THE_PROBE_S,
            f"judged {to_detect}s after the fault (the pair probe's bound: {FOUND_BY_THE_PROBE_S}s)",
        ),
    ]
    if drill.router:
        checks += failover_checks(drill, inc, None, key)
        stale = stale_router_workers(drill)
        checks.append((not stale, f"the router still lists workers of pods that are gone: {stale}"))
    fo = drill.result.failover[-1] if drill.result.failover else None
    drill.result.steps.append(
        {
            "fault": kind,
            "group": key,
            "incident": inc.get("id"),
            "verdict": inc.get("verdict"),
            "evidence": evidence_line(inc),
            "restart_mode": inc.get("restartMode"),
            "time_to_detect_s": to_detect,
            "other_epochs": moved,
            "failover": fo,
            "events": [
                e.get("message")
                for e in drill.cluster.events(NAMESPACE)
                if e.get("reason") in ("PairFailing", "PairLinkFailing")
            ][-5:],
            "passed": all(ok for ok, _ in checks),
        }
    )
    return checks


def evidence_line(inc: dict[str, Any]) -> str:
    """The first line of an incident's evidence (what the verdict said)."""
    lines = str(inc.get("evidence") or "").splitlines()
    return lines[0][:240] if lines else ""


SCENARIO = Scenario(
    "pd-path", act, overrides=overrides, router=True, faulted=("prefill/0", "prefill/1")
)

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
before SGLang's own waits (300 s) would end anything.

Then, on the same cluster, the KV of ended requests (`lockstep_dev.drills.ended_kv`):
`kv-leak` in decode/0 under an abort wave, freed by the operator without a restart; and
the abort storm, rounds of streams cancelled at once through the router, after which no
group holds anything.

With `soak_s` the faults wait for a healthy run that long under traffic first, which must
give no verdict and no pair Event (`result.soak`: also the pair probe's tries and the
probe requests each group served a second, from the stand-ins' request logs).

On the real engine (`engine="sglang"`: the faults through lockstep's hooks in the real
server, `lockstep_sglang.pd_faults`; the KV of ended requests as its deep probe reports
it, `lockstep_sglang.held_kv`) the drill runs the same steps. The CI drill of the real
engine runs them on the real sequence drill's cluster instead."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from lockstep.clients.pair_prober import PROMPT as PROBE_PROMPT
from lockstep_dev.drills.deployment import NAME, NAMESPACE
from lockstep_dev.drills.ended_kv import abort_storm, kv_leak
from lockstep_dev.drills.failover import failover_checks
from lockstep_dev.drills.figures import ts
from lockstep_dev.drills.restart import Checks, stale_router_workers
from lockstep_dev.drills.scenario import BOTH_ENGINES, Scenario
from lockstep_dev.faults import FaultKind
from lockstep_dev.traffic import request_log_arrivals

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
    checks: Checks = soak(drill) if drill.soak_s > 0 else []
    steps: list[tuple[str, Callable[[], Checks]]] = [
        (f"{kind} in {key}", partial(incident, drill, key, kind)) for key, kind in INCIDENTS
    ]
    steps.append(("kv-leak in decode/0", partial(kv_leak, drill, GROUPS)))
    steps.append(("the abort storm", partial(abort_storm, drill, GROUPS)))
    for what, run in steps:
        step = run()
        checks += [(ok, f"{what}: {why}") for ok, why in step]
        if not all(ok for ok, _ in step) and not drill.keep_going:
            break
    drill.conclude(checks)


def soak(drill: Drill) -> Checks:
    """A healthy run of `drill.soak_s` under traffic: no verdict, no pair Event, no free of
    the KV of ended requests."""
    began = time.time()
    seen = {g: drill.incident_count(g) for g in GROUPS}
    before = {e["metadata"]["uid"] for e in pair_events(drill) + free_events(drill)}
    drill.wait(lambda: time.time() - began >= drill.soak_s, drill.soak_s + 30, "the soak")
    ended = time.time()
    opened = {g: drill.incident_count(g) - seen[g] for g in GROUPS}
    told = [str(e.get("message")) for e in pair_events(drill) if e["metadata"]["uid"] not in before]
    freed = [
        str(e.get("message")) for e in free_events(drill) if e["metadata"]["uid"] not in before
    ]
    probes: dict[str, int] = dict.fromkeys(GROUPS, 0)
    for a in request_log_arrivals(drill.workdir / "kubelet", NAMESPACE, NAME):
        key = f"{a.role}/{a.group}"
        if began <= a.at <= ended and (a.prompt or "").startswith(PROBE_PROMPT) and key in probes:
            probes[key] += 1
    seconds = ended - began
    drill.result.soak = {
        "seconds": round(seconds, 1),
        "verdicts": opened,
        "pair_events": told,
        "ended_kv_frees": freed,
        "pairs": drill.status().get("pairs") or [],
        # Counted in the stand-ins' request logs (the real server keeps none).
        "probe_requests_per_group_per_s": (
            {g: round(n / seconds, 3) for g, n in probes.items()}
            if drill.engine == "standin"
            else None
        ),
    }
    return [
        (not any(opened.values()), f"verdicts in a healthy run: {opened}"),
        (not told, f"pair Events in a healthy run: {told[:3]}"),
        (not freed, f"KV of ended requests freed in a healthy run: {freed[:3]}"),
    ]


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
        (
            two_sided(inc),
            f"the evidence shows both sides of a failed hand-off: {inc.get('evidence')!r:.400}",
        ),
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
            "blamed": blamed,  # the groups an incident opened in
            "restarted": [g for g in GROUPS if int(drill.group(g).get("epoch", 0)) > epochs[g]],
            "failover": fo,
            "events": [e.get("message") for e in pair_events(drill)][-5:],
            "passed": all(ok for ok, _ in checks),
        }
    )
    return checks


def pair_events(drill: Drill) -> list[dict[str, Any]]:
    """The pair probe's warning Events (a failing link or pair) in the drill's namespace."""
    events = drill.cluster.events(NAMESPACE)
    return [e for e in events if e.get("reason") in ("PairFailing", "PairLinkFailing")]


def free_events(drill: Drill) -> list[dict[str, Any]]:
    """The operator's frees of the KV of ended requests (`EndedKVFreed`) in the namespace."""
    return [e for e in drill.cluster.events(NAMESPACE) if e.get("reason") == "EndedKVFreed"]


def two_sided(inc: dict[str, Any]) -> bool:
    """Whether the incident's evidence has a failed hand-off with both sides' state (the
    verdict's `sides`: what each leader's engine said of its PD queues and KV)."""
    lines = str(inc.get("evidence") or "").splitlines()
    if "sides:" not in lines:
        return False
    shown = lines[lines.index("sides:") + 1 :]
    return any("prefill: " in line and "decode: " in line for line in shown)


def evidence_line(inc: dict[str, Any]) -> str:
    """The first line of an incident's evidence (what the verdict said)."""
    lines = str(inc.get("evidence") or "").splitlines()
    return lines[0][:240] if lines else ""


SCENARIO = Scenario(
    "pd-path",
    act,
    engines=BOTH_ENGINES,
    overrides=overrides,
    router=True,
    faulted=("prefill/0", "prefill/1"),
)

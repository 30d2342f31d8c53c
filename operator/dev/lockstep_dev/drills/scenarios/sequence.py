"""`sequence`: one incident after another in decode/0 of one cluster, through the router
on the real engine (what its CI drill runs), each recovered and judged before the next.

On the real engine the same cluster then breaks its PD path, with two prefill groups
(`lockstep_dev.drills.scenarios.pd_path`'s incidents, through lockstep's hooks in the real
SGLang server): `transfer-stall` in prefill/0, then `bootstrap-down` in prefill/1, each
judged `TransferBroken` from the pair probe and restarted alone while the other prefill
group serves; then `kv-leak` in decode/0 (streams the client cancelled, generated for
nobody: found in its deep probe's report and freed by the operator, no restart), and
last the abort storm (rounds of streams through the router cancelled at once: nothing
held after, no verdict); the stand-in runs them in the `pd-path` drill."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from lockstep_dev.drills.deployment import AFFECTED, RecoveryMode
from lockstep_dev.drills.ended_kv import abort_storm, kv_leak
from lockstep_dev.drills.restart import Checks, restart_checks
from lockstep_dev.drills.scenario import BOTH_ENGINES, Scenario, step_bounds_overrides
from lockstep_dev.drills.scenarios import pd_path
from lockstep_dev.drills.suspects import suspect_checks
from lockstep_dev.faults import FaultKind

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

# The incidents, in order (a Drill's `sequence` replaces them). On the real engine a
# restart costs minutes on two cores: a desync and a rank stopped with SIGSTOP (a wedged
# process as an operator meets it; benchmarks/failover.py runs the rest there, and the
# realsglang tier judges a hang on the real engine's answers); the stand-in runs a
# killed rank, a hang, a rank stuck in the kernel (uninterruptible sleep inside its
# step, judged from /proc before the step bound) and a deleted pod after the desync. On both, the second incident
# hits the pods the desync's in-place restart kept, and names a rank the desync named:
# its node is the outlier's of two incidents (what the suspect-node checks count on).
SEQUENCE: tuple[tuple[str, FaultKind], ...] = (
    ("Desynced", "desync"),
    ("RankDown", "stall-rank"),
)
STANDIN_SEQUENCE: tuple[tuple[str, FaultKind], ...] = (
    ("Desynced", "desync"),
    ("RankDown", "kill-rank"),
    ("Hung", "hang"),
    ("Hung", "stuck-in-kernel"),
    ("RankDown", "delete-pod"),
)


def overrides(drill: Drill) -> dict[str, Any]:
    # Every incident of the sequence is a restart of one group within minutes:
    # room for all of them in the restart budget (the flapping drill tests it).
    incidents = max(len(drill.sequence or ()), len(STANDIN_SEQUENCE)) + len(pd_path.INCIDENTS)
    budget = {"restarts": incidents + 1, "windowSeconds": 3600}
    spec = step_bounds_overrides(drill) or {"recovery": {"budget": budget}}
    if drill.engine == "sglang":
        # A second prefill group: where a prefill's PD path breaks, the other serves.
        spec = {**spec, "prefill": pd_path.overrides(drill)["prefill"]}
    return spec


def act(drill: Drill) -> None:
    """A desync, then a stopped rank (the stand-in: a killed rank, a hang, a rank stuck in
    the kernel and a deleted pod), in decode/0 of one cluster, each recovered (and judged) before the next.

    The first is restarted in the deployment's mode; the group then fails again
    within `recovery.inPlace.escalationWindowSeconds` of an in-place restart, so (in
    InPlace mode) the next ones escalate to Recreate, as the design says."""
    checks: Checks = []
    sequence = drill.sequence or (SEQUENCE if drill.engine == "sglang" else STANDIN_SEQUENCE)
    for i, (verdict, kind) in enumerate(sequence):
        drill.note(f"next: {kind}")
        # A deleted pod cannot restart in place; the rest escalate (see above).
        mode: RecoveryMode = drill.recovery_mode if i == 0 else "Recreate"
        step = restart_checks(drill, verdict, kind, mode)
        drill.figures_now()
        r = drill.result
        inc = drill.incident(AFFECTED) or {}
        r.steps.append(
            {
                "fault": kind,
                "incident": inc.get("id"),
                "verdict": r.verdict,
                "restart_mode": r.restart_mode,
                "outliers": inc.get("outliers") or [],
                # Where the restart put the group (the suspect-node checks read it).
                "pods": [
                    {
                        "name": p["metadata"]["name"],
                        "node": p["spec"].get("nodeName"),
                        "created": p["metadata"].get("creationTimestamp"),
                    }
                    for p in drill.group_pods(AFFECTED)
                ],
                "time_to_detect_s": r.time_to_detect_s,
                "time_to_recover_s": r.time_to_recover_s,
                "phases": drill.phases(),
                "router_failed_before_drain": r.router_failed_before_drain,
                "router_failed_after_drain": r.router_failed_after_drain,
                "affected_received_while_drained": r.affected_received_while_drained,
                "failover": r.failover[-1] if r.failover else None,
                "passed": all(ok for ok, _ in step),
            }
        )
        failed_after = (
            r.router_failed_after_drain if drill.router else r.affected_failed_after_drain
        )
        step.append((failed_after == 0, f"{failed_after} request(s) failed after the drain"))
        r.steps[-1]["passed"] = all(ok for ok, _ in step)
        checks += [(ok, f"{kind}: {why}") for ok, why in step]
        if not all(ok for ok, _ in step) and not drill.keep_going:
            drill.conclude(checks)
            return
    if drill.suspect_nodes is not None:
        checks += [(ok, f"suspect nodes: {why}") for ok, why in suspect_checks(drill)]
    if drill.engine == "sglang":
        runs: list[tuple[str, Callable[[], Checks]]] = [
            (f"{kind} in {key}", partial(pd_path.incident, drill, key, kind))
            for key, kind in pd_path.INCIDENTS
        ]
        runs.append(("kv-leak in decode/0", partial(kv_leak, drill, pd_path.GROUPS)))
        runs.append(("the abort storm", partial(abort_storm, drill, pd_path.GROUPS)))
        for what, run in runs:
            drill.note(f"next: {what}")
            step = run()
            checks += [(ok, f"{what}: {why}") for ok, why in step]
            if not all(ok for ok, _ in step) and not drill.keep_going:
                break
    drill.conclude(checks)


SCENARIO = Scenario("sequence", act, engines=BOTH_ENGINES, overrides=overrides)

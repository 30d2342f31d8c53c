"""One control round for one PDDeployment: observe, judge, plan, act, record.

The round orchestrator, called by the PDDeployment's daemon (`lockstep.handlers.operator`)
when something happened (a failed probe, a pod changed, the spec changed, a recovery step
asked to run again) and on a slow resync. It decides nothing itself and knows no step of
recovery (what a group's record asks of a round, recovery says: `recovery.needs`).
`round.run_round` is one call per phase, each its own module:

1. observe (`observe`): the deployment's pods, Services, budgets and scale targets come
   from watch-fed caches (the caller passes them), the group records and the incident
   history from this runtime's memory (`runtime.Memory`: the annotations the last round
   persisted; read from the object only after an operator restart), the evidence store's
   entries, each role's shape (`core.shape`: its resolved count, THE RULE, and spares),
   the groups whose template changed;
2. judge (`judge`): each group once (`observe_group`: the newest deep-probe sample from
   the `ProbeBook`, or the pods when they alone show a rank down, or the rank states the
   incident's capture read, from the `CaptureBook`; `verdicts.classify_group` is called
   there and nowhere else), into the planner's input;
3. plan each role (`recovery.plan_role`, the incident's one owner, with its guard rails);
4. act (`act`): every change goes through `lockstep.execute` — the scale targets, each
   group's actions in order, the new epochs with the reconcile plan
   (`reconcile.plan_reconcile`, once), the disruption budgets, the router's objects, the
   cordons of suspect nodes;
5. record (`record`): the records, the incident history (`lockstep.core.records`) and the
   evidence (`lockstep.core.evidence`) when they changed, the capture book settled, the
   prober's targets, status (`lockstep.core.status`, patched only when it changed) and
   the metrics.

Every action is idempotent (see `recovery`), so a round interrupted anywhere (an
operator crash) is simply run again from the persisted records. A healthy deployment
costs the API server nothing per round: reads come from caches, writes only happen when
something changed.
"""

from lockstep.control.judge import observe_group
from lockstep.control.observe import step_bounds
from lockstep.control.record import RoundResult, probe_targets
from lockstep.control.round import run_round
from lockstep.control.runtime import Memory, Runtime, settled

__all__ = [
    "Memory",
    "RoundResult",
    "Runtime",
    "observe_group",
    "probe_targets",
    "run_round",
    "settled",
    "step_bounds",
]

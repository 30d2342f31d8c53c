"""Incident drills on the local cluster: inject a fault, watch lockstep handle it, judge.

Each scenario runs on a fresh `DevCluster` with the drill deployment
(`examples/local-drill.yaml`: one prefill group, two decode groups of TP2 spanning two
pods each), sends traffic to every Ready group the whole time (as a router would), injects
its fault into decode group 0 (both decode groups for `concurrent`), waits for the
expected outcome with a hard bound, and returns figures; `passed` is True only when the
scenario's expected outcome happened.

The package:

- `harness`: `Drill`, what every scenario shares (the cluster, the deployment, traffic,
  waiting, judging) and `run_drill`; the engines and the router (its docstring);
- `figures`: `DrillResult` and the figures computed into it (times to detect and recover,
  requests failed, out of service, what the router sent where);
- `deployment`: the drill deployment (`drill_spec`) and its names;
- `restart` and `failover`: one incident recovered by a whole-group restart and its checks,
  and what the requests it caught saw (most scenarios are one or more of these);
- `monitoring`: a drill watched by a real Prometheus as the chart's monitoring would (its
  alerts fire and resolve, its dashboard's queries return data);
- `suspects`: the suspect-node checks of a drill whose deployment sets
  `recovery.suspectNodes` (the condition, the Events, the cordon or none);
- `scenario`: `Scenario`, what the harness knows of a scenario (its spec overrides,
  cluster options, preparation, fault and checks, engines);
- `scenarios`: one module per scenario; `registry`: every one by name, and the lists
  derived from them (`SCENARIOS`, `REAL_SGLANG_SCENARIOS`, `NODE_SCENARIOS`).
"""

from __future__ import annotations

from lockstep_dev.drills.deployment import (
    AFFECTED,
    NAME,
    NAMESPACE,
    RESTARTING_STEPS,
    RecoveryMode,
    drill_spec,
)
from lockstep_dev.drills.failover import PAST_VERDICT_BOUND_S, STREAM_TOKENS
from lockstep_dev.drills.figures import DrillResult, ts
from lockstep_dev.drills.harness import Drill, Observer, run_drill
from lockstep_dev.drills.registry import (
    NODE_SCENARIOS,
    REAL_SGLANG_SCENARIOS,
    REGISTRY,
    SCENARIOS,
    lookup,
)
from lockstep_dev.drills.scenario import Scenario
from lockstep_dev.drills.scenarios.node_drain import DRILL_POOL
from lockstep_dev.drills.scenarios.sequence import SEQUENCE, STANDIN_SEQUENCE
from lockstep_dev.drills.scenarios.slow import SLOW_STEPS
from lockstep_dev.drills.scenarios.unplaceable import DRILL_CAPACITY

__all__ = [
    "AFFECTED",
    "DRILL_CAPACITY",
    "DRILL_POOL",
    "NAME",
    "NAMESPACE",
    "NODE_SCENARIOS",
    "PAST_VERDICT_BOUND_S",
    "REAL_SGLANG_SCENARIOS",
    "REGISTRY",
    "RESTARTING_STEPS",
    "SCENARIOS",
    "SEQUENCE",
    "SLOW_STEPS",
    "STANDIN_SEQUENCE",
    "STREAM_TOKENS",
    "Drill",
    "DrillResult",
    "Observer",
    "RecoveryMode",
    "Scenario",
    "drill_spec",
    "lookup",
    "run_drill",
    "ts",
]

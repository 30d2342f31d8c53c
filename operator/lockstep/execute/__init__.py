"""The executor: every change a control round makes to the cluster goes through it.

One small manager per concern, each over the round's `Scene` (the spec, the namespace,
the Event sink, the deployment's pods from the watch-fed cache):

| manager | module | carries out |
| --- | --- | --- |
| `PodManager` | `pods` | `DeletePods`, `CreateEpoch` (noted for the reconcile plan), the agent-token Secret before new pods, the reconcile plan, the disruption budgets |
| `RouterManager` | `routers` | `SetGate` (the readiness gate and every router replica's registry), the router's objects, the registries' sweep |
| `RequestManager` | `requests` | `EndRequests` (the group's own requests and its PD peers' halves) |
| `CaptureManager` | `capture` | `CaptureEvidence` (into the deployment's `CaptureBook`) |
| `RestartManager` | `restarts` | `RestartInPlace` |
| `ScaleManager` | `scale` | the per-role scale targets and their status |
| `IncidentManager` | `incidents` | `OpenIncident`, `UpdateIncident`, `CloseIncident` (metrics), `EmitEvent` |
| `NodeManager` | `nodes` | the opt-in cordon of suspect nodes |

`execution.ACTION_TABLE` maps each of recovery's actions to its one manager (a test
holds it to every action type). The round's own memory (the records and history
annotations, the evidence store, status) is written by `lockstep.control` as its last
step.

I/O only, no judgement: every action is one of `lockstep.core.recovery`'s frozen actions
and every one is idempotent (see that package's contract); nothing read here is parsed
or judged here (the capture's answers go to the `CaptureBook` as they came; the agent
client parses them and `verdicts` judges them). Every Kubernetes call goes through
`lockstep.clients.kube.Kube`. What the planner needs next round comes back through the
deployment's memory: in-place restarts that could not be asked
(`Deps.restart_failures`) and the captures (`CaptureBook`).
"""

from lockstep.execute.execution import ACTION_TABLE, Execution
from lockstep.execute.scene import Deps, EventSink, GroupId, agent_token

__all__ = ["ACTION_TABLE", "Deps", "EventSink", "Execution", "GroupId", "agent_token"]

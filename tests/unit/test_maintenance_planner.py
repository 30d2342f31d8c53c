"""Node maintenance and whole-or-nothing placement in the recovery planner, with an
injected clock: a group on a cordoned node moves make-before-break (the new epoch in the
other name slot, probed and admitted before the old pods leave the routers, drain, and go),
falls back to draining first when there is no room, never counts against the restart
budget; an epoch the scheduler does not place whole in time is withdrawn and retried.

`MoveSim` extends the planner tests' fake API server (`test_recovery.Sim`) with what
these paths need: the name slot of created pods, a scheduler that places or refuses them,
the leaders' in-flight requests and the nodes under maintenance."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from test_recovery import T0, Sim, settings

from lockstep.api.models import MaintenanceSpec
from lockstep.core.maintenance import (
    NodeState,
    cluster_fingerprint,
    group_maintenance,
    node_maintenance,
)
from lockstep.core.recovery import (
    CloseIncident,
    CreateEpoch,
    DeletePods,
    GroupInput,
    Reason,
    RoleSettings,
    SetGate,
    Step,
    status_state,
)
from lockstep.core.verdicts import PodView

pytestmark = pytest.mark.unit


def move_settings(
    mode: str = "MakeBeforeBreak", drain: int = 30, sched: float = 60
) -> RoleSettings:
    base = settings()
    return replace(
        base,
        maintenance=MaintenanceSpec.model_validate({"mode": mode, "drainTimeoutSeconds": drain}),
        scheduling_timeout_seconds=sched,
    )


@dataclass
class MoveSim(Sim):
    cordoned: set[str] = field(default_factory=set)
    full: bool = False  # the scheduler has no room for new pods
    inflight: dict[str, int] = field(default_factory=dict)  # leader name -> requests
    free_nodes: list[str] = field(default_factory=lambda: ["node-a", "node-b"])

    def create(self, group: int, epoch: int, gate: bool | None = None, slot: int = 0) -> None:
        names = {p.name for p in self.pods[group].values()}
        for rank in range(self.cfg.pods_per_group):
            name = f"m-decode-{group}{'b' if slot else ''}-{rank}"
            if name in names:
                continue
            uid = f"g{group}-e{epoch}-s{slot}-r{rank}-{next(iter(self._uids))}"
            if epoch == 0:
                node: str | None = f"node-{rank}"
            else:
                node = None if self.full else self.free_nodes[rank % len(self.free_nodes)]
            self.pods[group][uid] = PodView(
                name,
                uid,
                epoch,
                rank,
                gate=gate,
                node=node,
                phase="Running" if node else "Pending",
                container_running=node is not None,
                unschedulable=None if node else "Unschedulable: 0/3 nodes are available",
                slot=slot,
            )

    def apply(self, group: int, actions: list) -> None:  # type: ignore[override]
        rest = []
        for a in actions:
            if isinstance(a, CreateEpoch):
                self.log.append((self.now, group, a))
                self.create(group, a.epoch, slot=a.slot)
            else:
                rest.append(a)
        super().apply(group, rest)

    def inputs(self, verdicts=None, manual=None):  # type: ignore[no-untyped-def,override]
        base = super().inputs(verdicts, manual)
        nodes = {n: NodeState(n, unschedulable=True) for n in self.cordoned}
        out = {}
        for i, inp in base.items():
            rec = self.records[i]
            current = [
                {"spec": {"nodeName": p.node}} for p in inp.pods if p.epoch == rec.epoch and p.node
            ]
            why, moving = group_maintenance(current, nodes)
            out[i] = replace(
                inp,
                maintenance=why,
                maintenance_nodes=moving,
                inflight={p.name: self.inflight.get(p.name, 0) for p in inp.pods if p.rank == 0},
            )
        return out


def test_a_cordoned_node_moves_the_group_make_before_break_and_it_never_leaves_service() -> None:
    sim = MoveSim(cfg=move_settings())
    old = {p.uid for p in sim.view(0)}
    sim.round({0: "ok"})
    assert sim.step() is Step.HEALTHY
    sim.cordoned.add("node-1")
    sim.inflight["m-decode-0-0"] = 3  # the old leader still holds requests
    steps = [sim.step()]
    served: list[bool] = []
    for _ in range(40):
        sim.round({0: "ok"})
        if steps[-1] != sim.step():
            steps.append(sim.step())
        # At every moment some pod of the group is admitted (gate true).
        served.append(any(p.gate is True for p in sim.view(0) if not p.deleting))
        if sim.now > T0 + 12:
            sim.inflight["m-decode-0-0"] = 0  # the requests finish
        if sim.step() is Step.HEALTHY:
            break
    assert steps == [Step.HEALTHY, Step.MOVING, Step.HANDING_OVER, Step.HEALTHY]
    assert all(served)
    new = sim.view(0)
    assert {p.name for p in new} == {"m-decode-0b-0", "m-decode-0b-1"}
    assert not old & {p.uid for p in new}
    assert all(p.node in ("node-a", "node-b") and p.gate is True for p in new)
    rec = sim.records[0]
    assert (rec.epoch, rec.slot, rec.budget.restarts, rec.maintenance) == (1, 1, 0, None)
    # Admit the new pods first, then take the old ones out, then delete them after the
    # drain; no restart counted (the deletes are not restarts).
    gates = [(a.value, {r.name for r in a.pods}) for a in sim.actions(SetGate)]
    assert gates[0] == (True, {"m-decode-0b-0", "m-decode-0b-1"})
    assert gates[1] == (False, {"m-decode-0-0", "m-decode-0-1"})
    deletes = sim.actions(DeletePods)
    assert deletes and all(isinstance(d, DeletePods) and not d.restart for d in deletes)
    drained = [a for a in sim.actions(SetGate) if not a.value]
    first_delete = next(t for t, _, a in sim.log if isinstance(a, DeletePods))
    assert first_delete > T0 + 12  # waited for the in-flight requests
    assert drained
    closed = [a.incident for a in sim.actions(CloseIncident) if isinstance(a, CloseIncident)]
    assert closed[-1].verdict == "Maintenance"
    assert "make-before-break" in closed[-1].action and "never out of service" in closed[-1].action
    assert Reason.MAINTENANCE in sim.reasons() and Reason.MOVED in sim.reasons()


def test_the_drain_is_bounded_by_drain_timeout_seconds() -> None:
    sim = MoveSim(cfg=move_settings(drain=5))
    sim.round({0: "ok"})
    sim.cordoned.add("node-0")
    sim.inflight["m-decode-0-0"] = 1  # a request that never ends
    for _ in range(40):
        sim.round({0: "ok"})
        if sim.step() is Step.HEALTHY:
            break
    assert sim.step() is Step.HEALTHY and sim.records[0].slot == 1
    timed_out = [m for m in _messages(sim) if "drain timed out after 5s" in m]
    assert timed_out


def _messages(sim: Sim) -> list[str]:
    from lockstep.core.recovery import EmitEvent

    return [a.message for a in sim.actions(EmitEvent) if isinstance(a, EmitEvent)]


def test_no_room_elsewhere_falls_back_to_draining_first_one_group_at_a_time() -> None:
    # Both groups have a pod on the cordoned node and there is no spare capacity: each
    # tries make-before-break, then drains first, never both out of service at once,
    # and no restart is counted.
    sim = MoveSim(cfg=move_settings(), groups=2)
    sim.round({0: "ok", 1: "ok"})
    sim.full = True
    sim.cordoned.add("node-0")
    seen: list[Step] = []
    for _ in range(300):
        sim.round({0: "ok", 1: "ok"})
        seen.append(sim.step(0))
        if Step.DRAINING in (sim.step(0), sim.step(1)):
            sim.full = False  # the drained pods free their GPUs for the new epoch
        serving = [g for g in (0, 1) if any(p.gate is True and not p.deleting for p in sim.view(g))]
        assert serving, f"both groups out of service at {sim.now - T0:.0f}s"
        if all(sim.step(g) is Step.HEALTHY and sim.records[g].epoch > 0 for g in (0, 1)):
            break
    assert Step.MOVING in seen and Step.DRAINING in seen and Step.CREATING in seen
    assert "no room elsewhere" in " ".join(_messages(sim))
    assert Reason.MOVE_FAILED in sim.reasons(0)
    for g in (0, 1):
        rec = sim.records[g]
        assert sim.step(g) is Step.HEALTHY, g
        assert (
            rec.budget.restarts == 0 and rec.budget.restart_times == () and rec.maintenance is None
        )
        assert all(p.node in ("node-a", "node-b") for p in sim.view(g))
    closed = [a.incident for a in sim.actions(CloseIncident, 0) if isinstance(a, CloseIncident)]
    assert "draining first" in closed[-1].action
    # Recreated under the names no old pod had: a drain retrying its evictions by name
    # never evicts a new pod.
    for g in (0, 1):
        assert all(p.name.startswith(f"m-decode-{g}b-") for p in sim.view(g)), sim.view(g)


def test_maintenance_off_leaves_the_group_alone() -> None:
    sim = MoveSim(cfg=move_settings(mode="Off"))
    sim.cordoned.add("node-0")
    for _ in range(5):
        sim.round({0: "ok"})
    assert sim.step() is Step.HEALTHY and not sim.actions(CreateEpoch)


def test_an_epoch_not_placed_in_time_is_withdrawn_whole_and_retried_after_backoff() -> None:
    cfg = move_settings(sched=20)
    cfg = replace(
        cfg,
        recovery=cfg.recovery.model_copy(
            update={"backoff": cfg.recovery.backoff.model_copy(update={"base_seconds": 10})}
        ),
    )
    sim = MoveSim(cfg=cfg)
    sim.round({0: "desync!"})
    sim.full = True
    states = []
    for _ in range(40):
        sim.round({})
        states.append(sim.step())
        if sim.step() is Step.UNSCHEDULABLE:
            break
    assert sim.step() is Step.UNSCHEDULABLE
    assert status_state(sim.records[0]) == "Unschedulable"
    assert "0/3 nodes are available" in (sim.records[0].placement.unschedulable or "")
    assert not sim.view(0)  # withdrawn whole
    msg = [m for m in _messages(sim) if "withdrawn whole" in m]
    assert msg and "retrying in 10s" in msg[0]
    sim.full = False  # room appears
    for _ in range(40):
        sim.round({0: "ok"})
        if sim.step() is Step.HEALTHY:
            break
    assert sim.step() is Step.HEALTHY
    rec = sim.records[0]
    assert rec.placement.withdrawals == 0 and rec.placement.unschedulable is None and rec.epoch == 2
    # The withdrawal deleted pods without counting a restart; the restart itself counted once.
    assert rec.budget.restarts == 1


def test_a_withdrawn_group_creates_no_pod_until_the_cluster_changes() -> None:
    sim = MoveSim(cfg=move_settings(sched=20))  # backoff 0: it used to retry every 2 s
    sim.round({0: "desync!"})
    sim.full = True
    sim.facts = {0: {"cluster": "full"}}
    for _ in range(40):
        sim.round({})
        if sim.step() is Step.UNSCHEDULABLE and not sim.view(0):
            break
    assert sim.step() is Step.UNSCHEDULABLE and not sim.view(0)
    msg = [m for m in _messages(sim) if "withdrawn whole" in m]
    assert msg and "trying again when the cluster changes" in msg[0]
    created = len(sim.actions(CreateEpoch, 0))
    for _ in range(120):  # two minutes with nothing changed: no pod, no GPU held
        sim.round({}, dt=1.0)
        assert not sim.view(0) and sim.step() is Step.UNSCHEDULABLE
    assert len(sim.actions(CreateEpoch, 0)) == created
    sim.full = False
    sim.facts = {0: {"cluster": "a node uncordoned"}}
    for _ in range(40):
        sim.round({0: "ok"})
        if sim.step() is Step.HEALTHY:
            break
    assert sim.step() is Step.HEALTHY
    assert any("the cluster changed" in m for m in _messages(sim))


def test_the_cluster_fingerprint_follows_nodes_and_bound_pods_only() -> None:
    nodes = {"a": NodeState("a", gpus="8"), "b": NodeState("b", gpus="8")}
    pods = [
        {"metadata": {"uid": "p1"}, "spec": {"nodeName": "a"}},
        {"metadata": {"uid": "p2"}, "spec": {}},  # not bound: holds nothing
    ]
    base = cluster_fingerprint(nodes, pods)
    assert cluster_fingerprint(dict(reversed(nodes.items())), list(reversed(pods))) == base
    assert cluster_fingerprint(nodes, pods[:1]) == base
    assert cluster_fingerprint(nodes, []) != base  # a pod gone
    cordoned = {**nodes, "a": NodeState("a", unschedulable=True, gpus="8")}
    assert cluster_fingerprint(cordoned, pods) != base
    assert cluster_fingerprint({**nodes, "c": NodeState("c", gpus="8")}, pods) != base
    assert cluster_fingerprint({**nodes, "b": NodeState("b", gpus="4")}, pods) != base
    labelled = {**nodes, "b": NodeState("b", gpus="8", labels=(("pool", "decode"),))}
    assert cluster_fingerprint(labelled, pods) != base
    node = {
        "metadata": {"name": "a"},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    assert NodeState.from_k8s(node) == NodeState("a", gpus="8")


def test_node_maintenance_reads_cordons_and_maintenance_taints_not_health_taints() -> None:
    assert node_maintenance(NodeState("n", unschedulable=True)) == "node n is cordoned"
    taint = NodeState("n", taints=(("example.com/maintenance", "", "NoSchedule"),))
    assert node_maintenance(taint) == "node n is tainted example.com/maintenance:NoSchedule"
    tolerated = [{"key": "example.com/maintenance", "operator": "Exists"}]
    assert node_maintenance(taint, tolerated) is None
    health = NodeState("n", taints=(("node.kubernetes.io/not-ready", "", "NoExecute"),))
    assert node_maintenance(health) is None
    prefer = NodeState("n", taints=(("example.com/soon", "", "PreferNoSchedule"),))
    assert node_maintenance(prefer) is None
    nodes = {"a": NodeState("a", unschedulable=True), "b": NodeState("b")}
    pods = [{"spec": {"nodeName": "a"}}, {"spec": {"nodeName": "b"}}, {"spec": {}}]
    assert group_maintenance(pods, nodes) == ("node a is cordoned", ("a",))
    assert group_maintenance(pods[1:], nodes) == (None, ())


def test_an_unused_input_default_means_no_maintenance() -> None:
    assert GroupInput().maintenance is None and GroupInput().inflight == {}

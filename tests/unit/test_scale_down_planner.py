"""Scale-down in the recovery planner, with an injected clock: a group beyond the role's
replicas leaves every router, its in-flight requests finish (bounded by
maintenance.drainTimeoutSeconds), then its pods go; never the role's last group in
service, never while the role recovers a broken group; scaled back up meanwhile, a group
still serving stays and one already going is created anew.

`ScaleSim` extends the planner tests' fake API server (`test_recovery.Sim`) with the
role's replicas (the groups at or beyond it are told to retire, as the control round does)
and the leaders' in-flight requests."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from test_recovery import T0, Sim

from lockstep.core.recovery import (
    DeletePods,
    EndRequests,
    GroupInput,
    Reason,
    SetGate,
    Step,
    retired,
)

pytestmark = pytest.mark.unit


@dataclass
class ScaleSim(Sim):
    replicas: int = 2
    inflight: dict[str, int] = field(default_factory=dict)  # leader name -> requests

    def inputs(self, verdicts=None, manual=None):  # type: ignore[no-untyped-def,override]
        base = super().inputs(verdicts, manual)
        return {
            i: replace(
                inp,
                retire=i >= self.replicas,
                inflight={p.name: self.inflight.get(p.name, 0) for p in inp.pods if p.rank == 0},
            )
            for i, inp in base.items()
        }

    def gates(self, group: int) -> set[bool | None]:
        return {p.gate for p in self.view(group)}


def test_scale_down_drains_the_group_then_deletes_it_and_it_is_forgotten() -> None:
    sim = ScaleSim(groups=2, replicas=2)
    sim.inflight["m-decode-1-0"] = 3
    sim.replicas = 1  # an autoscaler wrote 1
    sim.round()
    assert sim.step(1) is Step.RETIRING
    assert sim.gates(1) == {False}  # out of every router first
    assert sim.reasons(1) == ["GroupRetiring"]
    # In-flight requests finish before any pod goes.
    for _ in range(10):
        sim.round()
    assert not sim.actions(DeletePods, 1)
    sim.inflight["m-decode-1-0"] = 0
    for _ in range(5):
        sim.round()
    assert sim.actions(DeletePods, 1)
    # Everything finished in time: nothing was ended.
    assert not sim.actions(EndRequests, 1)
    assert not sim.view(1)
    assert "GroupRetired" in sim.reasons(1)
    assert retired(sim.records[1], sim.view(1))  # the I/O layer forgets it
    # Group 0 was never touched.
    assert sim.step(0) is Step.HEALTHY
    assert not sim.actions(SetGate, 0) and not sim.actions(DeletePods, 0)


def test_the_drain_of_a_scale_down_is_bounded_by_drain_timeout_seconds() -> None:
    sim = ScaleSim(groups=2, replicas=1)  # drainTimeoutSeconds: the default, 120
    sim.inflight["m-decode-1-0"] = 1  # a request that never finishes
    start = sim.now
    while sim.view(1) and sim.now < start + 300:
        sim.round()
    deleted_at = next(t for t, g, a in sim.log if g == 1 and isinstance(a, DeletePods))
    assert 120 <= deleted_at - start < 125
    # What still ran when the time was up ended retryable first, never cut silently: the
    # leaders are told to end it in the round of the delete, before it.
    kinds = [type(a).__name__ for t, g, a in sim.log if g == 1 and t == deleted_at]
    assert kinds.index("EndRequests") < kinds.index("DeletePods")
    (ended,) = sim.actions(EndRequests, 1)
    assert isinstance(ended, EndRequests) and "drain ran out of time (120s)" in ended.reason
    drained = [
        a for _, g, a in sim.log if g == 1 and getattr(a, "reason", None) == Reason.DRAINED.value
    ]
    assert drained and "timed out" in drained[0].message and "1 request(s)" in drained[0].message


def test_scale_down_waits_while_the_role_recovers_a_broken_group() -> None:
    sim = ScaleSim(groups=3, replicas=3)
    sim.round({0: "desync!"})  # group 0 breaks and starts recovering
    assert sim.step(0) is not Step.HEALTHY
    sim.replicas = 2
    for _ in range(3):
        sim.round()
    assert sim.step(2) is Step.HEALTHY  # still serving
    assert sim.gates(2) == {True}
    assert sim.reasons(2).count("ScaleDownDeferred") == 1  # once, not every round
    assert "RestartDeferred" not in sim.reasons(2)
    assert not sim.actions(SetGate, 2) and not sim.actions(DeletePods, 2)
    sim.recover(0)
    for _ in range(5):
        if sim.step(2) is Step.RETIRING:
            break
        sim.round()
    assert sim.step(2) is Step.RETIRING
    assert sim.gates(2) == {False}  # out of the routers first, the pods still there


def test_scale_down_never_takes_the_last_group_in_service() -> None:
    sim = ScaleSim(groups=2, replicas=2)
    # Group 0 is starting and not yet probed: group 1 is the only one serving.
    sim.records[0] = sim.records[0].model_copy(
        update={
            "step": Step.STARTING,
            "epoch": 1,
            "epoch_started_at": sim.now,
            "step_since": sim.now,
        }
    )
    sim.pods[0] = {uid: replace(p, gate=None, epoch=1) for uid, p in sim.pods[0].items()}
    sim.replicas = 1
    sim.round()
    assert sim.step(1) is Step.HEALTHY and sim.gates(1) == {True}
    assert "ScaleDownDeferred" in sim.reasons(1)
    # Group 0's probe passes and it is admitted: then group 1 may go.
    for _ in range(5):
        sim.round({0: "ok"})
    assert sim.step(0) is Step.HEALTHY
    assert sim.step(1) is Step.RETIRING


def test_scaled_to_zero_every_group_goes() -> None:
    sim = ScaleSim(groups=2, replicas=0)
    for _ in range(10):
        sim.round()
    assert not sim.view(0) and not sim.view(1)
    assert all(retired(sim.records[i], sim.view(i)) for i in (0, 1))


def test_scaled_back_up_while_draining_the_group_stays_and_is_readmitted() -> None:
    sim = ScaleSim(groups=2, replicas=1)
    sim.inflight["m-decode-1-0"] = 2
    sim.round()
    assert sim.step(1) is Step.RETIRING and sim.gates(1) == {False}
    uids = {p.uid for p in sim.view(1)}
    sim.replicas = 2
    for _ in range(3):
        sim.round({1: "ok"})
    assert sim.step(1) is Step.HEALTHY
    assert sim.gates(1) == {True}  # back in every router
    assert {p.uid for p in sim.view(1)} == uids  # the same pods: nothing restarted
    assert not sim.actions(DeletePods, 1)
    assert "scale-down undone" in " ".join(
        a.message for _, g, a in sim.log if g == 1 and hasattr(a, "message")
    )


def test_scaled_back_up_after_the_pods_went_the_group_is_created_anew() -> None:
    sim = ScaleSim(groups=2, replicas=1, settle_deletes=False)
    while not sim.actions(DeletePods, 1):
        sim.round()
    assert all(p.deleting for p in sim.view(1))
    sim.replicas = 2
    sim.round()
    assert sim.step(1) is Step.WAITING_GONE  # the old pods finish going first
    sim.settle()
    for _ in range(3):
        sim.round()
    new = sim.view(1)
    assert new and all(not p.deleting for p in new)
    assert sim.records[1].epoch > 0
    sim.recover(1)
    assert sim.gates(1) == {True}


def test_an_input_without_a_replicas_decision_never_retires() -> None:
    assert GroupInput().retire is False
    sim = Sim(groups=2)  # the plain fake: every group within replicas
    for _ in range(3):
        sim.round()
    assert sim.step(0) is Step.HEALTHY and sim.step(1) is Step.HEALTHY
    assert sim.now > T0

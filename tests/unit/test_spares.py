"""Warm spare groups (`recovery.spares`): which groups stand by, and the hand-overs a user
notices as capacity that never left: a broken group's place taken at once, a
maintenance move with nothing drained first, a scale-up served by a spare."""

from __future__ import annotations

from dataclasses import replace

from factories import pdd_obj
from test_recovery import T0, Sim, settings

from lockstep.api.models import parse_pddeployment
from lockstep.core.policy import evaluate
from lockstep.core.recovery import (
    DeletePods,
    EmitEvent,
    GroupInput,
    IncidentKind,
    IncidentRecord,
    RestartInPlace,
    SetGate,
    Step,
    new_group_record,
    plan_role,
)
from lockstep.core.status import derive_status
from lockstep.core.verdicts import PodView

MOVE_INCIDENT = IncidentRecord(
    id="decode-0-1",
    kind=IncidentKind.MAINTENANCE,
    epoch=0,
    reason="node-0 cordoned",
    first_failure_at=T0,
    detected_at=T0,
)


def with_spares(groups: int = 3, serving: int = 2, **cfg: object) -> Sim:
    """A role of `groups` healthy groups, the highest `groups - serving` of them spares
    (out of every router: gates false)."""
    sim = Sim(cfg=settings(**cfg), groups=groups, serving=serving)  # type: ignore[arg-type]
    for i in range(serving, groups):
        sim.records[i] = sim.records[i].model_copy(update={"spare": True})
        sim.pods[i] = {u: replace(p, gate=False) for u, p in sim.pods[i].items()}
    return sim


def gates(sim: Sim, group: int) -> set[bool | None]:
    return {p.gate for p in sim.pods[group].values()}


def gate_actions(sim: Sim, group: int, value: bool) -> list[SetGate]:
    return [a for a in sim.actions(SetGate, group) if isinstance(a, SetGate) and a.value is value]


def test_a_new_role_starts_its_highest_groups_as_spares_and_never_admits_them() -> None:
    sim = Sim(groups=3, serving=2)
    for i in range(3):
        sim.records[i] = new_group_record("decode", i, now=sim.now)
        sim.pods[i] = {u: replace(p, gate=None) for u, p in sim.pods[i].items()}
    sim.round()
    assert [sim.records[i].spare for i in range(3)] == [False, False, True]
    for _ in range(4):
        sim.round({0: "ok", 1: "ok", 2: "ok"})
    assert [sim.step(i) for i in range(3)] == [Step.HEALTHY] * 3
    assert gates(sim, 0) == gates(sim, 1) == {True}
    assert gates(sim, 2) == {None} and gate_actions(sim, 2, True) == []
    assert "GroupStandingBy" in sim.reasons(2)


def test_a_desync_admits_the_spare_in_the_same_round_and_the_broken_group_becomes_it() -> None:
    sim = with_spares()
    plan = sim.round({0: "desync!"})
    # The spare is in every router before the broken group's requests are ended.
    assert plan.first == {2}
    assert next(i for i, _ in plan.order()) == 2
    assert gates(sim, 2) == {True} and sim.step(0) is Step.DRAINING
    assert sim.records[2].spare is False and sim.records[0].spare is True
    sim.round()
    assert gates(sim, 0) == {False}
    assert "SparePromoted" in sim.reasons(2) and "SparePromoted" in sim.reasons(0)
    # The broken group restarts as always and then stands by; it is never admitted.
    sim.recover(0, rounds=60)
    sim.round({2: "ok"})
    assert sim.step(2) is Step.HEALTHY and not sim.records[2].spare
    assert sim.records[0].spare and sim.step(0) is Step.HEALTHY
    assert len(sim.actions(DeletePods, 0)) >= 1  # restarted (Recreate)
    assert gate_actions(sim, 0, True) == []
    assert gates(sim, 0) <= {None, False}
    closed = [i for i in sim.incidents.values() if i.state == "Closed"]
    assert closed and "standing by as the role's spare" in (closed[-1].action or "")


def test_the_last_serving_group_may_leave_service_when_a_spare_takes_over() -> None:
    sim = with_spares(groups=2, serving=1)
    sim.round({0: "desync!"})
    assert sim.step(0) is Step.DRAINING  # not held back as the last group in service
    assert sim.step(1) is Step.READMITTING and gates(sim, 1) == {True}


def test_without_a_ready_spare_a_broken_group_restarts_as_before() -> None:
    sim = with_spares()
    sim.round({2: "timeout"})  # the spare failed a probe: Suspect, not ready
    assert sim.step(2) is Step.SUSPECT
    plan = sim.round({0: "desync!"})
    assert plan.first == frozenset() and sim.records[0].spare is False
    assert gates(sim, 2) == {False}


def test_a_broken_spare_is_recovered_like_any_group_and_never_admitted() -> None:
    sim = with_spares(mode="InPlace")
    sim.round({2: "desync!"})
    assert sim.step(2) is Step.DRAINING and sim.records[2].spare
    sim.recover(2, rounds=60)
    assert sim.records[2].spare and sim.actions(RestartInPlace, 2)
    assert gate_actions(sim, 2, True) == []
    assert [sim.step(i) for i in (0, 1)] == [Step.HEALTHY, Step.HEALTHY]
    assert gate_actions(sim, 0, False) == gate_actions(sim, 1, False) == []


def test_a_scale_up_promotes_the_ready_spare_at_once() -> None:
    sim = with_spares()
    sim.serving = 3  # three serving groups wanted, the spare the only one to hand
    sim.round()
    assert sim.records[2].spare is False and gates(sim, 2) == {True}
    assert "SparePromoted" in sim.reasons(2)
    sim.round()
    assert sim.step(2) is Step.HEALTHY


def test_a_scale_up_with_a_new_group_promotes_the_spare_and_the_new_group_stands_by() -> None:
    sim = with_spares()
    sim.serving, sim.groups = 3, 4  # replicas 2 -> 3, spares 1: a fourth group is asked for
    sim.pods[3] = {}
    sim.records[3] = new_group_record("decode", 3, now=sim.now)
    plan = sim.round()
    assert plan.first == {2} and gates(sim, 2) == {True}
    assert sim.records[2].spare is False and sim.records[3].spare is True


def test_a_second_spare_asked_for_starts_as_a_spare_and_nothing_is_handed_over() -> None:
    sim = with_spares()
    sim.groups = 4  # spares 1 -> 2
    sim.pods[3] = {}
    sim.records[3] = new_group_record("decode", 3, now=sim.now)
    plan = sim.round()
    assert plan.first == frozenset() and sim.records[3].spare
    assert [sim.step(i) for i in range(3)] == [Step.HEALTHY] * 3
    assert not any(r in ("SparePromoted", "GroupStandingDown") for r in sim.reasons())


def test_more_serving_groups_than_replicas_stand_one_down_through_a_drain() -> None:
    sim = with_spares()
    sim.serving = 1
    sim.facts = {1: {"inflight": {"m-decode-1-0": 2}}}  # its leader still holds 2
    sim.round()
    assert sim.step(1) is Step.STANDING_DOWN and sim.records[1].spare
    assert gates(sim, 1) == {False} and gates(sim, 0) == {True}
    sim.round()
    sim.round()
    assert sim.step(1) is Step.STANDING_DOWN  # its requests are still running
    sim.facts = {1: {"inflight": {"m-decode-1-0": 0}}}
    sim.round()
    assert sim.step(1) is Step.HEALTHY and sim.records[1].spare
    assert "GroupStandingBy" in sim.reasons(1)


def test_a_maintenance_move_hands_over_to_the_spare_and_drains_the_old_group_after() -> None:
    sim = with_spares()
    sim.facts = {0: {"maintenance": "node-0 cordoned", "maintenance_nodes": ("node-0",)}}
    plan = sim.round()
    assert plan.first == {2} and gates(sim, 2) == {True}
    # The old group moves by draining first (nothing waits: the spare serves), never
    # starts a second epoch beside its first.
    assert sim.records[0].spare and sim.step(0) is Step.DRAINING
    assert sim.records[0].maintenance == "node-0 cordoned"
    assert [e for e in sim.actions(EmitEvent, 0) if "took its place" in e.message]


def test_a_move_that_drains_first_hands_over_to_a_spare_ready_later() -> None:
    # No spare ready when the move starts: the group drains first (out of service);
    # a spare that turns ready meanwhile takes its place at once.
    sim = with_spares()
    sim.round({2: "timeout"})  # the spare is Suspect: not ready
    rec = sim.records[0]
    sim.records[0] = rec.model_copy(
        update={"step": Step.AWAITING_RESTART, "incident": MOVE_INCIDENT}
    )
    sim.round({2: "ok"})  # Healthy again: ready
    assert sim.records[2].spare is False and gates(sim, 2) == {True}
    assert sim.records[0].spare is True


def test_plan_role_without_a_serving_count_makes_no_spares() -> None:
    records = {i: new_group_record("decode", i, now=T0) for i in range(2)}
    pods = tuple(PodView(f"m-decode-1-{r}", f"u{r}", 0, r) for r in range(2))
    plan = plan_role(settings(), records, {1: GroupInput(pods)}, now=T0)
    assert not any(p.record.spare for p in plan.groups.values())


def test_status_counts_spares_apart_from_the_serving_groups() -> None:
    pdd = parse_pddeployment(pdd_obj(decode={"tp": 1, "gpusPerPod": 1, "replicas": 2, "spares": 1}))
    policy = evaluate(pdd.spec)
    healthy = {"step": Step.HEALTHY}
    records = {
        f"decode/{i}": new_group_record("decode", i, now=100.0).model_copy(
            update={**healthy, "spare": i == 2}
        )
        for i in range(3)
    }
    records["prefill/0"] = new_group_record("prefill", 0, now=100.0).model_copy(update=healthy)
    status = derive_status(pdd, policy, [], records, {}, {}, {}, {}, 200.0)
    decode = status["decode"]
    assert (decode["replicas"], decode["readyGroups"]) == (2, 2)
    assert (decode["spares"], decode["readySpares"]) == (1, 1)
    assert [g["spare"] for g in decode["groups"]] == [False, False, True]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert ready["message"].endswith("1/1 spare(s) ready")

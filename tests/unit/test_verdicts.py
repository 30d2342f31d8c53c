"""Verdicts: what the prober saw -> Healthy, Slow, Desynced, Hung, RankDown or Unknown."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lockstep.api import constants as c
from lockstep.core.verdicts import (
    MAX_EVIDENCE_ITEMS,
    MAX_EVIDENCE_TEXT,
    AgentReport,
    Collective,
    Decision,
    GroupObservation,
    PodView,
    ProbeOutcome,
    RankState,
    Signal,
    StepBounds,
    Verdict,
    classify_group,
    pod_view_from_k8s,
)

NOW = 1_000_000.0
EPOCH = 3
OK = ProbeOutcome("ok", latency_ms=4.0)
TIMEOUT = ProbeOutcome("timeout", error="no answer in 3s")
FAILED = ProbeOutcome("failed", error="HTTP 503")
ALLREDUCE = Collective("all_reduce", "tp:cpu", 88, NOW - 30)
BROADCAST = Collective("broadcast_pyobj", "tp:cpu", 87, NOW - 30)


def pod(rank: int, **kw: Any) -> PodView:
    base = PodView(name=f"m-decode-0-{rank}", uid=f"uid-{rank}", epoch=EPOCH, rank=rank)
    return replace(base, **kw)


def rs(pod_rank: int, rank: int, iteration: int = 100, seq: int = 50, **kw: Any) -> RankState:
    base = RankState(
        pod=f"m-decode-0-{pod_rank}",
        rank=rank,
        iteration=iteration,
        pid=1000 + rank,
        last_decision=Decision("batch", seq, "DECODE", 8, "abc"),
        collective=ALLREDUCE,
    )
    return replace(base, **kw)


def agents(*ranks: RankState) -> tuple[AgentReport, ...]:
    by_pod: dict[str, list[RankState]] = {}
    for r in ranks:
        by_pod.setdefault(r.pod, []).append(r)
    return tuple(AgentReport(p, tuple(rr)) for p, rr in by_pod.items())


def observe(
    probe: ProbeOutcome = TIMEOUT,
    ranks: tuple[RankState, ...] = (),
    pods: tuple[PodView, ...] | None = None,
    baseline: dict[str, int] | None = None,
    extra_agents: tuple[AgentReport, ...] = (),
) -> GroupObservation:
    return GroupObservation(
        epoch=EPOCH,
        expected_pods=2,
        probe=probe,
        pods=(pod(0), pod(1)) if pods is None else pods,
        agents=agents(*ranks) + extra_agents,
        restart_baseline=baseline or {},
    )


# Two pods, two ranks each; the previous sample is the same processes at iteration 100.
PREV = (rs(0, 0), rs(0, 1), rs(1, 2), rs(1, 3))


def all_ranks(**kw: Any) -> tuple[RankState, ...]:
    return tuple(replace(r, **kw) for r in PREV)


CASES: list[tuple[str, GroupObservation, tuple[RankState, ...], Verdict, bool, Signal | None]] = [
    ("probe passes", observe(OK), (), Verdict.HEALTHY, False, None),
    (
        "probe times out, every rank progressed",
        observe(ranks=all_ranks(iteration=140)),
        PREV,
        Verdict.SLOW,
        False,
        Signal.PROGRESS,
    ),
    (
        "consensus failure reported",
        observe(ranks=(*PREV[:3], replace(PREV[3], consensus_failure="hash mismatch at 51"))),
        PREV,
        Verdict.DESYNCED,
        True,
        Signal.CONSENSUS_FAILURE,
    ),
    (
        "ranks at different decision sequences",
        observe(
            ranks=(*PREV[:2], *(replace(r, last_decision=Decision("batch", 51)) for r in PREV[2:]))
        ),
        PREV,
        Verdict.DESYNCED,
        False,
        Signal.DIFFERENT_DECISIONS,
    ),
    (
        "same sequence, different request ids",
        observe(
            ranks=(
                *PREV[:3],
                replace(PREV[3], last_decision=Decision("batch", 50, "DECODE", 8, "zz")),
            )
        ),
        PREV,
        Verdict.DESYNCED,
        False,
        Signal.DIFFERENT_DECISIONS,
    ),
    (
        "ranks in different collectives",
        observe(ranks=(*PREV[:3], replace(PREV[3], collective=BROADCAST))),
        PREV,
        Verdict.DESYNCED,
        False,
        Signal.DIFFERENT_COLLECTIVES,
    ),
    (
        "one rank outside any collective while the others wait",
        observe(ranks=(*PREV[:3], replace(PREV[3], collective=None))),
        PREV,
        Verdict.DESYNCED,
        False,
        Signal.DIFFERENT_COLLECTIVES,
    ),
    (
        "all in the same collective, no progress",
        observe(ranks=PREV),
        PREV,
        Verdict.HUNG,
        False,
        Signal.SAME_COLLECTIVE,
    ),
    (
        "first failed sample, all in the same collective (progress unknown)",
        observe(ranks=PREV),
        (),
        Verdict.HUNG,
        False,
        Signal.SAME_COLLECTIVE,
    ),
    (
        "no collective, no progress",
        observe(ranks=all_ranks(collective=None)),
        PREV,
        Verdict.HUNG,
        False,
        Signal.NO_PROGRESS,
    ),
    (
        "only some ranks progressed",
        observe(ranks=(*(replace(r, iteration=101) for r in PREV[:2]), *PREV[2:])),
        PREV,
        Verdict.HUNG,
        False,
        Signal.NO_PROGRESS,
    ),
    (
        "a rank restarted its process: new pid is not progress",
        observe(ranks=all_ranks(iteration=140, pid=7)),
        PREV,
        Verdict.HUNG,
        False,
        Signal.NO_PROGRESS,
    ),
    (
        "probe fails, no agent answers",
        observe(FAILED),
        (),
        Verdict.UNKNOWN,
        False,
        Signal.PROBE_FAILED,
    ),
    (
        "probe times out, agents unreachable",
        observe(extra_agents=(AgentReport("m-decode-0-0", None, "connect refused"),)),
        (),
        Verdict.UNKNOWN,
        False,
        Signal.AGENT_UNREACHABLE,
    ),
    (
        "a pod is missing",
        observe(OK, pods=(pod(0),)),
        (),
        Verdict.RANK_DOWN,
        True,
        Signal.POD_MISSING,
    ),
    (
        "a pod is being deleted",
        observe(OK, pods=(pod(0), pod(1, deleting=True))),
        (),
        Verdict.RANK_DOWN,
        True,
        Signal.POD_DELETED,
    ),
    (
        "a pod was evicted",
        observe(OK, pods=(pod(0), pod(1, evicted=True, phase="Failed"))),
        (),
        Verdict.RANK_DOWN,
        True,
        Signal.POD_EVICTED,
    ),
    (
        "a pod Failed",
        observe(OK, pods=(pod(0), pod(1, phase="Failed", container_running=False))),
        (),
        Verdict.RANK_DOWN,
        True,
        Signal.POD_FAILED,
    ),
    (
        "a container is not running",
        observe(OK, pods=(pod(0), pod(1, container_running=False))),
        (),
        Verdict.RANK_DOWN,
        True,
        Signal.CONTAINER_NOT_RUNNING,
    ),
    (
        "a restart count moved although the probe passes",
        observe(OK, pods=(pod(0), pod(1, restart_count=2)), baseline={"uid-1": 1}),
        (),
        Verdict.RANK_DOWN,
        True,
        Signal.CONTAINER_RESTARTED,
    ),
    (
        "a fresh pod restarted (no baseline: counts from 0)",
        observe(OK, pods=(pod(0), pod(1, restart_count=1))),
        (),
        Verdict.RANK_DOWN,
        True,
        Signal.CONTAINER_RESTARTED,
    ),
    (
        "an agent reports a rank process gone",
        observe(ranks=(*PREV[:3], replace(PREV[3], alive=False))),
        PREV,
        Verdict.RANK_DOWN,
        True,
        Signal.RANK_EXITED,
    ),
    (
        "pending pods are starting, not down",
        observe(FAILED, pods=(pod(0), pod(1, phase="Pending", container_running=False))),
        (),
        Verdict.UNKNOWN,
        False,
        Signal.POD_NOT_STARTED,
    ),
]


@pytest.mark.parametrize(
    ("obs", "previous", "verdict", "immediate", "signal"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_classify_group(
    obs: GroupObservation,
    previous: tuple[RankState, ...],
    verdict: Verdict,
    immediate: bool,
    signal: Signal | None,
) -> None:
    got = classify_group(obs, previous, now=NOW)
    assert (got.verdict, got.immediate) == (verdict, immediate), got.reason
    if signal is not None:
        assert signal in got.signals
    assert got.reason
    assert got.epoch == EPOCH
    assert got.observed_at == NOW


def test_restart_count_at_its_baseline_is_healthy() -> None:
    obs = observe(OK, pods=(pod(0, restart_count=4), pod(1)), baseline={"uid-0": 4})
    assert classify_group(obs, now=NOW).verdict is Verdict.HEALTHY


def test_pods_of_another_epoch_do_not_count_as_the_group() -> None:
    old = pod(1, epoch=EPOCH - 1, uid="old-1")
    got = classify_group(observe(OK, pods=(pod(0), old)), now=NOW)
    assert got.verdict is Verdict.RANK_DOWN
    assert Signal.POD_MISSING in got.signals


def test_consensus_failure_wins_over_the_rank_death_it_causes() -> None:
    ranks = (*PREV[:3], replace(PREV[3], alive=False, consensus_failure="diverged"))
    obs = observe(ranks=ranks, pods=(pod(0), pod(1, restart_count=1)))
    got = classify_group(obs, PREV, now=NOW)
    assert got.verdict is Verdict.DESYNCED
    assert got.immediate
    assert "diverged" in str(got.evidence["consensus_failure"])


def test_slow_is_never_a_failure() -> None:
    got = classify_group(observe(ranks=all_ranks(iteration=101)), PREV, now=NOW)
    assert got.verdict is Verdict.SLOW
    assert not got.is_failure
    assert not Verdict.HEALTHY.is_failure
    assert all(v.is_failure for v in (Verdict.DESYNCED, Verdict.HUNG, Verdict.RANK_DOWN))
    assert Verdict.UNKNOWN.is_failure


def test_hung_reason_says_where_and_for_how_long() -> None:
    got = classify_group(observe(ranks=PREV), PREV, now=NOW)
    assert "all_reduce@tp:cpu#88" in got.reason
    assert "30.0s" in got.reason
    assert got.evidence["collective_since"] == ALLREDUCE.since


def test_evidence_is_bounded() -> None:
    many = tuple(replace(rs(0, i), pod="p" * 500, consensus_failure="x" * 5000) for i in range(100))
    got = classify_group(observe(ranks=many), now=NOW)
    for key in ("ranks", "consensus_failure"):
        items = got.evidence[key]
        assert isinstance(items, list)
        assert len(items) == MAX_EVIDENCE_ITEMS
        assert all(len(i) <= MAX_EVIDENCE_TEXT for i in items)
        assert items[-1].startswith("... and")
    assert len(got.reason) <= MAX_EVIDENCE_TEXT


def test_latency_is_carried_for_status() -> None:
    assert classify_group(observe(OK), now=NOW).latency_ms == 4.0


# ------------------------------------------------------------------------- parsers


def k8s_pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "m-decode-0-1",
            "uid": "u-1",
            "labels": {c.LABEL_EPOCH: "3", c.LABEL_RANK: "1"},
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": c.READINESS_GATE, "status": "True"},
            ],
            "containerStatuses": [
                {"name": "sglang", "restartCount": 2, "state": {"running": {}}},
            ],
            **status,
        },
    }


def test_pod_view_from_a_running_pod() -> None:
    got = pod_view_from_k8s(k8s_pod())
    assert got == PodView(
        name="m-decode-0-1",
        uid="u-1",
        epoch=3,
        rank=1,
        phase="Running",
        deleting=False,
        evicted=False,
        container_running=True,
        restart_count=2,
        ready=True,
        gate=True,
    )


def test_pod_view_of_a_pod_in_trouble() -> None:
    obj = k8s_pod(
        phase="Failed",
        reason="Evicted",
        conditions=[{"type": c.READINESS_GATE, "status": "False"}],
        containerStatuses=[
            {"restartCount": 1, "state": {"terminated": {"exitCode": 137}}},
        ],
        initContainerStatuses=[{"restartCount": 1, "state": {"terminated": {}}}],
    )
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    got = pod_view_from_k8s(obj)
    assert got.deleting and got.evicted
    assert not got.container_running and not got.ready
    assert got.gate is False
    assert got.restart_count == 2


def test_pod_view_of_a_fresh_pod_and_a_preempted_one() -> None:
    fresh = pod_view_from_k8s({"metadata": {"name": "p", "uid": "u", "labels": {}}})
    assert (fresh.phase, fresh.epoch, fresh.gate, fresh.container_running) == (
        "Pending",
        None,
        None,
        False,
    )
    preempted = pod_view_from_k8s(
        k8s_pod(conditions=[{"type": "DisruptionTarget", "status": "True"}])
    )
    assert preempted.evicted


# ------------------------------------------------------------------ busy is not hung


def in_step(age: float, recent: tuple[float, ...] = (0.02,)) -> tuple[RankState, ...]:
    """No rank advanced since PREV; rank 3 runs a model step `age` seconds old, the
    others wait for it in the next request broadcast (a skew, not a divergence)."""
    waiting = tuple(replace(r, collective=BROADCAST, recent_steps_s=recent) for r in PREV[:3])
    running = replace(PREV[3], step_age_s=age, recent_steps_s=recent)
    return (*waiting, running)


@pytest.mark.parametrize("step_s", [5, 15, 25, 60])
def test_a_long_step_is_slow_not_hung_under_the_default_bounds(step_s: float) -> None:
    # The first long step: the recent ones were short, so the floor (90 s) applies.
    got = classify_group(observe(ranks=in_step(step_s - 1)), PREV, now=NOW)
    assert got.verdict is Verdict.SLOW and not got.is_failure
    assert Signal.IN_STEP in got.signals
    # Once steps that long are the norm, the bound follows them (3 x the longest).
    later = in_step(step_s * 2.5, recent=(step_s,) * 4)
    assert classify_group(observe(ranks=later), PREV, now=NOW).verdict is Verdict.SLOW


def test_a_step_past_its_bound_is_a_hang() -> None:
    bounds = StepBounds(multiplier=3, min_seconds=10, max_seconds=300)
    # Recent steps of 2 s: a step is legitimate up to max(3 x 2, 10) = 10 s.
    assert (
        classify_group(
            observe(ranks=in_step(9.0, recent=(2.0,))), PREV, now=NOW, steps=bounds
        ).verdict
        is Verdict.SLOW
    )
    stuck = classify_group(observe(ranks=in_step(11.0, recent=(2.0,))), PREV, now=NOW, steps=bounds)
    assert stuck.verdict is not Verdict.SLOW and stuck.is_failure
    # The cap holds whatever the recent steps say (SGLang's watchdog ends a step there).
    capped = StepBounds(multiplier=3, min_seconds=10, max_seconds=120)
    long_ago = in_step(121.0, recent=(100.0,))
    assert classify_group(observe(ranks=long_ago), PREV, now=NOW, steps=capped).is_failure


def test_divergence_evidence_still_acts_during_a_step() -> None:
    ranks = in_step(5.0)
    ranks = (*ranks[:3], replace(ranks[3], consensus_failure="hash mismatch at 51"))
    got = classify_group(observe(ranks=ranks), PREV, now=NOW)
    assert got.verdict is Verdict.DESYNCED and got.immediate


# ------------------------------------------------------------------ a stopped rank


@pytest.mark.parametrize(
    "where",
    ["inside a model step", "one decision behind", "in another collective", "in step"],
)
def test_a_stopped_rank_is_rank_down_wherever_it_stopped(where: str) -> None:
    """Without the process state, the same frozen rank reads Slow (inside a model step),
    Desynced (one decision or one collective behind) or Hung: /proc says stopped."""
    stopped = {
        "inside a model step": in_step(5.0)[3],
        "one decision behind": replace(
            PREV[3], last_decision=Decision("batch", 49, "DECODE", 8, "abc")
        ),
        "in another collective": replace(PREV[3], collective=BROADCAST),
        "in step": PREV[3],
    }[where]
    stopped = replace(stopped, process="stopped")
    others = in_step(5.0)[:3] if where == "inside a model step" else PREV[:3]
    got = classify_group(observe(ranks=(*others, stopped)), PREV, now=NOW)
    assert got.verdict is Verdict.RANK_DOWN and not got.immediate, got
    assert Signal.RANK_STOPPED in got.signals
    assert got.culprits == frozenset({"m-decode-0-1"})
    assert "m-decode-0-1/r3 (stopped)" in got.reason
    assert "m-decode-0-1/r3 it=100 dec=batch" in " ".join(got.evidence["ranks"])  # type: ignore[arg-type]


def test_a_traced_rank_is_stopped_and_a_probe_that_passes_wins() -> None:
    traced = (*PREV[:3], replace(PREV[3], process="traced"))
    assert classify_group(observe(ranks=traced), PREV, now=NOW).verdict is Verdict.RANK_DOWN
    assert classify_group(observe(OK, ranks=traced), PREV, now=NOW).verdict is Verdict.HEALTHY
    # Running, sleeping or in uninterruptible sleep (a GPU driver call) is no stop.
    for state in ("running", "sleeping", "uninterruptible", None):
        ranks = tuple(replace(r, process=state) for r in PREV)
        got = classify_group(observe(ranks=ranks), PREV, now=NOW)
        assert Signal.RANK_STOPPED not in got.signals and got.verdict is Verdict.HUNG


# ------------------------------------------------------------------ a rank stuck in D


def test_a_rank_in_uninterruptible_sleep_across_the_streak_is_hung_inside_its_step() -> None:
    """A GPU call that never returns: rank 3 sits in D inside a 20 s step, well within
    the 90 s floor that makes a step legitimate. /proc said D in the streak's first
    failed sample and says it again, no iteration moved: Hung now, not after the bound."""
    stuck = in_step(20.0)
    first = (*PREV[:3], replace(PREV[3], process="uninterruptible"))
    now = (*stuck[:3], replace(stuck[3], process="uninterruptible"))
    got = classify_group(observe(ranks=now), first, now=NOW)
    assert got.verdict is Verdict.HUNG and not got.immediate, got
    assert Signal.RANK_UNINTERRUPTIBLE in got.signals
    assert got.culprits == frozenset({"m-decode-0-1"})
    assert "uninterruptible sleep" in got.reason and "m-decode-0-1/r3" in got.reason
    assert outliers(got) == [
        ("m-decode-0-1/r3", "its process is in uninterruptible sleep, no progress")
    ]
    assert got.evidence["ranks_uninterruptible"] == ["m-decode-0-1/r3"]
    # Without the fact the same sample is a legitimate step.
    assert classify_group(observe(ranks=stuck), PREV, now=NOW).verdict is Verdict.SLOW


@pytest.mark.parametrize("case", ["only now", "only first", "progressed", "another process"])
def test_a_brief_uninterruptible_sleep_is_no_verdict_of_its_own(case: str) -> None:
    """D seen once (a page fault, a disk read), a rank in D that advanced between the
    samples, or a new process in D (a restarted rank): the step bound decides as before."""
    d = "uninterruptible"
    stuck = in_step(20.0)
    first, now = PREV, stuck
    if case == "only now":
        now = (*stuck[:3], replace(stuck[3], process=d))
    elif case == "only first":
        first = (*PREV[:3], replace(PREV[3], process=d))
    elif case == "progressed":
        first = (*PREV[:3], replace(PREV[3], process=d))
        now = (*stuck[:3], replace(stuck[3], process=d, iteration=PREV[3].iteration + 1))
    else:
        first = (*PREV[:3], replace(PREV[3], process=d))
        now = (*stuck[:3], replace(stuck[3], process=d, pid=(PREV[3].pid or 0) + 1000))
    got = classify_group(observe(ranks=now), first, now=NOW)
    assert Signal.RANK_UNINTERRUPTIBLE not in got.signals
    assert got.verdict is Verdict.SLOW, got


# ------------------------------------------------------------------ the outlier named


def outliers(got: Any) -> list[tuple[str, str]]:
    return [(o.where, o.why) for o in got.outliers]


def test_the_rank_behind_in_the_decision_sequence_is_named() -> None:
    behind = replace(PREV[3], last_decision=Decision("batch", 49, "DECODE", 8, "abc"))
    got = classify_group(observe(ranks=(*PREV[:3], behind)), PREV, now=NOW)
    assert got.verdict is Verdict.DESYNCED
    assert outliers(got) == [("m-decode-0-1/r3", "behind: decision #49, the others at #50")]
    # One against one (TP2): no majority, the one behind is named.
    pair = (PREV[0], behind)
    got = classify_group(observe(ranks=pair), (PREV[0], PREV[3]), now=NOW)
    assert outliers(got) == [("m-decode-0-1/r3", "behind: decision #49, the others at #50")]


def test_the_rank_in_another_collective_is_named() -> None:
    odd = replace(PREV[2], collective=BROADCAST)
    got = classify_group(observe(ranks=(*PREV[:2], odd, PREV[3])), PREV, now=NOW)
    assert got.verdict is Verdict.DESYNCED
    assert outliers(got) == [
        (
            "m-decode-0-1/r2",
            "in broadcast_pyobj@tp:cpu#87, the others in all_reduce@tp:cpu#88",
        )
    ]
    # One against one: the one behind in the collective sequence.
    got = classify_group(observe(ranks=(PREV[0], odd)), (PREV[0], PREV[2]), now=NOW)
    assert [o.where for o in got.outliers] == ["m-decode-0-1/r2"]
    assert got.outliers[0].why.startswith("behind: in broadcast_pyobj@tp:cpu#87")


def test_a_hang_names_the_ranks_that_did_not_progress_and_none_when_all_wait() -> None:
    moving = tuple(replace(r, iteration=140) for r in PREV[:3])
    got = classify_group(observe(ranks=(*moving, PREV[3])), PREV, now=NOW)
    assert got.verdict is Verdict.HUNG
    assert outliers(got) == [("m-decode-0-1/r3", "no progress while 3 other rank(s) progressed")]
    got = classify_group(observe(ranks=PREV), PREV, now=NOW)
    assert got.verdict is Verdict.HUNG and got.outliers == ()


def test_a_dead_stopped_or_restarted_rank_is_named() -> None:
    stopped = classify_group(
        observe(ranks=(*PREV[:3], replace(PREV[3], process="stopped"))), PREV, now=NOW
    )
    assert outliers(stopped) == [("m-decode-0-1/r3", "its process is stopped")]
    gone = classify_group(observe(ranks=(*PREV[:3], replace(PREV[3], alive=False))), PREV, now=NOW)
    assert outliers(gone) == [("m-decode-0-1/r3", "its process is gone")]
    restarted = classify_group(
        observe(pods=(pod(0), pod(1, restart_count=1)), ranks=PREV), PREV, now=NOW
    )
    assert outliers(restarted) == [
        ("m-decode-0-1", "pod m-decode-0-1 restarted (restart count 0 -> 1)")
    ]

"""The one judge: `classify_group`, its rules in order (the decision table is in the
package docstring), and what the next judgement is measured against
(`progress_baseline`) and a capture's cause (`divergence_cause`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lockstep.core.verdicts.facts import (
    MAX_OUTLIERS,
    STOPPED_PROCESS_STATES,
    UNINTERRUPTIBLE_PROCESS_STATE,
    EvidenceValue,
    GroupObservation,
    GroupVerdict,
    Outlier,
    ProbeOutcome,
    RankState,
    Signal,
    StepBounds,
    Verdict,
    _bounded,
    clip_evidence,
)
from lockstep.core.verdicts.outliers import (
    _collective_outliers,
    _decision_outliers,
    _key_text,
    _rank_text,
)
from lockstep.core.verdicts.pods import _pod_problems


def progress_baseline(
    baseline: Sequence[RankState],
    ranks: Sequence[RankState],
    verdict: GroupVerdict,
    probe_ok: bool,
) -> tuple[RankState, ...]:
    """The rank states the next failed sample of a group is judged against for progress.

    Cleared when the probe passes. Otherwise kept from the first failed sample of these
    processes since the group last progressed, not replaced by each new one: a step
    longer than the probe period shows no progress between two close samples, but does
    across the failure streak. Replaced when the group progressed (a Slow verdict) or
    when no process of the baseline is sampled any more (a restarted rank).
    """
    if probe_ok:
        return ()
    if ranks and (
        verdict.verdict is Verdict.SLOW
        or not {r.identity for r in baseline} & {r.identity for r in ranks}
    ):
        return tuple(ranks)
    return tuple(baseline)


# ---------------------------------------------------------------------------- classify


def classify_group(
    obs: GroupObservation,
    previous: Sequence[RankState] = (),
    *,
    now: float,
    steps: StepBounds | None = None,
) -> GroupVerdict:
    """Classify one observation of a group (see the module docstring for the table).

    `previous` are the rank states of the first failed observation of the current
    streak, if any; progress is only judged between samples of the same process. A
    group with a rank inside a model step younger than `steps.bound(...)` is busy, not
    hung: a hang cannot be told from a legitimate step shorter than the longest one.
    """
    evidence: dict[str, EvidenceValue] = {"probe": _probe_text(obs.probe)}
    signals: set[Signal] = set()
    ranks = [r for a in obs.agents if a.ranks is not None for r in a.ranks]
    unreachable = [a.pod for a in obs.agents if a.ranks is None]
    if unreachable:
        signals.add(Signal.AGENT_UNREACHABLE)
        evidence["agents_unreachable"] = _bounded(unreachable)
    if ranks:
        evidence["ranks"] = _bounded(_rank_text(r) for r in ranks)

    def verdict(
        v: Verdict,
        immediate: bool,
        reason: str,
        culprits: Iterable[str] = (),
        outliers: Iterable[Outlier] = (),
    ) -> GroupVerdict:
        named = tuple(outliers)[:MAX_OUTLIERS]
        return GroupVerdict(
            outliers=named,
            verdict=v,
            immediate=immediate,
            reason=clip_evidence(reason),
            epoch=obs.epoch,
            observed_at=now,
            signals=frozenset(signals),
            evidence=evidence,
            latency_ms=obs.probe.latency_ms,
            culprits=frozenset(culprits),
            sample=obs.sample,
        )

    # An explicit divergence report is the strongest evidence there is: it names the
    # decision that differed, so it wins over the rank death it causes.
    failed = [r for r in ranks if r.consensus_failure]
    if failed:
        signals.add(Signal.CONSENSUS_FAILURE)
        evidence["consensus_failure"] = _bounded(
            f"{r.pod}/r{r.rank}: {r.consensus_failure}" for r in failed
        )
        return verdict(
            Verdict.DESYNCED,
            True,
            divergence_cause(failed) or "",
            [r.pod for r in failed],
            [Outlier(r.pod, r.rank, "reported the consensus failure") for r in failed],
        )

    culprits: list[str] = []
    down = _pod_problems(obs, signals, culprits)
    if down:
        evidence["pods"] = _bounded(down)
        named = [
            Outlier(pod, None, next((d for d in down if f"pod {pod} " in d), "down"))
            for pod in dict.fromkeys(culprits)
        ]
        return verdict(Verdict.RANK_DOWN, True, down[0], culprits, named)

    def ranks_down(
        found: list[RankState], signal: Signal, what: str, key: str, *, immediate: bool, shown: bool
    ) -> GroupVerdict:
        """RankDown for `found`: the rank processes gone, or stopped (`shown`: the state
        follows each name)."""
        signals.add(signal)
        names = [f"{r.pod}/r{r.rank}" + (f" ({r.process})" if shown else "") for r in found]
        evidence[key] = _bounded(names)
        return verdict(
            Verdict.RANK_DOWN,
            immediate,
            f"rank process {what}: {', '.join(names[:4])}",
            [r.pod for r in found],
            [Outlier(r.pod, r.rank, f"its process is {r.process if shown else what}")
             for r in found],
        )  # fmt: skip

    exited = [r for r in ranks if not r.alive]
    if exited:
        return ranks_down(
            exited, Signal.RANK_EXITED, "gone", "ranks_exited", immediate=True, shown=False
        )

    if obs.probe.ok:
        return verdict(Verdict.HEALTHY, False, "deep probe passed")

    signals.add(Signal.PROBE_TIMEOUT if obs.probe.status == "timeout" else Signal.PROBE_FAILED)
    # A stopped process (SIGSTOP, a debugger) is a fact from /proc, whatever collective or
    # step it stopped in: without it the same frozen rank reads as Slow (inside a model
    # step), Hung or Desynced (one collective behind), depending on where it froze. It
    # holds the whole group, so it is RankDown; not at once: a rank a person paused for
    # a moment gets the failure threshold's probes to go on.
    stopped = [r for r in ranks if r.process in STOPPED_PROCESS_STATES]
    if stopped:
        return ranks_down(
            stopped, Signal.RANK_STOPPED, "stopped", "ranks_stopped", immediate=False, shown=True
        )
    if not ranks:
        not_started = Signal.POD_NOT_STARTED in signals
        why = "pods not started yet" if not_started else "no rank state could be read"
        return verdict(Verdict.UNKNOWN, False, f"deep probe {obs.probe.status}; {why}")

    advanced, stalled = _progress(ranks, previous)
    # A rank in uninterruptible sleep (D: inside a driver or a file system call) in this
    # sample and in the streak's first, with no progress between, is stuck in the kernel,
    # whatever the step bound allows: a GPU call that never returns shows so. Not at
    # once (failureThreshold probes): a slow disk or a page fault passes.
    before = {r.identity: r.process for r in previous}
    in_kernel = [
        r
        for r in stalled
        if r.process == UNINTERRUPTIBLE_PROCESS_STATE
        and before.get(r.identity) == UNINTERRUPTIBLE_PROCESS_STATE
    ]
    if in_kernel:
        signals.add(Signal.RANK_UNINTERRUPTIBLE)
        names = [f"{r.pod}/r{r.rank}" for r in in_kernel]
        evidence["ranks_uninterruptible"] = _bounded(names)
        return verdict(
            Verdict.HUNG,
            False,
            f"rank process in uninterruptible sleep (D: inside the kernel) with no progress "
            f"across the failed probes: {', '.join(names[:4])}",
            [r.pod for r in in_kernel],
            [
                Outlier(r.pod, r.rank, "its process is in uninterruptible sleep, no progress")
                for r in in_kernel
            ],
        )
    if advanced and not stalled:
        signals.add(Signal.PROGRESS)
        return verdict(
            Verdict.SLOW,
            False,
            f"deep probe {obs.probe.status} but every rank progressed "
            f"({len(advanced)} ranks advanced their iteration)",
        )
    bound = (steps or StepBounds()).bound(ranks)
    busy = [r for r in ranks if r.step_age_s is not None and r.step_age_s < bound]
    if busy:
        signals.add(Signal.IN_STEP)
        oldest = max(r.step_age_s or 0.0 for r in busy)
        evidence["step_bound_s"] = round(bound, 1)
        return verdict(
            Verdict.SLOW,
            False,
            f"deep probe {obs.probe.status} while {len(busy)} rank(s) run a model step "
            f"(the oldest for {oldest:.1f}s, legitimate up to {bound:.0f}s)",
        )
    # Some ranks progressed, these did not: they are the ones to look at.
    not_moving = [
        Outlier(r.pod, r.rank, f"no progress while {len(advanced)} other rank(s) progressed")
        for r in stalled
    ] if advanced else []  # fmt: skip
    if advanced:
        evidence["progressed"] = _bounded(f"{r.pod}/r{r.rank}" for r in advanced)

    decisions = {
        (d.seq, d.kind, d.forward_mode, d.batch_size, d.rids_hash)
        for r in ranks
        if (d := r.last_decision) is not None
    }
    seqs = sorted({d[0] for d in decisions})
    if len(decisions) > 1:
        signals.add(Signal.DIFFERENT_DECISIONS)
        what = (
            f"decision sequences differ ({seqs[0]}..{seqs[-1]})"
            if len(seqs) > 1
            else f"ranks made different decisions at sequence {seqs[0]}"
        )
        return verdict(Verdict.DESYNCED, False, what, (), _decision_outliers(ranks))

    collectives = {None if r.collective is None else r.collective.key for r in ranks}
    if len(collectives) > 1:
        signals.add(Signal.DIFFERENT_COLLECTIVES)
        shown = sorted(_key_text(k) for k in collectives)
        return verdict(
            Verdict.DESYNCED,
            False,
            f"ranks in different collectives: {shown}",
            (),
            _collective_outliers(ranks),
        )

    signals.add(Signal.NO_PROGRESS)
    (key,) = collectives
    if key is None:
        return verdict(
            Verdict.HUNG, False, "no rank progressed and none is in a collective", (), not_moving
        )
    signals.add(Signal.SAME_COLLECTIVE)
    since = min(r.collective.since for r in ranks if r.collective is not None)
    evidence["collective_since"] = since
    return verdict(
        Verdict.HUNG,
        False,
        f"every rank waits in {_key_text(key)} for {max(0.0, now - since):.1f}s, no progress",
        (),
        not_moving,
    )


def divergence_cause(ranks: Iterable[RankState]) -> str | None:
    """The first consensus failure among `ranks`, as one line for an incident's reason
    and cause (None: no rank reported one)."""
    for r in ranks:
        if r.consensus_failure:
            return clip_evidence(
                f"rank {r.rank} ({r.pod}) reported a consensus failure: {r.consensus_failure}"
            )
    return None


def _progress(
    ranks: Iterable[RankState], previous: Sequence[RankState]
) -> tuple[list[RankState], list[RankState]]:
    """(ranks whose iteration advanced, ranks that did not) among comparable samples."""
    before = {r.identity: r.iteration for r in previous}
    advanced: list[RankState] = []
    stalled: list[RankState] = []
    for r in ranks:
        if r.identity not in before:
            continue
        (advanced if r.iteration > before[r.identity] else stalled).append(r)
    return advanced, stalled


def _probe_text(probe: ProbeOutcome) -> str:
    text: str = probe.status
    if probe.latency_ms is not None:
        text += f" {probe.latency_ms:.0f}ms"
    if probe.error:
        text += f": {probe.error}"
    return clip_evidence(text)

"""Verdicts: what is wrong with one TP group, from what the prober and the API server saw.

Pure: no I/O, no clock. The prober (I/O layer) gathers one `GroupObservation` per round:
the deep-probe outcome of the group's rank-0 pod, the pods of the group as the API server
lists them, and — only when the probe failed — the rank states every pod agent serves
(`GET /ranks`). `classify_group` turns it, together with the previous round's rank states
(for progress), into a `GroupVerdict`:

| verdict    | when                                                         | acts         |
| ---------- | ------------------------------------------------------------ | ------------ |
| `Healthy`  | the probe passed                                             | —            |
| `Slow`     | the probe failed but every rank's loop iteration advanced,   | never        |
|            | or a rank is inside a model step younger than the step bound |              |
| `Desynced` | a rank reported a consensus failure                          | at once      |
| `Desynced` | ranks in different collectives or decision sequences         | threshold    |
| `Hung`     | every rank in the same collective (or none), no progress     | threshold    |
| `RankDown` | pod missing, deleted, evicted or Failed; container not       | at once      |
|            | running; a restart count moved; a rank process gone          |              |
| `Unknown`  | the probe failed and no rank state could be read             | threshold    |
| `Unknown`  | a new epoch passed no probe within its startup grace         | at once      |

"threshold" means the recovery planner needs `health.failureThreshold` consecutive failed
observations; "at once" means the first one decides. Ranks sampled from several pods are
not a consistent snapshot, so a one-step skew between healthy ranks is normal: that is
why state-based verdicts wait for the threshold, and why progress (checked first) wins
over them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from lockstep.api import constants as c
from lockstep.api.objects import labels, meta

# Evidence is kept in status and Events: bound every list and every string in it.
MAX_EVIDENCE_ITEMS = 16
MAX_OUTLIERS = 8  # ranks named as outliers per verdict
MAX_EVIDENCE_TEXT = 240

EvidenceValue = str | int | float | bool | None | list[str]


class Verdict(StrEnum):
    """What is wrong with a group (the string is what status and Events show)."""

    HEALTHY = "Healthy"
    SLOW = "Slow"
    DESYNCED = "Desynced"
    HUNG = "Hung"
    RANK_DOWN = "RankDown"
    UNKNOWN = "Unknown"

    @property
    def is_failure(self) -> bool:
        """A verdict that may lead to a restart (Healthy and Slow never do)."""
        return self not in (Verdict.HEALTHY, Verdict.SLOW)


class Signal(StrEnum):
    """The individual facts a verdict rests on (several may hold at once)."""

    PROBE_FAILED = "probe-failed"
    PROBE_TIMEOUT = "probe-timeout"
    POD_MISSING = "pod-missing"
    POD_DELETED = "pod-deleted"
    POD_EVICTED = "pod-evicted"
    POD_FAILED = "pod-failed"
    POD_NOT_STARTED = "pod-not-started"
    CONTAINER_NOT_RUNNING = "container-not-running"
    CONTAINER_RESTARTED = "container-restarted"
    RANK_EXITED = "rank-exited"
    RANK_STOPPED = "rank-stopped"
    CONSENSUS_FAILURE = "consensus-failure"
    AGENT_UNREACHABLE = "agent-unreachable"
    PROGRESS = "progress"
    IN_STEP = "in-step"
    DIFFERENT_COLLECTIVES = "different-collectives"
    DIFFERENT_DECISIONS = "different-decisions"
    SAME_COLLECTIVE = "same-collective"
    NO_PROGRESS = "no-progress"


# OS states of a rank process that will not move until someone resumes it.
STOPPED_PROCESS_STATES = frozenset({"stopped", "traced"})

# Signals that prove the current epoch broke (as opposed to "not up yet"): the recovery
# planner acts on these even while it waits for a new epoch to pass its first probe.
BROKEN_SIGNALS = frozenset(
    {
        Signal.POD_DELETED,
        Signal.POD_EVICTED,
        Signal.POD_FAILED,
        Signal.CONTAINER_RESTARTED,
        Signal.RANK_EXITED,
        Signal.CONSENSUS_FAILURE,
    }
)


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Decision:
    """The last scheduling decision a rank made; every TP rank must make the same ones."""

    kind: str
    seq: int
    forward_mode: str | None = None
    batch_size: int = 0
    rids_hash: str = ""


@dataclass(frozen=True)
class Collective:
    """The collective a rank is inside now (`seq` counts collectives on `group`)."""

    op: str
    group: str
    seq: int
    since: float

    @property
    def key(self) -> tuple[str, str, int]:
        """Ranks that are in step wait in collectives with equal keys."""
        return (self.op, self.group, self.seq)


@dataclass(frozen=True)
class RankState:
    """One rank's published state, as its pod agent served it."""

    pod: str
    rank: int
    iteration: int
    tp_rank: int | None = None
    pid: int | None = None
    alive: bool = True
    # The OS state the pod agent read from /proc ("running", "sleeping", "stopped",
    # "traced", "zombie", ...; None: not reported).
    process: str | None = None
    last_decision: Decision | None = None
    collective: Collective | None = None
    consensus_failure: str | None = None
    updated_at: float | None = None
    # Inside a model step (run_batch) for this long (None: not in a step), by the pod's
    # own clock; and how long its recent steps took.
    step_age_s: float | None = None
    recent_steps_s: tuple[float, ...] = ()

    @property
    def identity(self) -> tuple[str, int, int | None]:
        """Two samples are comparable only for the same process of the same rank."""
        return (self.pod, self.rank, self.pid)


@dataclass(frozen=True)
class StepBounds:
    """How long a model step may run before a group that shows no progress is Hung
    (`spec.health.stepBounds`): `multiplier` times the group's longest recent step,
    never below `min_seconds`, never above `max_seconds`."""

    multiplier: float = 3.0
    min_seconds: float = 90.0
    max_seconds: float = 300.0

    def bound(self, ranks: Iterable[RankState]) -> float:
        """The longest a step of this group may run and still be legitimate."""
        longest = max((d for r in ranks for d in r.recent_steps_s), default=0.0)
        return min(max(self.multiplier * longest, self.min_seconds), self.max_seconds)


@dataclass(frozen=True)
class AgentReport:
    """What one pod agent answered; `ranks is None` when it could not be reached."""

    pod: str
    ranks: tuple[RankState, ...] | None
    error: str | None = None


@dataclass(frozen=True)
class PodView:
    """The facts about one pod of a group that verdicts and recovery use."""

    name: str
    uid: str
    epoch: int | None
    rank: int | None = None
    phase: str = "Running"
    deleting: bool = False
    evicted: bool = False
    container_running: bool = True
    restart_count: int = 0
    ready: bool = True
    # The `lockstep.dev/group-healthy` readiness-gate condition: None when never set.
    gate: bool | None = None
    # The node it was scheduled to (None: not scheduled).
    node: str | None = None
    # Why the scheduler could not place it ("reason: message"; None: not refused).
    unschedulable: str | None = None
    # Its name slot (`lockstep.dev/slot`: 0 `<group>-<rank>`, 1 `<group>b-<rank>`).
    slot: int = 0
    # Why lockstep's runtime refused to start in it (a container's termination message,
    # `RuntimeRefused: ...` or `RuntimeInstallFailed: ...`; None: it did not), and the
    # container restart that said so (one Event per refusal).
    refusal: str | None = None
    refusal_restart: int = 0


ProbeStatus = Literal["ok", "failed", "timeout"]


@dataclass(frozen=True)
class ProbeOutcome:
    """The deep probe (a no-op collective on every rank) of a group's rank-0 pod."""

    status: ProbeStatus
    latency_ms: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The collective passed on every rank."""
        return self.status == "ok"


@dataclass(frozen=True)
class GroupObservation:
    """One round of the prober for one group.

    `pods` lists every pod of the group the API server knows, of any epoch;
    `restart_baseline` maps a pod UID to its restart count when the epoch started (a
    UID missing from it counts from 0, which is right for freshly created pods);
    `agents` is empty when the probe passed (agents are read only on failure).
    """

    epoch: int
    expected_pods: int
    probe: ProbeOutcome
    pods: tuple[PodView, ...] = ()
    agents: tuple[AgentReport, ...] = ()
    restart_baseline: Mapping[str, int] = field(default_factory=dict)
    # The deep-probe sample this observation is of (`ProbeSample.id`); None: pods only.
    sample: str | None = None


@dataclass(frozen=True)
class Outlier:
    """A rank (or a whole pod: `rank` None) that differs from the rest of its group, and
    how: dead, stopped, behind in the decision or collective sequence, not progressing."""

    pod: str
    rank: int | None
    why: str

    @property
    def where(self) -> str:
        return self.pod if self.rank is None else f"{self.pod}/r{self.rank}"


@dataclass(frozen=True)
class GroupVerdict:
    """The classification of one observation.

    `immediate` verdicts act on the first observation; the others need
    `failureThreshold` consecutive failures. `sample` (else `observed_at`) and `epoch`
    let the planner count each observation once and drop verdicts about an epoch it
    already replaced.
    """

    verdict: Verdict
    immediate: bool
    reason: str
    epoch: int
    observed_at: float
    signals: frozenset[Signal] = frozenset()
    evidence: Mapping[str, EvidenceValue] = field(default_factory=dict)
    latency_ms: float | None = None
    # Pods the evidence implicates (a divergent or exited rank, a pod down, an agent
    # that did not answer); empty when it implicates none in particular (a hang).
    culprits: frozenset[str] = frozenset()
    # The probe sample it judged (None: the pods alone): each counts once.
    sample: str | None = None
    # The ranks that differ from the rest (empty: none does, as in a hang where every
    # rank waits in the same collective).
    outliers: tuple[Outlier, ...] = ()

    @property
    def is_failure(self) -> bool:
        """This observation counts as a failure of the group."""
        return self.verdict.is_failure


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


# ----------------------------------------------------------------------- from Kubernetes


def pod_view_from_k8s(pod: Mapping[str, Any]) -> PodView:
    """The facts `classify_group` and the recovery planner need from a Kubernetes Pod dict.

    Restart counts are summed over every container (an init or sidecar restart breaks the
    rendezvous just the same); "running" means every regular container is running.
    """
    m, pod_labels = meta(pod), labels(pod)
    status = pod.get("status") or {}
    conditions = {
        cond.get("type"): cond
        for cond in status.get("conditions") or []
        if isinstance(cond, Mapping)
    }
    statuses = [s for s in status.get("containerStatuses") or [] if isinstance(s, Mapping)]
    phase = str(status.get("phase") or "Pending")
    disruption = conditions.get("DisruptionTarget", {})
    gate = conditions.get(c.READINESS_GATE)
    return PodView(
        name=str(m.get("name", "")),
        uid=str(m.get("uid", "")),
        epoch=_label_int(pod_labels, c.LABEL_EPOCH),
        rank=_label_int(pod_labels, c.LABEL_RANK),
        phase=phase,
        deleting=m.get("deletionTimestamp") is not None,
        # Kubelet eviction leaves reason Evicted; API-initiated eviction and preemption
        # set the DisruptionTarget condition before the pod goes.
        evicted=status.get("reason") == "Evicted" or disruption.get("status") == "True",
        container_running=bool(statuses)
        and all("running" in (s.get("state") or {}) for s in statuses),
        restart_count=sum(
            _int(s.get("restartCount", 0))
            for s in [*statuses, *(status.get("initContainerStatuses") or [])]
            if isinstance(s, Mapping)
        ),
        ready=conditions.get("Ready", {}).get("status") == "True",
        gate=None if gate is None else gate.get("status") == "True",
        node=(pod.get("spec") or {}).get("nodeName") or None,
        unschedulable=_unschedulable(conditions.get("PodScheduled")),
        slot=1 if pod_labels.get(c.LABEL_SLOT) == "1" else 0,
        **_refusal([*(status.get("initContainerStatuses") or []), *statuses]),
    )


# The termination messages of lockstep's runtime refusing to start
# (`lockstep_sglang.termination`, `lockstep_sglang.install`).
REFUSAL_REASONS = ("RuntimeRefused", "RuntimeInstallFailed")


def _refusal(statuses: Sequence[Any]) -> dict[str, Any]:
    """`refusal` and `refusal_restart` of a pod: the newest termination message of a
    container whose runtime refused to start (its state or its last state)."""
    for s in statuses:
        if not isinstance(s, Mapping):
            continue
        for key in ("state", "lastState"):
            ended = (s.get(key) or {}).get("terminated") or {}
            message = str(ended.get("message") or "").strip()
            if message.split(":", 1)[0] in REFUSAL_REASONS:
                return {
                    "refusal": clip_evidence(message.splitlines()[0]),
                    "refusal_restart": _int(s.get("restartCount", 0)),
                }
    return {}


def _unschedulable(cond: Mapping[str, Any] | None) -> str | None:
    if not cond or cond.get("status") != "False":
        return None
    return clip_evidence(f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or ''}")


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


def _minority(ranks: Sequence[RankState], key: Callable[[RankState], Any]) -> list[RankState]:
    """The ranks outside the largest set of ranks that agree on `key` (empty: no set is
    larger than every other, as in a TP2 group split one against one)."""
    sets: dict[Any, list[RankState]] = {}
    for r in ranks:
        sets.setdefault(key(r), []).append(r)
    sizes = sorted((len(v) for v in sets.values()), reverse=True)
    if len(sizes) < 2 or sizes[0] == sizes[1]:
        return []
    largest = max(sets.values(), key=len)
    return [r for r in ranks if r not in largest]


def _decision_outliers(ranks: Sequence[RankState]) -> list[Outlier]:
    """Who differs in a decision desync: the ranks the majority disagrees with, else
    (no majority) the ranks furthest behind in the decision sequence."""
    decided = [r for r in ranks if r.last_decision is not None]

    def seq(r: RankState) -> int:
        return r.last_decision.seq if r.last_decision is not None else 0

    def key(r: RankState) -> Any:
        d = r.last_decision
        return None if d is None else (d.seq, d.kind, d.forward_mode, d.batch_size, d.rids_hash)

    odd = _minority(decided, key)
    if odd:
        top = max((seq(r) for r in decided if r not in odd), default=0)
        return [Outlier(r.pod, r.rank, _seq_text("decision", seq(r), top)) for r in odd]
    seqs = {seq(r) for r in decided}
    if len(seqs) < 2:
        return []
    low, top = min(seqs), max(seqs)
    return [
        Outlier(r.pod, r.rank, _seq_text("decision", low, top)) for r in decided if seq(r) == low
    ]


def _collective_outliers(ranks: Sequence[RankState]) -> list[Outlier]:
    """Who differs in a collective desync: the ranks the majority is not waiting with,
    else the ranks behind in the collective sequence (or in no collective)."""

    def where(r: RankState) -> str:
        return "in no collective" if r.collective is None else f"in {_key_text(r.collective.key)}"

    odd = _minority(ranks, lambda r: None if r.collective is None else r.collective.key)
    if odd:
        rest = next(r for r in ranks if r not in odd)
        return [Outlier(r.pod, r.rank, f"{where(r)}, the others {where(rest)}") for r in odd]
    seqs = {r.collective.seq if r.collective else -1 for r in ranks}
    if len(seqs) < 2:
        return []
    low = min(seqs)
    top = next(r for r in ranks if (r.collective.seq if r.collective else -1) == max(seqs))
    return [
        Outlier(r.pod, r.rank, f"behind: {where(r)}, another {where(top)}")
        for r in ranks
        if (r.collective.seq if r.collective else -1) == low
    ]


def _seq_text(what: str, seq: int, top: int) -> str:
    if seq == top:
        return f"a different {what} at #{seq}"
    return f"{'behind' if seq < top else 'ahead'}: {what} #{seq}, the others at #{top}"


def not_up_in_time(epoch: int, now: float, why: str) -> GroupVerdict:
    """A starting epoch that passed no deep probe within its startup grace: Unknown (no
    rank state said what is wrong), decided by the recovery planner's deadline."""
    return GroupVerdict(
        verdict=Verdict.UNKNOWN,
        immediate=True,
        reason=clip_evidence(why),
        epoch=epoch,
        observed_at=now,
        evidence={"startup": clip_evidence(why)},
    )


def pods_down(obs: GroupObservation) -> bool:
    """The pods alone show a rank down (missing, deleted, evicted, failed, restarted, not
    running): worth a judgement even without a new probe sample."""
    return bool(_pod_problems(obs, set(), []))


def divergence_cause(ranks: Iterable[RankState]) -> str | None:
    """The first consensus failure among `ranks`, as one line for an incident's reason
    and cause (None: no rank reported one)."""
    for r in ranks:
        if r.consensus_failure:
            return clip_evidence(
                f"rank {r.rank} ({r.pod}) reported a consensus failure: {r.consensus_failure}"
            )
    return None


# ---------------------------------------------------------------------------- helpers


def _pod_problems(obs: GroupObservation, signals: set[Signal], culprits: list[str]) -> list[str]:
    """Why the pods of the current epoch cannot be a working group (empty: they can);
    the pods at fault are appended to `culprits`."""
    problems: list[str] = []
    current = [p for p in obs.pods if p.epoch == obs.epoch]
    if len(current) < obs.expected_pods:
        signals.add(Signal.POD_MISSING)
        have = sorted(p.rank for p in current if p.rank is not None)
        problems.append(
            f"{obs.expected_pods - len(current)} of {obs.expected_pods} pods missing "
            f"(ranks present: {have})"
        )
    for pod in current:
        baseline = obs.restart_baseline.get(pod.uid, 0)
        if pod.deleting:
            signals.add(Signal.POD_DELETED)
            problems.append(f"pod {pod.name} is being deleted")
            culprits.append(pod.name)
        elif pod.evicted:
            signals.add(Signal.POD_EVICTED)
            problems.append(f"pod {pod.name} was evicted")
            culprits.append(pod.name)
        elif pod.phase in ("Failed", "Succeeded"):
            signals.add(Signal.POD_FAILED)
            problems.append(f"pod {pod.name} is {pod.phase}")
            culprits.append(pod.name)
        elif pod.restart_count > baseline:
            signals.add(Signal.CONTAINER_RESTARTED)
            problems.append(
                f"pod {pod.name} restarted (restart count {baseline} -> {pod.restart_count})"
            )
            culprits.append(pod.name)
        elif not pod.container_running:
            # A pod that never ran (scheduling, image pull) is starting, not down: the
            # planner's startup deadline covers it.
            if pod.phase == "Pending":
                signals.add(Signal.POD_NOT_STARTED)
            else:
                signals.add(Signal.CONTAINER_NOT_RUNNING)
                problems.append(f"pod {pod.name}: container not running")
                culprits.append(pod.name)
    return problems


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


def _rank_text(r: RankState) -> str:
    parts = [f"{r.pod}/r{r.rank}", f"it={r.iteration}"]
    if r.last_decision is not None:
        parts.append(f"dec={r.last_decision.kind}#{r.last_decision.seq}")
    if r.collective is not None:
        parts.append(f"in={_key_text(r.collective.key)}")
    if not r.alive:
        parts.append("exited")
    elif r.process in STOPPED_PROCESS_STATES:
        parts.append(str(r.process))
    return " ".join(parts)


def _key_text(key: tuple[str, str, int] | None) -> str:
    return "none" if key is None else f"{key[0]}@{key[1]}#{key[2]}"


def _bounded(items: Iterable[str]) -> list[str]:
    out = [clip_evidence(i) for i in items]
    if len(out) > MAX_EVIDENCE_ITEMS:
        return [*out[: MAX_EVIDENCE_ITEMS - 1], f"... and {len(out) - MAX_EVIDENCE_ITEMS + 1} more"]
    return out


def clip_evidence(text: str) -> str:
    """`text` bounded to `MAX_EVIDENCE_TEXT` characters (evidence goes to status)."""
    return text if len(text) <= MAX_EVIDENCE_TEXT else text[: MAX_EVIDENCE_TEXT - 3] + "..."


def _int(value: Any) -> int:
    # bool is an int in Python; a rank or counter given as true/false is malformed.
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)


def _label_int(labels: Mapping[str, Any], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, TypeError, ValueError):
        return None

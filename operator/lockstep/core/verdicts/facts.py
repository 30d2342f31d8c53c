"""What the judge judges and what it answers: the observation of one group (each rank's
state, each pod's view, the deep probe's outcome) and the verdict, with its signals and
outliers. Plain data; the readers of the agent's wire format are in
`lockstep.clients.agent_client`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

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
    # The group's TP ranks may be fine, but its KV hand-off fails with every peer of the
    # other role it was paired with (`lockstep.core.verdicts.pairs`).
    TRANSFER_BROKEN = "TransferBroken"
    # The group's leader holds KV for requests that ended, and the runtime's free could
    # not give it back (`lockstep.core.verdicts.ended_kv`).
    KV_LEAK = "KVLeak"
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
    RANK_UNINTERRUPTIBLE = "rank-uninterruptible"  # in D, no progress, two samples
    CONSENSUS_FAILURE = "consensus-failure"
    AGENT_UNREACHABLE = "agent-unreachable"
    PROGRESS = "progress"
    IN_STEP = "in-step"
    DIFFERENT_COLLECTIVES = "different-collectives"
    DIFFERENT_DECISIONS = "different-decisions"
    SAME_COLLECTIVE = "same-collective"
    NO_PROGRESS = "no-progress"
    PAIR_FAILED = "pair-failed"  # a pair probe's hand-off did not go through
    ENDED_KV_HELD = "ended-kv-held"  # KV held by ended requests, past the bound and grace


# OS states of a rank process that will not move until someone resumes it.
STOPPED_PROCESS_STATES = frozenset({"stopped", "traced"})
# The OS state of a process inside the kernel that no signal but SIGKILL ends: a driver
# call (a GPU's that never returns), a file system that does not answer. Brief for a
# page fault or a disk read; a rank that shows it in two samples of a failure streak,
# with no progress between, is stuck there.
UNINTERRUPTIBLE_PROCESS_STATE = "uninterruptible"

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


def _bounded(items: Iterable[str]) -> list[str]:
    out = [clip_evidence(i) for i in items]
    if len(out) > MAX_EVIDENCE_ITEMS:
        return [*out[: MAX_EVIDENCE_ITEMS - 1], f"... and {len(out) - MAX_EVIDENCE_ITEMS + 1} more"]
    return out


def clip_evidence(text: str) -> str:
    """`text` bounded to `MAX_EVIDENCE_TEXT` characters (evidence goes to status)."""
    return text if len(text) <= MAX_EVIDENCE_TEXT else text[: MAX_EVIDENCE_TEXT - 3] + "..."

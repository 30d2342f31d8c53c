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
| `Hung`     | a rank in uninterruptible sleep (D) now and in the streak's  | threshold    |
|            | first failed sample, no progress between (before the bound)  |              |
| `RankDown` | pod missing, deleted, evicted or Failed; container not       | at once      |
|            | running; a restart count moved; a rank process gone          |              |
| `RankDown` | a rank process stopped or traced (SIGSTOP, a debugger)       | threshold    |
| `Unknown`  | the probe failed and no rank state could be read             | threshold    |
| `Unknown`  | a new epoch passed no probe within its startup grace         | at once      |

Two verdicts come from outside the group's own probe: `TransferBroken` (the PD path,
`pairs`) and `KVLeak` (KV held by ended requests the runtime could not free, `ended_kv`).

"threshold" means the recovery planner needs `health.failureThreshold` consecutive failed
observations; "at once" means the first one decides. Ranks sampled from several pods are
not a consistent snapshot, so a one-step skew between healthy ranks is normal: that is
why state-based verdicts wait for the threshold, and why progress (checked first) wins
over them.
"""

from __future__ import annotations

from lockstep.core.verdicts.ended_kv import (
    EndedKVJudgement,
    KVFree,
    KVReading,
    judge_ended_kv,
    reading_from_probe,
)
from lockstep.core.verdicts.facts import (
    BROKEN_SIGNALS,
    MAX_EVIDENCE_ITEMS,
    MAX_EVIDENCE_TEXT,
    MAX_OUTLIERS,
    STOPPED_PROCESS_STATES,
    AgentReport,
    Collective,
    Decision,
    EvidenceValue,
    GroupObservation,
    GroupVerdict,
    Outlier,
    PodView,
    ProbeOutcome,
    ProbeStatus,
    RankState,
    Signal,
    StepBounds,
    Verdict,
    clip_evidence,
)
from lockstep.core.verdicts.judge import classify_group, divergence_cause, progress_baseline
from lockstep.core.verdicts.pairs import PairJudgement, classify_pairs
from lockstep.core.verdicts.pods import (
    REFUSAL_REASONS,
    not_up_in_time,
    pod_view_from_k8s,
    pods_down,
)

__all__ = [
    "BROKEN_SIGNALS",
    "MAX_EVIDENCE_ITEMS",
    "MAX_EVIDENCE_TEXT",
    "MAX_OUTLIERS",
    "REFUSAL_REASONS",
    "STOPPED_PROCESS_STATES",
    "AgentReport",
    "Collective",
    "Decision",
    "EndedKVJudgement",
    "EvidenceValue",
    "GroupObservation",
    "GroupVerdict",
    "KVFree",
    "KVReading",
    "Outlier",
    "PairJudgement",
    "PodView",
    "ProbeOutcome",
    "ProbeStatus",
    "RankState",
    "Signal",
    "StepBounds",
    "Verdict",
    "classify_group",
    "classify_pairs",
    "clip_evidence",
    "divergence_cause",
    "judge_ended_kv",
    "not_up_in_time",
    "pod_view_from_k8s",
    "pods_down",
    "progress_baseline",
    "reading_from_probe",
]

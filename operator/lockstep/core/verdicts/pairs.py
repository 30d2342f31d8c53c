"""The PD path's judge: from the pair probe's recent tries, which side is at fault.

A group's tries are read period by period (the tries of one period share its start;
within the window, for the epochs both sides run now). A group *passes* when a try of
its latest period went through: the hand-off works on its side.

| pattern | judged |
| --- | --- |
| a group that does not pass, whose tries failed in at least two periods since its last pass, with two different peers or with a peer that passes | that group: `TransferBroken` (at once: the pattern is its threshold) |
| a pair whose last try failed while both of its groups pass | the link between their nodes (both named; no restart: neither group is broken) |
| a pair that failed in two periods or more that neither rule explains (one group of each role, say) | unexplained: told, not acted on |

The TP group's own verdict (`classify_group`) comes first: a group whose newest deep
probe failed is the TP judge's, and its tries count for nothing here (a hung decode
fails every pair it is in; it must be judged `Hung`, not `TransferBroken`, and its
peers not blamed). A group at fault by the pattern is judged only once a deep probe
that began after its last failed period passed (its TP path works while its hand-off
does not), and no deep probe of it failed since its first counted failure (a group
busy with legitimately long model steps fails slow pairs and some deep probes: not
its hand-off's fault); until then it waits, told nothing.

A broken peer also fails its peers' tries with *other* groups: on the real engine a
prefill's KV sender shares its transfer queues across rooms, so a send blocked on a
stopped decode rank's socket holds the rooms queued behind it, hand-offs to healthy
decodes included (a real-engine drill here: a decode rank stopped with SIGSTOP got its
prefill peer judged `TransferBroken` and restarted too). So while a group of the other
role is in an incident or failing its deep probe (`settled[role]` None), a group's pair
failures wait, and once that role settled again only failures of periods that began
after it count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lockstep.core.pairs import PairKey, PairResult
from lockstep.core.verdicts.facts import (
    EvidenceValue,
    GroupVerdict,
    Signal,
    Verdict,
    clip_evidence,
)

GroupKey = tuple[str, int]  # (role, group)
MIN_FAILURES = 2


@dataclass(frozen=True)
class PairJudgement:
    """What the pair tries show: a verdict per group at fault, the links at fault (with
    both groups' nodes), and the failing pairs no pattern explains yet."""

    verdicts: Mapping[GroupKey, GroupVerdict]
    links: tuple[tuple[PairKey, str | None, str | None], ...] = ()
    unexplained: tuple[PairKey, ...] = ()


def _ends(r: PairResult) -> tuple[GroupKey, GroupKey]:
    return ("prefill", r.prefill), ("decode", r.decode)


def classify_pairs(
    results: Iterable[PairResult],
    epochs: Mapping[GroupKey, int],
    now: float,
    window_s: float,
    nodes: Mapping[GroupKey, str | None] | None = None,
    *,
    deep: Mapping[GroupKey, float | None],
    deep_failed: Mapping[GroupKey, float] | None = None,
    settled: Mapping[str, float | None] | None = None,
) -> PairJudgement:
    """Judge the tries of one deployment's pairs (see the module docstring). `epochs`:
    each group's current epoch (tries of another epoch do not count); `nodes`: each
    group's leader's node, named in a link's verdict; `deep`: each group's newest deep
    probe of its epoch, the wall time it began if it passed, None if it failed (absent:
    none yet); `deep_failed`: when each group's newest failed deep probe of its epoch
    began (a group busy with long model steps fails some: its slow pairs are not its
    hand-off's fault); `settled`: per role, since when every group of it serves with its
    deep probe passing (None: one does not now; absent: always)."""
    tp_failing = {g for g, passed in deep.items() if passed is None}
    current = sorted(
        (
            r
            for r in results
            if now - r.at <= window_s
            and epochs.get(("prefill", r.prefill)) == r.prefill_epoch
            and epochs.get(("decode", r.decode)) == r.decode_epoch
            and not tp_failing.intersection(_ends(r))
            and r.full is None  # capacity, not the path: it counts against no one
        ),
        key=lambda r: r.at,
    )
    latest: dict[PairKey, PairResult] = {}
    tries: dict[GroupKey, list[PairResult]] = {}
    for r in current:
        latest[r.key] = r
        for end in _ends(r):
            tries.setdefault(end, []).append(r)
    passes = set()
    for group, rs in tries.items():
        last = max(r.period for r in rs)
        if any(r.ok for r in rs if r.period == last):
            passes.add(group)
    verdicts: dict[GroupKey, GroupVerdict] = {}
    waiting: set[GroupKey] = set()
    for group, rs in tries.items():
        if group in passes:
            continue
        since = (settled or {}).get(_other(group[0]), 0.0)
        if since is None:
            waiting.add(group)  # a peer of the other role is broken: collateral failures
            continue
        last_pass = max((r.period for r in rs if r.ok), default=None)
        failures = [
            r
            for r in rs
            if not r.ok and (last_pass is None or r.period > last_pass) and r.period >= since
        ]
        peers = {_peer(group, r) for r in failures}
        if len({r.period for r in failures}) < MIN_FAILURES:
            continue
        if not (len(peers) >= 2 or peers & passes):
            continue
        passed, failed = deep.get(group), (deep_failed or {}).get(group)
        if (
            passed is not None
            and passed >= failures[-1].period
            and (failed is None or failed < failures[0].period)
        ):
            verdicts[group] = _verdict(group, failures, epochs[group])
        else:
            waiting.add(group)  # its TP path not yet shown to work since
    links = []
    unexplained = []
    for key, r in sorted(latest.items()):
        if r.ok:
            continue
        p, d = _ends(r)
        if {p, d} & (verdicts.keys() | waiting):
            continue
        if p in passes and d in passes:
            links.append((key, (nodes or {}).get(p), (nodes or {}).get(d)))
        elif _failed_periods(key, current) >= MIN_FAILURES:
            unexplained.append(key)
    return PairJudgement(verdicts, tuple(links), tuple(unexplained))


def _failed_periods(key: PairKey, tries: list[PairResult]) -> int:
    """In how many periods in a row, up to its last try, the pair failed."""
    n = 0
    for r in reversed([r for r in tries if r.key == key]):
        if r.ok:
            break
        n += 1
    return n


def _other(role: str) -> str:
    return "decode" if role == "prefill" else "prefill"


def _peer(group: GroupKey, r: PairResult) -> GroupKey:
    return ("decode", r.decode) if group[0] == "prefill" else ("prefill", r.prefill)


def _verdict(group: GroupKey, failures: list[PairResult], epoch: int) -> GroupVerdict:
    role, index = group
    other = "decode" if role == "prefill" else "prefill"
    peers = sorted({_peer(group, r)[1] for r in failures})
    last = failures[-1]
    shown = ", ".join(f"{other}/{g}" for g in peers)
    reason = clip_evidence(
        f"{role}/{index}'s KV hand-off failed with every {other} group it was paired with "
        f"({shown}; {len(failures)} tries): {last.error}"
    )
    evidence: dict[str, EvidenceValue] = {
        "pairs": [
            f"prefill/{r.prefill} -> decode/{r.decode}: "
            + ("ok" if r.ok else str(r.error))
            + ("" if r.latency_s is None else f" ({r.latency_s * 1000:.0f} ms)")
            for r in failures
        ],
        "failures": len(failures),
        # Both sides of each failed hand-off, as their SGLang told it (`side_state`).
        "sides": [
            f"prefill/{r.prefill} -> decode/{r.decode}: "
            + "; ".join(x for x in (r.prefill_state, r.decode_state) if x)
            for r in failures
            if r.prefill_state or r.decode_state
        ],
    }
    return GroupVerdict(
        verdict=Verdict.TRANSFER_BROKEN,
        immediate=True,
        reason=reason,
        epoch=epoch,
        observed_at=last.at,
        signals=frozenset({Signal.PAIR_FAILED}),
        evidence=evidence,
        sample=f"pairs-{role}-{index}-{last.room}",
    )

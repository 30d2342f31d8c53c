"""The ranks that differ from the rest of their group: the one behind in the decision or
the collective sequence (with no majority, the one furthest behind)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lockstep.core.verdicts.facts import STOPPED_PROCESS_STATES, Outlier, RankState


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

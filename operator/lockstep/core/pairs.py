"""The PD path as a unit of health: which prefill/decode pairs the pair probe tries, and
what a try found.

A TP group can pass its deep probe while the KV hand-off between a prefill group and a
decode group is broken (the prefill's bootstrap server, its KV sender, the transfer
engine, the KV the decode pre-allocates and waits for). The pair probe checks that path
the way the router pairs requests: one tiny request (one token, a bootstrap room of its
own) sent to one prefill group's leader and one decode group's leader at once, with a
short deadline (`lockstep.clients.pair_prober`).

It stays cheap as a deployment grows: with N prefill and M decode groups, a period tries
max(N, M) pairs, not N x M: every group is in at least one pair, and the peers rotate
from one period to the next (`plan_pairs`), so each group meets every peer within
min(N, M)..max(N, M) periods. Which side is at fault is judged from the pattern
(`lockstep.core.verdicts.pairs`). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lockstep.api import constants as c

PairKey = tuple[int, int]  # (prefill group, decode group)
# The request id prefix of a pair probe's halves (requests lists, logs).
PROBE_RID_PREFIX = "lockstep-pair-"
# A leader whose KV is this used (SGLang's `token_usage`) cannot take a new request now.
FULL_TOKEN_USAGE = 0.9


@dataclass(frozen=True)
class PairEnd:
    """One side of a pair as the probe reaches it: the group, the epoch its leader runs,
    its leader's address and HTTP port (and, on a prefill, its bootstrap port) and its
    node."""

    group: int
    epoch: int
    ip: str
    node: str | None = None
    bootstrap_port: int | None = None
    port: int = c.PORT_HTTP


@dataclass(frozen=True)
class PairResult:
    """One try of a pair: whether the hand-off went through within the deadline, how
    long it took, and what each half answered (None: it did not fail)."""

    prefill: int
    decode: int
    prefill_epoch: int
    decode_epoch: int
    ok: bool
    at: float  # wall time when the try ended
    latency_s: float | None = None
    prefill_error: str | None = None
    decode_error: str | None = None
    room: int | None = None
    # When the period this try belongs to began (every try of a period shares it; the
    # judge reads a group's tries period by period). None: the try's own end.
    started: float | None = None
    # A failed try whose half could not take a new request then (`full_from_loads`):
    # capacity, not the path; the judge counts it against no one.
    full: str | None = None
    # What each leader's SGLang said of its side of the PD path when the try failed
    # (`side_state`: its queues of rooms and the KV it held); None: it passed, or no word.
    prefill_state: str | None = None
    decode_state: str | None = None

    @property
    def period(self) -> float:
        """The period this try belongs to (its start)."""
        return self.at if self.started is None else self.started

    @property
    def key(self) -> PairKey:
        return (self.prefill, self.decode)

    @property
    def error(self) -> str | None:
        """What went wrong, both halves' words (None: it went through)."""
        parts = [
            f"prefill: {self.prefill_error}" if self.prefill_error else "",
            f"decode: {self.decode_error}" if self.decode_error else "",
            f"{self.full} (capacity: not counted)" if self.full else "",
        ]
        text = "; ".join(p for p in parts if p)
        return None if self.ok else (text or "failed")


def _first_load(body: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The (DP rank 0) load of an SGLang `GET /v1/loads` body; None when it has none."""
    loads = (body or {}).get("loads")
    return loads[0] if isinstance(loads, list) and loads and isinstance(loads[0], Mapping) else None


def full_from_loads(side: str, body: Mapping[str, Any] | None) -> str | None:
    """Why a leader could not take a new request, from its SGLang `GET /v1/loads` body
    (None: it could, or it did not say): its running slots all taken, its KV
    `FULL_TOKEN_USAGE` used, or (a decode) requests bootstrapped and waiting for KV
    memory in its prealloc queue (`queues.prealloc_ready`). Under a broken hand-off a
    decode is none of these: requests waiting on a silent bootstrap server are not
    bootstrapped, and a stalled sender's rooms hold little KV by the time it is judged."""
    load = _first_load(body)
    if load is None:
        return None

    def num(key: str, within: Mapping[str, Any] | None = None) -> float | None:
        value = (load if within is None else within).get(key)
        return (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        )

    running, cap = num("num_running_reqs"), num("max_running_requests")
    usage = num("token_usage")
    queues = load.get("queues")
    ready = num("prealloc_ready", queues) if isinstance(queues, Mapping) else None
    why = []
    if running is not None and cap and running >= cap:
        why.append(f"{running:.0f} of {cap:.0f} requests running")
    if usage is not None and usage >= FULL_TOKEN_USAGE:
        why.append(f"KV {usage:.0%} used")
    if ready:
        why.append(f"{ready:.0f} request(s) waiting for KV memory")
    return f"{side} full: {', '.join(why)}" if why else None


# SGLang 0.5.23's `/v1/loads` `disaggregation` section, per side: what each count is.
_SIDE_QUEUES: dict[str, tuple[tuple[str, str], ...]] = {
    "prefill": (
        ("prefill_bootstrap_queue_reqs", "waiting for their decode"),
        ("prefill_inflight_queue_reqs", "sending KV"),
    ),
    "decode": (
        ("decode_prealloc_queue_reqs", "waiting for KV memory or their prefill"),
        ("decode_transfer_queue_reqs", "waiting for KV"),
        ("decode_retracted_queue_reqs", "retracted"),
    ),
}


def side_state(side: str, body: Mapping[str, Any] | None) -> str | None:
    """One side of a failed hand-off as its leader's SGLang `GET /v1/loads` tells it: the
    rooms in each of its PD queues (a prefill's bootstrap and in-flight queues, a
    decode's prealloc, transfer and retracted queues) and the KV tokens it holds. None
    when the leader did not answer or said nothing of it."""
    load = _first_load(body)
    if load is None:
        return None
    pd = load.get("disaggregation")
    parts = []
    if isinstance(pd, Mapping):
        for key, what in _SIDE_QUEUES.get(side, ()):
            value = pd.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                parts.append(f"{value} {what}")
    used, total = load.get("num_used_tokens"), load.get("max_total_num_tokens")
    if isinstance(used, int) and isinstance(total, int) and total > 0:
        parts.append(f"KV {used} of {total} tokens held")
    return f"{side}: {', '.join(parts)}" if parts else None


def plan_pairs(prefills: Sequence[int], decodes: Sequence[int], turn: int) -> list[PairKey]:
    """The pairs one period tries: max(N, M) of them, every group in at least one, the
    peers shifted by `turn` (the period's number) so they rotate. With N = M each group
    is in exactly one pair; otherwise the smaller role's groups are in several."""
    if not prefills or not decodes:
        return []
    p, d = sorted(prefills), sorted(decodes)
    n = max(len(p), len(d))
    pairs = {(p[i % len(p)], d[(i + turn) % len(d)]) for i in range(n)}
    return sorted(pairs)

"""Messages between the pod's HTTP server and TP rank 0, and the deterministic "model".

The HTTP server (main process) sends :class:`GenerateRequest` and
:class:`lockstep_sglang.probe.ProbeRequest` to rank 0 over a pipe; rank 0 broadcasts
them (and the :class:`AbortRequest` it makes for requests past their deadline) to every
TP rank, and answers with :class:`Ready`, :class:`GenerateResult` and
:class:`lockstep_sglang.probe.ProbeReply`. Everything is a plain picklable dataclass.

Tokens are a hash of the prompt and the position, so every rank, every run and every
restart produces the same text for the same prompt: a client can tell a right answer from
a wrong one without a model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from lockstep_sglang.probe import ProbeRequest

VOCAB: tuple[str, ...] = (
    "lock", "step", "rank", "group", "probe", "batch", "idle", "token",
    "decode", "prefill", "gloo", "tensor", "epoch", "agent", "state", "route",
    "alpha", "beta", "gamma", "delta", "amber", "cobalt", "ember", "frost",
    "harbor", "island", "jade", "kite", "lumen", "meadow", "nova", "orbit",
)  # fmt: skip


def token_id(prompt: str, position: int) -> int:
    """The token at ``position`` of the completion of ``prompt``."""
    digest = hashlib.blake2b(f"{position}\x00{prompt}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % len(VOCAB)


def detokenize(ids: list[int]) -> str:
    """Text of token ids (each token is one word with a leading space)."""
    return "".join(" " + VOCAB[i % len(VOCAB)] for i in ids)


def expected_text(prompt: str, max_new_tokens: int) -> str:
    """What the stand-in answers for ``prompt`` (for clients and tests)."""
    return detokenize([token_id(prompt, p) for p in range(max_new_tokens)])


def prompt_tokens(prompt: str) -> int:
    """A stable token count for usage figures (words, at least one)."""
    return max(1, len(prompt.split()))


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One completion to run; ``deadline`` is unix seconds (dropped or aborted after it).

    The ``bootstrap_*`` fields are SGLang's PD hand-off coordinates, carried to every
    rank so a KV hand-off between prefill and decode stand-ins can use them later.
    """

    rid: str
    text: str
    max_new_tokens: int
    deadline: float
    sent_at: float
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    stream: bool = False  # rank 0 sends a :class:`TokenChunk` per token


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """An instruction to every rank to drop a request: its caller gave up (rank 0 makes
    these past the deadline), or the server ended it (the HTTP side sends these)."""

    rid: str


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """Rank 0's answer for a finished request."""

    rid: str
    output_ids: list[int]
    text: str
    prompt_tokens: int
    first_iteration: int
    last_iteration: int
    finished_at: float


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """Rank 0's streaming progress of a request: every token so far."""

    rid: str
    output_ids: list[int]


@dataclass(frozen=True, slots=True)
class Ready:
    """Rank 0's first message: the group formed and the loop runs."""

    world_size: int
    pid: int
    started_at: float
    groups: list[str] = field(default_factory=list)


def deadline_of(msg: object) -> float | None:
    """The deadline of a message that can expire before it is broadcast."""
    if isinstance(msg, GenerateRequest | ProbeRequest):
        return msg.deadline
    return None

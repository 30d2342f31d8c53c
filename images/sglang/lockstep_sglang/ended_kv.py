"""KV held by requests that no longer exist: reported, and freed on the operator's word.

A PD request that ends before its hand-off completed (its client cancelled, its transfer
failed or was aborted) must give back what its server reserved for it: on a decode, the
KV SGLang's ``DecodePreallocQueue`` pre-allocated and the ``DecodeTransferQueue`` waits to
fill; on a prefill, the KV its ``PrefillBootstrapQueue`` keeps until the decode took it.
When a server does not (public reports: requests stuck in ``KVPoll.Transferring`` leak
decode slots), nothing fails, every probe passes, and the group serves ever less until
its pool is gone.

The leader's HTTP process therefore reports, with every deep probe (the ``kv`` key of the
``GET /lockstep/probe`` body) and on its own route, what it still holds for requests
whose HTTP side ended, and frees it when the operator asks, through the engine's own
abort (the path that frees a live request's KV), to the operator only (the bearer token
of :mod:`lockstep_sglang.failover`):

- ``GET /lockstep/kv``: ``{"tokens", "requests", "oldest_s", "rooms"}``: KV tokens held by
  ended requests, how many, how long ago the oldest ended, up to 16 of their rooms;
- ``POST /lockstep/kv/free`` with ``{"reason": str}``: every ended request still holding
  KV is handed to the engine's abort; answers what was freed, in the same shape, and
  ``"left"``, the report after it (what the abort could not free).

Engine-agnostic: an engine supplies an :class:`EndedKVBook` (the CPU stand-in's frontend
in :mod:`lockstep_standin.server`; the real SGLang server's is
:class:`lockstep_sglang.held_kv.SGLangEndedKV`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse

from lockstep_sglang.failover import Failover, parse_body

KV_ROUTE = "/lockstep/kv"
FREE_ROUTE = "/lockstep/kv/free"
ROOMS_SHOWN = 16
MAX_REASON = 200


@dataclass(frozen=True)
class EndedKV:
    """KV held by requests whose HTTP side ended (or, from a free, what it freed)."""

    tokens: int = 0
    requests: int = 0
    oldest_s: float = 0.0
    rooms: tuple[int, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "requests": self.requests,
            "oldest_s": round(self.oldest_s, 3),
            "rooms": list(self.rooms[:ROOMS_SHOWN]),
        }


class EndedKVBook(Protocol):
    """What an engine offers: what ended requests still hold, and a way to free it."""

    def ended_kv(self) -> EndedKV:
        """KV held now by requests that ended (never blocks on the engine)."""
        ...

    def free_ended_kv(self, reason: str) -> EndedKV:
        """Hand every ended request still holding KV to the engine's abort; what it freed."""
        ...


def add_routes(
    app: Any,
    failover: Failover,
    book: EndedKVBook,
    settle: Callable[[EndedKV], Awaitable[None]] | None = None,
) -> None:
    """Serve :data:`KV_ROUTE` and :data:`FREE_ROUTE` from a FastAPI ``app``; ``settle``
    (an engine whose free completes later) is awaited before the free reports what is
    left."""

    async def kv_route(request: Request) -> JSONResponse:
        refused = failover.authorized(request.headers.get("authorization"))
        if refused is not None:
            return JSONResponse(refused[1], status_code=refused[0])
        return JSONResponse(book.ended_kv().to_json())

    async def free_route(request: Request) -> JSONResponse:
        refused = failover.authorized(request.headers.get("authorization"))
        if refused is not None:
            return JSONResponse(refused[1], status_code=refused[0])
        try:
            body = parse_body(await request.body())
            if not isinstance(body, dict) or set(body) - {"reason"}:
                raise ValueError('body: only {"reason": str} is accepted')
            reason = body.get("reason", "lockstep: KV held by ended requests")
            if not isinstance(reason, str):
                raise ValueError("reason: must be a string")
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        freed = book.free_ended_kv(reason[:MAX_REASON])
        if settle is not None and freed.requests:
            await settle(freed)
        return JSONResponse({**freed.to_json(), "left": book.ended_kv().to_json()})

    app.add_api_route(KV_ROUTE, kv_route, methods=["GET"])
    app.add_api_route(FREE_ROUTE, free_route, methods=["POST"])

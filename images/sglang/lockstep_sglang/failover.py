"""Requests caught by an incident: listed, ended at once with a retryable error.

A request that reaches a broken TP group waits for it; so does the other half of a PD pair
on a healthy peer (a prefill waiting for a dead decode's bootstrap, a decode waiting for a
wedged prefill's KV). Nothing in SGLang 0.5.23 or sglang-router 0.3.2 ends those waits
quickly (docs/router.md): the router waits for both halves of every attempt, a prefill
waits for its decode up to ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` (300 s), a decode
for a hung prefill up to ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` (300 s). The router
retries an attempt that ended with 408/429/500/502/503/504 on a freshly chosen pair, so a
half that ends with 503 at once is what turns a hang into a retry.

The leader's HTTP process (where the requests live) therefore serves, to the operator
only (``Authorization: Bearer <LOCKSTEP_AGENT_TOKEN>``, as the pod agent):

- ``GET /lockstep/requests``: the work requests it holds now,
  ``{"requests": [{"rid", "room", "bootstrap", "age_s", "stream"}], "fenced": reason|null}``
  (``room``: the PD ``bootstrap_room``, the key both halves share; ``bootstrap``: the
  ``host:port`` of the prefill's bootstrap server the request names — on a decode, its
  prefill);
- ``POST /lockstep/abort`` with ``{"all": bool, "rooms": [int], "peers": [host or
  host:port], "reason": str, "fence": bool}``: every held request that matches (all, or
  its room is listed, or its bootstrap host is a listed peer) is answered at once with a
  retryable error and handed to the engine's own abort, which frees what it holds (KV
  slots, metadata buffers); ``fence`` (default: with ``all``) also refuses every new work
  request (503) and fails ``/health`` from then on, until the process ends: the group is
  going down. Answers ``{"aborted": [request...], "fenced": reason|null}``.

What a client sees is what the engine itself sends for an abort with a status (SGLang's
``FINISH_ABORT`` with ``HTTPStatus.SERVICE_UNAVAILABLE``): a plain request gets HTTP 503
(the router retries it); a stream already under way cannot change its status, so it ends
with SGLang's abort as its last event (``/generate``: ``meta_info.finish_reason`` ``{"type":
"abort", "status_code": 503}``; the OpenAI routes: an ``error`` event) and ``data:
[DONE]``, never a clean-looking truncated 200.

The same book serves the runtime's own knowledge: when the engine learns that its group is
going down (a consensus divergence, a dead rank: SGLang's SIGQUIT) or is told to stop, it
ends every held request the same way before it exits (:func:`end_everything`).

Engine-agnostic: an engine supplies a :class:`RequestBook` (SGLang's tokenizer manager in
:mod:`lockstep_sglang.server_hooks`, the CPU stand-in's frontend in
:mod:`lockstep_standin.server`).
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

# FastAPI, as both engines' HTTP servers (SGLang's and the stand-in's); the route
# functions' annotations are resolved in this module's namespace.
from fastapi import Request
from fastapi.responses import JSONResponse

from lockstep_sglang.agent import TOKEN_ENV

logger = logging.getLogger("lockstep_sglang.failover")

REQUESTS_ROUTE = "/lockstep/requests"
ABORT_ROUTE = "/lockstep/abort"
# What every ended request gets: the router retries 503 on another pair (sglang-router
# 0.3.2 `is_retryable_status`), and SGLang uses it for its own overload aborts.
RETRYABLE_STATUS = 503
MAX_REASON = 200


@dataclass(frozen=True)
class HeldRequest:
    """One work request the server holds."""

    rid: str
    room: int | None = None  # PD bootstrap_room (both halves share it)
    bootstrap: str | None = None  # "host:port" of the prefill bootstrap server it names
    age_s: float = 0.0
    stream: bool = False

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["age_s"] = round(self.age_s, 3)
        return out

    @property
    def bootstrap_host(self) -> str | None:
        """The host part of ``bootstrap`` (an IPv6 host keeps its brackets off)."""
        if not self.bootstrap:
            return None
        host, _, _ = self.bootstrap.rpartition(":")
        return (host or self.bootstrap).strip("[]")


class RequestBook(Protocol):
    """What an engine offers: its held requests, and a way to end some of them now."""

    def held(self) -> list[HeldRequest]:
        """Every work request in flight (health checks excluded)."""
        ...

    def end(self, rids: Sequence[str], message: str) -> None:
        """Answer each of ``rids`` at once with a retryable error (:data:`RETRYABLE_STATUS`)
        and ask the engine to drop it, freeing what it holds. Runs on the server's event
        loop; never waits for the engine."""
        ...


@dataclass(frozen=True)
class AbortOrder:
    """Which held requests to end, and whether to refuse new ones afterwards."""

    all: bool = False
    rooms: frozenset[int] = frozenset()
    peers: frozenset[str] = frozenset()  # hosts, or host:port
    reason: str = "lockstep ended the request: its group is out of service"
    fence: bool = False

    @classmethod
    def from_json(cls, body: Any) -> AbortOrder:
        """Parse the body of ``POST /lockstep/abort``; ``ValueError`` names the field."""
        if not isinstance(body, Mapping):
            raise ValueError("body: a JSON object is required")
        unknown = set(body) - {"all", "rooms", "peers", "reason", "fence"}
        if unknown:
            raise ValueError(f"{sorted(unknown)[0]}: unknown field")
        every = body.get("all", False)
        if not isinstance(every, bool):
            raise ValueError("all: must be true or false")
        rooms = body.get("rooms", [])
        if not isinstance(rooms, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in rooms
        ):
            raise ValueError("rooms: must be a list of integers (bootstrap_room)")
        peers = body.get("peers", [])
        if not isinstance(peers, list) or not all(isinstance(p, str) and p for p in peers):
            raise ValueError("peers: must be a list of host or host:port strings")
        reason = body.get("reason", cls.reason)
        if not isinstance(reason, str):
            raise ValueError("reason: must be a string")
        fence = body.get("fence", every)
        if not isinstance(fence, bool):
            raise ValueError("fence: must be true or false")
        return cls(
            all=every,
            rooms=frozenset(rooms),
            peers=frozenset(peers),
            reason=reason[:MAX_REASON] or cls.reason,
            fence=fence,
        )

    def selects(self, req: HeldRequest) -> bool:
        """Whether this order ends ``req``."""
        if self.all:
            return True
        if req.room is not None and req.room in self.rooms:
            return True
        if req.bootstrap is not None:
            return req.bootstrap in self.peers or req.bootstrap_host in self.peers
        return False


@dataclass
class Fence:
    """Set once the group is going down: new work is refused (503), ``/health`` fails.

    One event loop reads and writes it (the server's); the reason is what clients read.
    """

    reason: str | None = None

    def close(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    @property
    def closed(self) -> bool:
        return self.reason is not None


@dataclass
class Failover:
    """One server's failover surface: its book, its fence and the operator's token."""

    book: RequestBook
    fence: Fence = field(default_factory=Fence)
    token: str = field(default_factory=lambda: os.environ.get(TOKEN_ENV, "").strip())

    def authorized(self, header: str | None) -> tuple[int, dict[str, Any]] | None:
        """None when ``header`` carries the operator's token, else the refusal to send."""
        if not self.token:
            return 403, {"error": f"disabled: {TOKEN_ENV} is not set in this pod"}
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), self.token.encode()
        ):
            return 401, {"error": "missing or wrong bearer token"}
        return None

    def requests(self) -> dict[str, Any]:
        """The body of ``GET /lockstep/requests``."""
        return {
            "requests": [r.to_json() for r in self.book.held()],
            "fenced": self.fence.reason,
        }

    def abort(self, order: AbortOrder) -> dict[str, Any]:
        """End what ``order`` selects (on the server's loop); the body of the answer."""
        if order.fence:
            self.fence.close(order.reason)
        chosen = [r for r in self.book.held() if order.selects(r)]
        if chosen:
            logger.warning(
                "lockstep: ending %d request(s) with %d: %s",
                len(chosen),
                RETRYABLE_STATUS,
                order.reason,
            )
            self.book.end([r.rid for r in chosen], order.reason)
        return {"aborted": [r.to_json() for r in chosen], "fenced": self.fence.reason}


def end_everything(failover: Failover | None, reason: str) -> int:
    """The runtime's own call when its group goes down: fence, end every held request.
    Returns how many were ended (0 without a failover surface)."""
    if failover is None:
        return 0
    return len(failover.abort(AbortOrder(all=True, reason=reason, fence=True))["aborted"])


def parse_body(raw: bytes) -> Any:
    """The JSON body of a request (an empty body is ``{}``); ``ValueError`` otherwise."""
    import json

    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"body: not JSON ({exc})") from None


def add_routes(app: Any, failover: Failover) -> None:
    """Serve :data:`REQUESTS_ROUTE` and :data:`ABORT_ROUTE` from a FastAPI ``app``."""

    async def requests_route(request: Request) -> JSONResponse:
        refused = failover.authorized(request.headers.get("authorization"))
        if refused is not None:
            return JSONResponse(refused[1], status_code=refused[0])
        return JSONResponse(failover.requests())

    async def abort_route(request: Request) -> JSONResponse:
        refused = failover.authorized(request.headers.get("authorization"))
        if refused is not None:
            return JSONResponse(refused[1], status_code=refused[0])
        try:
            order = AbortOrder.from_json(parse_body(await request.body()))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(failover.abort(order))

    app.add_api_route(REQUESTS_ROUTE, requests_route, methods=["GET"])
    app.add_api_route(ABORT_ROUTE, abort_route, methods=["POST"])


def rooms_of(requests: Iterable[HeldRequest]) -> set[int]:
    """The PD rooms among ``requests``."""
    return {r.room for r in requests if r.room is not None}

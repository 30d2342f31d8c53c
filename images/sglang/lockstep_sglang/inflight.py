"""The leader's in-flight requests: what a group leaving service waits for.

When lockstep takes a healthy group out of service on purpose (a node under maintenance,
a scale-down), it first removes the group from every router, then waits until the
requests the group already accepted have finished (bounded by the deployment's
`maintenance.drainTimeoutSeconds`) before its pods go. The leader's HTTP server is where
those requests live, so it counts them: an ASGI middleware counts every POST (the work
routes: `/generate`, `/v1/...`; GETs are health and info) from the moment it arrives to
the moment its response body has been sent in full (a streamed response counts until its
last chunk), and ``GET /lockstep/inflight`` answers ``{"inflight": n}``.

Once the group is going down (:class:`lockstep_sglang.failover.Fence` closed: the operator
ended its requests, or the runtime saw a consensus failure), the same middleware refuses
every new work request with 503 and fails ``/health`` (and ``/health_generate``), so a
router retry or health check never waits on it.

A plain ASGI middleware rather than Starlette's `BaseHTTPMiddleware`: the latter ends when
the response starts, so a streamed generation would stop counting at its first token.
The same middleware runs in SGLang's own app (`server_hooks`) and in the stand-in.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from lockstep_sglang.failover import RETRYABLE_STATUS, Fence

INFLIGHT_ROUTE = "/lockstep/inflight"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class InflightCounter:
    """How many work requests the server holds now (one event loop: no lock needed)."""

    def __init__(self) -> None:
        self.value = 0

    def body(self) -> dict[str, int]:
        """The JSON body of ``GET /lockstep/inflight``."""
        return {"inflight": self.value}


COUNTER = InflightCounter()


def counts(scope: Scope) -> bool:
    """Whether a request is work that a drain waits for."""
    return (
        scope.get("type") == "http"
        and scope.get("method") == "POST"
        and not str(scope.get("path", "")).startswith("/lockstep/")
    )


HEALTH_PATHS = frozenset({"/health", "/health_generate"})


async def refuse(send: Send, reason: str) -> None:
    """Answer 503 in SGLang's error shape (the router retries it elsewhere)."""
    body = json.dumps(
        {
            "object": "error",
            "message": f"the group is out of service: {reason}",
            "type": "ServiceUnavailable",
            "param": None,
            "code": RETRYABLE_STATUS,
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": RETRYABLE_STATUS,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class InflightMiddleware:
    """Counts work requests in `counter` until their response is complete (or fails);
    refuses them (and health checks) once `fence` is closed."""

    def __init__(
        self, app: ASGIApp, counter: InflightCounter = COUNTER, fence: Fence | None = None
    ) -> None:
        self.app = app
        self.counter = counter
        self.fence = fence

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fence = self.fence
        refused = scope.get("type") == "http" and (
            counts(scope) or scope.get("path") in HEALTH_PATHS
        )
        if fence is not None and fence.reason is not None and refused:
            await refuse(send, fence.reason)
            return
        if not counts(scope):
            await self.app(scope, receive, send)
            return
        self.counter.value += 1
        done = False

        async def send_counted(message: Message) -> None:
            nonlocal done
            await send(message)
            if (
                not done
                and message.get("type") == "http.response.body"
                and not message.get("more_body", False)
            ):
                done = True
                self.counter.value -= 1

        try:
            await self.app(scope, receive, send_counted)
        finally:
            if not done:
                done = True
                self.counter.value -= 1

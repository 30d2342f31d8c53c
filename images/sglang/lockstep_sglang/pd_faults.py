"""The PD path's test faults on the real SGLang server (SGLang 0.5.21 to 0.5.23).

Installed only with the test fault switch on (``LOCKSTEP_TEST_FAULT_FILE``, see
:mod:`lockstep_sglang.faults`; the operator refuses to render it), read from the same
fault file as the ranks' faults, and aimed at the pod (``ranks`` is ignored):

- ``transfer-stall`` (scheduler processes of a prefill): every rank's KV sender stops
  sending for bootstrap rooms it meets while the fault is in force. A room is judged at
  its first chunk and keeps that judgement, so a hand-off already under way completes
  and a stalled room never sends a late chunk. The prefill computes, its collectives,
  HTTP server and deep probe stay fine; the decode waits for KV that never comes.
  Hooked: ``send`` (called with each chunk) wherever SGLang defines it, on
  ``CommonKVSender`` and on ``MooncakeKVSender`` (its own in 0.5.21 and 0.5.22).
- ``bootstrap-down`` (the prefill's main process): its bootstrap server closes every
  connection without an answer (``/route``, ``/health``, the DP-rank routes), as a
  server that stopped would. Hooked: ``CommonKVBootstrapServer._setup_routes``, which
  builds the server's aiohttp application (a middleware is added there, before the
  application starts).
- ``kv-leak`` (a decode's main process): the tokenizer manager's abort of a request its
  client left is lost: the request's state is marked as aborted (``abort_sent``, as
  SGLang marks it) and no ``AbortReq`` reaches the scheduler, which keeps the request
  and its KV (in a PD queue, or running for nobody) with nobody waiting for it. Hooked:
  ``TokenizerManager.abort_request``; lockstep's own aborts (:func:`operator_abort`, and
  the free of :mod:`lockstep_sglang.held_kv`, which sends ``AbortReq`` itself) pass.

Not pinned (:mod:`lockstep_sglang.pins` pins what production runs): these hooks never
run without the switch, and the real-SGLang tier fails if a release moves what they hook
(``tests/realsglang/test_pd.py`` drives both faults through the operator's pair probe).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from lockstep_sglang.config import EPOCH_ENV
from lockstep_sglang.faults import FaultKind, FaultWatcher

logger = logging.getLogger(__name__)

ROOMS_KEPT = 4096  # judged rooms remembered (a room's chunks come within seconds)
SENDERS = (
    ("sglang.srt.disaggregation.common.conn", "CommonKVSender"),
    ("sglang.srt.disaggregation.mooncake.conn", "MooncakeKVSender"),
)


def _in_force(watcher: FaultWatcher, kind: FaultKind) -> bool:
    epoch = os.environ.get(EPOCH_ENV, "").strip() or None
    return watcher.current().pd_fault(kind, epoch)


class SenderStall:
    """``transfer-stall``'s judgement of each room: stalled or not, fixed at its first chunk."""

    def __init__(self, watcher: FaultWatcher) -> None:
        self.watcher = watcher
        self._rooms: OrderedDict[int, bool] = OrderedDict()

    def stalled(self, room: int) -> bool:
        """Whether the chunk of ``room`` about to be sent must be dropped."""
        judged = self._rooms.get(room)
        if judged is None:
            judged = _in_force(self.watcher, "transfer-stall")
            self._rooms[room] = judged
            if len(self._rooms) > ROOMS_KEPT:
                self._rooms.popitem(last=False)
            if judged:
                logger.warning(
                    "lockstep test fault transfer-stall: the KV of room %s not sent", room
                )
        return judged


def install_sender_stall(watcher: FaultWatcher) -> None:
    """Hook the KV senders' ``send`` (a scheduler process, switch on)."""
    import importlib

    stall = SenderStall(watcher)
    for module, name in SENDERS:
        try:
            owner = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            logger.warning("lockstep test fault transfer-stall: no %s.%s (%s)", module, name, exc)
            continue
        original = owner.__dict__.get("send")
        if original is None or getattr(original, "__lockstep_hook__", False):
            continue
        owner.send = _stalling(original, stall)


def _stalling(original: Callable[..., Any], stall: SenderStall) -> Callable[..., Any]:
    @functools.wraps(original)
    def send(self: Any, *args: Any, **kwargs: Any) -> Any:
        if stall.stalled(int(self.bootstrap_room)):
            return None
        return original(self, *args, **kwargs)

    send.__lockstep_hook__ = True  # type: ignore[attr-defined]
    return send


def bootstrap_down_middleware(watcher: FaultWatcher) -> Callable[..., Awaitable[Any]]:
    """An aiohttp middleware: while ``bootstrap-down`` is in force, every connection is
    closed without an answer."""
    from aiohttp import web

    @web.middleware
    async def down(request: web.Request, handler: Callable[..., Awaitable[Any]]) -> Any:
        if not _in_force(watcher, "bootstrap-down"):
            return await handler(request)
        transport = request.transport
        if transport is not None:
            transport.close()
        # Never reaches the peer (its connection is closed): ends aiohttp's handling.
        raise web.HTTPServiceUnavailable(text="bootstrap-down (lockstep test fault)")

    return down


def install_bootstrap_down(watcher: FaultWatcher) -> None:
    """Hook the bootstrap server a prefill's main process starts (switch on)."""
    from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer

    if getattr(CommonKVBootstrapServer._setup_routes, "__lockstep_hook__", False):
        return
    original = CommonKVBootstrapServer._setup_routes
    middleware = bootstrap_down_middleware(watcher)

    @functools.wraps(original)
    def setup_routes(self: Any) -> None:
        original(self)
        self.app.middlewares.append(middleware)

    setup_routes.__lockstep_hook__ = True  # type: ignore[attr-defined]
    CommonKVBootstrapServer._setup_routes = setup_routes


_OPERATOR_ABORT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "lockstep_operator_abort", default=False
)


@contextlib.contextmanager
def operator_abort() -> Iterator[None]:
    """Around an abort lockstep itself asks for (an incident's end of held requests):
    ``kv-leak`` never drops it."""
    token = _OPERATOR_ABORT.set(True)
    try:
        yield
    finally:
        _OPERATOR_ABORT.reset(token)


def install_kv_leak(watcher: FaultWatcher) -> None:
    """Hook the tokenizer manager's abort in a server's main process (switch on)."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    original = TokenizerManager.abort_request
    if getattr(original, "__lockstep_hook__", False):
        return

    @functools.wraps(original)
    def abort_request(self: Any, rid: str = "", abort_all: bool = False) -> Any:
        if abort_all or not rid or _OPERATOR_ABORT.get() or not _in_force(watcher, "kv-leak"):
            return original(self, rid, abort_all)
        state = self.rid_to_state.get(rid)
        if state is not None and not state.abort_sent:
            state.abort_sent = True
            logger.warning("lockstep test fault kv-leak: the abort of request %s dropped", rid)
        return None

    abort_request.__lockstep_hook__ = True  # type: ignore[attr-defined]
    TokenizerManager.abort_request = abort_request

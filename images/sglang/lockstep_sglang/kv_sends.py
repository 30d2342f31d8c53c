"""Bounded KV-path sends toward a peer whose pods are gone (SGLang 0.5.23).

What SGLang does (``sglang.srt.disaggregation.common.conn.CommonKVManager``): a KV
manager pushes its status messages, aux data and abort acks to a peer's endpoint over
one cached zmq PUSH socket per endpoint (``_connect``), all through
``_send_multipart_locked``. Those sockets never reconnect (``RECONNECT_IVL -1``); a
socket is replaced once its monitor has seen the peer disconnect, checked at the next
send. Their send timeout is SGLang's ``SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT`` (1 s by
default) under the ``prefill_complete`` allocation policy, and a fixed 30 s otherwise.

Why that matters: a PUSH socket whose only peer has left has no pipe to queue into, so a
send on it waits its whole send timeout (measured here, pyzmq 27.3 on libzmq 4.3.5: a
send after the peer closed blocked until the timeout; a fresh socket to a port nobody
listens on queues at once). When a peer dies between the monitor's check and the send,
the sending thread stalls 30 s. On a prefill that thread can be its bootstrap thread
(it sends the abort acks of the rooms a decode aborted just before its pods were
stopped), and every other decode's handshakes wait behind it.

What lockstep does: before each such send, the cached socket's send timeout is bounded
by SGLang's own ``SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT``, under the endpoint's send
lock (zmq sockets are not thread-safe; SGLang serialises sends per endpoint with that
lock). A send toward a live peer does not wait (its pipe takes up to 1,000 messages), so
only a send toward a gone peer is cut short; it fails through SGLang's own error path
(``Failed to sync status`` for a status message), and lockstep logs which endpoint and
how long. The wrapper reads only ``_connect`` and ``_socket_send_locks`` and calls the
original, so it needs no source pin; a release without them is reported, not patched.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

SEND_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT"  # SGLang's own, seconds
DEFAULT_SEND_TIMEOUT_S = 1  # SGLang 0.5.23's default for it
MANAGER = ("sglang.srt.disaggregation.common.conn", "CommonKVManager")
READS = ("_connect", "_socket_send_locks", "_send_multipart_locked")
"""What the wrapper uses of ``CommonKVManager`` (tests/sglang checks them)."""


def send_timeout_ms(environ: Mapping[str, str] | None = None) -> int:
    """SGLang's ``SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT`` in milliseconds (whole seconds > 0)."""
    env = os.environ if environ is None else environ
    raw = env.get(SEND_TIMEOUT_ENV, "").strip()
    try:
        seconds = int(raw) if raw else DEFAULT_SEND_TIMEOUT_S
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise ValueError(f"{SEND_TIMEOUT_ENV} must be a whole number of seconds > 0, got {raw!r}")
    return seconds * 1000


def install(timeout_ms: int) -> bool:
    """Bound every KV-path send of this process at ``timeout_ms``.

    Returns False when already installed, or when the installed SGLang has no
    ``CommonKVManager._send_multipart_locked`` (logged: sends stay as SGLang sets them).
    """
    module, name = MANAGER
    try:
        owner = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        logger.warning("lockstep: KV-path sends not bounded: no %s.%s (%s)", module, name, exc)
        return False
    original = owner.__dict__.get("_send_multipart_locked")
    if original is None or not callable(getattr(owner, "_connect", None)):
        logger.warning(
            "lockstep: KV-path sends not bounded: %s.%s has no _send_multipart_locked or _connect",
            module,
            name,
        )
        return False
    if getattr(original, "__lockstep_hook__", False):
        return False
    owner._send_multipart_locked = bounded(original, timeout_ms)
    logger.info("lockstep: KV-path sends bounded at %d ms", timeout_ms)
    return True


def bounded(original: Callable[..., Any], timeout_ms: int) -> Callable[..., Any]:
    """``original`` (``_send_multipart_locked``) with its socket's send timeout bounded."""
    import zmq

    @functools.wraps(original)
    def send(self: Any, endpoint: str, parts: list[bytes], is_ipv6: bool = False) -> Any:
        sock = self._connect(endpoint, is_ipv6=is_ipv6)
        with self._socket_send_locks[endpoint]:
            try:
                current = sock.getsockopt(zmq.SNDTIMEO)
                if current < 0 or current > timeout_ms:
                    sock.setsockopt(zmq.SNDTIMEO, timeout_ms)
            except zmq.ZMQError:  # closed by a concurrent replacement: SGLang's send decides
                pass
        start = time.monotonic()
        try:
            return original(self, endpoint, parts, is_ipv6=is_ipv6)
        except zmq.Again:
            logger.warning(
                "lockstep: a KV-path send to %s gave up after %.1f s: the peer is gone "
                "(no connection to queue into)",
                endpoint,
                time.monotonic() - start,
            )
            raise

    send.__lockstep_hook__ = True  # type: ignore[attr-defined]
    return send

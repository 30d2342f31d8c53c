"""The KV path's sends toward a peer that left, on SGLang 0.5.23's real KV manager.

SGLang's ``CommonKVManager`` pushes status messages and abort acks over one cached zmq
socket per peer endpoint. These tests build the real manager class with only what its
sends use (no transfer engine, no model) and drive its own ``send_kv_status_message``
and ``_send_multipart_locked`` against real zmq peers on localhost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from lockstep_sglang import kv_sends


@pytest.fixture
def manager(restore_hooks: ModuleType) -> Iterator[Any]:
    """A real ``MooncakeKVManager`` (the class the drills run) with only its send state."""
    import zmq
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    m = object.__new__(MooncakeKVManager)
    m._zmq_ctx = zmq.Context()
    m._socket_cache, m._monitor_cache, m._socket_send_locks = {}, {}, {}
    m._socket_lock = threading.Lock()
    m.defer_decode_allocation = False  # the default allocation policy
    m.attn_tp_rank = m.pp_rank = m.attn_cp_rank = 0
    m.pp_size = m.attn_cp_size = 1
    yield m
    for sock in [*m._socket_cache.values(), *m._monitor_cache.values()]:
        sock.close(linger=0)
    m._zmq_ctx.term()


def _peer(manager: Any) -> tuple[Any, int]:
    import zmq

    pull = manager._zmq_ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVTIMEO, 5000)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    return pull, port


def _leave(manager: Any, pull: Any, endpoint: str) -> None:
    """The peer's process ends, and the disconnect lands after the sender's check: the
    monitor's report is taken away, as if the send had started just before it came, and
    the socket has dropped its connection by the time of the send (zmq does so on its
    next command pass; a send in the same instant would still be queued, and lost)."""
    import zmq

    pull.close(linger=0)
    monitor = manager._monitor_cache[endpoint]
    monitor.setsockopt(zmq.RCVTIMEO, 5000)
    monitor.recv_multipart()
    time.sleep(0.3)


def _timed_send(manager: Any, port: int) -> float:
    from sglang.srt.disaggregation.base.conn import KVPoll

    done: list[float] = []

    def send() -> None:
        start = time.monotonic()
        manager.send_kv_status_message(
            targets=[("127.0.0.1", port)], bootstrap_room=7, status=KVPoll.Failed
        )
        done.append(time.monotonic() - start)

    worker = threading.Thread(target=send, daemon=True)
    worker.start()
    worker.join(timeout=40)
    assert done, "send_kv_status_message did not return within 40 s"
    return done[0]


def test_the_default_policy_sockets_wait_30_s_on_a_peer_that_left(manager: Any) -> None:
    # The fact the bound rests on: SGLang's own socket for the default allocation policy.
    import zmq

    pull, port = _peer(manager)
    endpoint = f"tcp://127.0.0.1:{port}"
    sock = manager._connect(endpoint)
    assert sock.getsockopt(zmq.SNDTIMEO) == 30000
    assert sock.getsockopt(zmq.RECONNECT_IVL) == -1
    pull.close(linger=0)
    # lockstep's wrapper reads these of the manager, and the class that runs here does
    # not define its own send.
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    assert all(hasattr(manager, name) for name in kv_sends.READS)
    assert "_send_multipart_locked" in CommonKVManager.__dict__
    assert "_send_multipart_locked" not in MooncakeKVManager.__dict__


def test_a_status_to_a_peer_that_left_fails_within_the_bound(
    manager: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from sglang.srt.disaggregation.base.conn import KVPoll

    assert kv_sends.install(kv_sends.send_timeout_ms({}))
    assert not kv_sends.install(1000)  # once per process
    pull, port = _peer(manager)
    endpoint = f"tcp://127.0.0.1:{port}"

    # A live peer gets the status, as before.
    assert _timed_send(manager, port) < 1.0
    room, status, rank, _ = manager.parse_kv_status_message(pull.recv_multipart())
    assert (room, status, rank) == (7, KVPoll.Failed, 0)

    _leave(manager, pull, endpoint)
    with caplog.at_level(logging.WARNING):
        waited = _timed_send(manager, port)
    # SGLang's own socket would have waited 30 s here (the test above); bounded at its
    # own 1 s send timeout, the status fails through SGLang's error path.
    assert 0.5 < waited < 5.0
    messages = [r.getMessage() for r in caplog.records]
    assert any("Failed to sync status" in m and "room 7" in m for m in messages), messages
    assert any("KV-path send to " + endpoint in m and "peer is gone" in m for m in messages), (
        messages
    )
    # The next send sees the monitor's report of a later disconnect or none: it never
    # waits on the dead socket again (a fresh socket to a closed port queues at once).
    assert _timed_send(manager, port) < 5.0


def test_the_send_timeout_is_sglang_own_setting() -> None:
    assert kv_sends.send_timeout_ms({}) == 1000
    assert kv_sends.send_timeout_ms({kv_sends.SEND_TIMEOUT_ENV: "3"}) == 3000
    for bad in ("0", "-1", "1.5", "soon"):
        with pytest.raises(ValueError, match=kv_sends.SEND_TIMEOUT_ENV):
            kv_sends.send_timeout_ms({kv_sends.SEND_TIMEOUT_ENV: bad})

"""The drills' own judges of who was named (issue 29): what the suspect-node drill expects
is counted from the incidents status lists, and the restart checks hold an incident to the
rank, pod and node the fault went into. A judge that passes anything would let the drills
pass whatever the operator names."""

from __future__ import annotations

from typing import Any

import pytest

from lockstep_dev.drills.failover import CaughtStreams, stream_checks
from lockstep_dev.drills.restart import outlier_checks
from lockstep_dev.drills.suspects import outlier_nodes
from lockstep_dev.traffic import Stream, event_rid

pytestmark = pytest.mark.unit


def incident(id_: str, *outliers: tuple[str, int | None, str | None]) -> dict[str, Any]:
    return {
        "id": id_,
        "outliers": [
            {"pod": p, "rank": r, "why": "x", **({"node": n} if n else {})} for p, r, n in outliers
        ],
    }


def test_an_incident_counts_once_per_node_and_an_outlier_without_a_node_not_at_all() -> None:
    found = outlier_nodes(
        [
            # A desync naming both ranks, both pods on one node: once for that node.
            incident("decode-0-1", ("d-0-0", 0, "gpu-2"), ("d-0-1", 1, "gpu-2")),
            incident("decode-0-2", ("d-0-1", 1, "gpu-2")),
            incident("decode-0-3", ("d-0-1", None, None)),  # a pod never scheduled
            incident("decode-0-4", ("d-0-0", 0, "gpu-1"), ("d-0-1", 1, "gpu-3")),
        ]
    )
    assert found == {
        "gpu-2": ["decode-0-1", "decode-0-2"],
        "gpu-1": ["decode-0-4"],
        "gpu-3": ["decode-0-4"],
    }


VICTIM = {
    "metadata": {"name": "drill-decode-0-1", "labels": {"lockstep.dev/rank": "1"}},
    "spec": {
        "nodeName": "gpu-3",
        "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    },
}


def passed(kind: Any, *outliers: tuple[str, int | None, str | None], why: str = "") -> bool:
    inc = incident("i", *outliers)
    for o in inc["outliers"]:
        o["why"] = why
    return all(ok for ok, _ in outlier_checks(kind, inc, VICTIM))


def test_a_stopped_rank_must_be_the_only_outlier_with_its_rank_pod_node_and_state() -> None:
    stopped = "its process is stopped"
    assert passed("stall-rank", ("drill-decode-0-1", 1, "gpu-3"), why=stopped)
    assert not passed("stall-rank", ("drill-decode-0-1", 1, "gpu-3"), why="behind: in broadcast")
    assert not passed("stall-rank", ("drill-decode-0-1", 1, None), why=stopped)
    assert not passed("stall-rank", ("drill-decode-0-0", 0, "gpu-2"), why=stopped)
    assert not passed(
        "stall-rank",
        ("drill-decode-0-1", 1, "gpu-3"),
        ("drill-decode-0-0", 0, "gpu-2"),
        why=stopped,
    )
    assert not passed("stall-rank")


def test_a_killed_rank_must_be_named_gone_and_a_deleted_pod_alone_with_their_nodes() -> None:
    gone = "its process is gone"
    assert passed("kill-rank", ("drill-decode-0-1", 1, "gpu-3"), why=gone)
    # Its peer exits when the collective breaks: named beside it, still a pass.
    assert passed(
        "kill-rank", ("drill-decode-0-0", 0, "gpu-2"), ("drill-decode-0-1", 1, "gpu-3"), why=gone
    )
    assert not passed("kill-rank", ("drill-decode-0-0", 0, "gpu-2"), why=gone)
    assert not passed("kill-rank", ("drill-decode-0-1", 1, "gpu-1"), why=gone)
    assert not passed("kill-rank", ("drill-decode-0-1", 1, "gpu-3"), why="its process is stopped")
    assert passed("delete-pod", ("drill-decode-0-1", None, "gpu-3"))
    assert not passed("delete-pod", ("drill-decode-0-1", None, "gpu-1"))
    assert not passed(
        "delete-pod", ("drill-decode-0-1", None, "gpu-3"), ("drill-decode-0-0", None, "gpu-2")
    )
    # A desync's and a hang's outliers are told in the figures, not judged by this check.
    assert passed("desync") and passed("hang")


def stream(how: str, rid: str | None) -> Stream:
    s = Stream("http://router", f"t {rid}")
    s.how, s.rid = how, rid
    return s


def test_each_stream_the_group_held_must_end_aborted_and_every_other_complete() -> None:
    # Two streams landed on the affected group (the router may send both there): both
    # are cut by the incident, each with the engine's abort event, and that passes.
    both = CaughtStreams([stream("aborted", "a"), stream("aborted", "b")], frozenset({"a", "b"}))
    assert stream_checks(both)[0]
    # A stream the group did not hold that ended aborted: the incident reached elsewhere.
    leak = CaughtStreams([stream("aborted", "a"), stream("aborted", "b")], frozenset({"b"}))
    assert not stream_checks(leak)[0]
    # A held stream that ended cut (no abort event): the user saw a short answer.
    cut = CaughtStreams([stream("cut", "a"), stream("completed", "b")], frozenset({"a"}))
    assert not stream_checks(cut)[0]
    # A held stream that completed: the incident did not reach what the group held.
    missed = CaughtStreams([stream("completed", "a")], frozenset({"a"}))
    assert not stream_checks(missed)[0]
    # A stream that never ended (still open past the client's limit).
    hung = CaughtStreams([stream("aborted", "a"), stream("completed", "b")], frozenset({"a"}))
    hung.started[1].how = None
    assert not stream_checks(hung)[0]
    # No stream was on the group: the incident caught none, nothing was shown.
    none = CaughtStreams([stream("completed", "a")], frozenset())
    assert not stream_checks(none)[0]
    # A runtime that cannot list its requests: exactly one of them aborted.
    assert stream_checks(CaughtStreams([stream("completed", "a"), stream("aborted", "b")], None))[0]
    assert not stream_checks(CaughtStreams([stream("aborted", "a"), stream("aborted", "b")], None))[
        0
    ]


def test_a_stream_the_group_received_is_its_own_though_the_leaders_list_missed_it() -> None:
    # On the stand-in the request logs say which group received a stream's prompt: an
    # aborted stream whose id the leader's list did not show is the group's, and passes.
    missed = CaughtStreams([stream("aborted", "x"), stream("aborted", "b")], frozenset({"b"}))
    missed.received = frozenset({"t x"})
    assert stream_checks(missed)[0]
    # A stream the group received that completed: the incident did not reach it.
    kept = CaughtStreams([stream("completed", "x"), stream("aborted", "b")], frozenset({"b"}))
    kept.received = frozenset({"t x"})
    assert not stream_checks(kept)[0]


def test_a_streams_id_is_read_from_its_first_event() -> None:
    assert event_rid('{"text": "", "meta_info": {"id": "r-1"}}') == "r-1"
    assert event_rid("[DONE]") is None and event_rid('{"meta_info": {}}') is None


def _pod_log(kubelet: Any, pod: str, uid: str, lines: list[str]) -> None:
    directory = kubelet / "pods" / f"lockstep-drill_{pod}_{uid}"
    directory.mkdir(parents=True)
    (directory / "container.log").write_text("\n".join(lines) + "\n")


def test_a_failed_real_drill_reports_what_its_pods_logged_of_the_kv_path(tmp_path: Any) -> None:
    from lockstep_dev.drills.failover import kv_path_log_lines, kv_path_note

    room, rid = "5154699355585701911", "62214076b2e74805a8215732e2e0a1b3"
    failed = (
        "[2026-12-07 20:51:10 TP0] Decode transfer failed for request rank=0 "
        "decode_req.req.rid='{}' decode_req.req.bootstrap_room={} with exception KVTransferError"
    )
    _pod_log(
        tmp_path,
        "drill-decode-1-0",
        "a1",
        [
            "[2026-12-07 20:45:11] server_args={'disaggregation_bootstrap_port': 8998}",
            *(failed.format(rid[:-1] + str(i), room[:-1] + str(i)) for i in range(3)),
            "[2026-12-07 20:51:12 TP0] Decode batch, #running-req: 2, #transfer-req: 0",
            '[2026-12-07 20:51:12] INFO:     127.0.0.1:1 - "POST /lockstep/abort HTTP/1.1" 200',
        ],
    )
    _pod_log(
        tmp_path,
        "drill-prefill-0-0",
        "b2",
        [
            "[2026-12-07 20:49:24] lockstep: a KV-path send to tcp://127.0.0.1:4 gave up after "
            "1.0 s: the peer is gone (no connection to queue into)",
            "[2026-12-07 20:49:25] Failed to sync status 3 of room 7 to 127.0.0.1:4: Again",
            "    a traceback line about a transfer",
        ],
    )
    lines = kv_path_log_lines(tmp_path)
    # Oldest first, each after its pod; one abort storm's failures in one second are one
    # line with their count; flag dumps, batch lines and access logs are not the KV path.
    assert [line.split("]")[0] for line in lines] == [
        "drill-prefill-0-0: [2026-12-07 20:49:24",
        "drill-prefill-0-0: [2026-12-07 20:49:25",
        "drill-decode-1-0: [2026-12-07 20:51:10 TP0",
    ]
    assert "KV-path send to tcp://127.0.0.1:4 gave up" in lines[0]
    assert lines[2].endswith("(x3)")
    assert kv_path_log_lines(tmp_path, kept=1) == lines[-1:]
    assert kv_path_log_lines(tmp_path / "none") == []
    assert kv_path_note(tmp_path).endswith("\n" + "\n".join(lines))
    assert kv_path_note(tmp_path / "none") == "no real pod logged anything of its KV path"

"""Which pods are router workers, which router replicas to tell, which ids to delete."""

from __future__ import annotations

from typing import Any

from lockstep.api import constants as c
from lockstep.clients.router_workers import (
    RouterWorker,
    admitted_urls,
    admitted_workers,
    pending_gates,
    router_bases,
    router_pod_selector,
    serving_workers,
    stale_workers,
    user_urls,
    worker_ids,
)


def pod(role: str, rank: int, ip: str | None, **meta: Any) -> dict[str, Any]:
    labels = {c.LABEL_ROLE: role, c.LABEL_RANK: str(rank), c.LABEL_DEPLOYMENT: "m"}
    return {
        "metadata": {"name": f"m-{role}-0-{rank}", "labels": labels, **meta},
        "status": {"podIP": ip} if ip else {},
    }


def test_only_addressed_rank0_pods_are_workers_with_the_prefill_bootstrap_port() -> None:
    prefill = pod("prefill", 0, "10.0.0.1", annotations={"sglang.ai/bootstrap-port": "8998"})
    pods = [
        prefill,
        pod("decode", 0, "10.0.0.2"),
        pod("decode", 1, "10.0.0.3"),
        pod("decode", 0, None),
    ]
    assert serving_workers(pods) == [
        RouterWorker(f"http://10.0.0.1:{c.PORT_HTTP}", "prefill", 8998),
        RouterWorker(f"http://10.0.0.2:{c.PORT_HTTP}", "decode", None),
    ]
    assert RouterWorker("http://10.0.0.1:30000", "prefill", 8998).body() == {
        "url": "http://10.0.0.1:30000",
        "worker_type": "prefill",
        "bootstrap_port": 8998,
    }
    assert RouterWorker("http://10.0.0.2:30000", "decode").body() == {
        "url": "http://10.0.0.2:30000",
        "worker_type": "decode",
    }


def test_every_addressed_router_replica_is_told_but_not_one_being_deleted() -> None:
    replicas = [
        {"metadata": {"name": "r-b"}, "status": {"podIP": "10.0.1.2"}},
        {"metadata": {"name": "r-a"}, "status": {"podIP": "10.0.1.1"}},
        {"metadata": {"name": "r-c", "deletionTimestamp": "2026-01-01T00:00:00Z"},
         "status": {"podIP": "10.0.1.3"}},
        {"metadata": {"name": "r-d"}, "status": {}},
    ]  # fmt: skip
    assert router_bases(replicas) == [
        f"http://10.0.1.1:{c.PORT_ROUTER}",
        f"http://10.0.1.2:{c.PORT_ROUTER}",
    ]
    assert router_pod_selector("m") == {c.LABEL_DEPLOYMENT: "m", c.LABEL_COMPONENT: "router"}


def test_worker_ids_match_urls_exactly() -> None:
    listing = {
        "workers": [
            {"id": "a", "url": "http://10.0.0.2:30000"},
            {"id": "b", "url": "http://10.0.0.20:30000"},
            {"id": "c", "url": "http://10.0.0.2:30000/"},
        ]
    }
    assert worker_ids(listing, ["http://10.0.0.2:30000"]) == ["a", "c"]
    assert worker_ids({"workers": []}, ["http://10.0.0.2:30000"]) == []


def gated(p: dict[str, Any], value: str) -> dict[str, Any]:
    p["status"]["conditions"] = [{"type": c.READINESS_GATE, "status": value}]
    return p


def test_the_router_may_list_only_admitted_serving_pods() -> None:
    admitted = gated(pod("decode", 0, "10.0.0.2"), "True")
    drained = gated(pod("prefill", 0, "10.0.0.1"), "False")
    deleting = gated(pod("decode", 0, "10.0.0.4", deletionTimestamp="2026-01-01T00:00:00Z"), "True")
    follower = gated(pod("decode", 1, "10.0.0.3"), "True")
    ungated = pod("decode", 0, "10.0.0.5")
    ungated["metadata"]["name"] = "m-decode-1-0"
    pods = [admitted, drained, deleting, follower, ungated]
    assert admitted_urls(pods) == {f"http://10.0.0.2:{c.PORT_HTTP}"}
    # A gate set this round wins over the cache's condition, both ways.
    assert admitted_urls(pods, {"m-prefill-0-0": True, "m-decode-0-0": False}) == {
        f"http://10.0.0.1:{c.PORT_HTTP}"
    }


def test_stale_workers_are_those_not_kept_and_user_flags_are_kept() -> None:
    listing = {
        "workers": [
            {"id": "a", "url": "http://10.0.0.2:30000"},
            {"id": "b", "url": "http://10.0.0.9:30000"},
            {"id": "c", "url": "http://static.example:30000/"},
            {"url": "http://10.0.0.8:30000"},  # no id: nothing to delete it by
        ]
    }
    keep = {"http://10.0.0.2:30000"} | user_urls(
        ["--decode", "http://static.example:30000/", "--policy", "random", "--x=https://y:1"]
    )
    assert user_urls(["--prefill=http://p:30000", "8998"]) == {"http://p:30000"}
    assert "https://y:1" in keep
    assert stale_workers(listing, keep) == [("b", "http://10.0.0.9:30000")]


def test_gates_the_operator_set_are_remembered_until_the_cache_shows_them() -> None:
    shown = gated(pod("decode", 0, "10.0.0.2"), "True")  # the cache caught up
    behind = gated(pod("prefill", 0, "10.0.0.1"), "False")  # re-admitted, cache behind
    going = gated(pod("decode", 0, "10.0.0.4", deletionTimestamp="2026-01-01T00:00:00Z"), "False")
    going["metadata"]["name"] = "m-decode-1-0"
    gates = {"m-decode-0-0": True, "m-prefill-0-0": True, "m-decode-1-0": True, "gone": False}
    assert pending_gates([shown, behind, going], gates) == {"m-prefill-0-0": True}
    # A remembered gate still ahead of the cache decides what is admitted.
    assert admitted_workers([shown, behind], {"m-prefill-0-0": True}) == [
        RouterWorker(f"http://10.0.0.2:{c.PORT_HTTP}", "decode", None),
        RouterWorker(f"http://10.0.0.1:{c.PORT_HTTP}", "prefill", None),
    ]
    assert admitted_workers([shown, behind], {}) == [
        RouterWorker(f"http://10.0.0.2:{c.PORT_HTTP}", "decode", None)
    ]

"""Which pods are router workers, which router replicas to tell, which ids to delete."""

from __future__ import annotations

from typing import Any

from lockstep import constants as c
from lockstep.router_workers import (
    RouterWorker,
    router_bases,
    router_pod_selector,
    serving_workers,
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

"""Operator memory with 1,000 groups: the resident set of an operator process holding the
state it keeps per group (probe history with failed samples and agent answers, the
persisted recovery records, the status it writes), next to the same process without.

This builds the state with the operator's own types in one process, without an API
server (1,000 groups would be 2,000+ pods to run). The watch caches (the kopf indexes of
the deployment's pods and Services, which replaced listing them every round) are
measured the same way: the objects the operator renders for that many groups, with the
status and `managedFields` an API server adds, kept as the indexes keep them
(`lockstep.handlers.operator.snapshot`). kopf's own per-object bookkeeping is not included.
Prints JSON.
Usage: python benchmarks/operator_memory.py [--groups 1000]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from pathlib import Path

import psutil
import yaml

from lockstep.api.models import parse_pddeployment
from lockstep.clients.agent_client import RanksAnswer
from lockstep.clients.prober import HISTORY, ProbeBook, ProbeSample, ProbeTarget
from lockstep.core.builders import build_all
from lockstep.core.records import dump_records
from lockstep.core.recovery import GroupRecord, IncidentRecord, PodRef, Step
from lockstep.handlers.operator import snapshot  # (and the operator's import footprint)

REPO = Path(__file__).resolve().parent.parent


def rank_state(rank: int, it: int) -> dict[str, object]:
    return {
        "rank": rank,
        "tp_rank": rank,
        "pid": 1000 + rank,
        "alive": True,
        "iteration": it,
        "updated_at": time.time(),
        "last_decision": {
            "kind": "batch",
            "forward_mode": "decode",
            "batch_size": 8,
            "rids_hash": "9f2c",
            "seq": it,
        },
        "collective": {"op": "all_reduce", "group": "tp_device", "seq": it, "since": 1.0},
        "consensus_failure": None,
    }


def build(groups: int, pods_per_group: int, ranks_per_pod: int) -> tuple[object, ...]:
    book = ProbeBook()
    targets = [
        ProbeTarget(
            key=("ns", "m", "decode", g),
            epoch=0,
            probe_url=f"http://10.{g // 250}.{g % 250}.1:30000/lockstep/probe",
            agents=tuple(
                (f"m-decode-{g}-{p}", f"http://10.{g // 250}.{g % 250}.{p + 1}:8999")
                for p in range(pods_per_group)
            ),
            period=5.0,
            timeout=3.0,
        )
        for g in range(groups)
    ]
    book.set_targets("ns", "m", targets)
    for t in targets:
        for i in range(HISTORY):  # a full history of failed samples: the worst case
            agents = tuple(
                RanksAnswer(
                    pod,
                    {"ranks": [rank_state(p * ranks_per_pod + r, i) for r in range(ranks_per_pod)]},
                )
                for p, (pod, _) in enumerate(t.agents)
            )
            book.record(ProbeSample(t.key, 0, float(i), False, 3.0, "timed out", None, agents))
    records = {
        f"decode/{g}": GroupRecord(
            role="decode",
            index=g,
            step=Step.HEALTHY,
            epoch=3,
            restarts=3,
            restart_times=(1.0, 2.0, 3.0),
            incident=IncidentRecord(
                id=f"decode-{g}-3",
                verdict="Desynced",
                epoch=3,
                reason="consensus failure",
                first_failure_at=1.0,
                detected_at=2.0,
                evidence="x" * 2000,
            ),
            old_pods=tuple(
                PodRef(name=f"m-decode-{g}-{p}", uid=f"uid-{g}-{p}") for p in range(pods_per_group)
            ),
        )
        for g in range(groups)
    }
    annotation = dump_records(records)
    return book, records, annotation


def watch_cache(groups: int, pods_per_group: int, ranks_per_pod: int) -> list[object]:
    """The pods and Services of `groups` groups as the indexes hold them."""
    obj = yaml.safe_load((REPO / "examples/pd-small.yaml").read_text())
    obj["metadata"]["uid"] = "bench-uid"
    # Half the groups prefill, half decode (a role has at most 512 groups).
    for role, n in (("prefill", groups // 2), ("decode", groups - groups // 2)):
        obj["spec"][role].update(
            {
                "replicas": n,
                "tp": pods_per_group * ranks_per_pod,
                "gpusPerPod": ranks_per_pod,
                "podsPerGroup": pods_per_group,
            }
        )
    objects = build_all(parse_pddeployment(obj), agent_token="x" * 43)
    cached = []
    for o in objects:
        if o["kind"] not in ("Pod", "Service"):
            continue
        o["metadata"].update(
            uid="0f3c9a3e-6a43-4c1e-9a0e-5b8f0d1c2e3f",
            resourceVersion="123456",
            creationTimestamp="2026-12-01T00:00:00Z",
            managedFields=[
                {"manager": m, "operation": "Update", "apiVersion": "v1",
                 "time": "2026-12-01T00:00:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in o["metadata"].get("labels", {})}},
                              "f:spec": {f"f:{k}": {} for k in o.get("spec", {})}}}
                for m in ("lockstep", "kube-scheduler", "kubelet")
            ],
        )  # fmt: skip
        if o["kind"] == "Pod":
            o["status"] = {
                "phase": "Running",
                "podIP": "10.1.2.3",
                "hostIP": "10.0.0.1",
                "startTime": "2026-12-01T00:00:00Z",
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}
                    for t in (
                        "Initialized",
                        "Ready",
                        "ContainersReady",
                        "PodScheduled",
                        "lockstep.dev/group-healthy",
                    )
                ],
                "containerStatuses": [
                    {
                        "name": "sglang",
                        "ready": True,
                        "restartCount": 1,
                        "started": True,
                        "image": "lmsysorg/sglang:v0.5.23",
                        "imageID": "sha256:" + "0" * 64,
                        "containerID": "containerd://" + "0" * 64,
                        "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}},
                    }
                ],
            }
        cached.append(snapshot(o))
    return cached


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--pods-per-group", type=int, default=2)
    parser.add_argument("--ranks-per-pod", type=int, default=8)
    args = parser.parse_args()
    proc = psutil.Process()
    gc.collect()
    rss0 = proc.memory_info().rss
    tracemalloc.start()
    state = build(args.groups, args.pods_per_group, args.ranks_per_pod)
    gc.collect()
    traced, _peak = tracemalloc.get_traced_memory()
    rss1 = proc.memory_info().rss
    tracemalloc.reset_peak()
    before_cache, _ = tracemalloc.get_traced_memory()
    cache = watch_cache(args.groups, args.pods_per_group, args.ranks_per_pod)
    gc.collect()
    after_cache, _ = tracemalloc.get_traced_memory()
    cache_bytes = after_cache - before_cache
    print(
        json.dumps(
            {
                "benchmark": "operator_memory",
                "groups": args.groups,
                "pods_per_group": args.pods_per_group,
                "ranks_per_pod": args.ranks_per_pod,
                "probe_history_per_group": HISTORY,
                "rss_after_import_mib": round(rss0 / 2**20, 1),
                "rss_with_state_mib": round(rss1 / 2**20, 1),
                "state_traced_mib": round(traced / 2**20, 1),
                "state_per_group_kib": round(traced / args.groups / 1024, 1),
                "records_annotation_kib": round(len(state[2]) / 1024, 1),  # type: ignore[arg-type]
                "watch_cache_objects": len(cache),
                "watch_cache_traced_mib": round(cache_bytes / 2**20, 1),
                "watch_cache_per_group_kib": round(cache_bytes / args.groups / 1024, 1),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

"""Faults for drills, injected the way they happen: into the ranks of one group
(decisions, collectives, step time via the pod's `fault.json`, which the CPU stand-in
always reads and the real SGLang runtime reads through its test-only switch), into their
processes (SIGKILL, SIGSTOP of the rank processes the pod agent reports), or through the
API (pod delete). The same for both engines of the local cluster.
"""

from __future__ import annotations

import base64
import json
import os
import signal
from pathlib import Path
from typing import Any, Literal

import httpx
from kubernetes import client as k8s

from lockstep.api import constants as c
from lockstep.clients.agent_client import AgentClient, report_from_ranks

FaultKind = Literal[
    "desync", "hang", "slow", "kill-rank", "stall-rank", "delete-pod", "none",
    "stuck-in-kernel", "transfer-stall", "bootstrap-down", "kv-leak",
]  # fmt: skip
# The PD path's faults: written to the group's leader pod only (its HTTP process holds the
# bootstrap server, the KV sender and the KV it reserves), in force for the epoch it runs;
# the role whose fault each is.
PD_FAULTS: dict[FaultKind, str] = {
    "transfer-stall": "prefill", "bootstrap-down": "prefill", "kv-leak": "decode",
}  # fmt: skip


def pod_dir(kubelet_root: Path, pod: dict[str, Any]) -> Path:
    """The current incarnation's directory of a pod (the process kubelet's layout)."""
    meta = pod["metadata"]
    return kubelet_root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"


def group_pods(
    core: k8s.CoreV1Api, namespace: str, deployment: str, role: str, group: int
) -> list[dict[str, Any]]:
    """The live pods of one group, rank 0 first."""
    sel = f"{c.LABEL_DEPLOYMENT}={deployment},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={group}"
    api = core.api_client
    pods: list[dict[str, Any]] = [
        api.sanitize_for_serialization(p)
        for p in core.list_namespaced_pod(namespace, label_selector=sel).items
    ]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    live.sort(key=lambda p: int(p["metadata"].get("labels", {}).get(c.LABEL_RANK, "0")))
    return live


def highest_rank(pod: dict[str, Any]) -> int:
    """The highest global rank of a pod, from its spec alone (its agent may not answer):
    node rank r of a group with g GPUs per pod holds ranks r*g .. r*g+g-1, as SGLang
    lays them out across nodes."""
    node_rank = int(pod["metadata"]["labels"].get(c.LABEL_RANK, "0"))
    limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
    gpus = int(str(limits.get("nvidia.com/gpu", "1")))
    return (node_rank + 1) * gpus - 1


def agent_token(core: k8s.CoreV1Api, pod: dict[str, Any]) -> str:
    """The pod agents' bearer token of a pod's deployment, from the Secret the operator
    made (`<deployment>-agent-token`), as the operator reads it."""
    meta = pod["metadata"]
    deployment = meta["labels"][c.LABEL_DEPLOYMENT]
    secret = core.read_namespaced_secret(f"{deployment}-agent-token", meta["namespace"])
    return base64.b64decode((secret.data or {})[c.AGENT_TOKEN_KEY]).decode()


def rank_pids(
    core: k8s.CoreV1Api, pod: dict[str, Any], timeout: float = 5.0
) -> list[tuple[int, int]]:
    """(global rank, pid) of the live ranks of a pod, from its pod agent's `GET /ranks`."""
    name = pod["metadata"]["name"]
    token = agent_token(core, pod)
    with httpx.Client(trust_env=False) as http:
        answer = AgentClient(http).ranks(name, pod["status"]["podIP"], token, timeout=timeout)
    report = report_from_ranks(name, answer.body, 0, answer.error)
    if report.ranks is None:
        raise RuntimeError(f"the pod agent of {name} did not answer: {report.error}")
    ranks = [(r.rank, r.pid) for r in report.ranks if r.alive and r.pid is not None]
    if not ranks:
        raise RuntimeError(f"the pod agent of {pod['metadata']['name']} reports no live rank")
    return ranks


def inject(
    core: k8s.CoreV1Api,
    kubelet_root: Path,
    namespace: str,
    deployment: str,
    role: str,
    group: int,
    kind: FaultKind,
    *,
    step_seconds: float = 4.0,
) -> str:
    """Inject a fault into one group; returns a one-line description."""
    pods = group_pods(core, namespace, deployment, role, group)
    if not pods:
        raise RuntimeError(f"{role}/{group} of {namespace}/{deployment} has no pods")
    last = pods[-1]
    dirs = [pod_dir(kubelet_root, p) for p in pods]
    if kind in PD_FAULTS:
        if role != PD_FAULTS[kind]:
            raise ValueError(f"{kind} is a {PD_FAULTS[kind]} group's fault, not a {role} group's")
        epoch = int(pods[0]["metadata"]["labels"].get(c.LABEL_EPOCH, "0"))
        _write_fault(dirs[0], {"kind": kind, "ranks": None, "epoch": epoch})
        return f"{kind} injected into {role}/{group} (its leader's PD path)"
    if kind in ("desync", "hang", "slow", "stuck-in-kernel", "none"):
        # desync/hang/stuck-in-kernel: one rank (the group's last) misbehaves; slow: every
        # rank. stuck-in-kernel: the CPU stand-in's only.
        victim = highest_rank(last) if kind in ("desync", "hang", "stuck-in-kernel") else None
        epoch = int(pods[0]["metadata"]["labels"].get(c.LABEL_EPOCH, "0"))
        # The epoch keeps a fault from firing again in a restarted container of a later
        # epoch that reuses nothing but the pod name.
        fault = {
            "kind": kind,
            "ranks": None if victim is None else [victim],
            "step_seconds": step_seconds,
            "epoch": epoch,
        }
        for d in dirs:
            _write_fault(d, fault)
        who = "every rank" if victim is None else f"rank {victim}"
        return f"{kind} injected into {role}/{group} ({who})"
    if kind in ("kill-rank", "stall-rank"):
        rank, pid = max(rank_pids(core, last))
        os.kill(pid, signal.SIGKILL if kind == "kill-rank" else signal.SIGSTOP)
        verb = "killed" if kind == "kill-rank" else "stopped (SIGSTOP)"
        return f"{verb} rank {rank} (pid {pid}) of {role}/{group} in {last['metadata']['name']}"
    if kind == "delete-pod":
        core.delete_namespaced_pod(last["metadata"]["name"], namespace)
        return f"deleted pod {last['metadata']['name']} of {role}/{group}"
    raise ValueError(f"unknown fault {kind!r}")


def _write_fault(pod_dir: Path, fault: dict[str, Any]) -> None:
    """Replace a pod's fault.json in one rename (no reader sees half a file)."""
    tmp = pod_dir / "fault.json.tmp"
    tmp.write_text(json.dumps(fault))
    tmp.replace(pod_dir / "fault.json")

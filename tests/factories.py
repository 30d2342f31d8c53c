"""Test object builders: the one place tests get PDDeployment objects from."""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
GOOD_EXAMPLES = sorted(EXAMPLES.glob("*.yaml"))
UNSAFE_EXAMPLES = sorted((EXAMPLES / "unsafe").glob("*.yaml"))


def load_example(name: str) -> dict[str, Any]:
    """An example manifest as a dict (`pd-small`, `unsafe/overlap-schedule`, ...)."""
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return data


def pdd_obj(**spec_overrides: Any) -> dict[str, Any]:
    """A minimal valid PDDeployment dict (TP1 roles, so no guard rules fire), with
    top-level spec keys replaced by `spec_overrides`."""
    obj: dict[str, Any] = {
        "apiVersion": "lockstep.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": "m", "namespace": "ns", "uid": "0000-uid"},
        "spec": {
            "model": {"path": "/models/m"},
            "image": "registry.local/sglang:0.5.23-lockstep",
            "prefill": {"tp": 1, "gpusPerPod": 1},
            "decode": {"tp": 1, "gpusPerPod": 1},
        },
    }
    obj["spec"].update(copy.deepcopy(spec_overrides))
    return obj


def with_path(obj: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of `obj` with the value at a dotted path set (creating mappings)."""
    out = copy.deepcopy(obj)
    node = out
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


# ------------------------------------------------- a deployment after two incidents
# What `kubectl lockstep` reads, as the operator writes it: the PDDeployment with its
# status and records annotation, its pods (rendered by the builders), its Events (as
# kopf posts them) and its evidence ConfigMap's data (the evidence store's format).


def rank_state(
    rank: int,
    *,
    now: float,
    seq: int,
    collective: tuple[str, str, int, float] | None = None,
    failure: dict[str, Any] | None = None,
    alive: bool = True,
) -> dict[str, Any]:
    """One rank of a pod agent's `GET /ranks` answer (`lockstep_sglang.rank_state`);
    `collective` is (op, group, seq, seconds inside it)."""
    return {
        "rank": rank,
        "tp_rank": rank,
        "pid": 4100 + rank,
        "alive": alive,
        "started_at": now - 600,
        "updated_at": now - 1,
        "iteration": seq + 2,
        "last_decision": {
            "kind": "batch",
            "forward_mode": "DECODE",
            "batch_size": 8,
            "rids_hash": "9f1c",
            "seq": seq,
        },
        "step": {"since": None, "count": seq, "recent_s": [0.05, 0.06]},
        "collective": None
        if collective is None
        else {
            "op": collective[0],
            "group": collective[1],
            "seq": collective[2],
            "since": now - collective[3],
        },
        "consensus": {"checks": 40, "events_checked": 900, "decisions_checked": 300},
        "consensus_failure": failure,
    }


def ranks_answer(pod: str, epoch: int, now: float, ranks: list[dict[str, Any]]) -> str:
    """A pod agent's `GET /ranks` answer, as the operator captures it (the raw text)."""
    return json.dumps(
        {
            "schema": "lockstep.dev/rank-state/v1",
            "hostname": pod,
            "pod": pod,
            "epoch": str(epoch),
            "agent_pid": 7,
            "now": now,
            "ranks": ranks,
            "previous": [],
            "previous_epoch": None,
            "engine_exit": None,
            "previous_engine_exit": None,
        }
    )


def stacks_answer(now: float, rank: int, frames: list[str]) -> str:
    """A pod agent's `POST /stacks` answer for one rank."""
    stack = f'Thread {4100 + rank} (idle): "MainThread"\n' + "\n".join(f"    {f}" for f in frames)
    return json.dumps(
        {
            "now": now,
            "stacks": [
                {
                    "rank": rank,
                    "pid": 4100 + rank,
                    "ok": True,
                    "duration_s": 0.21,
                    "stack": stack,
                    "error": None,
                }
            ],
        }
    )


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def kopf_event(
    pdd: dict[str, Any], reason: str, message: str, at: float, type_: str = "Normal"
) -> dict[str, Any]:
    """An Event on the PDDeployment as kopf posts it (`kopf.event`)."""
    meta = pdd["metadata"]
    when = datetime.fromtimestamp(at, UTC).isoformat(timespec="microseconds")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": meta["namespace"], "generateName": "kopf-event-"},
        "action": "Action?",
        "type": type_,
        "reason": reason,
        "message": message,
        "reportingComponent": "kopf",
        "reportingInstance": "dev",
        "source": {"component": "kopf"},
        "involvedObject": {
            "apiVersion": pdd["apiVersion"],
            "kind": pdd["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
            "namespace": meta["namespace"],
        },
        "firstTimestamp": when,
        "lastTimestamp": when,
        "eventTime": when,
    }


@dataclass
class IncidentScene:
    """`qwen` 10 minutes after decode/0 desynced (restarted in place, closed) and while
    decode/1 recovers from a dead rank (recreated, open, waiting for its deep probe)."""

    pdd: dict[str, Any]  # spec and metadata (with the records annotation)
    status: dict[str, Any]
    pods: list[dict[str, Any]]
    events: list[dict[str, Any]]  # need `pdd`'s uid: build them with `events_for`
    evidence: dict[str, str]  # the `<name>-evidence` ConfigMap's data
    now: float

    def events_for(self, pdd: dict[str, Any]) -> list[dict[str, Any]]:
        """The scene's Events about `pdd` as stored (its uid)."""
        return [kopf_event(pdd, e["reason"], e["message"], e["at"], e["type"]) for e in self.events]

    def stored(self, uid: str = "0000-uid") -> dict[str, Any]:
        """The PDDeployment as the API server returns it, status included."""
        obj = copy.deepcopy(self.pdd)
        obj["metadata"].update(uid=uid, generation=1, resourceVersion="42")
        obj["status"] = copy.deepcopy(self.status)
        return obj


def incident_scene(namespace: str = "ns", now: float = 1_780_000_000.0) -> IncidentScene:
    """The scene of `IncidentScene`'s docstring, its clock at `now`."""
    from lockstep.api.models import Incident, PDDeploymentStatus, parse_pddeployment
    from lockstep.clients.agent_client import report_from_text
    from lockstep.core.builders import build_group_pods
    from lockstep.core.evidence import EvidenceEntry, to_data
    from lockstep.core.policy import evaluate
    from lockstep.core.records import ANNOTATION_RECORDS, dump_records
    from lockstep.core.recovery import GroupRecord, IncidentRecord, Step
    from lockstep.core.verdicts import divergence_cause

    obj = pdd_obj(
        prefill={"tp": 1, "gpusPerPod": 1},
        decode={"replicas": 2, "tp": 2, "podsPerGroup": 2, "gpusPerPod": 1},
        runtime={"image": "ghcr.io/lockstep-dev/operator:0.1.0"},
    )
    obj["metadata"] = {"name": "qwen", "namespace": namespace}
    t0 = now - 600  # decode/0's first failed probe
    t1 = now - 20  # decode/1's rank died
    records = {
        "decode/1": GroupRecord(
            role="decode",
            index=1,
            step=Step.WAITING_PROBE,
            mode="Recreate",
            epoch=1,
            step_since=now - 6,
            incident=IncidentRecord(
                id="decode-1-1",
                verdict="RankDown",
                epoch=0,
                reason="pod qwen-decode-1-1 restarted (restart count 0 -> 1)",
                first_failure_at=t1,
                detected_at=t1 + 1.2,
                culprits=("qwen-decode-1-1",),
            ),
            restarts=1,
        )
    }
    obj["metadata"]["annotations"] = {ANNOTATION_RECORDS: dump_records(records)}
    pdd = parse_pddeployment({**obj, "metadata": {**obj["metadata"], "uid": "0000-uid"}})
    policy = evaluate(pdd.spec)
    pods: list[dict[str, Any]] = []
    for role, group, epoch in (("prefill", 0, 0), ("decode", 0, 1), ("decode", 1, 1)):
        for pod in build_group_pods(pdd, role, group, epoch, policy.roles[role]):
            pod["spec"]["nodeName"] = f"gpu-{len(pods) + 1}"
            pods.append(pod)

    desync = (
        "rank 1 (qwen-decode-0-1) reported a consensus failure\n"
        "signals: consensus-failure, probe-timeout\n"
        "probe: timeout 3001ms\n"
        "consensus_failure:\n"
        "  qwen-decode-0-1/r1: divergence after 900 events at index 3"
    )
    failure = {
        "detected_at": t0,
        "rank": 1,
        "events_checked": 900,
        "local_hash": "77ab",
        "first_divergence": {
            "index": 3,
            "events": {
                "0": "lockstep decision batch mode=DECODE size=8 rids=9f1c",
                "1": "lockstep decision idle",
            },
        },
        "recent_events": {},
    }
    at = t0 + 1  # when the evidence was captured (the pod agents' clock)
    rank0 = rank_state(0, now=at, seq=1198, collective=("all_reduce", "tp:cpu", 311, 12.3))
    rank1 = rank_state(
        1, now=at, seq=1199, failure=failure, collective=("broadcast_pyobj", "tp:cpu", 312, 12.1)
    )
    answers = [ranks_answer(f"qwen-decode-0-{r['rank']}", 0, at, [r]) for r in (rank0, rank1)]
    frames = [
        [
            "all_reduce (torch/distributed/distributed_c10d.py:2806)",
            "event_loop_normal (sglang/srt/managers/scheduler.py:1020)",
        ],
        ["broadcast_pyobj (sglang/srt/utils/common.py:1187)"],
    ]
    logs = [
        "log:\nINFO decode batch 1198\nINFO decode batch 1199",
        "log: unavailable (ApiException)",
    ]
    # As the executor's capture manager joins what it captured from each pod.
    captured = "\n".join(
        f"[qwen-decode-0-{rank}] {part}"
        for rank in (0, 1)
        for part in (
            f"ranks: {answers[rank]}",
            f"stacks: {stacks_answer(at, rank, frames[rank])}",
            logs[rank],
        )
    )
    # As the round's record step judges the cause of what was captured.
    cause = divergence_cause(
        r
        for rank, text in enumerate(answers)
        for r in report_from_text(f"qwen-decode-0-{rank}", text, 0).ranks or ()
    )
    rankdown = (
        "pod qwen-decode-1-1 restarted (restart count 0 -> 1)\n"
        "signals: container-restarted, probe-failed"
    )
    entries = {
        "decode-0-1": EvidenceEntry(verdict=desync, captured=captured, cause=cause),
        "decode-1-1": EvidenceEntry(verdict=rankdown),
    }
    incidents = [
        Incident(
            id="decode-0-1",
            role="decode",
            group=0,
            epoch=0,
            verdict="Desynced",
            state="Closed",
            action="drained, evidence captured, restarted the whole group in place into epoch 1",
            restart_mode="InPlace",
            first_failure_time=_rfc3339(t0),
            detected_time=_rfc3339(t0 + 0.7),
            recovered_time=_rfc3339(t0 + 8.1),
            time_to_detect_seconds=0.7,
            time_to_recover_seconds=7.4,
            evidence=entries["decode-0-1"].render(16384),
        ),
        Incident(
            id="decode-1-1",
            role="decode",
            group=1,
            epoch=0,
            verdict="RankDown",
            state="Open",
            action="drained, recreating the whole group in epoch 1",
            restart_mode="Recreate",
            escalation="the agent of qwen-decode-1-1 did not answer",
            first_failure_time=_rfc3339(t1),
            detected_time=_rfc3339(t1 + 1.2),
            time_to_detect_seconds=1.2,
            evidence=entries["decode-1-1"].render(16384),
        ),
    ]

    def group(index: int, state: str, epoch: int, restarts: int, ok: bool, **kw: Any) -> Any:
        probe = {"ok": ok, "time": _rfc3339(now - 3), "latencyMs": 6.9 if ok else None}
        if not ok:
            probe["error"] = "timeout after 3s"
        return {
            "index": index,
            "state": state,
            "epoch": epoch,
            "restarts": restarts,
            "readyPods": kw.pop("ready", 2),
            "pods": 2,
            "lastProbe": probe,
            **kw,
        }

    status = PDDeploymentStatus.model_validate(
        {
            "observedGeneration": 1,
            "prefillReady": "1/1",
            "decodeReady": "1/2",
            "openIncidents": 1,
            "prefill": {
                "replicas": 1,
                "readyGroups": 1,
                "groups": [{**group(0, "Healthy", 0, 0, True), "readyPods": 1, "pods": 1}],
            },
            "decode": {
                "replicas": 2,
                "readyGroups": 1,
                "groups": [
                    group(0, "Healthy", 1, 1, True, lastRestartTime=_rfc3339(t0 + 1.7)),
                    group(
                        1,
                        "Recovering",
                        1,
                        1,
                        False,
                        ready=0,
                        message="pod qwen-decode-1-1 restarted (restart count 0 -> 1)",
                    ),
                ],
            },
            "incidents": [i.model_dump(by_alias=True, exclude_none=True) for i in incidents],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "GroupsNotReady",
                    "message": "2/3 groups healthy",
                    "lastTransitionTime": _rfc3339(t1 + 1),
                },
                {
                    "type": "Progressing",
                    "status": "True",
                    "reason": "GroupsStarting",
                    "message": "decode/1",
                    "lastTransitionTime": _rfc3339(t1 + 1),
                },
                {
                    "type": "Degraded",
                    "status": "False",
                    "reason": "AsExpected",
                    "message": "",
                    "lastTransitionTime": _rfc3339(t0 + 8),
                },
            ],
        }
    ).model_dump(by_alias=True, exclude_none=True)

    def ev(at: float, reason: str, message: str, type_: str = "Normal") -> dict[str, Any]:
        return {"at": at, "reason": reason, "message": message, "type": type_}

    events = [
        ev(now - 900, "GroupReady", "prefill/0: deep probe passed, admitted"),
        ev(
            t0 + 0.7,
            "GroupDesynced",
            "decode/0: rank 1 (qwen-decode-0-1) reported a consensus failure",
            "Warning",
        ),
        ev(t0 + 1.0, "GroupDrained", "decode/0: out of 1 router, readiness gate false"),
        ev(t0 + 1.7, "GroupRestartingInPlace", "decode/0: every pod agent restarts into epoch 1"),
        ev(t0 + 8.1, "GroupReadmitted", "decode/0: deep probe passed in epoch 1, back in service"),
        ev(
            t1 + 1.2,
            "GroupRankDown",
            "decode/1: pod qwen-decode-1-1 restarted (restart count 0 -> 1)",
            "Warning",
        ),
        ev(
            t1 + 2.0,
            "GroupRestartEscalated",
            "decode/1: the agent of qwen-decode-1-1 did not answer: recreating",
            "Warning",
        ),
    ]
    return IncidentScene(obj, status, pods, events, to_data(entries), now)


def sglang_source(version: str) -> Path:
    """One SGLang release's unpacked wheel (`.ci/fetch-sglang-source`: cached outside the
    repository): the directory to put on PYTHONPATH, its `sglang-<v>.dist-info` inside."""
    fetched = subprocess.run(
        ["bash", str(REPO / ".ci/fetch-sglang-source"), version],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    return Path(fetched.stdout.strip().splitlines()[-1])

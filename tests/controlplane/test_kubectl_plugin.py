"""`kubectl lockstep` against the real API server: a PDDeployment with the status, records
annotation, pods, Events and evidence ConfigMap the operator writes during an incident
(`factories.incident_scene`), read by the plugin run as a process, as kubectl runs it
(also through the real kubectl's plugin discovery); `restart` sets the annotation the
operator reads. Every command's output is kept in the test's tmp_path (transcript.txt)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from factories import REPO, IncidentScene, incident_scene

from lockstep.api.models import parse_pddeployment
from lockstep.core.builders import build_evidence_configmap
from lockstep.core.records import ANNOTATION_RESTART, manual_request
from lockstep_dev.localcluster import LocalControlPlane

PDDS = "/apis/lockstep.dev/v1alpha1/namespaces/{ns}/pddeployments"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
PYTHONPATH = os.pathsep.join(str(REPO / p) for p in ("operator", "images/sglang"))


def ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    return body


class Plugin:
    """Runs `kubectl-lockstep` (this checkout's) as kubectl would, with KUBECONFIG set;
    appends every command and its output to a transcript."""

    def __init__(self, kubeconfig: Path, transcript: Path) -> None:
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": PYTHONPATH}
        self.transcript = transcript

    def __call__(self, *args: str, cmd: list[str] | None = None) -> tuple[int, str, str]:
        argv = [*(cmd or [sys.executable, "-m", "lockstep.cli.kubectl"]), *args]
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=60, check=False
        )
        shown = "kubectl lockstep" if cmd is None else " ".join(Path(a).name for a in cmd)
        with self.transcript.open("a") as f:
            f.write(
                f"$ {shown} {shlex.join(args)}\n{done.stdout}{done.stderr}(exit {done.returncode})\n\n"
            )
        return done.returncode, done.stdout, done.stderr


@pytest.fixture
def scene(
    controlplane: LocalControlPlane, http: httpx.Client, namespace: str
) -> Iterator[tuple[IncidentScene, dict[str, Any]]]:
    """The incident scene stored on the API server: (the scene, the stored PDDeployment)."""
    sc = incident_scene(namespace=namespace, now=time.time())
    created = ok(http.post(PDDS.format(ns=namespace), json=sc.pdd), 201)
    name, uid = created["metadata"]["name"], created["metadata"]["uid"]
    ok(
        http.patch(
            f"{PDDS.format(ns=namespace)}/{name}/status",
            json={"status": sc.status},
            headers=MERGE_PATCH,
        )
    )
    # Nodes for the pods (cluster-scoped: named after the namespace), so the pods are not
    # orphans the pod garbage collector deletes.
    nodes = sorted({p["spec"]["nodeName"] for p in sc.pods})
    renamed = {n: f"{namespace}-{n}" for n in nodes}
    for node in renamed.values():
        ok(http.post("/api/v1/nodes", json={"metadata": {"name": node}}), 201)
    for pod in sc.pods:
        pod["spec"]["nodeName"] = renamed[pod["spec"]["nodeName"]]
        for ref in pod["metadata"].get("ownerReferences") or []:
            ref["uid"] = uid
        ok(http.post(f"/api/v1/namespaces/{namespace}/pods", json=pod), 201)
    for event in sc.events_for(created):
        ok(http.post(f"/api/v1/namespaces/{namespace}/events", json=event), 201)
    cm = build_evidence_configmap(parse_pddeployment(created), sc.evidence)
    ok(http.post(f"/api/v1/namespaces/{namespace}/configmaps", json=cm), 201)
    yield sc, ok(http.get(f"{PDDS.format(ns=namespace)}/{name}"))
    for node in renamed.values():
        http.delete(f"/api/v1/nodes/{node}")


def columns(text: str, first: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", ln.strip()) for ln in text.splitlines() if ln.startswith(first)]


def test_kubectl_lockstep_against_the_api_server(
    controlplane: LocalControlPlane,
    http: httpx.Client,
    namespace: str,
    scene: tuple[IncidentScene, dict[str, Any]],
    kubectl: Path,
    tmp_path: Path,
) -> None:
    sc, stored = scene
    ns = namespace
    plugin = Plugin(controlplane.kubeconfig, tmp_path / "transcript.txt")
    node_of = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in sc.pods}

    # status: every group, its probe and the runtime its pods run; the conditions.
    code, out, err = plugin("status", "qwen", "-n", ns)
    assert (code, err) == (0, "")
    assert out.startswith(
        f"PDDeployment qwen in {ns}: prefill 1/1 ready, decode 1/2 ready, 1 open incident"
    )
    runtime = "ghcr.io/lockstep-dev/operator:0.1.0"
    groups = columns(out, "prefill/") + columns(out, "decode/")
    assert [g[:7] + g[8:] for g in groups] == [
        ["prefill/0", "Healthy", "0", "0", "1/1", "ok", "6.9ms", runtime, "-"],
        ["decode/0", "Healthy", "1", "1", "2/2", "ok", "6.9ms", runtime, "-"],
        ["decode/1", "Recovering", "1", "1", "0/2", "failed", "-", runtime,
         "pod qwen-decode-1-1 restarted (restart count 0 -> 1); probe: timeout after 3s"],
    ]  # fmt: skip
    assert all(g[7].endswith("s ago") for g in groups)
    assert [c[:3] for c in columns(out, "Ready") + columns(out, "Progressing")] == [
        ["Ready", "False", "GroupsNotReady"],
        ["Progressing", "True", "GroupsStarting"],
    ]
    code, out, _ = plugin("status", "qwen", "-n", ns, "-o", "json")
    view = json.loads(out)
    assert code == 0 and [(g["role"], g["group"], g["state"]) for g in view["groups"]] == [
        ("prefill", 0, "Healthy"),
        ("decode", 0, "Healthy"),
        ("decode", 1, "Recovering"),
    ]

    # incidents: the timeline of each, its steps from the real Events, the outlier.
    code, out, err = plugin("incidents", "qwen", "-n", ns)
    assert (code, err) == (0, "")
    (closed,) = columns(out, "decode-0-1  ")
    (open_,) = columns(out, "decode-1-1  ")
    assert closed[:5] + closed[6:] == [
        "decode-0-1", "decode/0", "0", "Desynced", "Closed", "0.7s", "7.4s", "InPlace", "-",
    ]  # fmt: skip
    assert open_[:5] + open_[6:] == [
        "decode-1-1", "decode/1", "0", "RankDown", "Open", "1.2s", "-", "Recreate",
        f"qwen-decode-1-1 (node {node_of['qwen-decode-1-1']})",
    ]  # fmt: skip
    steps = [ln.split()[2] for ln in out.splitlines() if re.match(r"^    \d\d:\d\d:", ln)]
    assert steps == [
        "GroupDesynced", "GroupDrained", "GroupRestartingInPlace", "GroupReadmitted",
        "GroupRankDown", "GroupRestartEscalated",
    ]  # fmt: skip
    assert f"kubectl lockstep evidence qwen decode-0-1 -n {ns}" in out
    code, out, _ = plugin("incidents", "qwen", "-n", ns, "-o", "json")
    incidents = json.loads(out)["incidents"]
    assert [i["id"] for i in incidents] == ["decode-0-1", "decode-1-1"]
    assert incidents[1]["currentStep"]["step"] == "WaitingProbe"

    # evidence: the rank states and stacks kept in the <name>-evidence ConfigMap.
    code, out, err = plugin("evidence", "qwen", "decode-0-1", "-n", ns)
    assert (code, err) == (0, "")
    assert "Pod qwen-decode-0-1: rank states" in out
    assert columns(out, "  1     1")[0][-1] == "FAILED"
    assert "broadcast_pyobj (sglang/srt/utils/common.py:1187)" in out
    assert "INFO decode batch 1199" not in out
    code, out, _ = plugin("evidence", "qwen", "decode-0-1", "-n", ns, "--logs")
    assert "  INFO decode batch 1199" in out

    # restart: the annotation docs/evidence.md documents, which the operator reads as a request.
    code, out, err = plugin("restart", "qwen", "decode/0", "--reason", "INC-42 wedged", "-n", ns)
    assert (code, err) == (0, "")
    after = ok(http.get(f"{PDDS.format(ns=ns)}/qwen"))
    value = after["metadata"]["annotations"][ANNOTATION_RESTART]
    assert re.fullmatch(r"decode/0@INC-42-wedged-\d{8}-\d{6}", value)
    assert f"annotated: {ANNOTATION_RESTART}={value}" in out
    assert manual_request(after, "decode", 0) == value.split("@", 1)[1]
    assert after["status"] == stored["status"]  # a metadata patch, nothing else

    # What the user gets wrong, each named with the fix.
    code, _, err = plugin("restart", "qwen", "decode/2", "--reason", "x", "-n", ns)
    assert code == 1 and "ROLE/GROUP 'decode/2': PDDeployment qwen has decode groups 0..1" in err
    code, _, err = plugin("evidence", "qwen", "decode-0-7", "-n", ns)
    assert code == 1 and err.strip().endswith("its incidents: decode-0-1, decode-1-1")
    code, _, err = plugin("status", "qwne", "-n", ns)
    assert code == 1 and err.strip() == (
        f'error: PDDeployment "qwne" not found in namespace "{ns}"; PDDeployments there: '
        "qwen (another namespace? -n NAMESPACE)"
    )

    # The namespace of the kubeconfig's context when -n is not given, as kubectl.
    config = yaml.safe_load(controlplane.kubeconfig.read_text())
    for ctx in config["contexts"]:
        ctx["context"]["namespace"] = ns
    (tmp_path / "ns.kubeconfig").write_text(yaml.safe_dump(config))
    code, out, _ = plugin("status", "qwen", "--kubeconfig", str(tmp_path / "ns.kubeconfig"))
    assert code == 0 and out.startswith(f"PDDeployment qwen in {ns}:")

    # An API server that does not answer: named, exit 1.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    (tmp_path / "down.kubeconfig").write_text(yaml.safe_dump(config))
    code, _, err = plugin("status", "qwen", "--kubeconfig", str(tmp_path / "down.kubeconfig"))
    assert code == 1 and f"cannot reach the API server at https://127.0.0.1:{port}" in err

    # Through kubectl itself: it finds `kubectl-lockstep` on PATH.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "kubectl-lockstep"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m lockstep.cli.kubectl "$@"\n')
    shim.chmod(0o755)
    # Only the shim's folder and the system's: another kubectl-lockstep on PATH (the
    # venv's, once installed) would make `kubectl plugin list` warn and fail.
    plugin.env["PATH"] = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    code, out, _ = plugin("plugin", "list", cmd=[str(kubectl)])
    assert code == 0 and str(shim) in out
    code, via_kubectl, err = plugin("lockstep", "status", "qwen", "-n", ns, cmd=[str(kubectl)])
    assert (code, err) == (0, "")
    assert via_kubectl.startswith(f"PDDeployment qwen in {ns}: prefill 1/1 ready")
    assert [r[0] for r in columns(via_kubectl, "decode/")] == ["decode/0", "decode/1"]

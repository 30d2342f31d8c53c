"""API requests the operator makes at steady state (JSON out), from the API server's own
audit log.

For each count of PDDeployments (default 1, 10, 30): a fresh local control plane with
its audit log on, the fake kubelet of the operator tests (every pod a fake SGLang pod on
a loopback address that answers the deep probe and the pod agent), the real operator
(`lockstep operator`, watching one namespace) under an identity of its own, and that many
copies of examples/pd-small.yaml (router off, no pod of it ever failing). Once every
group is Ready and a settle time passed, the operator's requests are counted for a
window: per verb and resource, per second, per second and deployment; with the
operator's CPU over the window.

Usage: python benchmarks/api_requests.py [--counts 1 10 30] [--window 60]
       [--operator-path DIR]   # run another checkout's operator (a before/after)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import yaml  # noqa: E402
from harness import FakeKubelet, OperatorProcess, wait_for  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

from lockstep.api import constants as c  # noqa: E402
from lockstep_dev.localcluster.audit import parse_audit_log  # noqa: E402
from lockstep_dev.localcluster.controlplane import LocalControlPlane  # noqa: E402

USER = "lockstep-bench-operator"


def spec(namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples/pd-small.yaml").read_text())
    obj["metadata"] = {"name": name, "namespace": namespace}
    for role in ("prefill", "decode"):
        obj["spec"][role].update({"replicas": 1, "tp": 1, "gpusPerPod": 1, "podsPerGroup": 1})
        obj["spec"][role]["nodeSelector"] = {"lockstep.dev/test-node": "fake-kubelet"}
    obj["spec"]["router"] = {"enabled": False}
    obj["spec"]["health"] = {"periodSeconds": 5, "timeoutSeconds": 3, "startupGraceSeconds": 60}
    return obj


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(count: int, window: float, settle: float, operator_path: str | None) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="lockstep-api-bench-"))
    with LocalControlPlane(
        workdir=workdir / "cp", crds=[REPO / "crds" / f"{c.CRD_NAME}.yaml"], audit_log=True
    ) as cp:
        ns = cp.new_namespace()
        api = cp.api_client()
        custom = k8s.CustomObjectsApi(api)
        kubelet = FakeKubelet(api, ns).start()
        kubeconfig = cp.user_kubeconfig(USER, ["system:masters"])
        if operator_path:
            roots = [f"{operator_path}/operator", f"{operator_path}/images/sglang"]
            os.environ["PYTHONPATH"] = os.pathsep.join(roots)
        operator = OperatorProcess(kubeconfig, ns, workdir / "operator.log").start()
        try:
            names = [f"bench-{i}" for i in range(count)]
            for name in names:
                custom.create_namespaced_custom_object(
                    c.GROUP, c.VERSION, ns, c.PLURAL, spec(ns, name)
                )

            def all_ready() -> bool:
                items = custom.list_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL)
                ready = [
                    i
                    for i in items["items"]
                    if (i.get("status") or {}).get("prefillReady") == "1/1"
                    and (i.get("status") or {}).get("decodeReady") == "1/1"
                ]
                return len(ready) == count

            started = time.monotonic()
            wait_for(all_ready, 300 + 10 * count, f"{count} deployments Ready", poll=1.0)
            ready_after = time.monotonic() - started
            time.sleep(settle)
            assert cp.audit_log is not None and operator.proc is not None
            start_lines = len(cp.audit_log.read_text().splitlines())
            cpu0, t0 = cpu_seconds(operator.proc.pid), time.monotonic()
            time.sleep(window)
            cpu1, t1 = cpu_seconds(operator.proc.pid), time.monotonic()
            lines = cp.audit_log.read_text().splitlines()[start_lines:]
        finally:
            operator.stop()
            kubelet.stop()
    events = [e for e in parse_audit_log(lines) if e.user == USER]
    elapsed = t1 - t0
    by_kind = Counter(f"{e.verb} {e.resource}" for e in events)
    return {
        "deployments": count,
        "ready_after_s": round(ready_after, 1),
        "window_s": round(elapsed, 1),
        "requests": len(events),
        "requests_per_s": round(len(events) / elapsed, 3),
        "requests_per_s_per_deployment": round(len(events) / elapsed / count, 4),
        "by_verb_resource_per_s": {
            k: round(v / elapsed, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
        },
        "operator_cpu_cores": round((cpu1 - cpu0) / elapsed, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 10, 30])
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=15.0)
    parser.add_argument("--operator-path", help="another checkout whose operator to run")
    args = parser.parse_args()
    results = [measure(n, args.window, args.settle, args.operator_path) for n in args.counts]
    out = {
        "benchmark": "api_requests",
        "operator": args.operator_path or str(REPO),
        "results": results,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

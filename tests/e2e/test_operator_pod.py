"""The operator on the local cluster as a cluster runs it: installed with the real Helm
chart, run by the process kubelet as the Deployment's pod under the chart's
ServiceAccount, behind the chart's admission webhooks (self-signed CA injected by the
operator, the API server calling them through the webhook Service).

One cluster, in order: the operator is up as the chart's ServiceAccount and its webhook
refuses an unsafe spec at the door; a SIGKILLed operator comes back by itself (the kubelet
restarts the container, nobody starts it) and serves again; a deleted operator pod is
replaced by the ReplicaSet, whose new pod serves again (with the certificate the first
pod kept in the chart's Secret: its CA is already in the configurations), and
`operator.log` follows it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from lockstep_dev.cluster import RELEASE, RELEASE_NAMESPACE, DevCluster, restart_count, wait_for
from lockstep_dev.localcluster.audit import by_user, parse_audit_log, serviceaccount_user
from lockstep_dev.localcluster.controlplane import find_kubectl, repo_root

REPO = repo_root() or Path(__file__).resolve().parents[2]
NAMESPACE = "lockstep-webhook-e2e"


def apply_unsafe(cluster: DevCluster) -> subprocess.CompletedProcess[str]:
    """`kubectl apply` of an example the flag policy refuses (an operator-owned flag)."""
    assert cluster.cp is not None
    obj = yaml.safe_load((REPO / "examples/unsafe/operator-owned-flag.yaml").read_text())
    obj["metadata"] = {"name": "unsafe", "namespace": NAMESPACE}
    return subprocess.run(
        [str(find_kubectl()), "--kubeconfig", str(cluster.cp.kubeconfig), "apply", "-f", "-"],
        input=yaml.safe_dump(obj),
        capture_output=True,
        text=True,
        timeout=60,
    )


def refused_at_the_door(cluster: DevCluster) -> None:
    out = apply_unsafe(cluster)
    assert out.returncode != 0, out.stdout
    assert "denied the request" in out.stderr and "operator-owned-flag" in out.stderr, out.stderr


@pytest.mark.timeout(420)
def test_the_chart_installed_operator_is_restarted_and_replaced_by_the_cluster(
    tmp_path: Path,
) -> None:
    with DevCluster(tmp_path / "cluster", nodes=1, audit_log=True) as cluster:
        operator = cluster.chart_operator
        assert cluster.cp is not None
        cluster.ensure_namespace(NAMESPACE)

        # The chart's Deployment, ServiceAccount and webhooks; the kubelet runs the pod.
        pod = operator.pod()
        assert pod is not None
        assert pod["metadata"]["name"].startswith(f"{RELEASE}-")
        assert pod["spec"]["serviceAccountName"] == RELEASE
        state = json.loads((cluster.workdir / "state.json").read_text())
        assert state["operator"] == "chart" and state["operator_namespace"] == RELEASE_NAMESPACE
        refused_at_the_door(cluster)
        # Its requests reach the API server as the chart's ServiceAccount (RBAC applies).
        audit = cluster.cp.audit_log
        assert audit is not None

        def as_service_account() -> bool:
            events = parse_audit_log(audit.read_text().splitlines())
            return bool(by_user(events, serviceaccount_user(RELEASE_NAMESPACE, RELEASE)))

        wait_for(as_service_account, 30, "the operator's requests as its ServiceAccount")

        # A crash: SIGKILL the container's process; the kubelet restarts it, same pod.
        uid, restarts = pod["metadata"]["uid"], restart_count(pod)
        killed_pid = operator.kill()
        started = time.monotonic()
        back = operator.wait_ready(120, restarts_at_least=restarts + 1)
        print(f"operator restarted by the kubelet in {time.monotonic() - started:.1f}s")
        assert back["metadata"]["uid"] == uid and restart_count(back) == restarts + 1
        assert operator.pid() not in (None, killed_pid)
        operator.wait_webhook(60)
        refused_at_the_door(cluster)

        # A deleted pod: the ReplicaSet makes a new one, which serves the same certificate.
        old = operator.delete_pod()
        started = time.monotonic()
        new = operator.wait_ready(120, other_than=old)
        print(f"operator pod replaced by the ReplicaSet in {time.monotonic() - started:.1f}s")
        assert new["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        operator.wait_webhook(60)
        refused_at_the_door(cluster)
        log = operator.log_path()
        assert log is not None and new["metadata"]["uid"] in str(log)
        link = cluster.workdir / "operator.log"
        wait_for(lambda: link.resolve() == log, 10, "operator.log to follow the new pod")
        assert "the webhook CA is already in" in log.read_text()

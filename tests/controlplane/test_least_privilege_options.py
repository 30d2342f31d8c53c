"""Least privilege for what the drill does not run, each against the real API server with
its audit log on, the operator authenticated as the chart's ServiceAccount and bound to
the RBAC the chart renders for the value set in question.

1. The self-signed admission webhook (the chart's defaults), with the
OwnerReferencesPermissionEnforcement admission plugin on (OpenShift and hardened clusters
run it; it checks, inside the API server, that whoever sets `blockOwnerDeletion` on an
owner reference may update the owner's finalizers). The operator injects its CA into this
release's two webhook configurations (get and patch, by name, as the chart's one named
rule grants), the webhooks judge a PDDeployment, and the operator creates that
deployment's objects (pods and Services with blocking owner references, which the chart's
update on pddeployments/finalizers allows under the plugin; the router's Role).

2. HA with the self-signed webhook (every namespace): two replicas elect one leader
through the chart's Lease and share one webhook certificate through the chart's Secret;
the standby serves admission too (the validating webhook goes to one replica, the mutating
one to the other, whichever leads); every request is allowed and every verb of the
release namespace's Role (Lease, its Event, the certificate's Secret) is used.

3. watchNamespaces with namespaced RBAC (a Role per watched namespace): the operator,
watching exact names, does not list or watch namespaces cluster-wide (kopf's scanning is
off then; this test first showed that refusal), and needs nothing else.

"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from factories import load_example
from harness import GROUP, PLURAL, REPO, VERSION, install_crd, wait_for
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from lockstep_dev.localcluster.audit import (
    AuditEvent,
    by_user,
    granted_permissions,
    not_covered,
    parse_audit_log,
    refused,
    serviceaccount_user,
    unused,
)
from lockstep_dev.localcluster.controlplane import LocalControlPlane

RELEASE, RELEASE_NAMESPACE = "lk", "lk-system"
CONFIG = "lk-lockstep"  # the webhook configurations' name (the release's full name)
USER = serviceaccount_user(RELEASE_NAMESPACE, CONFIG)
GROUPS = [
    "system:serviceaccounts",
    f"system:serviceaccounts:{RELEASE_NAMESPACE}",
    "system:authenticated",
]
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart (by default: every namespace, the self-signed webhook)."""
    tools = subprocess.run(
        ["bash", str(REPO / ".ci/fetch-tools")], capture_output=True, text=True, check=True
    )
    helm = Path(tools.stdout.strip().splitlines()[-1]) / "helm"
    out = subprocess.run(
        [helm, "template", RELEASE, REPO / "charts/lockstep", "-n", RELEASE_NAMESPACE, "-f", "-"],
        input=yaml.safe_dump(values or {}),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def operator_args(objs: list[dict[str, Any]], port: int) -> list[str]:
    """The rendered operator's arguments, its ports moved to free ones on loopback."""
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--webhook-self-signed" in args, args
    moved = {"--liveness-port": "0", "--metrics-port": "0", "--webhook-port": str(port)}
    out = [a for a in args if a.split("=", 1)[0] not in moved]
    return [*out, *(f"{k}={v}" for k, v in moved.items()), "--webhook-addr=127.0.0.1"]


def start_operator(kubeconfig: Path, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`lockstep operator` with exactly these arguments, as the chart's pod runs it."""
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "lockstep.cli", "operator", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_operator(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def apply(cp: LocalControlPlane, objs: list[dict[str, Any]], name: str) -> None:
    manifest = cp.workdir / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump_all(objs))
    cp.kubectl("apply", "--server-side", "-f", str(manifest))


def assert_nothing_refused(events: list[AuditEvent]) -> None:
    """No request of the operator's was refused (else the chart's RBAC is too tight)."""
    too_tight = refused(events)
    assert not too_tight, "refused (the chart's RBAC is too tight):\n" + "\n".join(
        sorted({f"{e} {e.uri.split('?')[0]}" for e in too_tight})
    )


def _create(custom: k8s.CustomObjectsApi, namespace: str, pdd: dict[str, Any]) -> bool:
    """Create the PDDeployment; False while the webhook server is not answering yet."""
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pdd)
    except ApiException as err:
        if err.status == 409:
            return True
        if err.status == 500 and "failed calling webhook" in str(err.body):
            return False
        raise
    return True


@pytest.mark.timeout(300)
def test_self_signed_webhook_operator_needs_no_more_than_the_chart_grants(
    tmp_path: Path,
) -> None:
    plugins = "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement"
    with LocalControlPlane(audit_log=True, apiserver_args=[plugins]) as cp:
        install_crd(cp)
        ns = cp.new_namespace()
        objs = render()
        port = free_port()
        cp.kubectl("create", "namespace", RELEASE_NAMESPACE)
        apply(cp, [o for o in objs if o["kind"] in RBAC_KINDS], "chart-rbac")
        webhooks = [o for o in objs if o["kind"] in WEBHOOK_KINDS]
        assert sorted(o["kind"] for o in webhooks) == sorted(WEBHOOK_KINDS)
        for doc in webhooks:
            assert doc["metadata"]["name"] == CONFIG
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
        apply(cp, webhooks, "chart-webhooks")
        api = cp.api_client()
        adm = k8s.AdmissionregistrationV1Api(api)
        custom = k8s.CustomObjectsApi(api)
        core = k8s.CoreV1Api(api)
        rbac = k8s.RbacAuthorizationV1Api(api)
        log = tmp_path / "operator.log"
        op = start_operator(cp.user_kubeconfig(USER, GROUPS), operator_args(objs, port), log)
        created = False
        blocking: list[bool | None] = []
        try:

            def ca_injected() -> bool:
                configs = [
                    adm.read_validating_webhook_configuration(CONFIG),
                    adm.read_mutating_webhook_configuration(CONFIG),
                ]
                return all(h.client_config.ca_bundle for cfg in configs for h in cfg.webhooks)

            wait_for(ca_injected, 60, "the operator to inject its CA into both configurations")
            pdd = load_example("pd-small")
            pdd["metadata"]["namespace"] = ns
            wait_for(lambda: _create(custom, ns, pdd), 60, "the webhooks to admit a PDDeployment")
            try:
                wait_for(
                    lambda: (
                        core.list_namespaced_pod(ns).items and rbac.list_namespaced_role(ns).items
                    ),
                    60,
                    "the operator to create the deployment's pods and the router's Role",
                )
                created = True
                blocking = [
                    ref.block_owner_deletion
                    for pod in core.list_namespaced_pod(ns).items
                    for ref in pod.metadata.owner_references or []
                ]
            except AssertionError as err:
                print(err)  # the audit below says which request was refused
        finally:
            stop_operator(op)
            print("\n".join(log.read_text(errors="replace").splitlines()[-40:]))
        assert cp.audit_log is not None
        events = by_user(parse_audit_log(cp.audit_log.read_text().splitlines()), USER)

    granted = granted_permissions(objs, USER)
    assert_nothing_refused(events)
    elsewhere = not_covered(events, granted)
    assert not elsewhere, "allowed by something the chart does not grant:\n" + "\n".join(
        map(str, elsewhere)
    )
    assert created, "the operator created no pods or no router Role"
    # What makes the chart's update on pddeployments/finalizers needed (the plugin refuses
    # blockOwnerDeletion without it): should the builders stop setting it, drop the rule.
    assert blocking and all(blocking), blocking
    webhook_rules = [p for p in granted if p.api_group == "admissionregistration.k8s.io"]
    assert sorted(map(str, webhook_rules)) == sorted(
        f"{verb} admissionregistration.k8s.io/{kind}webhookconfigurations named {CONFIG}"
        for kind in ("mutating", "validating")
        for verb in ("get", "patch")
    )
    assert unused(webhook_rules, events) == []


@pytest.mark.timeout(300)
def test_ha_replicas_need_no_more_than_the_chart_grants(tmp_path: Path) -> None:
    objs = render({"ha": {"enabled": True, "replicas": 2}})
    ports = [free_port(), free_port()]
    names = ["lk-lockstep-a", "lk-lockstep-b"]
    with LocalControlPlane(audit_log=True) as cp:
        install_crd(cp)
        ns = cp.new_namespace()
        cp.kubectl("create", "namespace", RELEASE_NAMESPACE)
        apply(cp, [o for o in objs if o["kind"] in RBAC_KINDS], "chart-rbac")
        # One webhook configuration to each replica: admission needs both, leader or not.
        webhooks = [o for o in objs if o["kind"] in WEBHOOK_KINDS]
        for doc, port in zip(sorted(webhooks, key=lambda o: o["kind"]), ports, strict=True):
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
        apply(cp, webhooks, "chart-webhooks")
        api = cp.api_client()
        custom, coord = k8s.CustomObjectsApi(api), k8s.CoordinationV1Api(api)
        kubeconfig = cp.user_kubeconfig(USER, GROUPS)
        logs = [tmp_path / f"operator-{i}.log" for i in range(2)]
        replicas = [
            start_operator(
                kubeconfig,
                [*operator_args(objs, port), f"--leader-election-identity={name}"],
                log,
            )
            for port, name, log in zip(ports, names, logs, strict=True)
        ]
        try:

            def holder() -> str | None:
                try:
                    lease = coord.read_namespaced_lease(CONFIG, RELEASE_NAMESPACE)
                except ApiException:
                    return None
                return str(lease.spec.holder_identity or "") or None

            wait_for(holder, 60, "a replica to hold the chart's Lease")
            pdd = load_example("pd-small")
            pdd["metadata"]["namespace"] = ns
            wait_for(lambda: _create(custom, ns, pdd), 90, "both webhooks to admit it")
            # Both serve the one certificate the Secret keeps.
            served = {ssl.get_server_certificate(("127.0.0.1", port)) for port in ports}
            leader = holder()
            time.sleep(4)  # renewals
            assert holder() == leader
            # Read while both run: a leader stopped first hands the Lease over on its way
            # out (it releases it), and the standby then rightly leads during shutdown.
            standby = logs[names.index(str(leader)) - 1].read_text()
        finally:
            # The standby first, for the same reason.
            current = holder()
            for i in sorted(range(len(replicas)), key=lambda i: names[i] == current):
                stop_operator(replicas[i])
            for i, log in enumerate(logs):
                text = log.read_text(errors="replace")
                print(f"--- replica {i}", *text.splitlines()[-15:], sep="\n")
        assert cp.audit_log is not None
        events = by_user(parse_audit_log(cp.audit_log.read_text().splitlines()), USER)

    assert leader in names and len(served) == 1
    assert "stands by" in standby and "leads" not in standby.split("stands by")[-1]
    granted = granted_permissions(objs, USER)
    assert_nothing_refused(events)
    assert not not_covered(events, granted)
    own = [p for p in granted if p.namespace == RELEASE_NAMESPACE]
    assert {p.resource for p in own} == {"leases", "events", "secrets"}
    assert [str(p) for p in unused(own, events)] == []


@pytest.mark.timeout(300)
def test_namespaced_operator_needs_no_more_than_its_namespaces_roles(tmp_path: Path) -> None:
    """watchNamespaces with namespaced RBAC: a Role per watched namespace and no cluster
    read of namespaces; the operator must not need one (it watches exact names)."""
    values = {
        "rbac": {"scope": "Namespaced"},
        "watchNamespaces": ["team-a"],
        "webhook": {"enabled": False},
    }
    objs = render(values)
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args or "team-a" in args, args
    ports = ("--liveness-port", "--metrics-port")
    args = [a for a in args if a.split("=", 1)[0] not in ports] + [f"{p}=0" for p in ports]
    pdd = load_example("pd-small")
    pdd["metadata"]["namespace"] = "team-a"
    with LocalControlPlane(audit_log=True, crds=sorted((REPO / "crds").glob("*.yaml"))) as cp:
        for ns in (RELEASE_NAMESPACE, "team-a"):
            cp.kubectl("create", "namespace", ns)
        apply(cp, [o for o in objs if o["kind"] in RBAC_KINDS], "chart-rbac")
        core = k8s.CoreV1Api(cp.api_client())
        custom = k8s.CustomObjectsApi(cp.api_client())
        custom.create_namespaced_custom_object(GROUP, VERSION, "team-a", PLURAL, pdd)
        proc = start_operator(cp.user_kubeconfig(USER, GROUPS), args, tmp_path / "operator.log")
        try:
            wait_for(lambda: len(core.list_namespaced_pod("team-a").items) >= 2, 60, "pods created")
            time.sleep(3)
        finally:
            stop_operator(proc)
            text = (tmp_path / "operator.log").read_text(errors="replace")
            print(*text.splitlines()[-20:], sep="\n")
        assert cp.audit_log is not None
        events = by_user(parse_audit_log(cp.audit_log.read_text().splitlines()), USER)
    assert_nothing_refused(events)
    assert not not_covered(events, granted_permissions(objs, USER))

"""Least privilege, checked: the desync drill with the operator authenticated as the
chart's ServiceAccount, bound to the chart's rendered RBAC, against the real local API
server (which enforces RBAC), with the API server's audit log on.

The drill must pass, and the audit log of the run must show
- no request of the operator refused (a 403 means the chart's RBAC is too tight), none
  allowed by anything but the chart's rules;
- every permission the chart grants (each API group, resource, verb) used at least once
  by the operator, apart from the router Role's pod permissions, which the operator holds
  only to hand them on (RBAC lets a user create a Role granting only what it holds
  itself) and which a successful create of that Role proves needed, and `NO_REQUEST`:
  permissions the API server checks on the operator's behalf, never a request of its own.

The desync drill alone does not reach every production path, so after it passes the same
cluster runs more: decode scaled down 2 -> 1 (pods, the group's Service and its
disruption budget deleted), a disruption budget edited by hand (patched back), the
router switched on (its ServiceAccount, Role, RoleBinding, Deployment and Service
created; 0 replicas, the router process is not what this checks), its policy changed
(each of them patched) and the router switched off (each of them deleted). A rule added later
(e.g. for secrets) is checked the same way, with no change here: exercise it or drop it.

Value set: the chart's defaults with the webhook off. The drill's operator
(`lockstep_dev.cluster.OperatorProcess`) runs every namespace (rbac.scope Cluster, the
default), without webhook flags and without leader election, which is what this value
set renders (asserted below). The self-signed webhook's caBundle and certificate Secret
rules, the owner references under OwnerReferencesPermissionEnforcement and the HA
Lease are checked as the ServiceAccount in
tests/controlplane/test_least_privilege_options.py.
"""

from __future__ import annotations

import functools
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from lockstep.api import constants as c
from lockstep.api.models import parse_pddeployment
from lockstep.core.builders import build_router
from lockstep_dev.drills import NAME, NAMESPACE, Drill, drill_spec
from lockstep_dev.localcluster.audit import (
    AuditEvent,
    Permission,
    by_user,
    granted_permissions,
    not_covered,
    parse_audit_log,
    refused,
    serviceaccount_user,
    unused,
)
from lockstep_dev.localcluster.controlplane import LocalControlPlane, repo_root

REPO = repo_root() or Path(__file__).resolve().parents[2]
RELEASE = "lockstep"
RELEASE_NAMESPACE = "lockstep-system"
SERVICE_ACCOUNT = "lockstep"  # the chart's fullname for release "lockstep"
USER = serviceaccount_user(RELEASE_NAMESPACE, SERVICE_ACCOUNT)
GROUPS = [
    "system:serviceaccounts",
    f"system:serviceaccounts:{RELEASE_NAMESPACE}",
    "system:authenticated",
]
# See the module docstring: what the drill's operator runs as.
VALUES: dict[str, Any] = {"webhook": {"enabled": False}}
# Granted permissions that no request of the operator uses, each with why it is needed.
NO_REQUEST = {
    ("lockstep.dev", "pddeployments/finalizers", "update"): (
        "the OwnerReferencesPermissionEnforcement admission plugin checks it inside the API "
        "server when the operator sets blockOwnerDeletion; the local cluster of the drill "
        "does not run that plugin, tests/controlplane/test_least_privilege_options.py does"
    ),
}
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


@functools.cache
def rendered() -> list[dict[str, Any]]:
    """The chart, rendered as `helm install -n lockstep-system lockstep` would."""
    tools = subprocess.run(
        ["bash", str(REPO / ".ci/fetch-tools")], capture_output=True, text=True, check=True
    )
    helm = Path(tools.stdout.strip().splitlines()[-1]) / "helm"
    out = subprocess.run(
        [helm, "template", RELEASE, REPO / "charts/lockstep", "-n", RELEASE_NAMESPACE, "-f", "-"],
        input=yaml.safe_dump(VALUES),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def rbac_objects() -> list[dict[str, Any]]:
    return [o for o in rendered() if o["kind"] in RBAC_KINDS]


def as_the_chart_service_account(cp: LocalControlPlane) -> Path:
    """`before_operator`: apply the chart's ServiceAccount and RBAC with the admin client
    and return a kubeconfig that authenticates as that ServiceAccount."""
    cp.kubectl("create", "namespace", RELEASE_NAMESPACE)
    manifest = cp.workdir / "chart-rbac.yaml"
    manifest.write_text(yaml.safe_dump_all(rbac_objects()))
    cp.kubectl("apply", "--server-side", "-f", str(manifest))
    return cp.user_kubeconfig(USER, GROUPS)


class LeastPrivilegeDrill(Drill):
    """The desync drill, then a scale-down and the router on the same cluster."""

    def act(self) -> None:
        super().act()
        if not self.result.passed:
            return
        custom = self.cluster.custom()
        spec = self.cluster.pdd(NAMESPACE, NAME)["spec"]
        self.note("scaling decode 2 -> 1: the operator deletes group 1's pods and Service")
        custom.patch_namespaced_custom_object(
            c.GROUP, c.VERSION, NAMESPACE, c.PLURAL, NAME, {"spec": {"decode": {"replicas": 1}}}
        )
        group1 = f"{c.LABEL_DEPLOYMENT}={NAME},{c.LABEL_ROLE}=decode,{c.LABEL_GROUP}=1"
        core = self.cluster.core()
        self.wait(
            lambda: (
                not self.cluster.pods(NAMESPACE, group1)
                and not core.list_namespaced_service(NAMESPACE, label_selector=group1).items
            ),
            90,
            "decode group 1's pods and Service deleted",
        )
        self.note("decode group 0's disruption budget edited: the operator patches it back")
        policy = k8s.PolicyV1Api(self.cluster.api)
        pdb = f"{NAME}-decode-0"
        want = spec["decode"].get("podsPerGroup", 1)
        policy.patch_namespaced_pod_disruption_budget(
            pdb, NAMESPACE, {"spec": {"minAvailable": want + 1}}
        )
        self.wait(
            lambda: (
                policy.read_namespaced_pod_disruption_budget(pdb, NAMESPACE).spec.min_available
                == want
            ),
            60,
            "decode group 0's budget patched back",
        )
        if not spec["router"]["enabled"]:
            self.note("router on (0 replicas): the operator creates the router's objects")
            router = {"router": {"enabled": True, "replicas": 0}}
            custom.patch_namespaced_custom_object(
                c.GROUP, c.VERSION, NAMESPACE, c.PLURAL, NAME, {"spec": router}
            )
        apps = k8s.AppsV1Api(self.cluster.api)

        def router_args() -> list[str]:
            items = apps.list_namespaced_deployment(NAMESPACE).items
            return list(items[0].spec.template.spec.containers[0].args) if items else []

        self.wait(router_args, 60, "the router's Deployment")
        self.note("router policy changed: the operator patches the router's objects")
        custom.patch_namespaced_custom_object(
            c.GROUP,
            c.VERSION,
            NAMESPACE,
            c.PLURAL,
            NAME,
            {"spec": {"router": {"policy": "random"}}},
        )
        self.wait(lambda: "random" in router_args(), 60, "the router's Deployment patched")
        self.note("router off: the operator deletes the router's objects")
        custom.patch_namespaced_custom_object(
            c.GROUP, c.VERSION, NAMESPACE, c.PLURAL, NAME, {"spec": {"router": {"enabled": False}}}
        )
        self.wait(
            lambda: not apps.list_namespaced_deployment(NAMESPACE).items,
            60,
            "the router's Deployment deleted",
        )
        time.sleep(2)  # a few more rounds (status, records) before the cluster stops


def router_role_permissions() -> list[Permission]:
    """What the router's Role grants; the operator must hold it to create that Role."""
    pdd = parse_pddeployment(drill_spec(router={"enabled": True}))
    (role,) = [o for o in build_router(pdd) if o["kind"] == "Role"]
    return [
        Permission(group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]


def held_to_delegate(perm: Permission, events: list[AuditEvent]) -> bool:
    """Unused itself, but needed to create the router's Role, which the operator did."""
    created_role = any(
        e.verb == "create" and e.resource == "roles" and e.code == 201 for e in events
    )
    return created_role and any(
        (p.api_group, p.resource, p.verb) == (perm.api_group, perm.resource, perm.verb)
        for p in router_role_permissions()
    )


def test_value_set_renders_the_operator_the_drill_runs() -> None:
    (deployment,) = [o for o in rendered() if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = {a.split("=", 1)[0] for a in args}
    assert flags == {"--liveness-port", "--metrics-port", "--runtime-image"}, args
    assert {o["kind"] for o in rbac_objects()} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    assert granted_permissions(rendered(), USER), "the chart binds nothing to its account"


@pytest.mark.timeout(600)
def test_desync_drill_as_the_chart_service_account_uses_every_rule(tmp_path: Path) -> None:
    drill = LeastPrivilegeDrill(
        "desync",
        workdir=tmp_path / "drill",
        cluster_options={
            "audit_log": True,
            # The operator as a process with the chart's identity and RBAC, without the
            # webhook (see the module docstring: the value set this checks).
            "operator": "process",
            "before_operator": as_the_chart_service_account,
        },
    )
    result = drill.run()
    print(result.to_json())

    audit_log = tmp_path / "drill/controlplane/logs/audit.log"
    with audit_log.open() as lines:
        events = by_user(parse_audit_log(lines), USER)
    granted = granted_permissions(rendered(), USER)
    # Refusals first: when RBAC is too tight the drill fails too, and this says why.
    too_tight = refused(events)
    assert not too_tight, "refused (the chart's RBAC is too tight):\n" + "\n".join(
        sorted({f"{e} {e.uri.split('?')[0]}" for e in too_tight})
    )
    assert result.passed, f"the drill failed as {USER}: {result.reason}"
    assert result.verdict == "Desynced"
    assert len(events) > 100, "the operator's requests are missing from the audit log"
    elsewhere = not_covered(events, granted)
    assert not elsewhere, "allowed by something the chart does not grant:\n" + "\n".join(
        map(str, elsewhere)
    )
    never = [
        p
        for p in unused(granted, events)
        if not held_to_delegate(p, events) and (p.api_group, p.resource, p.verb) not in NO_REQUEST
    ]
    assert not never, "granted by the chart but never used (trim or exercise):\n" + "\n".join(
        map(str, never)
    )

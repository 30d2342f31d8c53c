"""Reading an audit log against RBAC (lockstep_dev.localcluster.audit), on hand-written lines."""

from __future__ import annotations

import json
from typing import Any

from lockstep_dev.localcluster.audit import (
    Permission,
    by_user,
    granted_permissions,
    not_covered,
    parse_audit_line,
    parse_audit_log,
    refused,
    serviceaccount_user,
    unused,
)

SA = "system:serviceaccount:lockstep-system:lockstep"


def line(
    verb: str,
    resource: str = "",
    *,
    group: str = "",
    subresource: str = "",
    namespace: str = "",
    name: str = "",
    code: int = 200,
    user: str = SA,
    stage: str = "ResponseComplete",
    audit_id: str = "",
    decision: str = "allow",
    uri: str = "/api/v1/x",
) -> str:
    """One audit line as kube-apiserver writes it at level Metadata."""
    ref = {"resource": resource, "namespace": namespace, "name": name, "apiVersion": "v1"}
    if group:
        ref["apiGroup"] = group
    if subresource:
        ref["subresource"] = subresource
    event: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": audit_id or f"{verb}-{resource}-{subresource}-{namespace}-{name}-{code}",
        "stage": stage,
        "requestURI": uri,
        "verb": verb,
        "user": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]},
        "responseStatus": {"metadata": {}, "code": code},
        "annotations": {"authorization.k8s.io/decision": decision},
    }
    if resource:
        event["objectRef"] = {k: v for k, v in ref.items() if v}
    return json.dumps(event)


def role(kind: str, name: str, rules: list[dict[str, Any]], namespace: str = "") -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"kind": kind, "metadata": meta, "rules": rules}


def binding(
    kind: str, name: str, role_kind: str, role_name: str, namespace: str = ""
) -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
        "subjects": [
            {"kind": "ServiceAccount", "name": "lockstep", "namespace": "lockstep-system"}
        ],
    }


def rule(groups: list[str], resources: list[str], verbs: list[str], **extra: Any) -> Any:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **extra}


def test_a_line_becomes_one_request_with_its_subresource() -> None:
    event = parse_audit_line(
        line("patch", "pods", subresource="status", namespace="serving", name="p-0")
    )
    assert event is not None
    assert (event.verb, event.api_group, event.resource) == ("patch", "", "pods/status")
    assert (event.namespace, event.name, event.code, event.user) == ("serving", "p-0", 200, SA)
    assert not event.refused
    assert str(event) == "patch core/pods/status p-0 in serving -> 200"


def test_request_received_and_blank_lines_are_skipped() -> None:
    assert parse_audit_line(line("get", "pods", stage="RequestReceived")) is None
    assert parse_audit_line("  \n") is None


def test_a_watch_counts_once_with_its_last_stage() -> None:
    lines = [
        line("watch", "pods", audit_id="w1", stage="RequestReceived"),
        line("watch", "pods", audit_id="w1", stage="ResponseStarted"),
        line("watch", "pods", audit_id="w1", stage="ResponseComplete", code=200),
        line("list", "pods", audit_id="l1"),
    ]
    events = parse_audit_log(lines)
    assert [(e.verb, e.audit_id) for e in events] == [("watch", "w1"), ("list", "l1")]


def test_forbidden_requests_are_refused() -> None:
    events = parse_audit_log(
        [
            line("list", "secrets", namespace="a", code=403, decision="forbid"),
            # RBAC's escalation check: create allowed, the Role's content not.
            line("create", "roles", group="rbac.authorization.k8s.io", namespace="a", code=403),
            line("create", "pods", namespace="a", code=201),
        ]
    )
    assert [str(e) for e in refused(events)] == [
        "list core/secrets in a -> 403",
        "create rbac.authorization.k8s.io/roles in a -> 403",
    ]


def test_requests_are_filtered_by_user() -> None:
    events = parse_audit_log(
        [line("list", "pods"), line("list", "pods", user="system:kube-scheduler", audit_id="x")]
    )
    assert [e.user for e in by_user(events, SA)] == [SA]
    assert serviceaccount_user("lockstep-system", "lockstep") == SA


def test_cluster_role_grants_everywhere_role_only_in_its_namespace() -> None:
    objs = [
        role("ClusterRole", "c", [rule([""], ["pods"], ["list", "watch"])]),
        binding("ClusterRoleBinding", "c", "ClusterRole", "c"),
        role("Role", "r", [rule(["apps"], ["deployments"], ["create"])], namespace="team-a"),
        binding("RoleBinding", "r", "Role", "r", namespace="team-a"),
        # Bound to somebody else: not ours.
        role("ClusterRole", "other", [rule(["*"], ["*"], ["*"])]),
        {
            **binding("ClusterRoleBinding", "other", "ClusterRole", "other"),
            "subjects": [{"kind": "User", "name": "alice"}],
        },
    ]
    assert [str(p) for p in granted_permissions(objs, SA)] == [
        "create apps/deployments in team-a",
        "list core/pods",
        "watch core/pods",
    ]


def test_cluster_role_through_a_role_binding_holds_in_that_namespace() -> None:
    objs = [
        role("ClusterRole", "c", [rule([""], ["pods"], ["get"])]),
        binding("RoleBinding", "c", "ClusterRole", "c", namespace="team-b"),
    ]
    assert granted_permissions(objs, SA) == [Permission("", "pods", "get", namespace="team-b")]


def test_resource_names_and_namespaces_limit_a_permission() -> None:
    named = Permission("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch")
    named = Permission(named.api_group, named.resource, named.verb, name="lockstep")
    (mine, other) = parse_audit_log(
        [
            line(
                "patch",
                "validatingwebhookconfigurations",
                group="admissionregistration.k8s.io",
                name=n,
            )
            for n in ("lockstep", "other")
        ]
    )
    assert named.allows(mine) and not named.allows(other)
    in_a = Permission("", "pods", "list", namespace="a")
    (pods_a, pods_b, everywhere) = parse_audit_log(
        [
            line("list", "pods", namespace="a"),
            line("list", "pods", namespace="b"),
            line("list", "pods", audit_id="all"),
        ]
    )
    assert in_a.allows(pods_a)
    assert not in_a.allows(pods_b) and not in_a.allows(everywhere)


def test_wildcards_match_anything() -> None:
    (event,) = parse_audit_log([line("delete", "deployments", group="apps", namespace="x")])
    assert Permission("*", "*", "*").allows(event)
    assert not Permission("", "deployments", "delete").allows(event)


def test_unused_permissions_are_those_no_allowed_request_needed() -> None:
    objs = [
        role(
            "ClusterRole",
            "c",
            [
                rule([""], ["services"], ["list", "create", "delete"]),
                rule([""], ["events"], ["create", "patch"]),
            ],
        ),
        binding("ClusterRoleBinding", "c", "ClusterRole", "c"),
    ]
    events = parse_audit_log(
        [
            line("list", "services", namespace="a"),
            line("create", "events", namespace="a", code=201),
            # Refused requests use nothing.
            line("delete", "services", namespace="a", code=403, decision="forbid"),
        ]
    )
    assert [str(p) for p in unused(granted_permissions(objs, SA), events)] == [
        "create core/services",
        "delete core/services",
        "patch core/events",
    ]


def test_requests_outside_the_granted_rules_are_reported() -> None:
    granted = [Permission("", "pods", "list")]
    events = parse_audit_log(
        [
            line("list", "pods", namespace="a"),
            line("create", "selfsubjectreviews", group="authentication.k8s.io", code=201),
            line("get", uri="/apis", audit_id="discovery"),  # non-resource: not RBAC rules
        ]
    )
    assert [str(e) for e in not_covered(events, granted)] == [
        "create authentication.k8s.io/selfsubjectreviews -> 201"
    ]

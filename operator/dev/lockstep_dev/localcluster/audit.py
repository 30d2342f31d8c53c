"""Read an API server audit log against RBAC objects: what a user did, what it was refused,
and which granted permissions it never used.

The least-privilege checks use it: the operator runs as the chart's ServiceAccount, bound to
the chart's rendered RBAC, against the local control plane with its audit log on
(`LocalControlPlane(audit_log=True)`, policy level Metadata: who, verb, object, response
code, no bodies). Everything here is pure: audit lines and rendered objects in, plain
values out, so the matching rules are unit-tested on hand-written lines.

RBAC is matched as the API server's authorizer matches it (apiGroups, resources with
their subresource as `pods/status`, verbs, resourceNames; `*` as a wildcard); a Role's
rules hold only in its namespace, a ClusterRole's wherever a ClusterRoleBinding binds it
and in the namespace of a RoleBinding that binds it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lockstep.api.objects import parse_time

SERVICEACCOUNT_PREFIX = "system:serviceaccount:"

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class AuditEvent:
    """One request as the audit log recorded it (the stage that carries the response)."""

    audit_id: str
    user: str
    verb: str
    api_group: str
    resource: str
    """Resource with its subresource, `pods/status`; empty for a non-resource URL."""
    namespace: str | None
    name: str | None
    code: int
    uri: str
    decision: str | None = None
    """`allow` or `forbid`: the authorizer's decision, when the log carries it."""
    user_agent: str = ""
    received_at: float | None = None
    """When the API server received it (UNIX seconds)."""

    @property
    def write(self) -> bool:
        """A request that changes something (not get, list or watch)."""
        return self.verb not in ("get", "list", "watch")

    @property
    def refused(self) -> bool:
        """Refused by authorization (403: RBAC, or RBAC's escalation check on a Role)."""
        return self.code == 403 or self.decision == "forbid"

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        what = f"{self.api_group or 'core'}/{self.resource}" if self.resource else self.uri
        name = f" {self.name}" if self.name else ""
        return f"{self.verb} {what}{name}{where} -> {self.code}"


@dataclass(frozen=True)
class Permission:
    """One granted atom: a verb on a resource of an API group (one name, if named), in a
    namespace (None: every namespace and cluster-scoped objects)."""

    api_group: str
    resource: str
    verb: str
    name: str | None = None
    namespace: str | None = None

    def allows(self, event: AuditEvent) -> bool:
        """Whether this permission authorizes the request."""
        return (
            bool(event.resource)
            and self.api_group in ("*", event.api_group)
            and self.resource in ("*", event.resource)
            and self.verb in ("*", event.verb)
            and (self.name is None or self.name == event.name)
            and (self.namespace is None or self.namespace == event.namespace)
        )

    def __str__(self) -> str:
        name = f" named {self.name}" if self.name else ""
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.api_group or 'core'}/{self.resource}{name}{where}"


def parse_audit_line(line: str) -> AuditEvent | None:
    """One line of the audit log (JSON) as an event; None for a stage without a response
    (RequestReceived) and for blank lines."""
    if not line.strip():
        return None
    raw = json.loads(line)
    if raw.get("stage") == "RequestReceived":
        return None
    ref = raw.get("objectRef") or {}
    resource = str(ref.get("resource") or "")
    if resource and ref.get("subresource"):
        resource = f"{resource}/{ref['subresource']}"
    annotations = raw.get("annotations") or {}
    return AuditEvent(
        audit_id=str(raw.get("auditID", "")),
        user=str((raw.get("user") or {}).get("username", "")),
        verb=str(raw.get("verb", "")),
        api_group=str(ref.get("apiGroup") or ""),
        resource=resource,
        namespace=ref.get("namespace") or None,
        name=ref.get("name") or None,
        code=int((raw.get("responseStatus") or {}).get("code", 0)),
        uri=str(raw.get("requestURI", "")),
        decision=annotations.get("authorization.k8s.io/decision"),
        user_agent=str(raw.get("userAgent", "")),
        received_at=_timestamp(raw.get("requestReceivedTimestamp")),
    )


def _timestamp(value: Any) -> float | None:
    return parse_time(value)


def parse_audit_log(lines: Iterable[str]) -> list[AuditEvent]:
    """Every request of the log once: a watch logs ResponseStarted and ResponseComplete
    under one audit ID; the later stage wins."""
    by_id: dict[str, AuditEvent] = {}
    for line in lines:
        event = parse_audit_line(line)
        if event is not None:
            by_id[event.audit_id or str(len(by_id))] = event
    return list(by_id.values())


def by_user(events: Iterable[AuditEvent], user: str) -> list[AuditEvent]:
    """The requests one user made."""
    return [e for e in events if e.user == user]


def serviceaccount_user(namespace: str, name: str) -> str:
    """The user name a ServiceAccount authenticates as."""
    return f"{SERVICEACCOUNT_PREFIX}{namespace}:{name}"


def _rule_permissions(rule: Obj, namespace: str | None) -> list[Permission]:
    if rule.get("nonResourceURLs"):
        return []
    names: Sequence[str | None] = list(rule.get("resourceNames") or []) or [None]
    return [
        Permission(str(group), str(resource), str(verb), name, namespace)
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
        for name in names
    ]


def _binds(binding: Obj, user: str) -> bool:
    for subject in binding.get("subjects") or []:
        kind = subject.get("kind")
        if kind == "User" and subject.get("name") == user:
            return True
        if kind == "ServiceAccount":
            namespace = subject.get("namespace") or binding["metadata"].get("namespace")
            if serviceaccount_user(str(namespace), str(subject.get("name"))) == user:
                return True
    return False


def granted_permissions(objects: Iterable[Obj], user: str) -> list[Permission]:
    """Every permission the RBAC objects among `objects` grant `user` (through a
    ServiceAccount or User subject; group subjects are not followed)."""
    objs = list(objects)
    roles = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
        for o in objs
        if o.get("kind") in ("Role", "ClusterRole")
    }
    out: list[Permission] = []
    for binding in objs:
        kind = binding.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding") or not _binds(binding, user):
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if kind == "RoleBinding" else None
        role_ns = where if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        if role is None:
            continue
        for rule in role.get("rules") or []:
            out.extend(_rule_permissions(rule, where))
    return sorted(set(out), key=str)


def refused(events: Iterable[AuditEvent]) -> list[AuditEvent]:
    """Requests authorization refused: the RBAC is too tight for them."""
    return [e for e in events if e.refused]


def not_covered(
    events: Iterable[AuditEvent], permissions: Sequence[Permission]
) -> list[AuditEvent]:
    """Resource requests that none of `permissions` allows (allowed, if at all, by
    something else: a default ClusterRole such as system:basic-user)."""
    return [
        e
        for e in events
        if e.resource and not e.refused and not any(p.allows(e) for p in permissions)
    ]


def unused(permissions: Iterable[Permission], events: Sequence[AuditEvent]) -> list[Permission]:
    """Permissions no allowed request needed: candidates for removal."""
    done = [e for e in events if not e.refused]
    return [p for p in permissions if not any(p.allows(e) for e in done)]


__all__ = [
    "AuditEvent",
    "Permission",
    "by_user",
    "granted_permissions",
    "not_covered",
    "parse_audit_line",
    "parse_audit_log",
    "refused",
    "serviceaccount_user",
    "unused",
]

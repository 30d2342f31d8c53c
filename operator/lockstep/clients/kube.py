"""The operator's one Kubernetes I/O module: thin, idempotent calls, nothing decided here.

Uses the official `kubernetes` client (what kopf itself logs in with). Every write is
idempotent so a retried handler, or an operator restarted in the middle of a step, never
doubles an action:
- `create` treats 409 AlreadyExists as success (the object is adopted by name);
- `delete_pod` carries the pod's UID as a precondition, so a retry can never delete the
  pod of a newer epoch that reuses the name, and treats 404/409 as already done;
- patches are merge patches of only the fields lockstep owns.
Objects go in and come out as plain dicts (the builders' format), not client models.

With several replicas (leader election, `lockstep.clients.leader`) the API client is a
:class:`FencedApiClient`: every write it sends (any method but GET/HEAD/OPTIONS) first
asks the election whether this replica still holds the lease, so a leader that was
paused and woke up after another took over writes nothing.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from lockstep.api import constants as c
from lockstep.core.rolescale import PLURAL as ROLE_SCALES

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def _plain(api: k8s.ApiClient, model: object) -> Obj:
    """A client model as the plain dict the API server would send."""
    out: Obj = api.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
    return out


# Methods that change nothing: allowed to a replica that does not lead (its caches read).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class FencedApiClient(k8s.ApiClient):
    """The Kubernetes client whose writes pass `fence` first (it raises to refuse)."""

    def __init__(self, *args: Any, fence: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fence = fence

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() not in READ_METHODS:
            self.fence()
        return super().call_api(method, url, *args, **kwargs)


def api_client() -> k8s.ApiClient:
    """A Kubernetes client: in-cluster config, else the kubeconfig."""
    try:
        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
    return k8s.ApiClient()


def service_patch(obj: Obj) -> list[Obj]:
    """The JSON patch that makes a Service its desired self: selector, ports and labels
    replaced whole (a strategic merge would merge ports by number and keep the old
    epoch's rendezvous port), its annotations set."""
    meta = obj["metadata"]
    ops: list[Obj] = [
        {"op": "replace", "path": "/spec/selector", "value": obj["spec"]["selector"]},
        {"op": "replace", "path": "/spec/ports", "value": obj["spec"]["ports"]},
        {"op": "replace", "path": "/metadata/labels", "value": meta["labels"]},
    ]
    if meta.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": meta["annotations"]})
    return ops


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kube:
    """Idempotent reads and writes of the objects a PDDeployment owns."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.apps = k8s.AppsV1Api(api)
        self.rbac = k8s.RbacAuthorizationV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.policy = k8s.PolicyV1Api(api)

    # ------------------------------------------------------------------- reads

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        """One key of a Secret, decoded; None when the Secret is not there (404)."""
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        raw = (secret.data or {}).get(key)
        if raw is None:
            raise KeyError(f"Secret {namespace}/{name} has no key {key!r}")
        return base64.b64decode(raw).decode()

    def read_configmap(self, namespace: str, name: str) -> Obj | None:
        """A ConfigMap as a dict, or None when it is not there (404)."""
        try:
            found = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return _plain(self.api, found)

    def read_pod_log(self, namespace: str, name: str, tail_lines: int) -> str:
        """The last `tail_lines` lines of a pod's (only) container's log."""
        return str(self.core.read_namespaced_pod_log(name, namespace, tail_lines=tail_lines))

    # ------------------------------------------------------------------ writes

    def apply_configmap(self, obj: Obj) -> None:
        """Create a ConfigMap, or replace the data of the existing one."""
        if self.create(obj):
            return
        meta = obj["metadata"]
        self.core.patch_namespaced_config_map(
            meta["name"],
            meta.get("namespace", "default"),
            [{"op": "replace", "path": "/data", "value": obj.get("data") or {}}],
        )

    def create(self, obj: Obj) -> bool:
        """Create an object; False when it already existed (409)."""
        kind = obj["kind"]
        ns = obj["metadata"].get("namespace", "default")
        creators: dict[str, Any] = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ServiceAccount": self.core.create_namespaced_service_account,
            "Deployment": self.apps.create_namespaced_deployment,
            "Role": self.rbac.create_namespaced_role,
            "RoleBinding": self.rbac.create_namespaced_role_binding,
            "Secret": self.core.create_namespaced_secret,
            "ConfigMap": self.core.create_namespaced_config_map,
            "PodDisruptionBudget": self.policy.create_namespaced_pod_disruption_budget,
        }
        try:
            creators[kind](ns, obj)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        log.info("created %s %s/%s", kind, ns, obj["metadata"]["name"])
        return True

    def patch(self, obj: Obj) -> None:
        """Patch an existing object to the given fields.

        A Service's ports and selector are replaced whole (a JSON patch): a strategic
        merge would merge ports by number and keep the old epoch's rendezvous port.
        """
        kind = obj["kind"]
        ns = obj["metadata"].get("namespace", "default")
        name = obj["metadata"]["name"]
        if kind == "Service":
            self.core.patch_namespaced_service(name, ns, service_patch(obj))
            log.info("patched %s %s/%s", kind, ns, name)
            return
        patchers: dict[str, Any] = {
            "Service": self.core.patch_namespaced_service,
            "ServiceAccount": self.core.patch_namespaced_service_account,
            "Deployment": self.apps.patch_namespaced_deployment,
            "Role": self.rbac.patch_namespaced_role,
            "RoleBinding": self.rbac.patch_namespaced_role_binding,
            "PodDisruptionBudget": self.policy.patch_namespaced_pod_disruption_budget,
        }
        patchers[kind](name, ns, obj)
        log.info("patched %s %s/%s", kind, ns, name)

    def apply(self, obj: Obj) -> None:
        """Create an object, or patch the existing one to it."""
        if not self.create(obj):
            self.patch(obj)

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete one object of the kinds a deployment owns; False when it was not there."""
        deleters: dict[str, Any] = {
            "PodDisruptionBudget": self.policy.delete_namespaced_pod_disruption_budget,
            "Service": self.core.delete_namespaced_service,
            "ServiceAccount": self.core.delete_namespaced_service_account,
            "Deployment": self.apps.delete_namespaced_deployment,
            "Role": self.rbac.delete_namespaced_role,
            "RoleBinding": self.rbac.delete_namespaced_role_binding,
        }
        try:
            deleters[kind](name, namespace)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        log.info("deleted %s %s/%s", kind, namespace, name)
        return True

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int) -> bool:
        """Delete one pod by name *and* UID; False when it was already gone or replaced."""
        body = k8s.V1DeleteOptions(
            grace_period_seconds=grace_seconds,
            preconditions=k8s.V1Preconditions(uid=uid),
        )
        try:
            self.core.delete_namespaced_pod(name, namespace, body=body)
        except ApiException as err:
            if err.status in (404, 409):
                return False
            raise
        log.info("deleted pod %s/%s (uid %s)", namespace, name, uid)
        return True

    def delete_pods(
        self, namespace: str, pods: Iterable[tuple[str, str]], grace_seconds: int
    ) -> int:
        """Delete every (name, uid) given; how many deletes took effect."""
        return sum(self.delete_pod(namespace, n, u, grace_seconds) for n, u in pods)

    def relabel_pod(self, namespace: str, name: str, uid: str, labels: Mapping[str, str]) -> None:
        """Set labels on one pod by name *and* UID (a JSON patch whose first operation
        tests the UID: a replaced pod of the same name is refused, never relabelled)."""
        ops: list[Obj] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
        for key, value in sorted(labels.items()):
            path = "/metadata/labels/" + key.replace("~", "~0").replace("/", "~1")
            ops.append({"op": "add", "path": path, "value": value})
        self.core.patch_namespaced_pod(name, namespace, ops)
        log.info("relabelled pod %s/%s (uid %s): %s", namespace, name, uid, dict(labels))

    def set_pod_condition(
        self, namespace: str, name: str, cond_type: str, status: bool, reason: str, message: str
    ) -> None:
        """Set a pod condition (the readiness gate) through the pods/status subresource."""
        pod = self.core.read_namespaced_pod_status(name, namespace)
        current = list((pod.status.conditions if pod.status else None) or [])
        conditions = [_plain(self.api, cnd) for cnd in current if cnd.type != cond_type]
        value = "True" if status else "False"
        previous = next((cnd for cnd in current if cnd.type == cond_type), None)
        if previous is not None and previous.status == value:
            return
        conditions.append(
            {
                "type": cond_type,
                "status": value,
                "reason": reason,
                "message": message,
                "lastTransitionTime": _now(),
            }
        )
        # A strategic merge on conditions merges by type; send the full list to be exact.
        self.core.patch_namespaced_pod_status(
            name, namespace, {"status": {"conditions": conditions}}
        )

    def create_role_scale(self, obj: Obj) -> bool:
        """Create a PDRoleScale; False when it already existed (409)."""
        meta = obj["metadata"]
        body = {k: v for k, v in obj.items() if k != "status"}
        try:
            self.custom.create_namespaced_custom_object(
                c.GROUP, c.VERSION, meta["namespace"], ROLE_SCALES, body
            )
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        log.info("created PDRoleScale %s/%s", meta["namespace"], meta["name"])
        return True

    def patch_role_scale(self, namespace: str, name: str, patch: Obj, *, status: bool) -> None:
        """Merge-patch a PDRoleScale's spec (the person's count) or its status."""
        if status:
            self.custom.patch_namespaced_custom_object_status(
                c.GROUP, c.VERSION, namespace, ROLE_SCALES, name, patch
            )
        else:
            self.custom.patch_namespaced_custom_object(
                c.GROUP, c.VERSION, namespace, ROLE_SCALES, name, patch
            )

    def cordon_node(self, name: str, annotations: Mapping[str, str]) -> str | None:
        """Cordon a node (spec.unschedulable, as `kubectl cordon` does) and annotate why;
        None when done, else why not (the chart grants it only with rbac.cordonNodes: the
        API server refuses with 403 otherwise)."""
        body = {"metadata": {"annotations": dict(annotations)}, "spec": {"unschedulable": True}}
        try:
            self.core.patch_node(name, body)
        except ApiException as err:
            hint = (
                " (the operator may not patch nodes: install the chart with rbac.cordonNodes=true)"
                if err.status == 403
                else ""
            )
            return f"HTTP {err.status} {err.reason}{hint}"
        log.info("cordoned node %s: %s", name, dict(annotations))
        return None

    def patch_pddeployment_status(self, namespace: str, name: str, status: Obj) -> None:
        """Merge-patch the status subresource of a PDDeployment."""
        self.custom.patch_namespaced_custom_object_status(
            c.GROUP, c.VERSION, namespace, c.PLURAL, name, {"status": status}
        )

    def patch_pddeployment_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        """Merge-patch annotations of a PDDeployment (None removes one)."""
        self.custom.patch_namespaced_custom_object(
            c.GROUP,
            c.VERSION,
            namespace,
            c.PLURAL,
            name,
            {"metadata": {"annotations": dict(annotations)}},
        )

"""The router in front of the groups: sglang-router's Deployment, Service and RBAC."""

from __future__ import annotations

from collections.abc import Mapping

from lockstep.api import constants as c
from lockstep.api.models import PDDeployment
from lockstep.core.builders.common import (
    Obj,
    _metadata,
    deployment_labels,
    role_selector,
    spec_hash,
)

# How the router treats a server that died with requests in flight (measured with
# sglang-router 0.3.2 and the real SGLang 0.5.23 on CPU, docs/router.md): with its
# defaults (health check every 60 s, 5 retries) a request whose decode died was retried
# onto the same dead decode and waited for the prefill's 300 s bootstrap timeout; with
# these the dead server leaves the rotation within ~2 s and the request is retried on
# another one. A flag the user gives in spec.router.args wins.
ROUTER_FAILURE_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("--health-check-interval-secs", "1"),
    ("--health-failure-threshold", "2"),
    ("--retry-max-retries", "2"),
    ("--retry-initial-backoff-ms", "3000"),
)


def _selector_args(selector: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(selector.items())]


def build_router(pdd: PDDeployment) -> list[Obj]:
    """sglang-router in PD mode with Kubernetes service discovery, and what it needs."""
    router = pdd.spec.router
    name = router_name(pdd)
    labels = {c.APP_NAME: "sglang-router", c.LABEL_COMPONENT: "router"}
    namespace = pdd.metadata.namespace
    args = [
        "-m",
        "sglang_router.launch_router",
        "--pd-disaggregation",
        "--service-discovery",
        "--prefill-selector",
        *_selector_args(role_selector(pdd, "prefill")),
        "--decode-selector",
        *_selector_args(role_selector(pdd, "decode")),
        "--service-discovery-port",
        str(c.PORT_HTTP),
        "--policy",
        router.policy,
        "--host",
        "0.0.0.0",
        "--port",
        str(c.PORT_ROUTER),
        "--prometheus-port",
        str(c.PORT_ROUTER_METRICS),
        # The pod's addresses, so Prometheus can scrape it (said, not left to the default).
        "--prometheus-host",
        "0.0.0.0",
    ]
    if namespace:
        args += ["--service-discovery-namespace", namespace]
    given = {a.split("=", 1)[0] for a in router.args if a.startswith("--")}
    for flag, value in ROUTER_FAILURE_DEFAULTS:
        if flag not in given:
            args += [flag, value]
    args += list(router.args)
    pod_labels = {**deployment_labels(pdd), **labels}
    service_account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(pdd, name, labels),
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(pdd, name, labels),
        # Service discovery watches the worker pods of this namespace; nothing else.
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(pdd, name, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": name,
                **({"namespace": namespace} if namespace else {}),
            }
        ],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(pdd, name, labels),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": {c.LABEL_DEPLOYMENT: pdd.metadata.name, **labels}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": name,
                    "containers": [
                        {
                            "name": "router",
                            "image": router.image or pdd.spec.image,
                            "imagePullPolicy": pdd.spec.image_pull_policy,
                            "command": ["python3"],
                            "args": args,
                            "ports": [
                                {"name": "http", "containerPort": c.PORT_ROUTER},
                                {"name": "metrics", "containerPort": c.PORT_ROUTER_METRICS},
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": "http"},
                                "periodSeconds": 5,
                            },
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pdd, name, labels),
        "spec": {
            "selector": {c.LABEL_DEPLOYMENT: pdd.metadata.name, **labels},
            "ports": [{"name": "http", "port": c.PORT_ROUTER, "targetPort": "http"}],
        },
    }
    objects: list[Obj] = [service_account, role, binding, deployment, service]
    for obj in objects:
        # What the operator compares with the live object to patch it on drift.
        body = {k: v for k, v in obj.items() if k != "metadata"}
        obj["metadata"]["annotations"] = {c.ANNOTATION_SPEC_HASH: spec_hash(body)}
    return objects


ROUTER_KINDS = ("ServiceAccount", "Role", "RoleBinding", "Deployment", "Service")


def router_name(pdd: PDDeployment) -> str:
    """The name of every router object of a deployment."""
    return f"{pdd.metadata.name}-router"

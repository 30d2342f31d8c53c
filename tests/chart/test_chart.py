"""The Helm chart (charts/lockstep) and the operator image's install steps.

helm v3.19 comes from `.ci/fetch-tools` (a PyPI wheel, cached outside the repository).
Every rendered object is validated with `kubernetes-validate --strict` for the oldest and
newest Kubernetes lockstep supports. Custom resources (ServiceMonitor, cert-manager's
Issuer and Certificate) have no schema there: they are checked
by shape instead (`check_custom_shape`), against the fields their controllers require.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from factories import GOOD_EXAMPLES

from lockstep.api.models import parse_pddeployment
from lockstep.cli.main import build_parser
from lockstep.core.builders import build_all

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts/lockstep"
RELEASE = "lockstep"
NAMESPACE = "lockstep-system"
VERSIONS = ["1.30.0", "1.33.0"]

Obj = dict[str, Any]

# Value sets every check runs over; names are the test ids.
CERT_MANAGER = {"webhook": {"certManager": {"enabled": True}}}
VALUE_SETS: dict[str, Obj] = {
    "defaults": {},
    "namespaced-rbac": {"rbac": {"scope": "Namespaced"}, "watchNamespaces": ["team-a", "team-b"]},
    "namespaced-release-namespace": {"rbac": {"scope": "Namespaced"}},
    "cluster-rbac-some-namespaces": {"watchNamespaces": ["team-a"]},
    "ha": {"ha": {"enabled": True, "replicas": 3}, **CERT_MANAGER},
    "ha-self-signed": {"ha": {"enabled": True}},
    "ha-namespaced": {
        "ha": {"enabled": True},
        "rbac": {"scope": "Namespaced"},
        "watchNamespaces": ["team-a", "team-b"],
        **CERT_MANAGER,
    },
    "webhook-cert-manager": CERT_MANAGER,
    "cordon-nodes": {"rbac": {"cordonNodes": True}, **CERT_MANAGER},
    "webhook-cert-manager-cluster-issuer": {
        "webhook": {
            "certManager": {
                "enabled": True,
                "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
            }
        }
    },
    "webhook-self-signed": {"webhook": {"certManager": {"enabled": False}}},
    "webhook-validating-only": {"webhook": {"mutating": {"enabled": False}}},
    "webhook-off": {"webhook": {"enabled": False}},
    "servicemonitor-and-dashboard": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "prometheusRule": {
                "enabled": True,
                "labels": {"release": "prom"},
                "ruleLabels": {"team": "serving"},
                "runbookBaseURL": "https://runbooks.example.org/lockstep/runbooks.md",
            },
        },
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
    },
    "networkpolicy-off": {"networkPolicy": {"enabled": False}},
    "networkpolicy-extra-ingress": {
        "networkPolicy": {
            "namespaces": ["serving"],
            "extraIngress": [
                {
                    "from": [
                        {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}},
                    ],
                    "ports": [{"protocol": "TCP", "port": 30000}],
                }
            ],
        }
    },
}


# ---------------------------------------------------------------------------- helpers


@functools.cache
def helm_bin() -> str:
    out = subprocess.run(
        ["bash", str(REPO / ".ci/fetch-tools")], capture_output=True, text=True, check=True
    )
    return str(Path(out.stdout.strip().splitlines()[-1]) / "helm")


def helm(*args: str, values: Obj | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm; values (if any) go in through a file, as a user's would."""
    cmd = [helm_bin(), *args]
    stdin = None
    if values is not None:
        cmd += ["--values", "-"]
        stdin = yaml.safe_dump(values)
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60)


@functools.cache
def _template(values_json: str) -> str:
    res = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, values=json.loads(values_json))
    if res.returncode != 0:
        raise AssertionError(f"helm template failed: {res.stderr}")
    return res.stdout


def render_text(values: Obj) -> str:
    return _template(json.dumps(values, sort_keys=True))


def render(values: Obj) -> list[Obj]:
    return [d for d in yaml.safe_load_all(render_text(values)) if d]


def find(objs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def operator_container(objs: list[Obj]) -> Obj:
    deployment = one(objs, "Deployment", RELEASE)
    container: Obj = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def merge(base: Obj, extra: Obj) -> Obj:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def dotted(path: str, value: Any) -> Obj:
    """`a.b.c`, v -> {a: {b: {c: v}}}."""
    out: Any = value
    for key in reversed(path.split(".")):
        out = {key: out}
    result: Obj = out
    return result


def values_yaml() -> Obj:
    loaded: Obj = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def values_schema() -> Obj:
    loaded: Obj = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def leaves(values: Obj, schema: Obj, prefix: str = "") -> Iterator[tuple[str, Any, Obj]]:
    """(dotted path, default, schema) of every value; a map (user keys, or an empty
    Kubernetes object such as affinity) is one value."""
    for key, value in values.items():
        node = schema["properties"][key]
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and "properties" in node:
            yield from leaves(value, node, f"{path}.")
        else:
            yield path, value, node


# --------------------------------------------------------------------- lint, validity


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint_strict_passes(name: str) -> None:
    res = helm("lint", "--strict", str(CHART), "-n", NAMESPACE, values=VALUE_SETS[name])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[WARNING]" not in res.stdout and "[ERROR]" not in res.stdout, res.stdout


def check_custom_shape(obj: Obj) -> None:
    """Custom resources without a schema in kubernetes-validate: the fields that matter."""
    kind, spec = obj["kind"], obj.get("spec", {})
    if kind == "ServiceMonitor":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert spec["selector"]["matchLabels"]
        assert spec["namespaceSelector"]["matchNames"] == [NAMESPACE]
        (endpoint,) = spec["endpoints"]
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
        assert set(endpoint) == {"port", "path", "interval", "scrapeTimeout", "honorLabels"}
        assert endpoint["honorLabels"] is True  # the metrics' own namespace label stays
    elif kind == "PrometheusRule":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        (group,) = spec["groups"]
        assert group["name"] == "lockstep" and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert rule["labels"]["severity"] in ("critical", "warning")
            assert {"summary", "description"} <= set(rule["annotations"])
    elif kind == "Issuer":
        assert obj["apiVersion"] == "cert-manager.io/v1"
        assert spec == {"selfSigned": {}}
    elif kind == "Certificate":
        assert obj["apiVersion"] == "cert-manager.io/v1"
        assert set(spec) == {
            "secretName",
            "duration",
            "renewBefore",
            "dnsNames",
            "privateKey",
            "issuerRef",
        }
        assert set(spec["issuerRef"]) == {"name", "kind", "group"}
        assert spec["issuerRef"]["kind"] in ("Issuer", "ClusterIssuer")
        assert all(".svc" in n for n in spec["dnsNames"])
    else:
        pytest.fail(f"{kind} has neither a Kubernetes schema nor a shape check")


CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "Issuer", "Certificate"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", VALUE_SETS)
def test_rendered_objects_are_valid(name: str, version: str) -> None:
    objs = render(VALUE_SETS[name])
    assert objs
    for obj in objs:
        if obj["kind"] in CUSTOM_KINDS:
            check_custom_shape(obj)
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(
                f"{obj['kind']}/{obj['metadata']['name']} invalid for {version}: "
                f"{err.message} at {list(err.path)}"
            )
        # Namespaced objects name their namespace (some live in watched namespaces).
        cluster_scoped = {
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration",
        }
        assert ("namespace" in obj["metadata"]) != (obj["kind"] in cluster_scoped), obj["kind"]


@pytest.mark.parametrize("version", VERSIONS)
def test_chart_crds_are_valid(version: str) -> None:
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(crd, version, strict=True)


def test_chart_crd_is_the_generated_crd() -> None:
    generated = (REPO / "crds/pddeployments.lockstep.dev.yaml").read_bytes()
    chart = (CHART / "crds/pddeployments.lockstep.dev.yaml").read_bytes()
    assert chart == generated, (
        "charts/lockstep/crds/pddeployments.lockstep.dev.yaml differs from crds/: "
        "run `make crd && .ci/sync-chart-crd`"
    )


# ----------------------------------------------------------------- values and schema


def test_values_and_schema_agree() -> None:
    def walk(values: Obj, schema: Obj, path: str) -> None:
        assert schema.get("type") == "object", path
        assert schema.get("additionalProperties") is False, f"{path}: not closed"
        missing_in_schema = set(values) - set(schema["properties"])
        missing_in_values = set(schema["properties"]) - set(values)
        assert not missing_in_schema, f"{path}: in values.yaml only: {missing_in_schema}"
        assert not missing_in_values, f"{path}: in the schema only: {missing_in_values}"
        for key, node in schema["properties"].items():
            assert node.get("description"), f"{path}{key}: no description in the schema"
            # An empty map in values.yaml is one value: a Kubernetes object (affinity).
            if "properties" in node and values[key] != {}:
                assert isinstance(values[key], dict), f"{path}{key}"
                walk(values[key], node, f"{path}{key}.")

    walk(values_yaml(), values_schema(), "")


def test_schema_closes_every_object() -> None:
    # Every object with named fields refuses others; maps of user keys type their values.
    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "properties" in node:
                assert node.get("additionalProperties") is False, f"{path} is open"
            elif node.get("type") == "object" and "additionalProperties" in node:
                assert isinstance(node["additionalProperties"], dict), path
                assert node["additionalProperties"].get("type"), path
            for key, child in node.items():
                walk(child, f"{path}/{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{path}/{i}")

    walk(values_schema(), "")


def test_every_value_is_commented() -> None:
    # Each value in values.yaml has a comment just above it (cert-manager style).
    wanted = {path for path, _, _ in leaves(values_yaml(), values_schema())}
    stack: list[tuple[int, str]] = []
    lines = (CHART / "values.yaml").read_text().splitlines()
    seen = set()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z_]\w*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        stack = [(d, k) for d, k in stack if d < indent]
        stack.append((indent, m.group(2)))
        path = ".".join(k for _, k in stack)
        if path in wanted:
            seen.add(path)
            assert lines[i - 1].strip().startswith("#"), f"values.yaml: {path} has no comment"
    assert seen == wanted


@pytest.mark.parametrize(
    "bad",
    [
        ["--set", "foo=bar"],
        ["--set", "webhook.certManger.enabled=true"],
        ["--set", "rbac.scope=Everywhere"],
        ["--set", "ha.replicas=1"],
    ],
    ids=["unknown-top-level", "nested-typo", "bad-enum", "below-minimum"],
)
@pytest.mark.parametrize("command", ["lint", "template"])
def test_invalid_values_are_refused(command: str, bad: list[str]) -> None:
    args = [command, *(["--strict"] if command == "lint" else [RELEASE]), str(CHART), *bad]
    res = helm(*args)
    assert res.returncode != 0, f"helm {command} accepted {bad}"
    assert "values don't meet the specifications of the schema" in res.stdout + res.stderr


def test_ha_with_the_self_signed_webhook_shares_one_certificate() -> None:
    # No cert-manager needed: every replica serves the certificate kept in one Secret.
    args = operator_container(render(VALUE_SETS["ha-self-signed"]))["args"]
    assert "--leader-elect" in args and "--webhook-self-signed" in args
    assert "--webhook-cert-secret=lockstep-webhook-cert" in args


# Sentinels for values whose type alone does not say what a changed value looks like.
SENTINELS: dict[str, Any] = {
    "image.digest": "sha256:" + "a" * 64,
    "imagePullSecrets": [{"name": "registry"}],
    "watchNamespaces": ["sentinel-ns"],
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "metrics.serviceMonitor.interval": "15s",
    "metrics.serviceMonitor.scrapeTimeout": "5s",
    "metrics.prometheusRule.runbookBaseURL": "https://runbooks.example.org/runbooks.md",
    "webhook.certManager.duration": "2160h",
    "webhook.certManager.renewBefore": "360h",
    "networkPolicy.namespaces": ["sentinel-ns"],
    "networkPolicy.extraIngress": [{"ports": [{"protocol": "TCP", "port": 30000}]}],
}
# Every optional part on, so each value has something to change.
ALL_ON: Obj = merge(
    VALUE_SETS["ha"],
    {
        "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
        "grafanaDashboard": {"enabled": True},
    },
)
# Values that only matter (or only render) together with another setting.
NEEDS: dict[str, Obj] = {
    "serviceAccount.create": dotted("serviceAccount.name", "own-sa"),
    "webhook.certManager.issuerRef.kind": dotted("webhook.certManager.issuerRef.name", "ca"),
    "webhook.certManager.issuerRef.group": dotted("webhook.certManager.issuerRef.name", "ca"),
}


def lookup(values: Obj, path: str) -> Any:
    node: Any = values
    for key in path.split("."):
        node = node[key]
    return node


def sentinel(path: str, default: Any, schema: Obj) -> Any:
    """A valid value for `path` that differs from `default`."""
    if path in SENTINELS:
        return SENTINELS[path]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, str):
        if "enum" in schema:
            return next(v for v in schema["enum"] if v != default)
        return "sentinel-x"
    if isinstance(default, dict):
        return {**default, "sentinel": "1"}
    pytest.fail(f"add a sentinel for {path} to SENTINELS")


LEAVES = list(leaves(values_yaml(), values_schema()))


@pytest.mark.parametrize(("path", "default", "schema"), LEAVES, ids=[p for p, _, _ in LEAVES])
def test_every_value_is_used(path: str, default: Any, schema: Obj) -> None:
    base = merge(ALL_ON, NEEDS.get(path, {}))
    current = lookup(merge(values_yaml(), base), path)
    changed = merge(base, dotted(path, sentinel(path, current, schema)))
    assert render_text(changed) != render_text(base), f"{path} changes nothing in the output"


def test_unused_value_detection_can_fail() -> None:
    # The check above sees a value that does not matter: replicas without ha.enabled.
    assert render_text({"ha": {"replicas": 5}}) == render_text({})


# ------------------------------------------------------------------ the operator pod


def test_image_tag_defaults_to_app_version() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert app_version == "0.1.0"
    image = operator_container(render({}))["image"]
    assert image == f"ghcr.io/lockstep-dev/operator:{app_version}"
    assert operator_container(render({"image": {"tag": "dev"}}))["image"].endswith(":dev")
    digest = "sha256:" + "b" * 64
    pinned = operator_container(render({"image": {"tag": "dev", "digest": digest}}))["image"]
    assert pinned == f"ghcr.io/lockstep-dev/operator@{digest}"


def test_one_replica_recreated_by_default() -> None:
    deployment = one(render({}), "Deployment", RELEASE)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    args = operator_container(render({}))["args"]
    assert not any(a.startswith("--leader-elect") for a in args)
    assert not find(render({}), "PodDisruptionBudget")


def test_ha_runs_replicas_that_elect_a_leader_through_a_lease() -> None:
    objs = render(VALUE_SETS["ha"])
    deployment = one(objs, "Deployment", RELEASE)
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    args = operator_container(objs)["args"]
    assert "--leader-elect" in args
    assert f"--leader-election-namespace={NAMESPACE}" in args
    assert "--leader-election-id=lockstep" in args
    env = {e["name"]: e for e in operator_container(objs)["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert one(objs, "PodDisruptionBudget", RELEASE)["spec"]["minAvailable"] == 1
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"]
    # kopf's peering is gone for good: no peering object, no peering CRD in the chart.
    assert not [o for o in objs if o["kind"] in ("KopfPeering", "ClusterKopfPeering")]
    assert not (CHART / "crds/kopfpeerings.kopf.dev.yaml").exists()


def test_operator_command_line() -> None:
    container = operator_container(render({}))
    assert container["command"] == ["lockstep", "operator"]
    assert container["args"] == [
        "--liveness-port=8080",
        "--metrics-port=9090",
        "--runtime-image=ghcr.io/lockstep-dev/operator:0.1.0",
        "--webhook-port=9443",
        "--webhook-self-signed",
        "--webhook-service=lockstep-webhook",
        f"--webhook-namespace={NAMESPACE}",
        "--webhook-config-name=lockstep",
        "--webhook-cert-secret=lockstep-webhook-cert",
    ]
    cm = operator_container(render(CERT_MANAGER))
    assert cm["args"][3:] == ["--webhook-port=9443", "--webhook-cert-dir=/etc/lockstep/webhook-tls"]
    assert {"name": "webhook-tls", "mountPath": "/etc/lockstep/webhook-tls", "readOnly": True} in (
        cm["volumeMounts"]
    )
    off = operator_container(render({"webhook": {"enabled": False}}))
    assert not any(a.startswith("--webhook") for a in off["args"])
    namespaced = operator_container(render(VALUE_SETS["namespaced-rbac"]))
    assert [a for a in namespaced["args"] if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    own = operator_container(render(VALUE_SETS["namespaced-release-namespace"]))
    assert f"--namespace={NAMESPACE}" in own["args"]


def parse_operator_args(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[Any, list[str]]:
    """`lockstep operator ARGS` parsed by the CLI itself: (namespace, unknown flags)."""
    try:
        parsed, unknown = build_parser().parse_known_args(["operator", *args])
    except SystemExit:
        pytest.fail(f"lockstep operator refuses the chart's arguments: {capsys.readouterr().err}")
    return parsed, unknown


@pytest.mark.parametrize("name", ["defaults", "namespaced-rbac", "ha", "ha-namespaced"])
def test_chart_args_parse_with_the_operator_cli(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The chart and `lockstep operator` agree on the command line.
    args = operator_container(render(VALUE_SETS[name]))["args"]
    parsed, unknown = parse_operator_args(args, capsys)
    assert not unknown, unknown
    assert parsed.liveness_port == 8080 and parsed.metrics_port == 9090
    assert parsed.namespace == VALUE_SETS[name].get("watchNamespaces")
    assert parsed.leader_elect == ("ha" in VALUE_SETS[name])


@pytest.mark.parametrize("name", ["webhook-self-signed", "webhook-cert-manager"])
def test_chart_webhook_args_parse_with_the_operator_cli(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = operator_container(render(VALUE_SETS[name]))["args"]
    parsed, unknown = parse_operator_args(args, capsys)
    assert not unknown
    assert parsed.webhook_port == 9443
    assert bool(parsed.webhook_self_signed) == (name == "webhook-self-signed")
    assert bool(parsed.webhook_cert_dir) == (name == "webhook-cert-manager")


def test_operator_pod_is_restricted_and_probed() -> None:
    objs = render({})
    pod = one(objs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    container = operator_container(objs)
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"healthz": 8080, "metrics": 9090, "webhook": 9443}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert pod["serviceAccountName"] == RELEASE


# ---------------------------------------------------------------------------- RBAC

# The documented set. A new rule needs a line here: RBAC grows on purpose only. Each verb
# is one the operator was seen to use, as the chart's ServiceAccount, in the API server's
# audit log of a drill (tests/e2e/test_least_privilege.py), one it holds to grant the
# router's Role (pods get and watch), or one the API server checks on its behalf (update
# of pddeployments/finalizers, tests/controlplane/test_least_privilege_options.py).
NAMESPACED_RULES: dict[tuple[str, str], set[str]] = {
    ("lockstep.dev", "pddeployments"): {"list", "watch", "patch"},
    ("lockstep.dev", "pddeployments/status"): {"patch"},
    ("lockstep.dev", "pddeployments/finalizers"): {"update"},
    ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "pods/status"): {"get", "patch"},
    ("", "pods/log"): {"get"},
    ("", "secrets"): {"get", "create"},
    ("", "services"): {"list", "watch", "create", "patch", "delete"},
    ("", "configmaps"): {"get", "create", "patch"},
    ("", "serviceaccounts"): {"create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"create", "patch", "delete"},
    ("apps", "deployments"): {"list", "watch", "create", "patch", "delete"},
    ("", "events"): {"create"},
    ("lockstep.dev", "pdrolescales"): {"list", "watch", "create", "patch"},
    ("lockstep.dev", "pdrolescales/status"): {"patch"},
    ("policy", "poddisruptionbudgets"): {"list", "watch", "create", "patch", "delete"},
}
# Cluster-scoped, so in the cluster-wide ClusterRole whatever namespaces are watched.
CLUSTER_READ = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "nodes"): {"list", "watch"},
}
# In the release's namespace (Role `<release>-self`): the leader-election Lease and the
# Event on it (ha.enabled), the Secret of the shared self-signed webhook certificate.
LEASE = {
    ("coordination.k8s.io", "leases"): {"create"},
    ("coordination.k8s.io", "leases@lockstep"): {"get", "update"},
    ("", "events"): {"create"},
}
CERT_SECRET = {("", "secrets"): {"create"}, ("", "secrets@lockstep-webhook-cert"): {"get"}}
# Only with self-signed certificates, and only on this release's configurations.
WEBHOOK_CA = {
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations@lockstep"): {"get", "patch"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations@lockstep"): {"get", "patch"},
}


def granted(role: Obj) -> dict[tuple[str, str], set[str]]:
    """A role's rules as {(group, resource[@names]): verbs}."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        names = ",".join(rule.get("resourceNames", []))
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, f"{resource}@{names}" if names else resource)
                out.setdefault(key, set()).update(rule["verbs"])
    return out


Rules = dict[tuple[str, str], set[str]]
RBAC_CASES: dict[str, tuple[Rules, Rules, Rules]] = {
    # value set: (rules in each watched namespace, cluster-wide rules, in the release's)
    "defaults": (NAMESPACED_RULES, {**CLUSTER_READ, **WEBHOOK_CA}, CERT_SECRET),
    "webhook-cert-manager": (NAMESPACED_RULES, CLUSTER_READ, {}),
    "webhook-off": (NAMESPACED_RULES, CLUSTER_READ, {}),
    "ha": (NAMESPACED_RULES, CLUSTER_READ, LEASE),
    "ha-self-signed": (NAMESPACED_RULES, {**CLUSTER_READ, **WEBHOOK_CA}, {**LEASE, **CERT_SECRET}),
    "cluster-rbac-some-namespaces": (NAMESPACED_RULES, {**CLUSTER_READ, **WEBHOOK_CA}, CERT_SECRET),
    "namespaced-rbac": (NAMESPACED_RULES, {**CLUSTER_READ, **WEBHOOK_CA}, CERT_SECRET),
    "ha-namespaced": (NAMESPACED_RULES, CLUSTER_READ, LEASE),
    # Suspect nodes may be cordoned: patch on nodes, and nothing else more.
    "cordon-nodes": (
        NAMESPACED_RULES,
        {**CLUSTER_READ, ("", "nodes"): {"list", "watch", "patch"}},
        {},
    ),
}


@pytest.mark.parametrize("name", RBAC_CASES)
def test_rbac_rules_are_exactly_the_documented_set(name: str) -> None:
    objs = render(VALUE_SETS[name])
    namespaced, cluster, own = RBAC_CASES[name]
    values = VALUE_SETS[name]
    selves = [o for o in find(objs, "Role") if o["metadata"]["name"] == "lockstep-self"]
    assert [granted(r) for r in selves] == ([own] if own else [])
    assert all(r["metadata"]["namespace"] == NAMESPACE for r in selves)
    objs = [o for o in objs if not o["metadata"]["name"].endswith("-self")]
    if values.get("rbac", {}).get("scope") == "Namespaced":
        roles = find(objs, "Role")
        assert sorted(r["metadata"]["namespace"] for r in roles) == values["watchNamespaces"]
        for role in roles:
            assert granted(role) == namespaced
        assert granted(one(objs, "ClusterRole", "lockstep-cluster")) == cluster
        for binding in find(objs, "RoleBinding"):
            assert binding["roleRef"] == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "lockstep",
            }
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": "lockstep", "namespace": NAMESPACE}
            ]
    else:
        assert not find(objs, "Role")
        assert granted(one(objs, "ClusterRole", "lockstep")) == {**namespaced, **cluster}
    binding = find(objs, "ClusterRoleBinding")[0]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "lockstep", "namespace": NAMESPACE}
    ]


def test_namespaced_rbac_defaults_to_the_release_namespace() -> None:
    objs = render(VALUE_SETS["namespaced-release-namespace"])
    roles = [r for r in find(objs, "Role") if r["metadata"]["name"] == "lockstep"]
    assert [r["metadata"]["namespace"] for r in roles] == [NAMESPACE]


def test_no_rbac_without_rbac_create() -> None:
    objs = render({"rbac": {"create": False}})
    kinds = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    assert not [o for o in objs if o["kind"] in kinds]


def test_every_rule_is_commented() -> None:
    for name in RBAC_CASES:
        for doc in render_text(VALUE_SETS[name]).split("\n---\n"):
            if not re.search(r"^kind: (Cluster)?Role$", doc, re.M):
                continue
            lines = doc.splitlines()
            rules = [i for i, line in enumerate(lines) if line.startswith("  - apiGroups:")]
            assert rules
            for i in rules:
                assert lines[i - 1].strip().startswith("#"), f"{name}: uncommented {lines[i]}"


def test_operator_may_do_what_the_builders_make_it_do() -> None:
    # The operator creates every kind the builders render (what else it does with them
    # the audit of tests/e2e/test_least_privilege.py checks), and holds every permission
    # of the router's Role it creates (RBAC grants only what one holds).
    rules = NAMESPACED_RULES
    group_of = {"Role": "rbac.authorization.k8s.io", "RoleBinding": "rbac.authorization.k8s.io"}
    group_of["Deployment"] = "apps"
    for path in GOOD_EXAMPLES:
        for obj in build_all(parse_pddeployment(yaml.safe_load(path.read_text()))):
            kind = obj["kind"]
            group = group_of.get(kind, "")
            resource = {"RoleBinding": "rolebindings"}.get(kind, kind.lower() + "s")
            assert "create" in rules.get((group, resource), set()), f"may not create {kind}"
            if kind == "Role":
                for key, verbs in granted(obj).items():
                    assert verbs <= rules[key], f"router Role grants {key} {verbs}"


# ---------------------------------------------------------------------- the webhook


def test_webhook_configurations_point_at_the_operator() -> None:
    objs = render({})
    service = one(objs, "Service", "lockstep-webhook")
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    expected = {
        "ValidatingWebhookConfiguration": "/validate-pddeployment",
        "MutatingWebhookConfiguration": "/mutate-pddeployment",
    }
    for kind, path in expected.items():
        config = one(objs, kind, "lockstep")
        (hook,) = config["webhooks"]
        assert hook["clientConfig"] == {
            "service": {
                "name": "lockstep-webhook",
                "namespace": NAMESPACE,
                "path": path,
                "port": 443,
            }
        }, "no caBundle: the operator patches it in (an upgrade must not reset it)"
        assert hook["failurePolicy"] == "Fail"
        assert hook["sideEffects"] == "None"
        (rule,) = hook["rules"]
        assert rule["apiGroups"] == ["lockstep.dev"] and rule["resources"] == ["pddeployments"]
        assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
        assert "namespaceSelector" not in hook  # every namespace is watched
        assert "annotations" not in config["metadata"]
    ignore = render({"webhook": {"failurePolicy": "Ignore"}})
    assert one(ignore, "ValidatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Ignore"
    validating_only = render(VALUE_SETS["webhook-validating-only"])
    assert not find(validating_only, "MutatingWebhookConfiguration")
    off = render(VALUE_SETS["webhook-off"])
    assert not [
        o for o in off if "Webhook" in o["kind"] or o["metadata"]["name"].endswith("webhook")
    ]


def test_webhook_with_cert_manager() -> None:
    objs = render(CERT_MANAGER)
    cert = one(objs, "Certificate", "lockstep-webhook-tls")
    assert cert["spec"]["dnsNames"] == [
        f"lockstep-webhook.{NAMESPACE}.svc",
        f"lockstep-webhook.{NAMESPACE}.svc.cluster.local",
    ]
    assert cert["spec"]["issuerRef"]["name"] == one(objs, "Issuer")["metadata"]["name"]
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        annotations = one(objs, kind)["metadata"]["annotations"]
        assert annotations == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/lockstep-webhook-tls"
        }
    deployment = one(objs, "Deployment")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-tls", "secret": {"secretName": "lockstep-webhook-tls"}} in volumes
    external = render(VALUE_SETS["webhook-cert-manager-cluster-issuer"])
    assert not find(external, "Issuer")
    assert one(external, "Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_webhook_only_judges_watched_namespaces_and_spec_changes() -> None:
    objs = render(VALUE_SETS["namespaced-rbac"])
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        (hook,) = one(objs, kind)["webhooks"]
        assert hook["namespaceSelector"] == {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "In",
                    "values": ["team-a", "team-b"],
                }
            ]
        }
        (condition,) = hook["matchConditions"]
        assert "object.spec != oldObject.spec" in condition["expression"]


# --------------------------------------------------------- metrics, network, dashboard


def test_metrics_service_and_service_monitor() -> None:
    objs = render({})
    service = one(objs, "Service", "lockstep-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert not find(objs, "ServiceMonitor")
    monitored = render(VALUE_SETS["servicemonitor-and-dashboard"])
    monitor = one(monitored, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]


def port_set(rule: Obj) -> set[int]:
    ports: set[int] = set()
    for port in rule["ports"]:
        assert port["protocol"] == "TCP"
        ports.update(range(port["port"], port.get("endPort", port["port"]) + 1))
    return ports


def test_network_policy_keeps_agent_and_probe_for_the_operator() -> None:
    objs = render({})
    sglang = one(objs, "NetworkPolicy", "lockstep-sglang")
    assert sglang["metadata"]["namespace"] == NAMESPACE
    assert sglang["spec"]["podSelector"]["matchLabels"]["lockstep.dev/component"] == "sglang"
    operator_rule, peer_rule = sglang["spec"]["ingress"]
    (operator_peer,) = operator_rule["from"]
    operator_pod = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert operator_peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}
    }
    assert operator_peer["podSelector"]["matchLabels"].items() <= operator_pod.items()
    assert port_set(operator_rule) == {8999, 30000}
    # Peers reach each other on every TCP port but the agent's and the probe's.
    assert port_set(peer_rule) == set(range(1, 65536)) - {8999, 30000}
    router = one(objs, "NetworkPolicy", "lockstep-sglang-router")
    assert router["spec"]["podSelector"]["matchLabels"]["lockstep.dev/rank"] == "0"
    (router_rule,) = router["spec"]["ingress"]
    assert router_rule["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/managed-by": "lockstep",
                    "lockstep.dev/component": "router",
                }
            }
        }
    ]
    assert port_set(router_rule) == {30000}
    assert not find(render(VALUE_SETS["networkpolicy-off"]), "NetworkPolicy")


def test_network_policy_selectors_match_the_pods_lockstep_builds() -> None:
    sglang, router = (
        one(render({}), "NetworkPolicy", n)["spec"]["podSelector"]["matchLabels"]
        for n in ("lockstep-sglang", "lockstep-sglang-router")
    )
    pdd = parse_pddeployment(yaml.safe_load(GOOD_EXAMPLES[0].read_text()))
    objs = build_all(pdd)
    pods = [o for o in objs if o["kind"] == "Pod"]
    assert all(sglang.items() <= p["metadata"]["labels"].items() for p in pods)
    rank0 = [p for p in pods if router.items() <= p["metadata"]["labels"].items()]
    assert rank0 and all(p["metadata"]["labels"]["lockstep.dev/rank"] == "0" for p in rank0)
    router_pod = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]
    policy = one(render({}), "NetworkPolicy", "lockstep-sglang-router")
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed.items() <= router_pod["metadata"]["labels"].items()


def test_network_policy_namespaces_and_extra_ingress() -> None:
    objs = render(VALUE_SETS["networkpolicy-extra-ingress"])
    policies = find(objs, "NetworkPolicy")
    assert {p["metadata"]["namespace"] for p in policies} == {"serving"}
    sglang = one(objs, "NetworkPolicy", "lockstep-sglang")
    assert (
        sglang["spec"]["ingress"][-1]
        == VALUE_SETS["networkpolicy-extra-ingress"]["networkPolicy"]["extraIngress"][0]
    )
    watched = find(render(VALUE_SETS["namespaced-rbac"]), "NetworkPolicy", "lockstep-sglang")
    assert sorted(p["metadata"]["namespace"] for p in watched) == ["team-a", "team-b"]


DASHBOARD_METRICS = [
    "lockstep_probe_latency_seconds_bucket",
    "lockstep_group_verdicts_total",
    "lockstep_group_restarts_total",
    "lockstep_incidents_open",
    "lockstep_time_to_detect_seconds_bucket",
    "lockstep_time_to_recover_seconds_bucket",
]


def test_grafana_dashboard() -> None:
    assert not find(render({}), "ConfigMap")
    objs = render(VALUE_SETS["servicemonitor-and-dashboard"])
    config_map = one(objs, "ConfigMap", "lockstep-dashboard")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["lockstep.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for metric in DASHBOARD_METRICS:
        assert any(metric in e for e in exprs), f"no panel shows {metric}"
    assert any("by (verdict)" in e for e in exprs)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


# --------------------------------------------------------------------- the image

DOCKERFILE = REPO / "images/operator/Dockerfile"
INSTALL = REPO / "images/operator/install-venv.sh"


def test_dockerfile_is_pinned_multistage_non_root() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base[1])
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?$", text, re.M)
    assert stages == [("${PYTHON_IMAGE}", "build"), ("${PYTHON_IMAGE}", "runtime")]
    assert "RUN bash images/operator/install-venv.sh /opt/lockstep" in text
    assert re.findall(r"^USER (\S+)$", text, re.M) == ["10001:10001"]
    assert text.rstrip().endswith('ENTRYPOINT ["lockstep", "operator"]')
    # The Dockerfile copies every source the install script builds from.
    sources = re.search(r"^sources=\((.*)\)$", INSTALL.read_text(), re.M)
    assert sources
    copied = " ".join(re.findall(r"^COPY (?!--from)(.*)$", text, re.M))
    for src in sources[1].split():
        assert src in copied, f"the Dockerfile does not COPY {src}"


@pytest.mark.timeout(420)
def test_install_venv_installs_the_operator_without_torch(tmp_path: Path) -> None:
    # Downloads the operator's dependencies from PyPI (pip's cache makes reruns fast).
    venv = tmp_path / "venv"
    res = subprocess.run(
        ["bash", str(INSTALL), str(venv)],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "lockstep operator installed" in res.stdout
    help_text = subprocess.run(
        [str(venv / "bin/lockstep"), "operator", "--help"], capture_output=True, text=True
    )
    assert help_text.returncode == 0 and "--leader-elect" in help_text.stdout
    no_torch = subprocess.run([str(venv / "bin/python"), "-c", "import torch"], capture_output=True)
    assert no_torch.returncode != 0
    # What the init container of a stock SGLang pod does with this image: the runtime,
    # without the stand-in, with py-spy, and the launcher a stock image's Python runs.
    dest = tmp_path / "runtime"
    copied = subprocess.run(
        [str(venv / "bin/lockstep-runtime-install"), str(dest)], capture_output=True, text=True
    )
    assert copied.returncode == 0, copied.stderr
    assert (dest / "launch.py").is_file() and (dest / "bin/py-spy").is_file()
    assert (dest / "lockstep_sglang/launcher.py").is_file()
    assert not (dest / "lockstep_standin").exists() and not (dest / "lockstep_dev").exists()


@pytest.mark.timeout(300)
def test_the_wheel_ships_no_dev_wing_and_no_stand_in(tmp_path: Path) -> None:
    # `pip wheel .` of the checkout's sources, the dev wing among them (operator/dev): the
    # package list in pyproject.toml is the one list that keeps it out.
    src = tmp_path / "src"
    for part in ("pyproject.toml", "README.md", "operator", "images/sglang/lockstep_sglang"):
        (src / part).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy
        copy(REPO / part, src / part)
    assert (src / "operator/dev/lockstep_dev/drills/__init__.py").exists()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(tmp_path),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (wheel,) = tmp_path.glob("lockstep-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "lockstep/cli/main.py" in names and "lockstep_sglang/launcher.py" in names
    wing = [n for n in names if n.split("/")[0] in ("lockstep_dev", "lockstep_standin")]
    assert wing == [] and not [n for n in names if "localcluster" in n or "standin" in n]

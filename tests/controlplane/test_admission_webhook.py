"""The chart's admission webhooks, registered with the real API server, pointing at the
operator's webhook server on loopback over TLS (self-signed CA injected by the operator).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import GROUP, PLURAL, REPO, VERSION, OperatorProcess, install_crd, wait_for
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from lockstep_dev.localcluster.controlplane import LocalControlPlane, find_kubectl

CONFIG = "lk-lockstep"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def helm() -> Path:
    out = subprocess.run(
        ["bash", str(REPO / ".ci/fetch-tools")], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip()) / "helm"


def chart_webhooks(port: int) -> list[dict[str, Any]]:
    """The chart's webhook configurations, re-pointed at the operator on loopback."""
    out = subprocess.run(
        [
            str(helm()),
            "template",
            "lk",
            str(REPO / "charts/lockstep"),
            "--namespace",
            "lk-system",
            "--show-only",
            "templates/webhook.yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    for doc in docs:
        assert doc["metadata"]["name"] == CONFIG
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
    return docs


@pytest.fixture(scope="module")
def webhooked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalControlPlane, str]]:
    with LocalControlPlane() as cp:
        install_crd(cp)
        api = cp.api_client()
        port = free_port()
        adm = k8s.AdmissionregistrationV1Api(api)
        for doc in chart_webhooks(port):
            if doc["kind"] == "MutatingWebhookConfiguration":
                adm.create_mutating_webhook_configuration(doc)
            else:
                adm.create_validating_webhook_configuration(doc)
        ns = cp.new_namespace()
        op = OperatorProcess(
            cp.kubeconfig,
            ns,
            tmp_path_factory.mktemp("op") / "operator.log",
            extra_args=[
                "--webhook-port",
                str(port),
                "--webhook-addr",
                "127.0.0.1",
                "--webhook-self-signed",
                "--webhook-config-name",
                CONFIG,
            ],
        ).start()
        try:

            def ca_injected() -> bool:
                cfg = adm.read_validating_webhook_configuration(CONFIG)
                return bool(cfg.webhooks[0].client_config.ca_bundle)

            wait_for(ca_injected, 60, "the operator to inject its CA")
            wait_for(lambda: _listening(port), 60, "the webhook server")
            yield cp, ns
        finally:
            op.stop()
            print(op.log_tail())


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def kubectl_apply(cp: LocalControlPlane, ns: str, path: Path) -> subprocess.CompletedProcess[str]:
    obj = yaml.safe_load(path.read_text())
    obj["metadata"]["namespace"] = ns
    obj["metadata"]["name"] = f"{path.stem}"[:40]
    return subprocess.run(
        [str(find_kubectl()), "--kubeconfig", str(cp.kubeconfig), "apply", "-f", "-"],
        input=yaml.safe_dump(obj),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("example", "needles"),
    [
        (
            "unsafe/operator-owned-flag",
            ["operator-owned-flag", "spec.decode.args[0]", "spec.decode.tp"],
        ),
        ("unsafe/misspelt-flag", ["unknown-flag", "--mem-fraction-static", "flag-value"]),
    ],
)
def test_unsafe_examples_fail_at_the_door(
    webhooked: tuple[LocalControlPlane, str], example: str, needles: list[str]
) -> None:
    cp, ns = webhooked
    out = kubectl_apply(cp, ns, REPO / "examples" / f"{example}.yaml")
    assert out.returncode != 0
    for needle in needles:
        assert needle in out.stderr, out.stderr


@pytest.mark.timeout(240)
def test_reject_mode_refuses_and_enforce_mode_adjusts(
    webhooked: tuple[LocalControlPlane, str], tmp_path: Path
) -> None:
    cp, ns = webhooked
    obj = yaml.safe_load((REPO / "examples/unsafe/watchdog-unbounded.yaml").read_text())
    obj["spec"]["safety"] = {"mode": "Reject"}
    path = tmp_path / "reject.yaml"
    path.write_text(yaml.safe_dump(obj))
    out = kubectl_apply(cp, ns, path)
    assert out.returncode != 0 and "watchdog-timeout" in out.stderr
    out = kubectl_apply(cp, ns, REPO / "examples/unsafe/watchdog-unbounded.yaml")
    assert out.returncode == 0, out.stderr
    stored = k8s.CustomObjectsApi(cp.api_client()).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "watchdog-unbounded"
    )
    # The decode role wrote --watchdog-timeout=1000000; the mutation kept its form.
    assert stored["spec"]["decode"]["args"][0] == "--watchdog-timeout=300"
    prefill = stored["spec"]["prefill"]["args"]
    assert prefill[prefill.index("--watchdog-timeout") + 1] == "300"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("example", ["pd-small", "dp-attention", "deepseek-v3"])
def test_good_examples_are_accepted(webhooked: tuple[LocalControlPlane, str], example: str) -> None:
    cp, ns = webhooked
    out = kubectl_apply(cp, ns, REPO / "examples" / f"{example}.yaml")
    assert out.returncode == 0, out.stderr


def test_webhook_refusal_is_not_a_server_error(webhooked: tuple[LocalControlPlane, str]) -> None:
    cp, ns = webhooked
    obj = yaml.safe_load((REPO / "examples/unsafe/operator-owned-flag.yaml").read_text())
    obj["metadata"]["namespace"] = ns
    with pytest.raises(ApiException) as info:
        k8s.CustomObjectsApi(cp.api_client()).create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, obj
        )
    assert info.value.status == 422


def _variant(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples/pd-small.yaml").read_text())
    change(obj)
    return obj


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = obj
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return change


# What a user may write, and what the cluster (the API server's CRD schema and metadata
# rules, then lockstep's webhook) says of it: `lockstep check` must say the same.
CORPUS: dict[str, dict[str, Any]] = {
    "good": _variant(lambda o: None),
    "bool-as-string": _variant(_set("spec.router.enabled", "yes")),
    "int-as-string": _variant(_set("spec.decode.tp", "2")),
    "fractional-int": _variant(_set("spec.decode.tp", 2.5)),
    "below-minimum": _variant(_set("spec.health.periodSeconds", 0)),
    "not-an-enum-value": _variant(_set("spec.safety.mode", "Strict")),
    "unknown-field": _variant(_set("spec.decode.tpSize", 2)),
    "label-value-too-long": _variant(_set("metadata.labels", {"team": "x" * 64})),
    "label-value-good": _variant(_set("metadata.labels", {"team": "serving-a"})),
    "annotation-key-bad": _variant(_set("metadata.annotations", {"bad key": "v"})),
    "annotation-good": _variant(_set("metadata.annotations", {"example.org/ticket": "INC 42"})),
    "name-a-subdomain-not-a-label": _variant(_set("metadata.name", "qwen.small")),
    "operator-owned-flag": yaml.safe_load(
        (REPO / "examples/unsafe/operator-owned-flag.yaml").read_text()
    ),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", sorted(CORPUS))
def test_lockstep_check_says_what_the_cluster_says(
    webhooked: tuple[LocalControlPlane, str], tmp_path: Path, case: str
) -> None:
    cp, ns = webhooked
    obj = CORPUS[case]
    obj["metadata"]["namespace"] = ns
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(obj))
    server = subprocess.run(
        [str(find_kubectl()), "--kubeconfig", str(cp.kubeconfig), "apply", "--dry-run=server",
         "-f", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    check = subprocess.run(
        [sys.executable, "-m", "lockstep.cli", "check", "-f", str(path), "-o", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    report = json.loads(check.stdout)
    assert report["accepted"] == (server.returncode == 0), (case, server.stderr, report)
    if not report["accepted"]:
        # Both name the field at fault (the API server by its path, up to a map key).
        refused = [f for f in report["findings"] if f["action"] == "rejected"]
        fields = {f["field"].split("[")[0] for f in refused or report["findings"]}
        assert any(field in server.stderr for field in fields), (fields, server.stderr)

"""The committed PDRoleScale CRD on the real API server: served with the scale and status
subresources, scaled by `kubectl scale`, its `/scale` showing the status selector, the
real HPA controller scaling it, and garbage-collected with its PDDeployment."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from factories import load_example, with_path

from lockstep.api import constants as c
from lockstep.api.models import parse_pddeployment
from lockstep.core import rolescale as rs
from lockstep.core.builders import role_selector
from lockstep_dev.localcluster import LocalControlPlane

API = "/apis/lockstep.dev/v1alpha1"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
WAIT = 60.0  # the HPA controller and the garbage collector act within seconds


def scales(namespace: str) -> str:
    return f"{API}/namespaces/{namespace}/pdrolescales"


def ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    return body


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


def kubectl_run(kubectl: Path, cp: LocalControlPlane, *args: str) -> str:
    out = subprocess.run(
        [str(kubectl), "--kubeconfig", str(cp.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def create_role_scale(http: httpx.Client, namespace: str, replicas: int) -> dict[str, Any]:
    """A PDDeployment (pd-small) and its decode PDRoleScale, as the operator creates it:
    the object, then its status (the server drops status on create)."""
    pdd_obj = with_path(load_example("pd-small"), "metadata.namespace", namespace)
    created = ok(http.post(f"{API}/namespaces/{namespace}/pddeployments", json=pdd_obj), 201)
    pdd = parse_pddeployment(created)
    selector = role_selector(pdd, "decode")
    obj = rs.build_role_scale(
        pdd.metadata.name, namespace, pdd.metadata.uid, "decode", replicas, selector
    )
    stored = ok(http.post(scales(namespace), json=obj), 201)
    assert "status" not in stored or "specReplicas" not in stored["status"]
    name = obj["metadata"]["name"]
    ok(
        http.patch(
            f"{scales(namespace)}/{name}/status",
            json={"status": obj["status"]},
            headers=MERGE_PATCH,
        )
    )
    return obj


def test_crd_is_served_with_scale_and_status_subresources(
    controlplane: LocalControlPlane, http: httpx.Client
) -> None:
    crd = ok(http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{rs.CRD_NAME}"))
    conditions = {cond["type"]: cond["status"] for cond in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert "NonStructuralSchema" not in conditions
    resources = {r["name"]: r for r in ok(http.get(API))["resources"]}
    assert resources["pdrolescales"]["shortNames"] == ["pdrs"]
    assert resources["pdrolescales"]["namespaced"] is True
    assert {"pdrolescales/scale", "pdrolescales/status"} <= set(resources)


def test_kubectl_scale_and_the_scale_subresource(
    controlplane: LocalControlPlane, http: httpx.Client, namespace: str, kubectl: Path
) -> None:
    obj = create_role_scale(http, namespace, replicas=1)
    name = obj["metadata"]["name"]
    assert name == "qwen-small-decode"

    kubectl_run(
        kubectl, controlplane, "-n", namespace, "scale", f"pdrolescale/{name}", "--replicas=3"
    )
    stored = ok(http.get(f"{scales(namespace)}/{name}"))
    assert stored["spec"]["replicas"] == 3
    # The record is untouched by kubectl: the next round serves the scale's value.
    decision = rs.resolve(1, stored)
    assert (decision.replicas, decision.source) == (3, "Scale")

    # The operator's status write: observed groups and the serving-pod selector.
    selector = {c.LABEL_DEPLOYMENT: "qwen-small", c.LABEL_ROLE: "decode", c.LABEL_RANK: "0"}
    patch = rs.status_patch(decision, replicas=2, ready_groups=2, selector=selector)
    ok(http.patch(f"{scales(namespace)}/{name}/status", json=patch, headers=MERGE_PATCH))
    scale = ok(http.get(f"{scales(namespace)}/{name}/scale"))
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 3
    assert scale["status"]["replicas"] == 2
    assert scale["status"]["selector"] == (
        f"{c.LABEL_DEPLOYMENT}=qwen-small,{c.LABEL_RANK}=0,{c.LABEL_ROLE}=decode"
    )

    # A status write cannot change the spec; the schema's bounds hold on /scale too.
    too_many = {"spec": {"replicas": rs.MAX_REPLICAS + 1}}
    response = http.patch(f"{scales(namespace)}/{name}/scale", json=too_many, headers=MERGE_PATCH)
    assert response.status_code == 422, response.text

    table = kubectl_run(kubectl, controlplane, "-n", namespace, "get", "pdrs", name)
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "REPLICAS", "READY", "SOURCE", "AGE"]
    assert row.split()[:4] == [name, "3", "2", "Scale"]


def test_real_hpa_controller_scales_the_role_scale(
    controlplane: LocalControlPlane, http: httpx.Client, namespace: str
) -> None:
    obj = create_role_scale(http, namespace, replicas=1)
    name = obj["metadata"]["name"]
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": c.API_VERSION, "kind": rs.KIND, "name": name},
            "minReplicas": 2,
            "maxReplicas": 4,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "sglang_num_running_reqs"},
                        "target": {"type": "AverageValue", "averageValue": "96"},
                    },
                }
            ],
        },
    }
    hpas = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers"
    ok(http.post(hpas, json=hpa), 201)
    # Below minReplicas the HPA controller scales up without metrics, through /scale.
    wait_for(
        "the HPA controller to scale the PDRoleScale to minReplicas",
        lambda: ok(http.get(f"{scales(namespace)}/{name}"))["spec"]["replicas"] == 2,
    )
    status = wait_for(
        "the HPA to report that it read the scale subresource",
        lambda: ok(http.get(f"{hpas}/{name}")).get("status", {}).get("conditions"),
    )
    able = next(cond for cond in status if cond["type"] == "AbleToScale")
    assert able["status"] == "True", able
    decision = rs.resolve(1, ok(http.get(f"{scales(namespace)}/{name}")))
    assert (decision.replicas, decision.source) == (2, "Scale")
    ok(http.delete(f"{hpas}/{name}"))


def test_role_scale_goes_with_its_deployment(
    controlplane: LocalControlPlane, http: httpx.Client, namespace: str
) -> None:
    obj = create_role_scale(http, namespace, replicas=1)
    name = obj["metadata"]["name"]
    owner = obj["metadata"]["ownerReferences"][0]["name"]
    ok(http.delete(f"{API}/namespaces/{namespace}/pddeployments/{owner}"))
    wait_for(
        "the garbage collector to delete the PDRoleScale",
        lambda: http.get(f"{scales(namespace)}/{name}").status_code == 404,
    )

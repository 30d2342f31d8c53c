"""The committed PDDeployment CRD on the real API server: accepted as a structural
schema, defaults and validation (OpenAPI and CEL) enforced by the server itself, the status
subresource, and the printer columns `kubectl get pdd` shows."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import REPO, load_example, with_path

from lockstep_dev.localcluster import LocalControlPlane

PDD_CRD = REPO / "crds" / "pddeployments.lockstep.dev.yaml"
CRD_NAME = "pddeployments.lockstep.dev"
API = "/apis/lockstep.dev/v1alpha1"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
STATUS = {
    "observedGeneration": 1,
    "prefillReady": "1/1",
    "decodeReady": "0/1",
    "openIncidents": 2,
    "conditions": [
        {
            "type": "Ready",
            "status": "False",
            "reason": "DecodeStarting",
            "message": "decode group 0 is starting",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
        {
            "type": "Degraded",
            "status": "True",
            "reason": "RuntimeRefused",
            "message": "decode group 0: RuntimeRefused: set LOCKSTEP_EPOCH",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
    ],
}


def pdds(namespace: str) -> str:
    return f"{API}/namespaces/{namespace}/pddeployments"


def small(namespace: str) -> dict[str, Any]:
    """examples/pd-small.yaml, in the test's namespace."""
    return with_path(load_example("pd-small"), "metadata.namespace", namespace)


def create(http: httpx.Client, obj: dict[str, Any]) -> dict[str, Any]:
    response = http.post(pdds(obj["metadata"]["namespace"]), json=obj)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def get(http: httpx.Client, namespace: str, name: str) -> dict[str, Any]:
    response = http.get(f"{pdds(namespace)}/{name}")
    assert response.status_code == 200, response.text
    obj: dict[str, Any] = response.json()
    return obj


def test_committed_crd_is_accepted_as_structural_and_served(
    controlplane: LocalControlPlane, http: httpx.Client
) -> None:
    # The session already installed it at start; applying it again must be a no-op.
    assert controlplane.install_crd(PDD_CRD) == [CRD_NAME]
    crd = http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}").json()
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    assert "NonStructuralSchema" not in conditions
    assert crd["status"]["acceptedNames"]["shortNames"] == ["pdd"]
    resources = http.get(API).json()["resources"]
    pdd = next(r for r in resources if r["name"] == "pddeployments")
    assert pdd["shortNames"] == ["pdd"]
    assert {"pddeployments/status"} <= {r["name"] for r in resources}


def test_valid_pddeployment_is_stored_with_server_side_defaults(
    http: httpx.Client, namespace: str
) -> None:
    obj = small(namespace)
    create(http, obj)
    stored = get(http, namespace, obj["metadata"]["name"])
    assert stored["metadata"]["generation"] == 1
    assert stored["spec"]["model"] == obj["spec"]["model"]
    assert stored["spec"]["prefill"]["args"] == obj["spec"]["prefill"]["args"]
    # Defaults come from the CRD's schema, applied by the API server.
    assert stored["spec"]["prefill"]["podsPerGroup"] == 1
    assert stored["spec"]["safety"]["mode"] == "Enforce"
    assert stored["spec"]["safety"]["overlapSchedule"] == "Guarded"  # as written
    assert stored["spec"]["recovery"]["policy"] == "RestartGroup"
    assert stored["spec"]["health"]["failureThreshold"] == 3
    assert stored["spec"]["decode"]["placement"] == {"schedulingTimeoutSeconds": 300}


def _without(obj: dict[str, Any], dotted: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    *parents, last = dotted.split(".")
    node = out
    for part in parents:
        node = node[part]
    del node[last]
    return out


INVALID = [
    pytest.param(
        lambda o: _without(o, "spec.image"), "spec.image: Required value", id="missing-image"
    ),
    pytest.param(
        lambda o: with_path(o, "spec.prefill.tp", "two"),
        'spec.prefill.tp: Invalid value: "string"',
        id="tp-not-integer",
    ),
    pytest.param(
        lambda o: with_path(o, "spec.decode.tp", 4),
        "tp must equal gpusPerPod * podsPerGroup",
        id="cel-tp-vs-gpus",
    ),
    pytest.param(
        lambda o: with_path(o, "spec.transfer.backend", "rdma"),
        'spec.transfer.backend: Unsupported value: "rdma"',
        id="unknown-transfer-backend",
    ),
    pytest.param(
        lambda o: with_path(o, "spec.decode.replicas", -1),
        "spec.decode.replicas: Invalid value: -1",
        id="negative-replicas",
    ),
    pytest.param(
        lambda o: with_path(
            o, "spec.decode.placement.spread", [{"topologyKey": "z", "maxSkew": 0}]
        ),
        "spec.decode.placement.spread[0].maxSkew: Invalid value: 0",
        id="spread-max-skew-zero",
    ),
    pytest.param(
        lambda o: with_path(
            o,
            "spec.decode.placement.spread",
            [{"topologyKey": "z", "whenUnsatisfiable": "DoNotSchedul"}],
        ),
        'spec.decode.placement.spread[0].whenUnsatisfiable: Unsupported value: "DoNotSchedul"',
        id="spread-when-unsatisfiable-typo",
    ),
    pytest.param(
        lambda o: with_path(
            o, "spec.decode.placement.spread", [{"topologyKey": "z"}, {"topologyKey": "z"}]
        ),
        "spread lists a topologyKey more than once",
        id="cel-spread-key-twice",
    ),
    pytest.param(
        lambda o: with_path(o, "spec.decode.placement.schedulingTimeoutSeconds", 1),
        "spec.decode.placement.schedulingTimeoutSeconds: Invalid value: 1",
        id="scheduling-timeout-too-short",
    ),
]


@pytest.mark.parametrize(("mutate", "message"), INVALID)
def test_invalid_pddeployment_is_refused_by_the_server_schema(
    http: httpx.Client, namespace: str, mutate: Any, message: str
) -> None:
    obj = mutate(small(namespace))
    response = http.post(pdds(namespace), json=obj)
    assert response.status_code == 422, response.text
    status = response.json()
    assert status["reason"] == "Invalid"
    assert message in status["message"]
    assert http.get(f"{pdds(namespace)}/{obj['metadata']['name']}").status_code == 404


def test_unknown_field_is_refused_strictly_and_pruned_otherwise(
    http: httpx.Client, namespace: str
) -> None:
    obj = with_path(small(namespace), "spec.prefill.tpSize", 2)
    # kubectl asks for strict validation by default: a misspelt field is an error.
    response = http.post(pdds(namespace), params={"fieldValidation": "Strict"}, json=obj)
    assert response.status_code == 400, response.text
    assert 'unknown field "spec.prefill.tpSize"' in response.json()["message"]
    # Other clients get a warning, and the structural schema prunes the field.
    response = http.post(pdds(namespace), json=obj)
    assert response.status_code == 201, response.text
    warning = response.headers["Warning"]
    assert warning.startswith("299 ") and "unknown field" in warning and "tpSize" in warning
    stored = get(http, namespace, obj["metadata"]["name"])
    assert "tpSize" not in stored["spec"]["prefill"]


def test_status_subresource_separates_spec_and_status(http: httpx.Client, namespace: str) -> None:
    obj = small(namespace)
    name = obj["metadata"]["name"]
    path = f"{pdds(namespace)}/{name}"
    create(http, obj)

    response = http.patch(f"{path}/status", headers=MERGE_PATCH, json={"status": STATUS})
    assert response.status_code == 200, response.text
    stored = get(http, namespace, name)
    assert stored["status"]["prefillReady"] == "1/1"
    assert stored["status"]["openIncidents"] == 2
    assert stored["metadata"]["generation"] == 1  # status writes do not bump generation

    # On the main resource the status is ignored and the spec change bumps generation.
    change = {"spec": {"decode": {"replicas": 2}}, "status": {"openIncidents": 0}}
    assert http.patch(path, headers=MERGE_PATCH, json=change).status_code == 200
    stored = get(http, namespace, name)
    assert stored["spec"]["decode"]["replicas"] == 2
    assert stored["metadata"]["generation"] == 2
    assert stored["status"]["openIncidents"] == 2

    # On /status the spec is ignored.
    change = {"spec": {"decode": {"replicas": 5}}, "status": {"openIncidents": 1}}
    assert http.patch(f"{path}/status", headers=MERGE_PATCH, json=change).status_code == 200
    stored = get(http, namespace, name)
    assert stored["spec"]["decode"]["replicas"] == 2
    assert stored["status"]["openIncidents"] == 1
    assert stored["metadata"]["generation"] == 2

    # The status schema is enforced too.
    bad = {"status": {"openIncidents": -1}}
    response = http.patch(f"{path}/status", headers=MERGE_PATCH, json=bad)
    assert response.status_code == 422, response.text


def _kubectl_table(controlplane: LocalControlPlane, kubectl: Path, *args: str) -> list[list[str]]:
    done = controlplane.kubectl(*args, kubectl=kubectl)
    assert isinstance(done, subprocess.CompletedProcess)
    return [line.split() for line in done.stdout.splitlines()]


def test_kubectl_get_pdd_shows_the_printer_columns(
    controlplane: LocalControlPlane, kubectl: Path, http: httpx.Client, namespace: str
) -> None:
    obj = small(namespace)
    name = obj["metadata"]["name"]
    create(http, obj)
    response = http.patch(
        f"{pdds(namespace)}/{name}/status", headers=MERGE_PATCH, json={"status": STATUS}
    )
    assert response.status_code == 200, response.text

    header, row = _kubectl_table(controlplane, kubectl, "get", "pdd", "-n", namespace)
    assert header == ["NAME", "PREFILL", "DECODE", "READY", "INCIDENTS", "AGE", "PROBLEM"]
    assert row[:5] == [name, "1/1", "0/1", "False", "2"]
    # PROBLEM is the Degraded condition's message: why a group is not serving.
    assert " ".join(row[6:]) == "decode group 0: RuntimeRefused: set LOCKSTEP_EPOCH"
    # The CRD's categories make `kubectl get lockstep` list it as well.
    listed = controlplane.kubectl("get", "lockstep", "-n", namespace, "-o", "name", kubectl=kubectl)
    assert listed.stdout.split() == [f"pddeployment.lockstep.dev/{name}"]

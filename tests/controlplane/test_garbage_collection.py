"""Owner references on the real control plane: the garbage collector removes what a
PDDeployment owns when it goes (how the operator's pods and Services are cleaned up), and
keeps it when the owner is deleted with the orphan policy."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from factories import load_example, with_path

GC_TIMEOUT = 60.0  # the garbage collector usually acts in well under a second


def make_owner(http: httpx.Client, namespace: str) -> dict[str, Any]:
    obj = with_path(load_example("pd-small"), "metadata.namespace", namespace)
    response = http.post(
        f"/apis/lockstep.dev/v1alpha1/namespaces/{namespace}/pddeployments", json=obj
    )
    assert response.status_code == 201, response.text
    owner: dict[str, Any] = response.json()
    return owner


def make_child(http: httpx.Client, owner: dict[str, Any]) -> str:
    namespace = owner["metadata"]["namespace"]
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "generateName": "child-",
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {"role": "decode"},
    }
    response = http.post(f"/api/v1/namespaces/{namespace}/configmaps", json=child)
    assert response.status_code == 201, response.text
    return str(response.json()["metadata"]["name"])


def wait_until(predicate: Any, what: str, timeout: float = GC_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.parametrize("propagation", ["Background", "Foreground"])
def test_deleting_the_owner_deletes_its_child(
    http: httpx.Client, namespace: str, propagation: str
) -> None:
    owner = make_owner(http, namespace)
    owner_path = f"/apis/lockstep.dev/v1alpha1/namespaces/{namespace}/pddeployments/qwen-small"
    child_path = f"/api/v1/namespaces/{namespace}/configmaps/{make_child(http, owner)}"

    response = http.request(
        "DELETE",
        owner_path,
        json={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
    )
    assert response.status_code in (200, 202), response.text
    wait_until(lambda: http.get(child_path).status_code == 404, "the child to be collected")
    wait_until(lambda: http.get(owner_path).status_code == 404, "the owner to be gone")
    assert owner["metadata"]["uid"]  # the reference named this exact owner


def test_orphan_deletion_keeps_the_child_and_drops_its_owner_reference(
    http: httpx.Client, namespace: str
) -> None:
    owner = make_owner(http, namespace)
    owner_path = f"/apis/lockstep.dev/v1alpha1/namespaces/{namespace}/pddeployments/qwen-small"
    child_path = f"/api/v1/namespaces/{namespace}/configmaps/{make_child(http, owner)}"

    response = http.request(
        "DELETE",
        owner_path,
        json={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"},
    )
    assert response.status_code in (200, 202), response.text
    wait_until(lambda: http.get(owner_path).status_code == 404, "the owner to be gone")
    child = http.get(child_path)
    assert child.status_code == 200
    assert not child.json()["metadata"].get("ownerReferences")

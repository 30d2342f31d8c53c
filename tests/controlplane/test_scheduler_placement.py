"""spec.<role>.placement as the real kube-scheduler reads it: each group's pods share one
rack, and the groups spread over the racks."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from factories import pdd_obj

from lockstep.api.models import parse_pddeployment
from lockstep.core.builders import build_agent_token_secret, build_group_pods
from lockstep.core.policy import evaluate
from lockstep_dev.localcluster import LocalControlPlane
from lockstep_dev.localcluster.kubelet import ProcessKubelet

RACK = "lockstep.dev/test-rack"
RACKS = ("r0", "r0", "r1", "r1")
WAIT = 30.0


@pytest.fixture(scope="module")
def kubelet(
    controlplane: LocalControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProcessKubelet]:
    """Four fake GPU nodes; the SGLang container is a sleeping process (only where the
    scheduler binds the pods matters here)."""
    with ProcessKubelet(
        controlplane,
        nodes=len(RACKS),
        node_prefix="placement-gpu",
        root_dir=tmp_path_factory.mktemp("kubelet"),
        address_pool="127.0.97.0/24",
        commands={("lockstep-sglang",): (sys.executable, "-c", "import time; time.sleep(600)")},
        heartbeat_seconds=1.0,
    ) as running:
        yield running
        assert not running.errors


def label_racks(http: httpx.Client, nodes: list[str]) -> None:
    for node, rack in zip(nodes, RACKS, strict=True):
        response = http.patch(
            f"/api/v1/nodes/{node}",
            headers={"Content-Type": "application/merge-patch+json"},
            json={"metadata": {"labels": {RACK: rack}}},
        )
        assert response.status_code == 200, response.text


def bound(http: httpx.Client, namespace: str, names: list[str]) -> dict[str, str]:
    """Pod name -> node, for the pods the scheduler has bound so far."""
    out = {}
    for name in names:
        response = http.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        node = response.json().get("spec", {}).get("nodeName") if response.is_success else None
        if node:
            out[name] = node
    return out


@pytest.mark.timeout(90)
def test_the_scheduler_keeps_each_group_in_one_rack_and_spreads_the_groups(
    kubelet: ProcessKubelet, namespace: str, http: httpx.Client
) -> None:
    label_racks(http, kubelet.node_names)
    placement: dict[str, Any] = {
        "topologyKey": RACK,
        "spread": [{"topologyKey": RACK, "whenUnsatisfiable": "DoNotSchedule"}],
    }
    obj = pdd_obj(
        runtime={"inject": False},
        decode={"tp": 2, "gpusPerPod": 1, "podsPerGroup": 2, "replicas": 2, "placement": placement},
    )
    obj["metadata"] = {"name": "m", "namespace": namespace}  # no owner: nothing to collect
    pdd = parse_pddeployment(obj)
    policy = evaluate(pdd.spec).roles["decode"]
    secret = http.post(
        f"/api/v1/namespaces/{namespace}/secrets", json=build_agent_token_secret(pdd, "t0ken")
    )
    assert secret.status_code == 201, secret.text
    groups = [build_group_pods(pdd, "decode", g, 0, policy) for g in range(2)]
    # Every pod at once, followers first: the scheduler, not the order, must get it right.
    for body in sorted((p for g in groups for p in g), key=lambda p: p["metadata"]["name"])[::-1]:
        created = http.post(f"/api/v1/namespaces/{namespace}/pods", json=body)
        assert created.status_code == 201, created.text
    names = [p["metadata"]["name"] for g in groups for p in g]

    deadline = time.monotonic() + WAIT
    nodes = bound(http, namespace, names)
    while len(nodes) < len(names) and time.monotonic() < deadline:
        time.sleep(0.2)
        nodes = bound(http, namespace, names)
    assert len(nodes) == len(names), f"bound after {WAIT}s: {nodes}"

    rack_of = dict(zip(kubelet.node_names, RACKS, strict=True))
    racks = [{rack_of[nodes[p["metadata"]["name"]]] for p in g} for g in groups]
    assert all(len(r) == 1 for r in racks), f"a group spans racks: {nodes}"
    assert racks[0] != racks[1], f"both groups in one rack: {nodes}"
    # The kubelet's heartbeats left the labels the placement relies on in place.
    for node, rack in rack_of.items():
        labels = http.get(f"/api/v1/nodes/{node}").json()["metadata"]["labels"]
        assert labels[RACK] == rack

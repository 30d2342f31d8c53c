"""PDRoleScale: the conflict rule (every branch, across rounds and restarts), the object,
its CRD (generated, structural, in the chart) and the autoscaling examples."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from factories import REPO

from lockstep.api import constants as c
from lockstep.api.models import RoleSpec, parse_pddeployment
from lockstep.cli.main import main
from lockstep.core import rolescale as rs
from lockstep.core.builders import role_selector
from lockstep.core.crd import build_crd, build_role_scale_crd, crd_yaml, role_scale_crd_yaml

CRD_PATH = REPO / "crds/pdrolescales.lockstep.dev.yaml"
CHART_CRD_PATH = REPO / "charts/lockstep/crds/pdrolescales.lockstep.dev.yaml"
AUTOSCALING = REPO / "examples/autoscaling"
K8S_VERSIONS = ["1.30.0", "1.33.0"]
UID = "6f1c2f0e-0000-4000-8000-000000000001"
SELECTOR = {c.LABEL_DEPLOYMENT: "m", c.LABEL_ROLE: "decode", c.LABEL_RANK: "0"}


def scale_object(spec_replicas: int | None, recorded: int | None, **status: Any) -> dict[str, Any]:
    """A PDRoleScale as the API server returns it."""
    obj = rs.build_role_scale("m", "ns", UID, "decode", 1, SELECTOR)
    obj["metadata"]["resourceVersion"] = "7"
    if spec_replicas is None:
        del obj["spec"]
    else:
        obj["spec"] = {"replicas": spec_replicas}
    obj["status"] = {"replicas": 1, **status}
    if recorded is not None:
        obj["status"]["specReplicas"] = recorded
    return obj


# ---------------------------------------------------------------------- the object


def test_role_scale_name_is_deployment_dash_role() -> None:
    assert rs.role_scale_name("qwen-small", "decode") == "qwen-small-decode"
    assert rs.role_scale_name("qwen-small", "prefill") == "qwen-small-prefill"


def test_built_object_is_owned_by_the_deployment_and_carries_the_first_record() -> None:
    obj = rs.build_role_scale("m", "ns", UID, "decode", 3, SELECTOR, observed_replicas=2)
    assert obj["apiVersion"] == "lockstep.dev/v1alpha1"
    assert obj["kind"] == "PDRoleScale"
    assert obj["metadata"]["name"] == "m-decode"
    assert obj["metadata"]["namespace"] == "ns"
    assert obj["metadata"]["ownerReferences"] == [
        {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": "m",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert obj["metadata"]["labels"][c.LABEL_ROLE] == "decode"
    assert obj["metadata"]["labels"][c.LABEL_DEPLOYMENT] == "m"
    assert obj["spec"] == {"replicas": 3}
    assert obj["status"] == {
        "replicas": 2,
        "selector": "lockstep.dev/deployment=m,lockstep.dev/rank=0,lockstep.dev/role=decode",
        "specReplicas": 3,
        "source": "PDDeployment",
    }
    jsonschema.validate(obj, crd_schema())


def test_no_owner_reference_before_the_uid_is_known() -> None:
    obj = rs.build_role_scale("m", "ns", None, "prefill", 1, SELECTOR)
    assert "ownerReferences" not in obj["metadata"]


def test_unknown_role_and_out_of_range_count_are_refused() -> None:
    with pytest.raises(ValueError, match="role"):
        rs.build_role_scale("m", "ns", UID, "router", 1, SELECTOR)
    with pytest.raises(ValueError):
        rs.build_role_scale("m", "ns", UID, "decode", rs.MAX_REPLICAS + 1, SELECTOR)


def test_status_selector_is_the_roles_serving_pods() -> None:
    # One rank-0 pod per group serves HTTP and metrics: the HPA's pod count equals the
    # group count and a Pods metric averages per group.
    pdd = parse_pddeployment(yaml.safe_load((REPO / "examples/pd-small.yaml").read_text()))
    selector = rs.selector_string(role_selector(pdd, "decode"))
    assert selector == (
        "lockstep.dev/deployment=qwen-small,lockstep.dev/rank=0,lockstep.dev/role=decode"
    )


def test_scale_bound_is_the_roles_bound() -> None:
    # The person's value must always fit the scale object (rule 2 writes it there).
    role_bound = RoleSpec.model_json_schema()["properties"]["replicas"]["maximum"]
    assert role_bound == rs.MAX_REPLICAS
    spec = crd_schema()["properties"]["spec"]["properties"]["replicas"]
    assert (spec["minimum"], spec["maximum"]) == (0, role_bound)


# ------------------------------------------------------------------------ the rule


def test_rule_1_missing_scale_object_is_created_with_the_deployments_value() -> None:
    r = rs.resolve(4, None)
    assert r == rs.Resolution(
        replicas=4,
        source="PDDeployment",
        create=True,
        scale_spec_patch=None,
        status={"specReplicas": 4, "source": "PDDeployment"},
    )


def test_rule_2_a_persons_edit_wins_over_the_autoscaler() -> None:
    # Recorded 2, the HPA scaled to 5, then a person set the PDDeployment to 3.
    r = rs.resolve(3, scale_object(5, recorded=2))
    assert r.replicas == 3
    assert r.source == "PDDeployment"
    assert not r.create
    assert r.scale_spec_patch == {"spec": {"replicas": 3}}
    assert r.status == {"specReplicas": 3, "source": "PDDeployment"}


def test_rule_2_persons_edit_equal_to_the_scale_needs_no_spec_write() -> None:
    r = rs.resolve(5, scale_object(5, recorded=2))
    assert (r.replicas, r.source, r.scale_spec_patch) == (5, "PDDeployment", None)
    assert r.status["specReplicas"] == 5


def test_rule_2_nothing_recorded_the_deployment_wins() -> None:
    # E.g. a crash between create and the first status write, or status wiped.
    r = rs.resolve(2, scale_object(6, recorded=None))
    assert (r.replicas, r.source) == (2, "PDDeployment")
    assert r.scale_spec_patch == {"spec": {"replicas": 2}}


@pytest.mark.parametrize(
    "spec", [None, {}, {"replicas": "three"}, {"replicas": -1}, {"replicas": 1.0}, "not a mapping"]
)
def test_rule_2_a_malformed_scale_spec_is_rewritten(spec: Any) -> None:
    obj = scale_object(1, recorded=2)
    if spec is None:
        del obj["spec"]
    else:
        obj["spec"] = spec
    r = rs.resolve(2, obj)
    assert (r.replicas, r.source) == (2, "PDDeployment")
    assert r.scale_spec_patch == {"spec": {"replicas": 2}}


def test_rule_3_the_autoscalers_value_wins_when_the_deployment_is_unchanged() -> None:
    r = rs.resolve(2, scale_object(7, recorded=2, source="PDDeployment"))
    assert r == rs.Resolution(
        replicas=7,
        source="Scale",
        create=False,
        scale_spec_patch=None,
        status={"specReplicas": 2, "source": "Scale"},
    )


def test_rule_3_scale_to_zero_is_served() -> None:
    r = rs.resolve(2, scale_object(0, recorded=2))
    assert (r.replicas, r.source, r.scale_spec_patch) == (0, "Scale", None)


def test_rule_3_equal_values_are_the_deployments() -> None:
    r = rs.resolve(2, scale_object(2, recorded=2, source="Scale"))
    assert (r.replicas, r.source, r.scale_spec_patch) == (2, "PDDeployment", None)


@pytest.mark.parametrize(
    "extra", [{"conditions": [{"type": "X"}]}, {"source": "SomethingNewer"}, {"replicas": "?"}]
)
def test_other_status_fields_do_not_hide_the_record(extra: dict[str, Any]) -> None:
    r = rs.resolve(2, scale_object(7, recorded=2, **extra))
    assert (r.replicas, r.source) == (7, "Scale")


@pytest.mark.parametrize("recorded", ["2", True, -1, rs.MAX_REPLICAS + 1])
def test_a_malformed_record_counts_as_none(recorded: Any) -> None:
    obj = scale_object(7, recorded=None)
    obj["status"]["specReplicas"] = recorded
    r = rs.resolve(2, obj)
    assert (r.replicas, r.source, r.scale_spec_patch) == (
        2,
        "PDDeployment",
        {"spec": {"replicas": 2}},
    )


def test_status_patch_adds_the_observations() -> None:
    r = rs.resolve(2, scale_object(7, recorded=2))
    patch = rs.status_patch(r, replicas=5, ready_groups=4, selector=SELECTOR)
    assert patch == {
        "status": {
            "replicas": 5,
            "readyGroups": 4,
            "selector": rs.selector_string(SELECTOR),
            "specReplicas": 2,
            "source": "Scale",
        }
    }
    jsonschema.validate(patch["status"], crd_schema()["properties"]["status"])


# ------------------------------------------------------- rounds, crashes and restarts


class World:
    """The two objects on the API server; the operator keeps nothing between rounds."""

    def __init__(self, deployment_replicas: int) -> None:
        self.deployment_replicas = deployment_replicas
        self.scale: dict[str, Any] | None = None

    def round(self, crash_after_spec: bool = False) -> rs.Resolution:
        """One reconcile round of a freshly started operator: read both, decide, write
        the spec first, then the status (unless it crashes in between)."""
        observed = copy.deepcopy(self.scale)
        r = rs.resolve(self.deployment_replicas, observed)
        if r.create:
            obj = rs.build_role_scale("m", "ns", UID, "decode", r.replicas, SELECTOR)
            self.scale = {k: v for k, v in obj.items() if k != "status"}  # dropped on create
        elif r.scale_spec_patch is not None:
            assert self.scale is not None
            self.scale["spec"] = dict(r.scale_spec_patch["spec"])
        if crash_after_spec:
            return r
        assert self.scale is not None
        patch = rs.status_patch(r, replicas=r.replicas, ready_groups=None, selector=SELECTOR)
        self.scale["status"] = patch["status"]
        return r

    def kubectl_scale(self, replicas: int) -> None:
        assert self.scale is not None
        self.scale["spec"]["replicas"] = replicas


def test_a_story_of_edits_autoscaling_and_restarts() -> None:
    world = World(deployment_replicas=2)
    assert world.round().replicas == 2  # created
    assert world.scale is not None and world.scale["status"]["specReplicas"] == 2
    world.kubectl_scale(5)  # the HPA scales up
    assert (world.round().replicas, world.scale["status"]["source"]) == (5, "Scale")
    # Restart: a new operator with nothing in memory decides the same.
    assert world.round().replicas == 5
    assert world.round().replicas == 5
    world.deployment_replicas = 3  # a person edits the PDDeployment
    r = world.round()
    assert (r.replicas, r.source) == (3, "PDDeployment")
    assert world.scale["spec"]["replicas"] == 3
    world.kubectl_scale(4)  # the autoscaler decides again from there
    assert (world.round().replicas, world.scale["status"]["source"]) == (4, "Scale")


def test_a_crash_between_create_and_the_first_status_write_converges() -> None:
    world = World(deployment_replicas=2)
    world.round(crash_after_spec=True)
    assert world.scale is not None and "status" not in world.scale
    world.kubectl_scale(6)  # the HPA acts before the record exists: the person wins once
    assert (world.round().replicas, world.scale["spec"]["replicas"]) == (2, 2)
    world.kubectl_scale(6)
    assert world.round().replicas == 6


def test_a_crash_between_the_spec_and_the_record_keeps_the_persons_edit() -> None:
    world = World(deployment_replicas=2)
    world.round()
    world.kubectl_scale(5)
    world.round()
    world.deployment_replicas = 3
    world.round(crash_after_spec=True)  # spec written, record still 2
    r = world.round()  # after the restart: rule 2 again, same outcome
    assert (r.replicas, r.source) == (3, "PDDeployment")
    assert world.scale is not None
    assert world.scale["status"]["specReplicas"] == 3
    assert world.round().replicas == 3


# ---------------------------------------------------------------------------- CRD


def crd_schema() -> dict[str, Any]:
    s: dict[str, Any] = build_role_scale_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return s


def test_committed_crd_matches_the_models() -> None:
    assert CRD_PATH.read_text() == role_scale_crd_yaml(), (
        "crds/pdrolescales.lockstep.dev.yaml is stale: run `make crd`"
    )


def test_chart_ships_the_generated_crd() -> None:
    assert CHART_CRD_PATH.read_bytes() == CRD_PATH.read_bytes(), (
        "charts/lockstep/crds/pdrolescales.lockstep.dev.yaml differs from crds/: "
        "run `make crd` (it runs .ci/sync-chart-crd)"
    )


def test_crd_has_the_scale_subresource_names_and_columns() -> None:
    crd = build_role_scale_crd()
    assert crd["metadata"]["name"] == "pdrolescales.lockstep.dev"
    spec = crd["spec"]
    assert spec["group"] == c.GROUP and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "PDRoleScale"
    assert spec["names"]["shortNames"] == ["pdrs"]
    version = spec["versions"][0]
    assert version["name"] == c.VERSION
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {col["name"]: col["jsonPath"] for col in version["additionalPrinterColumns"]}
    assert columns == {
        "Replicas": ".spec.replicas",
        "Ready": ".status.readyGroups",
        "Source": ".status.source",
        "Age": ".metadata.creationTimestamp",
    }


def test_crd_schema_is_structural_and_rejects_what_the_models_reject() -> None:
    schema = crd_schema()
    for node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "nullable" not in node
    obj = rs.build_role_scale("m", "ns", UID, "decode", 1, SELECTOR)
    for bad in ({"replicas": -1}, {"replicas": rs.MAX_REPLICAS + 1}, {}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**obj, "spec": bad}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**obj, "status": {"source": "Someone"}}, schema)


def _walk(node: Any) -> list[dict[str, Any]]:
    out = []
    if isinstance(node, dict):
        out.append(node)
        for v in node.values():
            out.extend(_walk(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_walk(v))
    return out


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_crd_is_a_valid_kubernetes_object(version: str) -> None:
    kubernetes_validate.validate(yaml.safe_load(CRD_PATH.read_text()), version, strict=True)


def test_cli_prints_each_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd", "--kind", "PDRoleScale"]) == 0
    assert capsys.readouterr().out == CRD_PATH.read_text()
    assert main(["crd"]) == 0  # unchanged: the Makefile writes the PDDeployment's
    assert capsys.readouterr().out == crd_yaml()
    assert build_crd()["spec"]["names"]["kind"] == "PDDeployment"


# ----------------------------------------------------------------------- examples


def example_docs() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(AUTOSCALING.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[f"{path.name}:{doc['kind']}"] = doc
    return docs


def example_deployment() -> dict[str, Any]:
    deployment: dict[str, Any] = example_docs()["pd-autoscaled.yaml:PDDeployment"]
    return deployment


def test_example_deployment_is_accepted_and_exports_metrics(tmp_path: Path) -> None:
    pdd = example_deployment()
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(pdd))
    assert main(["check", "-f", str(path)]) == 0
    assert "--enable-metrics" in pdd["spec"]["decode"]["args"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_hpa_example_is_valid_and_targets_the_decode_role_scale(version: str) -> None:
    hpa = example_docs()["hpa-decode.yaml:HorizontalPodAutoscaler"]
    kubernetes_validate.validate(hpa, version, strict=True)
    deployment = example_deployment()
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": c.API_VERSION,
        "kind": rs.KIND,
        "name": rs.role_scale_name(deployment["metadata"]["name"], "decode"),
    }
    assert hpa["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    metric = hpa["spec"]["metrics"][0]
    assert metric["type"] == "Pods"
    # The name prometheus-adapter serves for SGLang's `sglang:num_running_reqs`.
    adapter = example_docs()["hpa-decode.yaml:ConfigMap"]
    assert "sglang:num_running_reqs" in adapter["data"]["config.yaml"]
    assert metric["pods"]["metric"]["name"] == "sglang_num_running_reqs"


def test_keda_example_targets_the_decode_role_scale() -> None:
    scaled = example_docs()["keda-decode.yaml:ScaledObject"]
    deployment = example_deployment()
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": c.API_VERSION,
        "kind": rs.KIND,
        "name": rs.role_scale_name(deployment["metadata"]["name"], "decode"),
    }
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert "sglang:num_running_reqs" in trigger["metadata"]["query"]
    assert scaled["spec"]["minReplicaCount"] >= 1  # a PD deployment needs a decode group


def test_pod_monitor_example_scrapes_the_roles_serving_pods() -> None:
    monitor = example_docs()["pd-autoscaled.yaml:PodMonitor"]
    pdd = parse_pddeployment(example_deployment())
    labels = monitor["spec"]["selector"]["matchLabels"]
    assert labels[c.LABEL_DEPLOYMENT] == pdd.metadata.name
    assert labels[c.LABEL_RANK] == "0"  # only rank 0 serves HTTP (and /metrics)
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"

"""The CRD is generated from the models, structural, and the examples fit its schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from factories import GOOD_EXAMPLES, REPO, UNSAFE_EXAMPLES

from lockstep.core.crd import build_crd, crd_yaml

CRD_PATH = REPO / "crds/pddeployments.lockstep.dev.yaml"


def test_committed_crd_matches_the_models() -> None:
    assert CRD_PATH.read_text() == crd_yaml(), (
        "crds/pddeployments.lockstep.dev.yaml is stale: run `make crd`"
    )


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for k, v in node.items():
            out.extend(walk(v, f"{path}/{k}"))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(walk(v, f"{path}/{i}"))
    return out


def schema() -> dict[str, Any]:
    s: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return s


def test_schema_is_structural() -> None:
    for path, node in walk(schema()):
        assert "$ref" not in node, path
        assert "anyOf" not in node and "oneOf" not in node, path
        assert "nullable" not in node, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if path.endswith("/properties"):
            for name, prop in node.items():
                assert "type" in prop or prop.get("x-kubernetes-int-or-string"), f"{path}/{name}"


def test_crd_names_subresource_and_columns() -> None:
    crd = build_crd()
    spec = crd["spec"]
    assert spec["names"]["shortNames"] == ["pdd"]
    assert "lockstep" in spec["names"]["categories"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Prefill"] == ".status.prefillReady"
    assert columns["Decode"] == ".status.decodeReady"
    assert columns["Incidents"] == ".status.openIncidents"
    assert "Age" in columns


def test_cross_field_rules_are_also_cel_rules() -> None:
    role = schema()["properties"]["spec"]["properties"]["decode"]
    rules = [r["rule"] for r in role["x-kubernetes-validations"]]
    assert "self.tp == self.gpusPerPod * self.podsPerGroup" in rules


@pytest.mark.parametrize("path", GOOD_EXAMPLES + UNSAFE_EXAMPLES, ids=lambda p: p.name)
def test_examples_fit_the_crd_schema(path: Path) -> None:
    # The unsafe examples are schema-valid too: they are refused by the flag policy.
    jsonschema.validate(yaml.safe_load(path.read_text()), schema())


def test_crd_schema_rejects_what_the_models_reject() -> None:
    obj = yaml.safe_load(GOOD_EXAMPLES[0].read_text())
    obj["spec"]["safety"] = {"mode": "Sometimes"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, schema())

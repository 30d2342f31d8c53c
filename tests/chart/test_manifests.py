"""Everything lockstep renders passes `kubernetes-validate --strict` for 1.30 and 1.33."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from factories import GOOD_EXAMPLES, REPO

from lockstep.api.models import parse_pddeployment
from lockstep.core.builders import build_all

VERSIONS = ["1.30.0", "1.33.0"]


def validate(obj: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        kind, name = obj.get("kind"), obj.get("metadata", {}).get("name")
        pytest.fail(
            f"{kind}/{name} invalid for Kubernetes {version}: {err.message} at {list(err.path)}"
        )


@pytest.mark.parametrize("version", VERSIONS)
def test_crd_is_a_valid_kubernetes_object(version: str) -> None:
    crd = yaml.safe_load((REPO / "crds/pddeployments.lockstep.dev.yaml").read_text())
    validate(crd, version)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", GOOD_EXAMPLES, ids=lambda p: p.name)
def test_rendered_examples_are_valid_kubernetes_objects(path: Path, version: str) -> None:
    obj = yaml.safe_load(path.read_text())
    obj["metadata"]["uid"] = "6f1c2f0e-0000-4000-8000-000000000001"
    objects = build_all(parse_pddeployment(obj))
    assert objects
    for rendered in objects:
        validate(rendered, version)


def test_strict_validation_catches_a_broken_object() -> None:
    # The check itself must be able to fail: an unknown pod field is refused.
    obj = yaml.safe_load(GOOD_EXAMPLES[0].read_text())
    pod = next(o for o in build_all(parse_pddeployment(obj)) if o["kind"] == "Pod")
    pod["spec"]["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, VERSIONS[0], strict=True)

"""The drill deployment every scenario runs (`examples/local-drill.yaml`: one prefill
group, two decode groups of TP2 spanning two pods each), its names, and the recovery
steps the drills watch for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import yaml

from lockstep_dev.localcluster.controlplane import repo_root

RecoveryMode = Literal["InPlace", "Recreate"]
NAMESPACE = "lockstep-drill"
NAME = "drill"
# The group every scenario injects its fault into (both decode groups for `concurrent`).
AFFECTED = "decode/0"
RESTARTING_STEPS = (
    "RestartingInPlace",
    "Deleting",
    "WaitingGone",
    "Creating",
    "WaitingProbe",
    "Readmitting",
)
# The local cluster of the scenarios that need more nodes than the default cluster's, in
# labelled pools (6 nodes in 2 racks).
MORE_NODES: Mapping[str, Any] = {"nodes": 6, "racks": 2}


def drill_spec(**spec_overrides: Any) -> dict[str, Any]:
    """The drill deployment (examples/local-drill.yaml), with spec keys overridden."""
    root = repo_root()
    assert root is not None
    obj: dict[str, Any] = yaml.safe_load((root / "examples/local-drill.yaml").read_text())
    obj["metadata"]["namespace"] = NAMESPACE
    for key, value in spec_overrides.items():
        if isinstance(value, dict) and isinstance(obj["spec"].get(key), dict):
            obj["spec"][key] = {**obj["spec"][key], **value}
        else:
            obj["spec"][key] = value
    return obj


def base_health() -> dict[str, Any]:
    """The drill deployment's `health` (to override one key of it)."""
    return dict(drill_spec()["spec"]["health"])


def group_key(incident: Mapping[str, Any]) -> str:
    """`decode/0` for an incident of decode group 0."""
    return f"{incident['role']}/{incident['group']}"


def required_node_terms(expression: Mapping[str, Any]) -> dict[str, Any]:
    """A required node affinity of one match expression."""
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [dict(expression)]}]
        }
    }

"""Test object builders: the one place tests get PDDeployment objects from."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
GOOD_EXAMPLES = sorted(EXAMPLES.glob("*.yaml"))
UNSAFE_EXAMPLES = sorted((EXAMPLES / "unsafe").glob("*.yaml"))


def load_example(name: str) -> dict[str, Any]:
    """An example manifest as a dict (`pd-small`, `unsafe/overlap-schedule`, ...)."""
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return data


def pdd_obj(**spec_overrides: Any) -> dict[str, Any]:
    """A minimal valid PDDeployment dict (TP1 roles, so no guard rules fire), with
    top-level spec keys replaced by `spec_overrides`."""
    obj: dict[str, Any] = {
        "apiVersion": "lockstep.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": "m", "namespace": "ns", "uid": "0000-uid"},
        "spec": {
            "model": {"path": "/models/m"},
            "image": "registry.local/sglang:0.5.23-lockstep",
            "prefill": {"tp": 1, "gpusPerPod": 1},
            "decode": {"tp": 1, "gpusPerPod": 1},
        },
    }
    obj["spec"].update(copy.deepcopy(spec_overrides))
    return obj


def with_path(obj: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of `obj` with the value at a dotted path set (creating mappings)."""
    out = copy.deepcopy(obj)
    node = out
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out

"""Generate the CustomResourceDefinitions from the pydantic models: the PDDeployment
(`lockstep.api.models`) and the per-role scale target PDRoleScale (`lockstep.core.rolescale`).

pydantic writes JSON Schema (2020-12 flavour: `$ref`/`$defs`, `anyOf` with `null` for
optional fields, `title`s, `additionalProperties: false`). The API server wants a
*structural* OpenAPI v3 schema: every node typed, no `$ref`, no `anyOf` over types, and no
`additionalProperties` beside `properties`. `structural_schema` rewrites one into the
other; `build_crd` and `build_role_scale_crd` wrap it with the subresources, printer
columns and names.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import yaml

from lockstep.api import constants as c
from lockstep.api.models import PDDeploymentSpec, PDDeploymentStatus
from lockstep.core import rolescale

# Keys of JSON Schema the CRD's JSONSchemaProps does not accept, or that carry nothing.
_DROP = {"title", "$defs"}


def structural_schema(model: type[Any]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model, every `$ref` inlined."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema: dict[str, Any] = _rewrite(raw, defs)
    return schema


def _rewrite(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_rewrite(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _rewrite(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", 0) is None:
            del rest["default"]
        if len(options) == 1:
            # Optional[X]: the field is simply not required.
            return _rewrite({**options[0], **rest}, defs)
        if {o.get("type") for o in options} == {"integer", "string"}:
            return _rewrite({**rest, "x-kubernetes-int-or-string": True}, defs)
        raise ValueError(f"cannot express anyOf {options} structurally")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _rewrite(v, defs) for name, v in value.items()}
        elif key == "additionalProperties":
            if value is False:
                continue  # unknown fields are pruned / rejected by the server already
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
                continue
            out[key] = _rewrite(value, defs)
        elif key == "items":
            out[key] = _rewrite(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum", "const", "examples"):
            raise ValueError(f"{key} is not structural OpenAPI v3; use ge/le or an enum")
        else:
            out[key] = value
    if out.get("x-kubernetes-preserve-unknown-fields") and "type" not in out:
        out["type"] = "object"
    if "default" in out and out.get("default") is None:
        del out["default"]
    return out


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Prefill",
        "type": "string",
        "jsonPath": ".status.prefillReady",
        "description": "Ready/desired prefill groups",
    },
    {
        "name": "Decode",
        "type": "string",
        "jsonPath": ".status.decodeReady",
        "description": "Ready/desired decode groups",
    },
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {
        "name": "Incidents",
        "type": "integer",
        "jsonPath": ".status.openIncidents",
        "description": "Open incidents",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        # Why the deployment is degraded (a group's runtime refusing to start, broken or
        # quarantined groups); empty while it is not.
        "name": "Problem",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Degraded")].message',
        "description": "Why the deployment is degraded (the Degraded condition's message)",
    },
]


def build_crd() -> dict[str, Any]:
    """The PDDeployment CRD as a Kubernetes object."""
    return _crd(
        names=(c.PLURAL, c.SINGULAR, c.KIND, c.SHORT_NAME),
        description="A model served by SGLang prefill and decode TP groups and a router, "
        "kept in lockstep by the lockstep operator.",
        spec=structural_schema(PDDeploymentSpec),
        status=structural_schema(PDDeploymentStatus),
        columns=PRINTER_COLUMNS,
        subresources={"status": {}},
    )


def _crd(
    *,
    names: tuple[str, str, str, str],
    description: str,
    spec: dict[str, Any],
    status: dict[str, Any],
    columns: list[dict[str, Any]],
    subresources: dict[str, Any],
) -> dict[str, Any]:
    """The skeleton every lockstep CRD shares: namespaced, one served and stored version
    of the lockstep.dev group, `spec` required; `names` is (plural, singular, kind, short
    name)."""
    plural, singular, kind, short = names
    schema = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{c.GROUP}",
            "labels": {c.APP_NAME: "lockstep", c.APP_MANAGED_BY: "lockstep"},
        },
        "spec": {
            "group": c.GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": plural,
                "singular": singular,
                "kind": kind,
                "listKind": f"{kind}List",
                "shortNames": [short],
                "categories": ["lockstep", "sglang"],
            },
            "versions": [
                {
                    "name": c.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML committed in crds/ (and the chart)."""
    header = "# Generated by `lockstep crd` from operator/lockstep/api/models/. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)


ROLE_SCALE_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Replicas",
        "type": "integer",
        "jsonPath": ".spec.replicas",
        "description": "Desired groups of the role",
    },
    {
        "name": "Ready",
        "type": "integer",
        "jsonPath": ".status.readyGroups",
        "description": "Groups that are Healthy and admitted",
    },
    {
        "name": "Source",
        "type": "string",
        "jsonPath": ".status.source",
        "description": "Whose count is served: PDDeployment (a person) or Scale (autoscaler)",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_role_scale_crd() -> dict[str, Any]:
    """The PDRoleScale CRD: one scale target per role of a PDDeployment."""
    return _crd(
        names=(rolescale.PLURAL, rolescale.SINGULAR, rolescale.KIND, rolescale.SHORT_NAME),
        description="The scale target of one role (prefill or decode) of a PDDeployment, "
        "for the HorizontalPodAutoscaler, KEDA and `kubectl scale`; created and owned by "
        "the lockstep operator.",
        spec=structural_schema(rolescale.PDRoleScaleSpec),
        status=structural_schema(rolescale.PDRoleScaleStatus),
        columns=ROLE_SCALE_PRINTER_COLUMNS,
        subresources={
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
    )


def role_scale_crd_yaml() -> str:
    """The PDRoleScale CRD as the YAML committed in crds/ (and the chart)."""
    header = (
        "# Generated by `lockstep crd --kind PDRoleScale` from operator/lockstep/core/rolescale.py."
        " Do not edit.\n"
    )
    return header + yaml.safe_dump(build_role_scale_crd(), sort_keys=False, width=100)


# `lockstep crd --kind KIND`: every CRD lockstep ships, by kind.
CRD_YAML_BY_KIND: dict[str, Callable[[], str]] = {
    c.KIND: crd_yaml,
    rolescale.KIND: role_scale_crd_yaml,
}

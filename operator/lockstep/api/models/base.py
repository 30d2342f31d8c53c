"""What every model of the custom resource shares: the base model (camelCase aliases,
extra fields refused) and the patterns and bounds several fields use."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, WithJsonSchema
from pydantic.alias_generators import to_camel

# Kubernetes resource quantities are written as integers or strings ("8", 8, "64Gi").
Quantity = Annotated[
    int | str,
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]

# metadata.name feeds pod names `<name>-<role>-<group>[b]-<rank>` (hostnames: DNS-1123
# labels of at most 63 characters; up to 16 characters longer than the name with 512
# groups of 32 pods), per-group Service names (DNS-1035 labels) and the Kueue pod-group
# label `<name>-<role>-<group>-e<epoch>` (a label value of at most 63 characters: 40 keeps
# nine digits of epoch).
MAX_NAME_LENGTH = 40

SGLANG_VERSION_PATTERN = r"^\d+\.\d+\.\d+$"

# Kueue's queue-name label names a LocalQueue: a DNS-1123 subdomain, and a label value of
# at most 63 characters (the CRD carries the same pattern).
KUEUE_QUEUE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class CRDModel(BaseModel):
    """The base of every lockstep custom resource's schema model (PDDeployment,
    PDRoleScale): camelCase on the wire, unknown fields refused, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )


def _obj_default() -> dict[str, Any]:
    """Schema extra so the API server fills a nested object's defaults when omitted."""
    return {"default": {}}

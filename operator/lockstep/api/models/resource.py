"""The PDDeployment itself: its spec, its metadata as the operator reads it, the object."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lockstep.api.models.base import SGLANG_VERSION_PATTERN, CRDModel, _obj_default
from lockstep.api.models.operations import (
    HealthSpec,
    MaintenanceSpec,
    RecoverySpec,
    RuntimeSpec,
    SafetySpec,
)
from lockstep.api.models.roles import ModelSpec, RoleSpec, RouterSpec, TransferSpec
from lockstep.api.models.status import PDDeploymentStatus


class PDDeploymentSpec(CRDModel):
    """A model served by prefill groups, decode groups and a router."""

    model: ModelSpec = Field(description="The model.")
    image: str = Field(
        min_length=1,
        description="The SGLang image: a stock one (lmsysorg/sglang, lockstep's runtime is "
        "injected, see runtime) or one that carries the runtime (runtime.inject: false).",
    )
    runtime: RuntimeSpec = Field(
        default_factory=RuntimeSpec,
        description="How lockstep's runtime gets into the SGLang pods.",
        json_schema_extra=_obj_default(),
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy."
    )
    sglang_version: str | None = Field(
        None,
        pattern=SGLANG_VERSION_PATTERN,
        description="The SGLang release inside spec.image (the flag table, rules and pins "
        "it is judged by); default: the release the image tag names (v0.5.23-cu130), else "
        "the newest supported. The launcher refuses an image that runs another release.",
    )
    transfer: TransferSpec = Field(
        default_factory=TransferSpec,
        description="KV transfer between prefill and decode.",
        json_schema_extra=_obj_default(),
    )
    prefill: RoleSpec = Field(description="Prefill groups.")
    decode: RoleSpec = Field(description="Decode groups.")
    router: RouterSpec = Field(
        default_factory=RouterSpec, description="The router.", json_schema_extra=_obj_default()
    )
    safety: SafetySpec = Field(
        default_factory=SafetySpec,
        description="SGLang flag policy.",
        json_schema_extra=_obj_default(),
    )
    health: HealthSpec = Field(
        default_factory=HealthSpec, description="Deep probe.", json_schema_extra=_obj_default()
    )
    recovery: RecoverySpec = Field(
        default_factory=RecoverySpec,
        description="Recovery of broken groups.",
        json_schema_extra=_obj_default(),
    )
    maintenance: MaintenanceSpec = Field(
        default_factory=MaintenanceSpec,
        description="Node maintenance: how groups move off cordoned or drained nodes.",
        json_schema_extra=_obj_default(),
    )
    paused: bool = Field(False, description="Paused: no reconcile, no recovery; replicas may be 0.")

    def role(self, name: str) -> RoleSpec:
        """The spec of role `prefill` or `decode`."""
        if name == "prefill":
            return self.prefill
        if name == "decode":
            return self.decode
        raise KeyError(name)

    def transfer_for(self, role: str) -> TransferSpec:
        """The transfer settings a role uses (its override, else spec.transfer)."""
        return self.role(role).transfer or self.transfer


class ObjectMeta(BaseModel):
    """The metadata fields lockstep reads; everything else is kept as is."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PDDeployment(CRDModel):
    """A PDDeployment object as stored by the API server."""

    api_version: str = Field(alias="apiVersion")
    kind: str
    metadata: ObjectMeta
    spec: PDDeploymentSpec
    status: PDDeploymentStatus | None = None

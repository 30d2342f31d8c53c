"""The PDDeployment custom resource (`lockstep.dev/v1alpha1`) as pydantic models.

These models are the one source of the API: the CRD's OpenAPI schema is generated from
them (`lockstep.core.crd`), the CLI and the admission webhook validate with them, and the
operator reads specs and writes status through them. Field names are camelCase on the
wire (aliases) and snake_case in Python.

Validation happens in two passes, both reported with the field path and the fix:
1. the schema (types, enums, bounds, unknown fields) by pydantic;
2. cross-field rules (`cross_field_problems`), e.g. `tp == gpusPerPod * podsPerGroup`,
   and Kubernetes' own rules (`lockstep.api.k8s_rules`) for every value that goes into a
   Kubernetes object: names, label keys and values, node selectors, tolerations,
   quantities, env var names and sources, image references, paths in the container.
`parse_pddeployment` runs both and raises `InvalidPDDeployment` listing every problem.
"""

from __future__ import annotations

from lockstep.api.models.base import (
    KUEUE_QUEUE_PATTERN,
    MAX_NAME_LENGTH,
    SGLANG_VERSION_PATTERN,
    CRDModel,
    Quantity,
)
from lockstep.api.models.operations import (
    BackoffSpec,
    BudgetSpec,
    DiagnosticsSpec,
    EndedKVSpec,
    HealthSpec,
    InPlaceSpec,
    MaintenanceSpec,
    PairProbeSpec,
    RecoverySpec,
    RuntimeSpec,
    SafetySpec,
    StepBoundsSpec,
    SuspectNodesSpec,
)
from lockstep.api.models.resource import ObjectMeta, PDDeployment, PDDeploymentSpec
from lockstep.api.models.roles import (
    NODE_AFFINITY_FIELDS,
    EnvVar,
    GangSpec,
    KueueGang,
    ModelSpec,
    PlacementSpec,
    Resources,
    RoleSpec,
    RouterSpec,
    SpreadSpec,
    Toleration,
    TransferSpec,
    WeightsVolume,
)
from lockstep.api.models.status import (
    Condition,
    GroupState,
    GroupStatus,
    Incident,
    IncidentOutlier,
    OperatorStatus,
    PairStatus,
    PDDeploymentStatus,
    PolicyFinding,
    ProbeResult,
    RoleStatus,
)
from lockstep.api.models.validation import (
    GPU_RESOURCE,
    RESERVED_MOUNT_PATHS,
    InvalidPDDeployment,
    SpecProblem,
    cross_field_problems,
    kubernetes_problems,
    parse_pddeployment,
    with_runtime_image,
)

__all__ = [
    "GPU_RESOURCE",
    "KUEUE_QUEUE_PATTERN",
    "MAX_NAME_LENGTH",
    "NODE_AFFINITY_FIELDS",
    "RESERVED_MOUNT_PATHS",
    "SGLANG_VERSION_PATTERN",
    "BackoffSpec",
    "BudgetSpec",
    "CRDModel",
    "Condition",
    "DiagnosticsSpec",
    "EndedKVSpec",
    "EnvVar",
    "GangSpec",
    "GroupState",
    "GroupStatus",
    "HealthSpec",
    "InPlaceSpec",
    "Incident",
    "IncidentOutlier",
    "InvalidPDDeployment",
    "KueueGang",
    "MaintenanceSpec",
    "ModelSpec",
    "ObjectMeta",
    "OperatorStatus",
    "PDDeployment",
    "PDDeploymentSpec",
    "PDDeploymentStatus",
    "PairProbeSpec",
    "PairStatus",
    "PlacementSpec",
    "PolicyFinding",
    "ProbeResult",
    "Quantity",
    "RecoverySpec",
    "Resources",
    "RoleSpec",
    "RoleStatus",
    "RouterSpec",
    "RuntimeSpec",
    "SafetySpec",
    "SpecProblem",
    "SpreadSpec",
    "StepBoundsSpec",
    "SuspectNodesSpec",
    "Toleration",
    "TransferSpec",
    "WeightsVolume",
    "cross_field_problems",
    "kubernetes_problems",
    "parse_pddeployment",
    "with_runtime_image",
]

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

import difflib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema
from pydantic.alias_generators import to_camel

from lockstep.api import constants as c
from lockstep.api import k8s_rules as k8s

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


# ---------------------------------------------------------------------------- spec


class WeightsVolume(CRDModel):
    """Where the model weights come from, mounted read-only into every SGLang pod."""

    persistent_volume_claim: str | None = Field(
        None, description="Name of a PersistentVolumeClaim holding the weights."
    )
    host_path: str | None = Field(
        None, description="A directory on the node holding the weights (local NVMe cache)."
    )
    mount_path: str = Field("/models", description="Where the weights appear inside the container.")


class ModelSpec(CRDModel):
    """The model served by every prefill and decode group."""

    path: str = Field(
        min_length=1, description="`--model-path` for SGLang: a path inside the container."
    )
    served_name: str | None = Field(
        None, description="`--served-model-name`: the name clients and the router use."
    )
    weights: WeightsVolume | None = Field(None, description="The volume with the weights.")


class TransferSpec(CRDModel):
    """KV-cache transfer between prefill and decode."""

    backend: Literal["mooncake", "nixl"] = Field(
        "mooncake", description="`--disaggregation-transfer-backend`."
    )
    devices: list[str] = Field(
        default_factory=list,
        description="RDMA devices for `--disaggregation-ib-device` (empty: backend default).",
    )


class EnvVar(CRDModel):
    """An environment variable for the SGLang container."""

    name: str = Field(min_length=1, description="Variable name.")
    value: str | None = Field(None, description="Literal value.")
    value_from: dict[str, Any] | None = Field(
        None,
        description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, ...).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class Resources(CRDModel):
    """Extra container resources; the operator adds `nvidia.com/gpu: gpusPerPod`."""

    requests: dict[str, Quantity] = Field(default_factory=dict, description="Requests.")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Limits.")


class Toleration(CRDModel):
    """A Kubernetes toleration."""

    key: str | None = Field(None, description="Taint key.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Match operator.")
    value: str | None = Field(None, description="Taint value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect (empty: all)."
    )
    toleration_seconds: int | None = Field(None, ge=0, description="For NoExecute.")


# The fields of a Kubernetes NodeAffinity (placement.nodeAffinity is passed through).
NODE_AFFINITY_FIELDS = frozenset(
    {
        "requiredDuringSchedulingIgnoredDuringExecution",
        "preferredDuringSchedulingIgnoredDuringExecution",
    }
)


class SpreadSpec(CRDModel):
    """How a role's groups spread over the domains of one node label."""

    topology_key: str = Field(
        min_length=1,
        max_length=317,
        description="The node label whose values are the domains (e.g. "
        "topology.kubernetes.io/zone, topology.kubernetes.io/rack).",
    )
    max_skew: int = Field(
        1,
        ge=1,
        le=512,
        description="The most the number of groups in one domain may exceed the number in "
        "the emptiest one.",
    )
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        "ScheduleAnyway",
        description="DoNotSchedule: a group that would break maxSkew stays Pending; "
        "ScheduleAnyway: the skew is only a preference of the scheduler.",
    )


class KueueGang(CRDModel):
    """A Kueue plain-pod group per group and epoch."""

    queue_name: str = Field(
        min_length=1,
        max_length=63,
        pattern=KUEUE_QUEUE_PATTERN,
        description="The Kueue LocalQueue of this role's pods (label kueue.x-k8s.io/queue-name): "
        "a lowercase DNS-1123 subdomain of at most 63 characters.",
    )


class GangSpec(CRDModel):
    """All-or-nothing admission of one group's pods."""

    kueue: KueueGang | None = Field(
        None,
        description="Admit each group's pods of one epoch as one Kueue plain-pod group "
        "(labels kueue.x-k8s.io/queue-name and kueue.x-k8s.io/pod-group-name "
        "<name>-<role>-<group>-e<epoch>, annotation kueue.x-k8s.io/pod-group-total-count "
        "podsPerGroup): Kueue releases the pods only when the whole group fits. Kueue "
        "must manage pods of this namespace (its pod integration).",
    )


class PlacementSpec(CRDModel):
    """Where a role's pods may run: a group whole inside one topology domain, groups
    spread over domains, node affinity, and gang admission."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # The API server refuses a pod with two spread constraints on one key.
                    "rule": "!has(self.spread) || self.spread.all(a, "
                    "self.spread.exists_one(b, b.topologyKey == a.topologyKey))",
                    "message": "spread lists a topologyKey more than once",
                }
            ]
        }
    )

    topology_key: str | None = Field(
        None,
        min_length=1,
        max_length=317,
        description="A node label (e.g. topology.kubernetes.io/rack, nvidia.com/gpu.clique) "
        "within which all pods of one group of one epoch must land: each pod gets a "
        "required pod affinity to its group's epoch on this key (the group's leader may "
        "land anywhere, the other ranks follow it). Nodes without the label are not "
        "used. Unset: the pods of a group may land anywhere.",
    )
    spread: list[SpreadSpec] = Field(
        default_factory=list,
        max_length=8,
        description="How the role's groups spread over domains (zones, racks): a "
        "topologySpreadConstraint per entry on each group's leader (rank-0) pod, counting "
        "the role's leader pods, so each group counts once. The other ranks are placed "
        "by topologyKey: without it only the leaders spread.",
    )
    node_affinity: dict[str, Any] | None = Field(
        None,
        description="A Kubernetes NodeAffinity (requiredDuringSchedulingIgnoredDuring"
        "Execution, preferredDuringSchedulingIgnoredDuringExecution) for the role's pods, "
        "as is. The operator appends its own preferences (nodes to avoid after a "
        "recreate).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    scheduler_name: str | None = Field(
        None,
        min_length=1,
        description="The pods' schedulerName (e.g. a gang scheduler); unset: the default "
        "scheduler.",
    )
    gang: GangSpec | None = Field(
        None,
        description="Gang admission of each group (all pods of an epoch or none). Kueue is "
        "the supported gang scheduler (gang.kueue); another one is used through "
        "schedulerName and its own admission (pod group objects, labels) that lockstep "
        "does not write.",
    )
    scheduling_timeout_seconds: int = Field(
        300,
        ge=10,
        le=86400,
        description="How long every pod of a group's epoch may take to be bound to a node. "
        "Past it the epoch is withdrawn whole (every pod deleted, nothing left holding "
        "GPUs) and retried, so a group never waits half-placed.",
    )


class RoleSpec(CRDModel):
    """One role (prefill or decode): `replicas` TP groups of `podsPerGroup` pods each."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.tp == self.gpusPerPod * self.podsPerGroup",
                    "message": "tp must equal gpusPerPod * podsPerGroup",
                },
                {
                    "rule": "!self.dpAttention || self.dp > 1",
                    "message": "dpAttention needs dp > 1",
                },
            ]
        }
    )

    replicas: int = Field(
        1, ge=0, le=512, description="Number of TP groups (SGLang instances) of this role."
    )
    spares: int = Field(
        0,
        ge=0,
        le=64,
        description=(
            "Warm spare groups beside `replicas`: started, deep-probed and kept out of "
            "every router; one is admitted at once when a serving group breaks, moves for "
            "maintenance or the role scales up, and the group it replaces becomes the "
            "spare. Each costs a group's GPUs."
        ),
    )
    tp: int = Field(ge=1, le=256, description="Tensor-parallel size of one group.")
    pods_per_group: int = Field(
        1, ge=1, le=32, description="Pods (nodes) one TP group spans (SGLang --nnodes)."
    )
    gpus_per_pod: int = Field(ge=1, le=16, description="GPUs per pod (nvidia.com/gpu).")
    dp: int = Field(1, ge=1, le=256, description="Data-parallel size (--dp-size).")
    dp_attention: bool = Field(False, description="DP attention (--attn-dp-size dp); needs dp > 1.")
    ep: int = Field(1, ge=1, le=256, description="Expert-parallel size (--ep-size).")
    args: list[str] = Field(
        default_factory=list,
        description="Extra SGLang server flags; checked against the pinned SGLang's flags.",
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment.")
    resources: Resources = Field(
        default_factory=Resources,
        description="Extra resources (GPUs are set from gpusPerPod).",
        json_schema_extra=_obj_default(),
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node selector for this role's pods."
    )
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations.")
    priority_class_name: str | None = Field(None, description="PriorityClass of the pods.")
    transfer: TransferSpec | None = Field(
        None, description="Per-role override of spec.transfer (must match the other role)."
    )
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec,
        description="Where the groups run: one topology domain per group, spread of groups, "
        "node affinity, scheduler and gang admission, and the binding deadline.",
        json_schema_extra=_obj_default(),
    )


class RouterSpec(CRDModel):
    """The sglang-router in PD mode in front of the groups."""

    enabled: bool = Field(True, description="Deploy the router.")
    image: str | None = Field(
        None, description="Router image (default: spec.image, which ships sglang-router)."
    )
    replicas: int = Field(1, ge=0, le=64, description="Router replicas.")
    policy: Literal["cache_aware", "round_robin", "random", "power_of_two"] = Field(
        "round_robin", description="Load-balancing policy (--policy)."
    )
    args: list[str] = Field(default_factory=list, description="Extra router flags.")


class SafetySpec(CRDModel):
    """The SGLang flag policy: how unsafe flags are handled."""

    mode: Literal["Enforce", "Reject", "Warn"] = Field(
        "Enforce",
        description="Enforce: adjust unsafe flags and report; Reject: refuse the spec; "
        "Warn: report only.",
    )
    overlap_schedule: Literal["Disabled", "Guarded"] = Field(
        "Disabled",
        description="Disabled: force --disable-overlap-schedule on TP>1 PD roles without "
        "DP attention; Guarded: keep overlap on, guarded by the rank consensus checker.",
    )
    watchdog_timeout_seconds: int = Field(
        300, ge=10, le=3600, description="--watchdog-timeout the operator sets."
    )
    max_watchdog_timeout_seconds: int = Field(
        3600, ge=10, le=86400, description="Largest --watchdog-timeout a user may set."
    )
    dist_timeout_seconds: int = Field(
        600,
        ge=10,
        le=c.MAX_DIST_TIMEOUT_SECONDS,
        description="--dist-timeout the operator sets when missing.",
    )
    gloo_timeout_seconds: int = Field(
        120, ge=5, le=3600, description="Timeout for SGLang's gloo CPU groups (not 2 h)."
    )


class StepBoundsSpec(CRDModel):
    """How long a model step may run before a group that shows no progress is Hung.

    A hang inside a step cannot be told from a legitimate step until the step has run
    longer than the longest legitimate one: a group with a rank inside a step younger
    than max(multiplier x its longest recent step, minSeconds), capped at maxSeconds,
    is Slow (never restarted). Evidence of a divergence (a consensus failure, different
    decisions or collectives outside a step, a dead rank) still acts at once.
    """

    multiplier: float = Field(
        3.0, ge=1, le=100, description="Times the group's longest recent step a step may run."
    )
    min_seconds: int = Field(
        90,
        ge=1,
        le=86400,
        description="A step is never called hung before this (above your longest legitimate "
        "step: a first long step has no recent ones to go by). At most maxSeconds and each "
        "role's watchdog (--watchdog-timeout, else spec.safety.watchdogTimeoutSeconds).",
    )
    max_seconds: int | None = Field(
        None,
        ge=1,
        le=86400,
        description="A step is always called hung past this (default: the role's watchdog, "
        "--watchdog-timeout, else spec.safety.watchdogTimeoutSeconds, where SGLang's own "
        "watchdog ends it). At most each role's watchdog.",
    )


class HealthSpec(CRDModel):
    """The deep probe: a no-op collective across every rank of a group."""

    period_seconds: int = Field(5, ge=1, le=3600, description="Probe period.")
    timeout_seconds: int = Field(3, ge=1, le=600, description="Probe timeout.")
    failure_threshold: int = Field(
        3, ge=1, le=100, description="Consecutive probe failures before a verdict."
    )
    startup_grace_seconds: int = Field(
        900, ge=0, le=86400, description="No verdicts this long after a group starts."
    )
    step_bounds: StepBoundsSpec = Field(
        default_factory=StepBoundsSpec,
        description="How long a model step may run before a group without progress is Hung.",
    )


class BackoffSpec(CRDModel):
    """Exponential backoff between restarts of one group."""

    base_seconds: int = Field(30, ge=0, le=86400, description="First delay.")
    max_seconds: int = Field(600, ge=0, le=86400, description="Largest delay.")
    reset_after_seconds: int = Field(
        1800, ge=0, le=604800, description="A group healthy this long resets its backoff."
    )


class BudgetSpec(CRDModel):
    """Restart budget: past it a group is Quarantined (no restart storm)."""

    restarts: int = Field(3, ge=1, le=1000, description="Restarts allowed per window.")
    window_seconds: int = Field(3600, ge=60, le=604800, description="The window.")


class DiagnosticsSpec(CRDModel):
    """Evidence captured before a restart."""

    capture_stacks: bool = Field(True, description="Capture py-spy stacks of every rank.")
    log_lines: int = Field(200, ge=0, le=5000, description="Last log lines per pod.")
    max_evidence_bytes: int = Field(
        16384, ge=1024, le=262144, description="Bound on the evidence kept per incident."
    )
    full_captures: int = Field(
        3,
        ge=0,
        le=20,
        description=(
            "Captures larger than maxEvidenceBytes also kept whole, each in a ConfigMap "
            "<name>-evidence-<slot>: at most this many, the oldest incident's slot reused "
            "(0: none)."
        ),
    )


class InPlaceSpec(CRDModel):
    """In-place restarts: when to give up on one and recreate the group's pods instead."""

    restart_timeout_seconds: int = Field(
        120,
        ge=10,
        le=3600,
        description="Every container of the group must have restarted within this; "
        "otherwise the group is recreated.",
    )
    escalation_window_seconds: int = Field(
        900,
        ge=0,
        le=86400,
        description="A group that fails again within this long after an in-place restart "
        "is recreated (new pods, other nodes preferred) instead.",
    )


class SuspectNodesSpec(CRDModel):
    """A node that hosts the outlier rank of several incidents (`status.incidents[].
    outliers`) is suspect: the NodesSuspect condition and a NodeSuspect Event say so, and
    with `cordon` the operator cordons it (never more than `maxCordoned` at once; it never
    uncordons: a person does, `kubectl uncordon`)."""

    incidents: int = Field(
        3, ge=2, le=100, description="Incidents whose outlier ran on one node that make it suspect."
    )
    window_seconds: int = Field(
        3600, ge=60, le=604800, description="Within this long (by each incident's verdict time)."
    )
    cordon: bool = Field(
        False,
        description="Cordon a suspect node (spec.unschedulable), so no restart places a group "
        "there; the chart must grant it (rbac.cordonNodes: true).",
    )
    max_cordoned: int = Field(
        1, ge=1, le=10, description="Nodes this deployment keeps cordoned at most."
    )


class RecoverySpec(CRDModel):
    """What the operator does with a broken group."""

    policy: Literal["RestartGroup", "ObserveOnly"] = Field(
        "RestartGroup",
        description="RestartGroup: restart the whole TP group; ObserveOnly: verdicts and "
        "incidents only.",
    )
    mode: Literal["InPlace", "Recreate"] = Field(
        "InPlace",
        description="InPlace: every pod agent of the group restarts its container at once "
        "(same pods and nodes, image and page cache warm), escalating to Recreate when an "
        "agent does not answer, a container does not come back or the group fails again "
        "soon; Recreate: delete the group's pods and create new ones.",
    )
    in_place: InPlaceSpec = Field(
        default_factory=InPlaceSpec,
        description="In-place restart settings.",
        json_schema_extra=_obj_default(),
    )
    max_concurrent_group_restarts: int = Field(
        1, ge=1, le=64, description="Groups of one role restarting at once."
    )
    backoff: BackoffSpec = Field(
        default_factory=BackoffSpec,
        description="Backoff between restarts of a group.",
        json_schema_extra=_obj_default(),
    )
    budget: BudgetSpec = Field(
        default_factory=BudgetSpec,
        description="Restart budget per group.",
        json_schema_extra=_obj_default(),
    )
    diagnostics: DiagnosticsSpec = Field(
        default_factory=DiagnosticsSpec,
        description="Evidence capture.",
        json_schema_extra=_obj_default(),
    )
    suspect_nodes: SuspectNodesSpec = Field(
        default_factory=SuspectNodesSpec,
        description="Nodes that host the outlier of several incidents.",
        json_schema_extra=_obj_default(),
    )


class MaintenanceSpec(CRDModel):
    """Planned node maintenance (a cordon, `kubectl drain`, a NoSchedule/NoExecute taint)."""

    mode: Literal["MakeBeforeBreak", "DrainFirst", "Off"] = Field(
        "MakeBeforeBreak",
        description=(
            "How a group with a pod on a node under maintenance moves. MakeBeforeBreak: "
            "start its next epoch on other nodes, wait for its deep probe, admit it, then "
            "drain the old pods (in-flight requests finish, bounded by "
            "drainTimeoutSeconds) and delete them; when the new epoch cannot be placed, "
            "drain first. DrainFirst: always drain, delete, then recreate elsewhere. Off: "
            "leave it (a PodDisruptionBudget still refuses evicting a serving group)."
        ),
    )
    drain_timeout_seconds: int = Field(
        120,
        ge=0,
        le=86400,
        description=(
            "How long a group leaving service (maintenance, scale-down) waits for its "
            "in-flight requests after it left every router, before its pods go."
        ),
    )


class RuntimeSpec(CRDModel):
    """How lockstep's runtime gets into the SGLang pods."""

    inject: bool = Field(
        True,
        description="Copy lockstep's runtime into each pod from runtime.image (an init "
        "container and an emptyDir volume) and start it with the SGLang image's own Python: "
        "spec.image may then be a stock SGLang image. false: spec.image already carries "
        "lockstep's runtime (its lockstep-sglang entrypoint).",
    )
    image: str | None = Field(
        None,
        description="The image the runtime is copied from (default: the operator's own "
        "image, which carries it). Setting or changing it rolls every group onto it, one "
        "group at a time.",
    )
    upgrade: Literal["OnRestart", "Rolling"] = Field(
        "OnRestart",
        description="When runtime.image is unset, what a new operator version does to "
        "running groups: OnRestart keeps each group on the runtime it runs until it is "
        "recreated anyway (a failure, a move, a spec change), so an operator upgrade "
        "restarts nothing; Rolling moves the groups onto the operator's runtime now, one "
        "at a time, as a spec change rolls.",
    )
    python: str = Field(
        "python3",
        min_length=1,
        description="The Python interpreter of spec.image that runs the injected launcher: "
        "an absolute path (/usr/bin/python3) or a command on the image's PATH (python3), "
        "with no arguments.",
    )


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


# -------------------------------------------------------------------------- status

GroupState = Literal[
    "Pending",
    "Starting",
    "Healthy",
    "Suspect",
    "Desynced",
    "Hung",
    "RankDown",
    "Recovering",
    "Moving",
    "Unschedulable",
    "Retiring",
    "StandingDown",
    "Quarantined",
]


class ProbeResult(CRDModel):
    """The last deep probe of a group."""

    ok: bool = Field(description="The collective passed on every rank.")
    time: str = Field(description="When (RFC 3339).")
    latency_ms: float | None = Field(None, description="Round trip in milliseconds.")
    error: str | None = Field(None, description="Why it failed.")


class GroupStatus(CRDModel):
    """One TP group."""

    index: int = Field(ge=0, description="Group number within the role.")
    state: GroupState = Field("Pending", description="Where the group is.")
    epoch: int = Field(0, ge=0, description="Incremented by every whole-group restart.")
    restarts: int = Field(0, ge=0, description="Whole-group restarts so far.")
    ready_pods: int = Field(0, ge=0, description="Pods of the group that are Ready.")
    pods: int = Field(0, ge=0, description="Pods the group has.")
    consecutive_failures: int = Field(0, ge=0, description="Failed probes in a row.")
    last_probe: ProbeResult | None = Field(None, description="The last deep probe.")
    last_restart_time: str | None = Field(None, description="Last restart (RFC 3339).")
    runtime: str | None = Field(
        None,
        description="The lockstep runtime the group's pods run: the image it was copied "
        "from, or the SGLang image's own (built in).",
    )
    spare: bool = Field(
        False, description="A warm spare: kept out of every router until it is admitted."
    )
    message: str | None = Field(None, description="Human-readable detail.")


class RoleStatus(CRDModel):
    """One role's groups."""

    replicas: int = Field(0, ge=0, description="Desired groups.")
    replicas_source: Literal["PDDeployment", "Scale"] | None = Field(
        None,
        description=(
            "Whose count `replicas` is: the PDDeployment's spec, or the role's PDRoleScale "
            "(an autoscaler or kubectl scale). A person's edit of the spec wins once; the "
            "scale target decides from there (docs/autoscaling.md)."
        ),
    )
    scale_target: str | None = Field(
        None, description="The role's PDRoleScale (kubectl scale pdrs/<name> --replicas=N)."
    )
    ready_groups: int = Field(0, ge=0, description="Groups that are Healthy and admitted.")
    spares: int = Field(0, ge=0, description="Desired warm spare groups.")
    ready_spares: int = Field(
        0, ge=0, description="Spare groups that are Healthy (deep-probed), ready to admit."
    )
    groups: list[GroupStatus] = Field(default_factory=list, description="Every group.")
    effective_args: list[str] = Field(
        default_factory=list, description="The SGLang argv after the flag policy."
    )


class IncidentOutlier(CRDModel):
    """A rank (or a pod) that differed from the rest of its group in an incident."""

    pod: str = Field(description="The pod.")
    rank: int | None = Field(None, ge=0, description="The rank (absent: the pod as a whole).")
    node: str | None = Field(None, description="The node the pod ran on.")
    why: str = Field("", description="How it differed: dead, stopped, behind, not progressing.")


class Incident(CRDModel):
    """One broken group: what was seen, what was done, how long it took."""

    id: str = Field(description="Incident id.")
    role: Literal["prefill", "decode"] = Field(description="Role of the group.")
    group: int = Field(ge=0, description="Group number.")
    epoch: int = Field(ge=0, description="The epoch that broke.")
    verdict: str = Field(description="Desynced, Hung or RankDown.")
    state: Literal["Open", "Closed"] = Field("Open", description="Open until re-admitted.")
    action: str = Field("", description="What the operator did.")
    restart_mode: Literal["InPlace", "Recreate"] | None = Field(
        None, description="How the group was last restarted in this incident."
    )
    escalation: str | None = Field(
        None, description="Why the group was recreated instead of restarted in place."
    )
    first_failure_time: str | None = Field(None, description="First failed probe.")
    detected_time: str | None = Field(None, description="When the verdict was reached.")
    recovered_time: str | None = Field(None, description="When the group was re-admitted.")
    time_to_detect_seconds: float | None = Field(None, description="First failure to verdict.")
    time_to_recover_seconds: float | None = Field(None, description="Verdict to re-admission.")
    evidence: str = Field("", max_length=262144, description="Evidence summary (bounded).")
    outliers: list[IncidentOutlier] = Field(
        default_factory=list,
        max_length=8,
        description="The ranks that differed from the rest of the group, with pod and node.",
    )


class Condition(CRDModel):
    """A standard Kubernetes condition."""

    type: str = Field(
        description="Ready, Progressing, Degraded, Schedulable, FlagsAdjusted or NodesSuspect."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="Condition status.")
    reason: str = Field("", description="CamelCase reason.")
    message: str = Field("", description="Human-readable message.")
    last_transition_time: str | None = Field(None, description="RFC 3339.")
    observed_generation: int | None = Field(None, description="Spec generation seen.")


class PolicyFinding(CRDModel):
    """A finding of the flag policy, as kept in status."""

    rule: str = Field(description="Rule id.")
    severity: Literal["error", "warning", "info"] = Field(description="Severity.")
    field: str = Field(description="Field path.")
    message: str = Field(description="What is wrong.")
    fix: str = Field(description="How to fix it.")
    action: Literal["adjusted", "rejected", "reported"] = Field(description="What was done.")


class OperatorStatus(CRDModel):
    """Which operator replica acts (with leader election: the Lease's holder)."""

    leader: str = Field(description="The operator replica (pod) that acts on this deployment.")
    since: str | None = Field(None, description="When it became the leader (RFC 3339).")


class PDDeploymentStatus(CRDModel):
    """Observed state, written by the operator."""

    observed_generation: int | None = Field(None, description="Last spec generation seen.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions.")
    prefill: RoleStatus | None = Field(None, description="Prefill groups.")
    decode: RoleStatus | None = Field(None, description="Decode groups.")
    prefill_ready: str | None = Field(None, description="Ready/desired prefill groups.")
    decode_ready: str | None = Field(None, description="Ready/desired decode groups.")
    open_incidents: int = Field(0, ge=0, description="Incidents not yet closed.")
    incidents: list[Incident] = Field(
        default_factory=list, max_length=20, description="The most recent incidents."
    )
    findings: list[PolicyFinding] = Field(
        default_factory=list, description="Flag policy findings for the current spec."
    )
    operator: OperatorStatus | None = Field(
        None, description="The operator replica that acts (several replicas: the elected one)."
    )


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


# ----------------------------------------------------------------- validation


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a PDDeployment: where, what, and how to fix it."""

    field: str
    message: str
    fix: str
    # "schema": the CR's own rules; "kubernetes": a value Kubernetes (the API server, the
    # kubelet, Kueue) would refuse in the objects the operator writes.
    rule: str = "schema"

    def __str__(self) -> str:
        return f"{self.field}: {self.message} (fix: {self.fix})"


class InvalidPDDeployment(ValueError):
    """The object is not a valid PDDeployment; `problems` lists every reason."""

    def __init__(self, problems: list[SpecProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def parse_pddeployment(obj: Mapping[str, Any]) -> PDDeployment:
    """Validate a PDDeployment object (schema, then cross-field rules).

    Raises `InvalidPDDeployment` with every problem found, each naming its field path.
    """
    problems: list[SpecProblem] = []
    if obj.get("apiVersion") != c.API_VERSION:
        problems.append(
            SpecProblem("apiVersion", f"is {obj.get('apiVersion')!r}", f"use {c.API_VERSION}")
        )
    if obj.get("kind") != c.KIND:
        problems.append(SpecProblem("kind", f"is {obj.get('kind')!r}", f"use {c.KIND}"))
    try:
        pdd = PDDeployment.model_validate(dict(obj))
    except ValidationError as err:
        problems.extend(_schema_problems(err))
        raise InvalidPDDeployment(problems) from None
    problems.extend(cross_field_problems(pdd))
    if problems:
        raise InvalidPDDeployment(problems)
    return pdd


def cross_field_problems(pdd: PDDeployment) -> list[SpecProblem]:
    """Rules that span fields; each problem names the field to change."""
    problems: list[SpecProblem] = []
    name = pdd.metadata.name
    why = k8s.dns1035_label(name)
    if why is None and len(name) > MAX_NAME_LENGTH:
        why = f"has {len(name)} characters"
    if why is not None:
        problems.append(
            SpecProblem(
                "metadata.name",
                f"{name!r} {why}: the name prefixes the pod names <name>-<role>-<group>-"
                "<rank> (hostnames of at most 63 characters), the group Services (DNS-1035 "
                "labels) and the Kueue pod-group labels, so it must be a DNS-1035 label of "
                f"at most {MAX_NAME_LENGTH} characters",
                f"use at most {MAX_NAME_LENGTH} characters; {k8s.FIX_DNS1035_LABEL}",
            )
        )
    spec = pdd.spec
    for role_name in c.ROLES:
        role = spec.role(role_name)
        path = f"spec.{role_name}"
        if role.tp != role.gpus_per_pod * role.pods_per_group:
            want = role.gpus_per_pod * role.pods_per_group
            problems.append(
                SpecProblem(
                    f"{path}.tp",
                    f"tp={role.tp} but gpusPerPod*podsPerGroup="
                    f"{role.gpus_per_pod}*{role.pods_per_group}={want}",
                    f"set tp to {want}, or change gpusPerPod/podsPerGroup so their product "
                    f"is {role.tp}",
                )
            )
        if role.dp_attention and role.dp < 2:
            problems.append(
                SpecProblem(
                    f"{path}.dp",
                    "dpAttention needs dp > 1",
                    "set dp to the number of attention DP ranks (e.g. equal to tp), or set "
                    "dpAttention: false",
                )
            )
        if role.tp % role.dp:
            problems.append(
                SpecProblem(
                    f"{path}.dp",
                    f"dp={role.dp} does not divide tp={role.tp}",
                    "use a dp that divides tp",
                )
            )
        if role.tp % role.ep:
            problems.append(
                SpecProblem(
                    f"{path}.ep",
                    f"ep={role.ep} does not divide tp={role.tp}",
                    "use an ep that divides tp (usually ep = tp or 1)",
                )
            )
        node_affinity = role.placement.node_affinity or {}
        unknown = sorted(set(node_affinity) - NODE_AFFINITY_FIELDS)
        if unknown:
            problems.append(
                SpecProblem(
                    f"{path}.placement.nodeAffinity",
                    f"has unknown field(s) {', '.join(unknown)}",
                    "use " + " and/or ".join(sorted(NODE_AFFINITY_FIELDS)),
                )
            )
        keys = [s.topology_key for s in role.placement.spread]
        for key in sorted({k for k in keys if keys.count(k) > 1}):
            problems.append(
                SpecProblem(
                    f"{path}.placement.spread",
                    f"topologyKey {key!r} is listed more than once (the API server refuses "
                    "a pod with two spread constraints on one key)",
                    "keep one entry per topologyKey",
                )
            )
        if role.replicas < 1 and not spec.paused:
            problems.append(
                SpecProblem(
                    f"{path}.replicas",
                    "is 0: a PD deployment needs at least one group of each role",
                    "set replicas >= 1, or set spec.paused: true to stop serving",
                )
            )
    prefill_backend = spec.transfer_for("prefill").backend
    decode_backend = spec.transfer_for("decode").backend
    if prefill_backend != decode_backend:
        problems.append(
            SpecProblem(
                "spec.decode.transfer.backend",
                f"decode uses {decode_backend!r} but prefill uses {prefill_backend!r}: KV "
                "cannot move between different transfer backends",
                "use the same backend for both roles (set it once in spec.transfer)",
            )
        )
    if spec.health.timeout_seconds > spec.health.period_seconds:
        problems.append(
            SpecProblem(
                "spec.health.timeoutSeconds",
                f"{spec.health.timeout_seconds}s exceeds periodSeconds "
                f"{spec.health.period_seconds}s: probes would overlap",
                "make timeoutSeconds <= periodSeconds",
            )
        )
    backoff = spec.recovery.backoff
    if backoff.base_seconds > backoff.max_seconds:
        problems.append(
            SpecProblem(
                "spec.recovery.backoff.maxSeconds",
                f"{backoff.max_seconds}s is below baseSeconds {backoff.base_seconds}s",
                "make maxSeconds >= baseSeconds",
            )
        )
    safety = spec.safety
    if safety.watchdog_timeout_seconds > safety.max_watchdog_timeout_seconds:
        problems.append(
            SpecProblem(
                "spec.safety.watchdogTimeoutSeconds",
                f"{safety.watchdog_timeout_seconds}s exceeds maxWatchdogTimeoutSeconds "
                f"{safety.max_watchdog_timeout_seconds}s",
                "lower watchdogTimeoutSeconds or raise maxWatchdogTimeoutSeconds",
            )
        )
    weights = spec.model.weights
    if weights and weights.persistent_volume_claim and weights.host_path:
        problems.append(
            SpecProblem(
                "spec.model.weights",
                "sets both persistentVolumeClaim and hostPath",
                "keep one of them",
            )
        )
    steps = spec.health.step_bounds
    if steps.max_seconds is not None and steps.min_seconds > steps.max_seconds:
        # A step is never hung before minSeconds and always hung past maxSeconds: both
        # cannot hold, and lockstep does not pick one for you.
        problems.append(
            SpecProblem(
                "spec.health.stepBounds.minSeconds",
                f"{steps.min_seconds}s is above maxSeconds {steps.max_seconds}s",
                "make minSeconds <= maxSeconds",
            )
        )
    problems.extend(kubernetes_problems(pdd))
    return problems


# ---------------------------------------------------- values Kubernetes must accept

# The paths the operator mounts into the SGLang container itself.
RESERVED_MOUNT_PATHS = ("/dev/shm", c.RUNTIME_MOUNT)


def kubernetes_problems(pdd: PDDeployment) -> list[SpecProblem]:
    """Every value of the spec the operator writes into a Kubernetes object, checked with
    Kubernetes' own rules (`lockstep.api.k8s_rules`): what the API server, the kubelet or
    Kueue would refuse on every pod is refused here, naming the field and the fix."""
    spec = pdd.spec
    found: list[tuple[str, str, str]] = []

    def add(field: str, violations: list[k8s.Violation]) -> None:
        found.extend((field + v.path, v.message, v.fix) for v in violations)

    def check(
        field: str, value: str, rule: Callable[[str], str | None], what: str, fix: str
    ) -> None:
        why = rule(value)
        if why is not None:
            found.append((field, f"{value!r} is not {what}: it {why}", fix))

    # The runtime's image and Python are used only when the runtime is injected.
    injected = spec.runtime.inject
    for fld, image in (
        ("spec.image", spec.image),
        ("spec.runtime.image", spec.runtime.image if injected else None),
        ("spec.router.image", spec.router.image),
    ):
        if image is not None:
            check(fld, image, k8s.image_reference, "an image reference", k8s.FIX_IMAGE)
    if injected:
        found.extend(_runtime_python_problems(spec.runtime.python))
    weights = spec.model.weights
    if weights is not None:
        found.extend(_weights_problems(weights))
    for role_name in c.ROLES:
        role = spec.role(role_name)
        path = f"spec.{role_name}"
        for key, value in role.node_selector.items():
            check(f"{path}.nodeSelector", key, k8s.qualified_name, "a label key", k8s.FIX_LABEL_KEY)
            check(
                f"{path}.nodeSelector.{key}", value, k8s.label_value, "a label value",
                k8s.FIX_LABEL_VALUE,
            )  # fmt: skip
        for i, t in enumerate(role.tolerations):
            add(
                f"{path}.tolerations[{i}]",
                k8s.toleration(t.key, t.operator, t.value, t.effect, t.toleration_seconds),
            )
        if role.priority_class_name is not None:
            check(
                f"{path}.priorityClassName", role.priority_class_name, k8s.dns1123_subdomain,
                "a PriorityClass name", k8s.FIX_DNS1123_SUBDOMAIN,
            )  # fmt: skip
        placement = role.placement
        if placement.topology_key is not None:
            check(
                f"{path}.placement.topologyKey", placement.topology_key, k8s.qualified_name,
                "a node label key", k8s.FIX_LABEL_KEY,
            )  # fmt: skip
        for i, spread in enumerate(placement.spread):
            check(
                f"{path}.placement.spread[{i}].topologyKey", spread.topology_key,
                k8s.qualified_name, "a node label key", k8s.FIX_LABEL_KEY,
            )  # fmt: skip
        if placement.scheduler_name is not None:
            check(
                f"{path}.placement.schedulerName", placement.scheduler_name,
                k8s.dns1123_subdomain, "a scheduler name", k8s.FIX_DNS1123_SUBDOMAIN,
            )  # fmt: skip
        if placement.node_affinity:
            add(f"{path}.placement.nodeAffinity", k8s.node_affinity(placement.node_affinity))
        requests, limits = role.resources.requests, role.resources.limits
        add(
            f"{path}.resources",
            k8s.container_resources(
                {k: v for k, v in requests.items() if k != GPU_RESOURCE},
                {k: v for k, v in limits.items() if k != GPU_RESOURCE},
            ),
        )
        for kind, given in (
            ("requests", role.resources.requests),
            ("limits", role.resources.limits),
        ):
            if GPU_RESOURCE in given:
                found.append(
                    (
                        f"{path}.resources.{kind}.{GPU_RESOURCE}",
                        "is set by the operator from gpusPerPod (the value here would be replaced)",
                        f"remove it; set {path}.gpusPerPod instead",
                    )
                )
        for i, var in enumerate(role.env):
            check(
                f"{path}.env[{i}].name", var.name, k8s.env_var_name,
                "an environment variable name", k8s.FIX_ENV_VAR_NAME,
            )  # fmt: skip
            if var.value_from is not None:
                if var.value:
                    found.append(
                        (
                            f"{path}.env[{i}]",
                            "sets both value and valueFrom",
                            "keep one of them",
                        )
                    )
                # "sglang": the container the builders put the role's env into.
                add(f"{path}.env[{i}].valueFrom", k8s.env_var_source(var.value_from, "sglang"))
    return [SpecProblem(f, m, fix, rule="kubernetes") for f, m, fix in found]


# The GPU resource the operator sets from gpusPerPod.
GPU_RESOURCE = "nvidia.com/gpu"


def _runtime_python_problems(python: str) -> list[tuple[str, str, str]]:
    """`spec.runtime.python` is the SGLang container's command[0]: the container runtime
    executes it as one file, found on the image's PATH only when it has no '/'."""
    fld = "spec.runtime.python"
    fix = "use an absolute path (e.g. /usr/bin/python3) or a command on the image's PATH (python3)"
    if not python.strip() or python != python.strip() or any(ch.isspace() for ch in python):
        return [
            (
                fld,
                f"{python!r} holds whitespace: it is executed as one file name, with no "
                "shell to split off arguments",
                fix,
            )
        ]
    if "/" in python and not python.startswith("/"):
        return [
            (
                fld,
                f"{python!r} is a relative path: it would be looked up from the image's "
                "working directory, which the operator does not know",
                fix,
            )
        ]
    if python.startswith("~") or "$" in python:
        return [(fld, f"{python!r} needs a shell to expand it; none runs it", fix)]
    return []


def _weights_problems(weights: WeightsVolume) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    fld = "spec.model.weights"
    mount = weights.mount_path
    if not mount.startswith("/") or "/../" in f"{mount}/":
        out.append(
            (
                f"{fld}.mountPath",
                f"{mount!r} is not an absolute path without '..'",
                "use an absolute path, e.g. /models",
            )
        )
    elif mount.rstrip("/") in RESERVED_MOUNT_PATHS:
        out.append(
            (
                f"{fld}.mountPath",
                f"{mount!r} is where the operator mounts its own volume",
                "use another path, e.g. /models",
            )
        )
    host = weights.host_path
    if host is not None and (not host.startswith("/") or "/../" in f"{host}/"):
        out.append(
            (
                f"{fld}.hostPath",
                f"{host!r} is not an absolute path without '..'",
                "use the absolute path of the directory on the node",
            )
        )
    claim = weights.persistent_volume_claim
    if claim is not None and (why := k8s.dns1123_subdomain(claim)) is not None:
        out.append(
            (
                f"{fld}.persistentVolumeClaim",
                f"{claim!r} is not a PersistentVolumeClaim name: it {why}",
                k8s.FIX_DNS1123_SUBDOMAIN,
            )
        )
    return out


# --------------------------------------------------------- pydantic error mapping

_FIXES: dict[str, str] = {
    "missing": "add this field",
    "int_type": "use an integer",
    "int_parsing": "use an integer",
    "int_from_float": "use a whole number",
    "bool_type": "use true or false",
    "bool_parsing": "use true or false",
    "string_type": "use a string",
    "list_type": "use a list",
    "dict_type": "use a mapping",
    "model_type": "use a mapping of the documented fields",
    "model_attributes_type": "use a mapping of the documented fields",
    "float_type": "use a number",
    "float_parsing": "use a number",
}


# What to write instead of a string that does not match a field's pattern.
_PATTERN_FIXES: dict[str, str] = {
    KUEUE_QUEUE_PATTERN: "use the name of a Kueue LocalQueue: at most 63 lowercase letters, "
    "digits, '-' and '.', each dot-separated part starting and ending with a letter or digit "
    "(e.g. team-a-gpu)",
    SGLANG_VERSION_PATTERN: "use a release number such as 0.5.23",
}


def _schema_problems(err: ValidationError) -> list[SpecProblem]:
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = _path(loc)
        kind = e["type"]
        ctx = e.get("ctx") or {}
        if kind == "extra_forbidden":
            known = _field_names_at(loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            fix = f"did you mean {close[0]!r}?" if close else "remove it"
            problems.append(SpecProblem(path, "unknown field", fix))
            continue
        if kind == "literal_error":
            fix = f"use one of {ctx.get('expected')}"
        elif kind in ("greater_than_equal", "less_than_equal"):
            bound = ctx.get("ge", ctx.get("le"))
            fix = f"use a value {'>=' if kind == 'greater_than_equal' else '<='} {bound}"
        elif kind in ("string_too_short", "too_short"):
            fix = "give it a value"
        elif kind in ("too_long", "string_too_long"):
            fix = "shorten it"
        elif kind == "string_pattern_mismatch":
            fix = _PATTERN_FIXES.get(str(ctx.get("pattern")), "see `lockstep crd` for the schema")
        else:
            fix = _FIXES.get(kind, "see `lockstep crd` for the schema")
        problems.append(SpecProblem(path, e["msg"], fix))
    return problems


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _field_names_at(loc: tuple[int | str, ...]) -> list[str]:
    """The wire names of the fields of the model found at `loc`, for suggestions."""
    model: Any = PDDeployment
    for part in loc:
        if isinstance(part, int):
            continue
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        field = fields.get(str(part))
        if field is None:
            return []
        nested = _model_in(field.annotation)
        if nested is None:
            return []
        model = nested
    return [(f.alias or n) for n, f in model.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def with_runtime_image(pdd: PDDeployment, image: str | None) -> PDDeployment:
    """`pdd` with `spec.runtime.image` set to `image` when the spec leaves it unset (the
    operator's configured runtime image: its own)."""
    if image is None or pdd.spec.runtime.image is not None:
        return pdd
    runtime = pdd.spec.runtime.model_copy(update={"image": image})
    return pdd.model_copy(update={"spec": pdd.spec.model_copy(update={"runtime": runtime})})

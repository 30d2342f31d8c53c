"""The spec's serving parts: the model and its weights, the KV transfer, a role's groups
(TP, pods per group, GPUs, SGLang args, env, resources, placement) and the router."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from lockstep.api.models.base import KUEUE_QUEUE_PATTERN, CRDModel, Quantity, _obj_default

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

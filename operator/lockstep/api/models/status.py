"""The status the operator derives (never read back): each role's groups, the incidents,
the conditions, the policy's findings, the acting operator replica."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lockstep.api.models.base import CRDModel

# -------------------------------------------------------------------------- status

GroupState = Literal[
    "Pending",
    "Starting",
    "Healthy",
    "Suspect",
    "Desynced",
    "Hung",
    "RankDown",
    "TransferBroken",
    "KVLeak",
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
    verdict: str = Field(description="Desynced, Hung, RankDown, TransferBroken or KVLeak.")
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


class PairStatus(CRDModel):
    """The last try of one prefill/decode pair's KV hand-off (the pair probe)."""

    prefill: int = Field(ge=0, description="Prefill group.")
    decode: int = Field(ge=0, description="Decode group.")
    ok: bool = Field(description="The hand-off and its token came back within the deadline.")
    time: str = Field(description="When the try ended (RFC 3339).")
    latency_ms: float | None = Field(None, description="Round trip of a try that passed.")
    error: str | None = Field(None, description="What each half said, when it failed.")


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
    pairs: list[PairStatus] = Field(
        default_factory=list,
        max_length=256,
        description="Each prefill/decode pair's last hand-off (the pair probe).",
    )
    operator: OperatorStatus | None = Field(
        None, description="The operator replica that acts (several replicas: the elected one)."
    )

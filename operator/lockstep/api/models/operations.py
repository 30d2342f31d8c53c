"""The spec's operating parts: the flag policy's safety mode, the deep probe and step
bounds, recovery (backoff, budget, diagnostics, in-place restarts, suspect nodes),
maintenance and the runtime."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lockstep.api import constants as c
from lockstep.api.models.base import CRDModel, _obj_default


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


class PairProbeSpec(CRDModel):
    """The pair probe: the KV hand-off between a prefill group and a decode group, tried
    with a one-token request of the operator's own (its own bootstrap room, pinned to one
    group of each role, a short deadline), each group against a rotating peer: max(N, M)
    tries a period for N prefill and M decode groups (docs/pd-path.md)."""

    enabled: bool = Field(True, description="Probe the PD path between groups.")
    period_seconds: int = Field(3, ge=1, le=3600, description="Pair probe period.")
    timeout_seconds: int = Field(
        4, ge=1, le=600, description="A try's deadline: the hand-off and its one token."
    )


class EndedKVSpec(CRDModel):
    """KV a group's leader holds for requests that ended (cancelled, failed, aborted),
    read with every deep probe: held above `maxTokens` in every reading for
    `graceSeconds`, it is freed through the runtime's abort; a free that cannot bring it
    down, or a group that keeps leaking, is judged `KVLeak` and restarted
    (docs/pd-path.md)."""

    enabled: bool = Field(True, description="Watch and free KV held by ended requests.")
    max_tokens: int = Field(
        0, ge=0, le=1 << 40, description="KV tokens ended requests may hold at any time."
    )
    grace_seconds: int = Field(
        10, ge=1, le=3600, description="How long it may stay above maxTokens before a free."
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
    pair_probe: PairProbeSpec = Field(
        default_factory=PairProbeSpec,
        description="The PD path between prefill and decode groups, probed as a unit.",
    )
    ended_kv: EndedKVSpec = Field(
        default_factory=EndedKVSpec,
        description="KV held by requests that ended: freed, or the group restarted.",
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

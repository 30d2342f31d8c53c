"""The safety-flag policy: (role spec, SGLang version) -> effective argv, env, findings.

Pure: no I/O, no Kubernetes, no SGLang import. The CLI (`lockstep check`), the admission
webhook and the operator's reconcile all call `evaluate`, so a spec is judged the same
way everywhere.

Modes (`spec.safety.mode`), for rules about *unsafe* settings:
- `Enforce`: adjust the argv/env and report the adjustment (severity warning);
- `Reject`: refuse the spec, the finding's fix says what to write instead;
- `Warn`: report only, the argv is left as written.
Rules about *invalid* input (unknown or misspelt flags, wrong value types, flags the
operator owns, an unsupported SGLang version, step bounds that contradict the watchdog)
refuse in every mode: SGLang would fail to start, the group would not rendezvous, or a
bound would be clamped behind the user's back. Every setting of lockstep's own runtime
guard (`LOCKSTEP_*` env) is the operator's in every mode: `Warn` reports what it leaves
unsafe, it does not let a spec switch a lockstep guard off. Operator defaults for
missing timeouts are filled in `Enforce` and `Reject` (filling a default overrides
nothing the user wrote) and only reported in `Warn`.

Every rule is listed in `RULES` with the SGLang issues it comes from.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lockstep.api import constants as c
from lockstep.api.models import EnvVar, PDDeploymentSpec, RoleSpec
from lockstep.core.policy.flags import (
    ArgItem,
    FlagSpec,
    FlagTable,
    check_value,
    load_flag_table,
    split_args,
    supported_versions,
)

Severity = Literal["error", "warning", "info"]
Action = Literal["adjusted", "rejected", "reported"]


@dataclass(frozen=True)
class Rule:
    """A policy rule: id, what it guards against, the SGLang issues behind it, and the
    SGLang releases it is for (None: every supported release)."""

    id: str
    title: str
    issues: tuple[str, ...] = ()
    versions: tuple[str, ...] | None = None

    def applies(self, version: str) -> bool:
        """Whether the rule is for SGLang `version`."""
        return self.versions is None or version in self.versions


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "overlap-schedule",
            "The overlap scheduler on a TP>1 PD role without DP attention lets TP ranks "
            "decide batch-vs-idle differently and hang in mismatched collectives",
            ("sglang#26454", "sglang#20315", "sglang#20853"),
        ),
        Rule(
            "watchdog-timeout",
            "--watchdog-timeout must be set, positive and bounded (a shipped runtime used "
            "1000000, i.e. no watchdog)",
        ),
        Rule(
            "dist-timeout",
            "--dist-timeout must be set so torch.distributed init cannot wait forever",
        ),
        Rule(
            "operator-owned-flag",
            "Flags the operator writes from the PDDeployment (parallelism, rendezvous, "
            "ports, PD mode, transfer backend, model) may not be set in args",
        ),
        Rule("unknown-flag", "Flags must exist in the pinned SGLang's ServerArgs"),
        Rule("flag-value", "Flag values must have the arity, type and choices SGLang expects"),
        Rule("duplicate-flag", "A flag may be given once"),
        Rule("deprecated-flag", "The flag is deprecated in the pinned SGLang"),
        Rule(
            "spec-grammar-dp-attention-overlap",
            "Speculative decoding with grammar and DP attention under the overlap scheduler: "
            "idle DP ranks take a different collective path and hang",
            ("sglang#29144", "sglang#32527", "sglang#3600"),
        ),
        Rule(
            "hicache-prefetch-tp",
            "HiCache storage prefetch with TP>1: ranks issue a different number of "
            "all_reduce calls in check_prefetch_progress and deadlock",
            ("sglang#30760", "sglang#22607"),
        ),
        Rule(
            "decode-queue-collectives",
            "PD decode with TP>1: the preallocation/transfer queue poll skips its all_reduce "
            "when a rank's local queue is empty, so ranks can issue different collective "
            "sequences (present in 0.5.23)",
            ("sglang#36928",),
        ),
        Rule(
            "decode-transfer-hold",
            "PD decode with TP>1: a failed KV transfer is held or released by each rank on "
            "its own (0.5.23 agrees across ranks with an all_reduce first), so ranks can "
            "take different paths after a transfer failure",
            versions=("0.5.21", "0.5.22"),
        ),
        Rule(
            "sglang-version",
            "The SGLang release (spec.sglangVersion, or the image tag) must be one lockstep "
            "supports, and the two must agree",
        ),
        Rule(
            "operator-owned-env",
            "Environment variables the operator sets for the runtime, and every setting of "
            "lockstep's own runtime guard (LOCKSTEP_*: pod agent, consensus, probe, "
            "timeouts, state dir), may not be set in a role's env, in any mode",
        ),
        Rule(
            "guard-env",
            "Environment variables that switch off or loosen torch's guards (NCCL error "
            "handling, monitor and flight recorder): a bound holds in every form a setting "
            "can take",
        ),
        Rule(
            "step-bounds",
            "spec.health.stepBounds must fit under the watchdog each role runs with "
            "(--watchdog-timeout, else spec.safety.watchdogTimeoutSeconds): SGLang's "
            "watchdog ends a step past it, so a larger bound would be clamped to it",
        ),
        Rule(
            "config-file",
            "--config reads SGLang options from a file the policy cannot see, so no bound "
            "could hold for what it sets",
        ),
    )
}

# Flags the operator writes, by spelling: the PDDeployment field to use instead.
OWNED_FLAGS: dict[str, str] = {
    "tp_size": "spec.{role}.tp",
    "nnodes": "spec.{role}.podsPerGroup",
    "node_rank": "nothing: the operator sets it per pod",
    "dist_init_addr": "nothing: the operator sets it per group and epoch",
    "host": "nothing: the operator binds every pod",
    "port": "nothing: the operator assigns the ports",
    "disaggregation_mode": "nothing: it follows the role (spec.prefill / spec.decode)",
    "disaggregation_bootstrap_port": "nothing: the operator assigns the ports",
    "disaggregation_transfer_backend": "spec.transfer.backend",
    "disaggregation_ib_device": "spec.transfer.devices",
    "dp_size": "spec.{role}.dp",
    "attn_dp_size": "spec.{role}.dpAttention",
    "enable_dp_attention": "spec.{role}.dpAttention",
    "ep_size": "spec.{role}.ep",
    "model_path": "spec.model.path",
    "served_model_name": "spec.model.servedName",
    "pp_size": "nothing: lockstep v1alpha1 runs TP groups without pipeline parallelism",
}

# Env the operator sets for the runtime; users may not override these.
OWNED_ENV = (
    c.ENV_SGLANG_VERSION,
    c.ENV_CONSENSUS,
    c.ENV_GLOO_TIMEOUT,
    c.ENV_AGENT_PORT,
    c.ENV_GROUP_EPOCH,
    c.ENV_POD_NAME,
    c.ENV_AGENT_TOKEN,
)

# Every `LOCKSTEP_` variable is a setting of lockstep's own runtime (lockstep_sglang.config
# and the modules it reads for): the operator's, in every mode. What each one guards, for
# the message; one not listed is refused as "a setting of lockstep's runtime".
GUARD_ENV_PREFIX = "LOCKSTEP_"
RUNTIME_GUARD_ENV: dict[str, str] = {
    "LOCKSTEP_AGENT": "starts the pod agent; 0 switches it off, and the operator can no "
    "longer read the ranks' state, capture their stacks or restart the group in place",
    "LOCKSTEP_AGENT_HOST": "is the pod agent's address; the operator reaches it on the pod's IP",
    "LOCKSTEP_CONSENSUS": "switches the rank decision consensus; 0 switches it off, and a "
    "desync is no longer ended at once",
    "LOCKSTEP_CONSENSUS_PAUSE_S": "paces the ranks' decision comparisons; longer lets a "
    "desync run longer",
    "LOCKSTEP_GLOO_TIMEOUT_S": "caps SGLang's gloo CPU groups; the operator sets it from "
    "spec.safety.glooTimeoutSeconds",
    "LOCKSTEP_PROBE_TIMEOUT_S": "is the deep probe's default timeout",
    "LOCKSTEP_PROBE_MAX_TIMEOUT_S": "bounds the deep probe's timeout",
    "LOCKSTEP_EXIT_HOLD_S": "is how long a pod keeps serving its evidence after the server ends",
    "LOCKSTEP_STATE_DIR": "is where the ranks publish the state the pod agent serves",
    "LOCKSTEP_TERMINATION_LOG": "is where the runtime writes why it refused to start; the "
    "operator reads it from the pod's status (the container's termination message)",
}
NCCL_GUARD_ENV: dict[str, str] = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "a timed-out NCCL collective no longer ends the "
    "process, so a wedged rank waits forever instead of failing",
    "TORCH_NCCL_ENABLE_MONITORING": "torch's NCCL heartbeat monitor is off, so a stuck "
    "NCCL watchdog is never noticed",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "the NCCL flight recorder no longer dumps on a timeout, "
    "so the evidence of a device-side hang is lost",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "the NCCL flight recorder keeps no trace, so the "
    "evidence of a device-side hang is lost",
}
NCCL_GUARD_OFF = ("0", "false", "False", "")

# NCCL flight recorder: keep a trace buffer and dump it when a collective times out, so
# the evidence of a device-side hang survives the restart.
FLIGHT_RECORDER_ENV = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/lockstep/nccl_trace_rank_",
}


# A decode server notices a dead prefill by its bootstrap heartbeat: SGLang's default
# (every 5 s, 2 misses) held requests waiting for KV from a dead prefill ~15 s before
# they failed and the router could retry them; every 2 s makes it ~4 s (measured on the
# real SGLang 0.5.23, docs/router.md). Defaults: a role's own env wins.
PEER_FAILURE_ENV: dict[str, dict[str, str]] = {
    "decode": {
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
    },
}


@dataclass(frozen=True)
class Finding:
    """One policy finding: which rule, how bad, which field, what, how to fix, what done."""

    rule: str
    severity: Severity
    field: str
    message: str
    fix: str
    action: Action
    issues: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form (status, CLI, webhook)."""
        return {
            "rule": self.rule,
            "severity": self.severity,
            "field": self.field,
            "message": self.message,
            "fix": self.fix,
            "action": self.action,
            "issues": list(self.issues),
        }

    def __str__(self) -> str:
        cite = f" [{', '.join(self.issues)}]" if self.issues else ""
        return f"{self.rule}: {self.field}: {self.message} (fix: {self.fix}){cite}"


@dataclass(frozen=True)
class RolePolicy:
    """The policy's verdict for one role."""

    role: str
    argv: tuple[str, ...]
    env: dict[str, str]
    findings: tuple[Finding, ...]
    # The user's args after the policy (what an Enforce mutation writes back to the spec).
    user_args: tuple[str, ...] = ()
    # The user's env after the policy (Enforce drops what loosens a guard).
    user_env: tuple[EnvVar, ...] = ()

    @property
    def accepted(self) -> bool:
        """No finding refused the spec."""
        return all(f.action != "rejected" for f in self.findings)


@dataclass(frozen=True)
class PolicyResult:
    """The verdict for both roles."""

    roles: dict[str, RolePolicy]
    sglang_version: str = ""  # the release the spec was judged for

    @property
    def findings(self) -> list[Finding]:
        """Every finding of every role."""
        return [f for r in self.roles.values() for f in r.findings]

    @property
    def accepted(self) -> bool:
        """Every role accepted."""
        return all(r.accepted for r in self.roles.values())

    @property
    def adjusted(self) -> bool:
        """Some flag or env was changed by the policy."""
        return any(f.action == "adjusted" and f.severity != "info" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """`{"accepted", "findings", "effective": {role: argv}}` for `lockstep check -o json`."""
        return {
            "accepted": self.accepted,
            "sglangVersion": self.sglang_version,
            "findings": [f.to_dict() for f in self.findings],
            "effective": {name: list(r.argv) for name, r in self.roles.items()},
        }


@dataclass
class _Ctx:
    """Working state while one role is evaluated."""

    role_name: str
    role: RoleSpec
    spec: PDDeploymentSpec
    table: FlagTable
    items: list[ArgItem]
    added: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    user_env: list[EnvVar] = field(default_factory=list)
    version: str = ""
    findings: list[Finding] = field(default_factory=list)
    # Flags (by dest) the user wrote but that were refused (a bad value, an abbreviation):
    # the rules that fill a missing flag must not call them "not set".
    refused: set[str] = field(default_factory=set)

    @property
    def mode(self) -> str:
        return self.spec.safety.mode

    def path(self, item: ArgItem | None = None) -> str:
        base = f"spec.{self.role_name}.args"
        return f"{base}[{item.index}]" if item is not None else base

    def find(self, dest: str) -> ArgItem | None:
        for item in self.items:
            spec = self.table.lookup(item.option)
            if spec is not None and spec.dest == dest:
                return item
        return None

    def has(self, dest: str) -> bool:
        return self.find(dest) is not None or any(
            (s := self.table.lookup(t)) is not None and s.dest == dest for t in self.added
        )

    def value(self, dest: str) -> str | None:
        item = self.find(dest)
        return item.values[0] if item is not None and item.values else None

    def invalid(self, rule: str, fld: str, message: str, fix: str) -> None:
        self.findings.append(
            Finding(rule, "error", fld, message, fix, "rejected", RULES[rule].issues)
        )

    def unsafe(
        self, rule: str, fld: str, message: str, fix: str, adjust: Callable[[], None]
    ) -> None:
        """An unsafe setting: adjusted, refused or reported, by mode."""
        issues = RULES[rule].issues
        if self.mode == "Enforce":
            adjust()
            self.findings.append(Finding(rule, "warning", fld, message, fix, "adjusted", issues))
        elif self.mode == "Reject":
            self.findings.append(Finding(rule, "error", fld, message, fix, "rejected", issues))
        else:
            self.findings.append(Finding(rule, "warning", fld, message, fix, "reported", issues))

    def default(
        self, rule: str, fld: str, message: str, fix: str, adjust: Callable[[], None]
    ) -> None:
        """A missing setting the operator fills (Enforce, Reject) or reports (Warn)."""
        action: Action = "reported" if self.mode == "Warn" else "adjusted"
        if action == "adjusted":
            adjust()
        severity: Severity = "warning" if action == "reported" else "info"
        self.findings.append(Finding(rule, severity, fld, message, fix, action, RULES[rule].issues))

    def guard(self) -> None:
        """Turn on SGLang's rank consensus checker with lockstep's decision hooks."""
        self.env[c.ENV_CONSENSUS] = "1"


IMAGE_TAG_VERSION = re.compile(r"^v?(\d+\.\d+\.\d+)(?:$|[^\d.])")


def image_sglang_version(image: str) -> str | None:
    """The SGLang release an image's tag names (`lmsysorg/sglang:v0.5.23-cu130`,
    `...:0.5.22`), or None."""
    ref = image.split("@", 1)[0]
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:  # no tag (a registry port is not one)
        return None
    found = IMAGE_TAG_VERSION.match(tag)
    return found[1] if found else None


def sglang_version(spec: PDDeploymentSpec) -> str:
    """The SGLang release a spec is judged for: `spec.sglangVersion`, else the one the
    image tag names, else the newest supported."""
    return spec.sglang_version or image_sglang_version(spec.image) or supported_versions()[-1]


def evaluate(spec: PDDeploymentSpec, table: FlagTable | None = None) -> PolicyResult:
    """Run the policy on both roles of a PDDeployment spec, for its SGLang release."""
    version = sglang_version(spec)
    if table is None:
        table = load_flag_table(version if version in supported_versions() else None)
    roles: dict[str, RolePolicy] = {}
    for name in c.ROLES:
        role = evaluate_role(spec, name, table, version)
        # A step bound against the watchdog both roles take from spec.safety is one
        # finding about the spec, not one per role.
        earlier = {f for r in roles.values() for f in r.findings if f.rule == "step-bounds"}
        if earlier:
            kept = tuple(f for f in role.findings if f not in earlier)
            role = dataclasses.replace(role, findings=kept)
        roles[name] = role
    return PolicyResult(roles, version)


def watchdog_seconds(argv: Sequence[str], table: FlagTable | None = None) -> float | None:
    """The `--watchdog-timeout` an argv gives SGLang (any spelling, `--flag value` or
    `--flag=value`), when it is a positive number of seconds; None when there is none
    (no watchdog, or a value that is not one: a spec only Warn lets through)."""
    table = table or load_flag_table()
    raw: str | None = None
    for i, token in enumerate(argv):
        option, eq, value = token.partition("=")
        spec = table.lookup(option)
        if spec is None or spec.dest != "watchdog_timeout":
            continue
        raw = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    try:
        seconds = float(raw) if raw is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def evaluate_role(
    spec: PDDeploymentSpec, role_name: str, table: FlagTable, version: str | None = None
) -> RolePolicy:
    """Run the policy on one role: the effective SGLang argv, env and findings."""
    role = spec.role(role_name)
    split = split_args(list(role.args))
    version = version or sglang_version(spec)
    ctx = _Ctx(role_name, role, spec, table, split.items, user_env=list(role.env), version=version)
    for index, token in split.stray:
        ctx.invalid(
            "flag-value",
            f"spec.{role_name}.args[{index}]",
            f"{token!r} follows no flag",
            "put it after the flag it belongs to, or remove it",
        )
    _check_version(ctx)
    _check_flags(ctx)
    _check_env(ctx)
    _rule_overlap_schedule(ctx)
    _rule_spec_grammar_dp_attention(ctx)
    _rule_watchdog(ctx)
    _rule_step_bounds(ctx)
    _rule_dist_timeout(ctx)
    _rule_hicache_prefetch(ctx)
    _rule_decode_queue(ctx)
    _rule_decode_transfer_hold(ctx)
    user_env = {var.name for var in ctx.user_env}
    env = {
        **FLIGHT_RECORDER_ENV,
        **{k: v for k, v in PEER_FAILURE_ENV.get(role_name, {}).items() if k not in user_env},
        c.ENV_GLOO_TIMEOUT: str(spec.safety.gloo_timeout_seconds),
        c.ENV_AGENT_PORT: str(c.PORT_AGENT),
        # The launcher refuses an image that runs another release.
        c.ENV_SGLANG_VERSION: version,
        **ctx.env,
    }
    user_args = (*(t for item in ctx.items for t in item.tokens()), *ctx.added)
    argv = (*_operator_argv(spec, role_name, table), *user_args)
    return RolePolicy(role_name, argv, env, tuple(ctx.findings), user_args, tuple(ctx.user_env))


def _operator_argv(spec: PDDeploymentSpec, role_name: str, table: FlagTable) -> list[str]:
    """The role-wide flags the operator owns (per-pod ones are added by the builders)."""
    role = spec.role(role_name)
    transfer = spec.transfer_for(role_name)
    argv = [
        "--model-path",
        spec.model.path,
        "--disaggregation-mode",
        role_name,
        "--tp-size",
        str(role.tp),
        "--nnodes",
        str(role.pods_per_group),
        "--host",
        "0.0.0.0",
        "--port",
        str(c.PORT_HTTP),
        "--disaggregation-bootstrap-port",
        str(c.PORT_BOOTSTRAP),
        "--disaggregation-transfer-backend",
        transfer.backend,
    ]
    if spec.model.served_name:
        argv += ["--served-model-name", spec.model.served_name]
    if transfer.devices:
        argv += ["--disaggregation-ib-device", ",".join(transfer.devices)]
    if role.dp > 1:
        argv += ["--dp-size", str(role.dp)]
    if role.dp_attention:
        # 0.5.22 and later size attention DP; 0.5.21 has only the switch.
        if table.lookup("--attn-dp-size") is not None:
            argv += ["--attn-dp-size", str(role.dp)]
        else:
            argv += ["--enable-dp-attention"]
    if role.ep > 1:
        argv += ["--ep-size", str(role.ep)]
    return argv


# ------------------------------------------------------------------- the rules


def _check_version(ctx: _Ctx) -> None:
    if ctx.role_name != c.ROLES[0]:
        return  # a finding about the spec, once
    spec = ctx.spec
    supported = supported_versions()
    tagged = image_sglang_version(spec.image)
    how_to_add = "to add one, run .ci/sglang-release <version> (docs/validation.md: Supporting a new SGLang release)"
    if spec.sglang_version and tagged and spec.sglang_version != tagged:
        ctx.invalid(
            "sglang-version",
            "spec.sglangVersion",
            f"declares SGLang {spec.sglang_version}, but spec.image ({spec.image}) is tagged "
            f"{tagged}",
            "make spec.sglangVersion and the image tag name the same release",
        )
    elif ctx.version not in supported:
        fld = "spec.sglangVersion" if spec.sglang_version else "spec.image"
        ctx.invalid(
            "sglang-version",
            fld,
            f"SGLang {ctx.version} is not supported (supported: {', '.join(supported)})",
            f"use an image of a supported release; {how_to_add}",
        )
    elif not spec.sglang_version and not tagged:
        ctx.findings.append(
            Finding(
                "sglang-version",
                "warning",
                "spec.sglangVersion",
                f"not set, and the tag of spec.image ({spec.image}) names no release: judged "
                f"as SGLang {ctx.version}, the newest supported; the launcher refuses an "
                "image that runs another release",
                f"set spec.sglangVersion (supported: {', '.join(supported)})",
                "reported",
            )
        )


def _check_flags(ctx: _Ctx) -> None:
    seen: dict[str, ArgItem] = {}
    kept: list[ArgItem] = []
    for item in ctx.items:
        spec = ctx.table.lookup(item.option)
        fld = ctx.path(item)
        if spec is None:
            full = ctx.table.expand_prefix(item.option)
            if full is not None:
                # argparse takes a unique prefix for the flag: SGLang would apply it, the
                # policy must see the real name to apply the flag's bounds.
                ctx.refused.add(full.dest)
                ctx.invalid(
                    "unknown-flag",
                    fld,
                    f"{item.option} is an abbreviation SGLang would read as {full.name}",
                    f"write {full.name} in full",
                )
                continue
            close = ctx.table.closest(item.option)
            fix = f"did you mean {close}?" if close else "remove it"
            ctx.invalid(
                "unknown-flag",
                fld,
                f"{item.option} is not a flag of SGLang {ctx.table.sglang_version}",
                fix,
            )
            continue
        if spec.dest == "config":
            ctx.invalid(
                "config-file",
                fld,
                f"{item.option} reads SGLang options from a file the policy cannot see "
                "(a --watchdog-timeout or --dist-timeout there would escape their bounds)",
                "write those options in args instead",
            )
            continue
        if spec.dest in OWNED_FLAGS:
            use = OWNED_FLAGS[spec.dest].format(role=ctx.role_name)
            fix = (
                f"remove it; set {use} instead"
                if use.startswith("spec.")
                else f"remove it; set {use.removeprefix('nothing: ')}"
            )
            ctx.invalid("operator-owned-flag", fld, f"{item.option} is set by the operator", fix)
            continue
        if spec.dest in seen:
            ctx.invalid(
                "duplicate-flag",
                fld,
                f"{item.option} is already given at {ctx.path(seen[spec.dest])}",
                "keep one of them",
            )
            continue
        seen[spec.dest] = item
        problem = _arity_problem(spec.arity, item)
        if problem is None:
            for value in item.values:
                problem = problem or check_value(spec, value)
        if problem is not None:
            ctx.refused.add(spec.dest)
            bounded = _bounded_flags(ctx).get(spec.dest)
            if bounded is not None:
                # A bounded flag: say what it wants, not only what it is not.
                bound, want = bounded
                kind = "a whole number" if spec.type == "int" else "a number"
                ctx.invalid(
                    "flag-value",
                    fld,
                    f"{item.option} wants {kind} of seconds in (0, {bound}]: {problem}",
                    f"give {spec.name} {kind} of seconds, e.g. {spec.name} {want}",
                )
                continue
            ctx.invalid("flag-value", fld, f"{item.option}: {problem}", _value_fix(spec))
            continue
        if spec.deprecated is not None:
            ctx.findings.append(
                Finding(
                    "deprecated-flag",
                    "warning",
                    fld,
                    f"{item.option} is deprecated in SGLang {ctx.table.sglang_version}",
                    f"use {spec.deprecated}" if spec.deprecated else "remove it",
                    "reported",
                )
            )
        kept.append(item)
    ctx.items = kept


def _arity_problem(arity: str, item: ArgItem) -> str | None:
    n = len(item.values)
    if arity == "switch" and n:
        return f"takes no value, got {item.values}"
    if arity == "one" and n != 1:
        return "needs exactly one value" if n == 0 else f"takes one value, got {n}"
    if arity == "optional" and n > 1:
        return f"takes at most one value, got {n}"
    if arity == "some" and n == 0:
        return "needs at least one value"
    return None


def _value_fix(spec: FlagSpec) -> str:
    if spec.arity == "switch":
        return f"write {spec.name} alone (it is a switch)"
    if spec.choices:
        return f"use one of: {', '.join(spec.choices)}"
    kind = {"int": "an integer", "float": "a number", "json": "a JSON value"}.get(
        str(spec.type), "a value"
    )
    return f"give {spec.name} {kind}"


def _check_env(ctx: _Ctx) -> None:
    for i, var in enumerate(ctx.role.env):
        if var.name == c.ENV_TEST_FAULT_FILE:
            ctx.invalid(
                "operator-owned-env",
                f"spec.{ctx.role_name}.env[{i}].name",
                f"{var.name} is the runtime's test-only fault switch (it injects desyncs and "
                "hangs on purpose); the operator never renders it",
                "remove it (the local cluster's drills set it on their own pods only)",
            )
        elif var.name in OWNED_ENV:
            ctx.invalid(
                "operator-owned-env",
                f"spec.{ctx.role_name}.env[{i}].name",
                f"{var.name} is set by the operator",
                "remove it (see spec.safety for the settings behind it)",
            )
        elif var.name.startswith(GUARD_ENV_PREFIX):
            # Refused in every mode, whether a value or valueFrom (which the policy cannot
            # read): a spec does not switch a lockstep guard off, Warn included.
            what = RUNTIME_GUARD_ENV.get(var.name, "is a setting of lockstep's runtime")
            ctx.invalid(
                "operator-owned-env",
                f"spec.{ctx.role_name}.env[{i}].name",
                f"{var.name} {what}: lockstep's runtime guard is the operator's, in every mode",
                f"remove {var.name} from env (lockstep's guards are set through spec.safety "
                "and spec.health)",
            )
        else:
            _check_guard_env(ctx, i, var)


def _check_guard_env(ctx: _Ctx, index: int, var: EnvVar) -> None:
    """An env var that loosens torch's guards: dropped (Enforce), refused (Reject) or
    reported (Warn), whether given as a value or through valueFrom (which the policy cannot
    read)."""
    fld = f"spec.{ctx.role_name}.env[{index}]"
    shown = "valueFrom (not visible to the policy)" if var.value_from is not None else var.value
    if var.name in NCCL_GUARD_ENV and (
        var.value_from is not None or (var.value or "").strip() in NCCL_GUARD_OFF
    ):
        what = f"{var.name}={shown}: {NCCL_GUARD_ENV[var.name]}"
    else:
        return

    def drop() -> None:
        ctx.user_env = [v for v in ctx.user_env if v is not var]

    ctx.unsafe("guard-env", fld, what, f"remove {var.name} from env", drop)


def _overlap_on(ctx: _Ctx) -> bool:
    return not ctx.has("disable_overlap_schedule")


def _disable_overlap(ctx: _Ctx) -> Callable[[], None]:
    def adjust() -> None:
        if not ctx.has("disable_overlap_schedule"):
            ctx.added.append("--disable-overlap-schedule")

    return adjust


def _rule_overlap_schedule(ctx: _Ctx) -> None:
    role = ctx.role
    if role.tp <= 1 or role.dp_attention or not _overlap_on(ctx):
        return
    if ctx.spec.safety.overlap_schedule == "Guarded":
        ctx.guard()
        ctx.findings.append(
            Finding(
                "overlap-schedule",
                "info",
                "spec.safety.overlapSchedule",
                f"overlap schedule kept on for TP{role.tp} {ctx.role_name}, guarded by the "
                "rank consensus checker (a divergence ends the group fast and it restarts)",
                "none needed",
                "adjusted",
                RULES["overlap-schedule"].issues,
            )
        )
        return
    ctx.unsafe(
        "overlap-schedule",
        ctx.path(),
        f"the overlap scheduler is on for TP{role.tp} {ctx.role_name} without DP attention",
        "add --disable-overlap-schedule to args, or set spec.safety.overlapSchedule: Guarded",
        _disable_overlap(ctx),
    )


def _rule_spec_grammar_dp_attention(ctx: _Ctx) -> None:
    algo = ctx.value("speculative_algorithm")
    grammar = ctx.value("grammar_backend") or "xgrammar"
    if not (ctx.role.dp_attention and algo and algo.upper() != "NONE"):
        return
    if grammar == "none" or not _overlap_on(ctx):
        return
    ctx.unsafe(
        "spec-grammar-dp-attention-overlap",
        ctx.path(ctx.find("speculative_algorithm")),
        f"speculative decoding ({algo}) with grammar backend {grammar} and DP attention "
        "under the overlap scheduler can hang idle DP ranks",
        "add --disable-overlap-schedule, or --grammar-backend none if no request uses "
        "constrained decoding",
        _disable_overlap(ctx),
    )


def _bounded_flags(ctx: _Ctx) -> dict[str, tuple[int, str]]:
    """The flags whose value must lie in (0, bound], by dest: (bound, the operator's value)."""
    safety = ctx.spec.safety
    return {
        "watchdog_timeout": (
            safety.max_watchdog_timeout_seconds,
            str(safety.watchdog_timeout_seconds),
        ),
        "dist_timeout": (c.MAX_DIST_TIMEOUT_SECONDS, str(safety.dist_timeout_seconds)),
    }


def _rule_watchdog(ctx: _Ctx) -> None:
    safety = ctx.spec.safety
    item = ctx.find("watchdog_timeout")
    want = str(safety.watchdog_timeout_seconds)
    if item is None and "watchdog_timeout" in ctx.refused:
        return  # written, and refused for its value: that finding says what to write
    if item is None:

        def add() -> None:
            ctx.added.extend(["--watchdog-timeout", want])

        ctx.default(
            "watchdog-timeout",
            ctx.path(),
            f"--watchdog-timeout is not set; the operator sets {want}s "
            "(spec.safety.watchdogTimeoutSeconds)",
            f"nothing, or add --watchdog-timeout {want} to args",
            add,
        )
        return
    bound = safety.max_watchdog_timeout_seconds
    _bounded_flag(
        ctx, "watchdog-timeout", item, bound, want,
        "disables the watchdog", f"exceeds the bound of {bound}s",
        "a hung scheduler would never be ended",
    )  # fmt: skip


def _rule_step_bounds(ctx: _Ctx) -> None:
    """spec.health.stepBounds against the watchdog this role runs with, in whichever form
    it is given (`--watchdog-timeout v`, `--watchdog-timeout=v`, else the CR field; an
    abbreviation or a --config file is refused before): SGLang's watchdog ends a step
    at W seconds, so a step can never be called hung later than W. A minSeconds or a
    maxSeconds above W would be clamped to W behind the user's back: refused instead."""
    steps = ctx.spec.health.step_bounds
    item = ctx.find("watchdog_timeout")
    if item is None and "watchdog_timeout" in ctx.refused:
        return  # the flag's own finding says what to write
    if item is not None:
        raw, source = item.values[0], f"--watchdog-timeout in {ctx.path(item)}"
        raise_it = f"raise --watchdog-timeout in {ctx.path(item)}"
    else:
        raw = str(ctx.spec.safety.watchdog_timeout_seconds)
        source = "spec.safety.watchdogTimeoutSeconds"
        raise_it = "raise spec.safety.watchdogTimeoutSeconds (or set --watchdog-timeout)"
    watchdog = float(raw)
    if not (math.isfinite(watchdog) and watchdog > 0):
        return  # no watchdog (only Warn leaves one off): the watchdog rule reported it
    shown = f"{watchdog:g}s ({source})"
    if steps.max_seconds is not None and steps.max_seconds > watchdog:
        ctx.invalid(
            "step-bounds",
            "spec.health.stepBounds.maxSeconds",
            f"{steps.max_seconds}s is above the watchdog of {shown}: SGLang's watchdog "
            "ends a step first, so a step could never run that long",
            f"make maxSeconds <= {watchdog:g}, or {raise_it}",
        )
    elif steps.max_seconds is None and steps.min_seconds > watchdog:
        default = type(steps).model_fields["min_seconds"].default
        was = " (the default)" if steps.min_seconds == default else ""
        ctx.invalid(
            "step-bounds",
            "spec.health.stepBounds.minSeconds",
            f"{steps.min_seconds}s{was} is above the watchdog of {shown}: SGLang's "
            "watchdog ends a step before lockstep may call it hung",
            f"make minSeconds <= {watchdog:g}, or {raise_it}",
        )


def _bounded_flag(
    ctx: _Ctx,
    rule: str,
    item: ArgItem,
    bound: int,
    want: str,
    not_positive: str,
    too_large: str,
    harm: str,
) -> None:
    """A flag whose value must lie in (0, bound]: outside it, set to `want` (Enforce),
    refused (Reject) or reported (Warn)."""
    value = float(item.values[0])
    if 0 < value <= bound:
        return

    def replace() -> None:
        item.values = [want]

    if math.isnan(value):
        # float() takes "nan", and so does SGLang's argparse; no timeout compares to it.
        what = "is not a number of seconds"
    else:
        what = not_positive if value <= 0 else too_large
    ctx.unsafe(
        rule,
        ctx.path(item),
        f"{item.option} {item.values[0]} {what}: {harm}",
        f"use a value in (0, {bound}], e.g. {want}",
        replace,
    )


def _rule_dist_timeout(ctx: _Ctx) -> None:
    want = str(ctx.spec.safety.dist_timeout_seconds)
    item = ctx.find("dist_timeout")
    if item is None and "dist_timeout" in ctx.refused:
        return  # written, and refused for its value: that finding says what to write
    if item is not None:
        # The bound of the CR's own field: an initialisation that may wait longer hangs.
        bound = c.MAX_DIST_TIMEOUT_SECONDS
        _bounded_flag(
            ctx, "dist-timeout", item, bound, want,
            "is not positive", f"exceeds {bound}s",
            "distributed initialisation could wait for a missing rank for that long",
        )  # fmt: skip
        return

    def add() -> None:
        ctx.added.extend(["--dist-timeout", want])

    ctx.default(
        "dist-timeout",
        ctx.path(),
        f"--dist-timeout is not set; the operator sets {want}s (spec.safety.distTimeoutSeconds)",
        f"nothing, or add --dist-timeout {want} to args",
        add,
    )


def _rule_hicache_prefetch(ctx: _Ctx) -> None:
    if ctx.role.tp <= 1 or not ctx.has("enable_hierarchical_cache"):
        return
    if ctx.find("hicache_storage_backend") is None:
        return
    ctx.unsafe(
        "hicache-prefetch-tp",
        ctx.path(ctx.find("hicache_storage_backend")),
        f"HiCache storage prefetch with TP{ctx.role.tp} can deadlock in "
        "check_prefetch_progress; the operator turns on the rank consensus guard so a "
        "divergence ends the group and it restarts",
        "remove --hicache-storage-backend, or accept the guard (mode Enforce)",
        ctx.guard,
    )


def _decode_attn_tp(ctx: _Ctx) -> int:
    """The attention TP of the decode role (1 for the prefill role: no such rule)."""
    role = ctx.role
    if ctx.role_name != "decode":
        return 1
    return role.tp // role.dp if role.dp_attention else role.tp


def _decode_guard(ctx: _Ctx, rule: str, message: str, fix: str) -> None:
    """A decode divergence the rank consensus guard turns into a fast group restart: on
    and noted under overlapSchedule Guarded, otherwise adjusted/refused/reported by mode."""
    if ctx.spec.safety.overlap_schedule == "Guarded":
        ctx.guard()
        ctx.findings.append(
            Finding(rule, "info", "spec.decode.tp", message, "none needed (guarded)",
                    "adjusted", RULES[rule].issues)
        )  # fmt: skip
        return
    ctx.unsafe(rule, "spec.decode.tp", message, fix, ctx.guard)


def _rule_decode_transfer_hold(ctx: _Ctx) -> None:
    attn_tp = _decode_attn_tp(ctx)
    if attn_tp <= 1 or not RULES["decode-transfer-hold"].applies(ctx.version):
        return
    _decode_guard(
        ctx,
        "decode-transfer-hold",
        f"SGLang {ctx.version} PD decode with attention TP{attn_tp}: after a failed KV "
        "transfer each rank holds or releases the request on its own; the rank consensus "
        "guard turns a divergence into a fast group restart (0.5.23 agrees across ranks)",
        "use mode Enforce (turns the guard on), SGLang 0.5.23, or overlapSchedule: Guarded",
    )


def _rule_decode_queue(ctx: _Ctx) -> None:
    attn_tp = _decode_attn_tp(ctx)
    if attn_tp <= 1:
        return
    _decode_guard(
        ctx,
        "decode-queue-collectives",
        f"SGLang {ctx.table.sglang_version} PD decode with attention TP{attn_tp}: a rank "
        "whose preallocation/transfer queue is empty skips the poll all_reduce its peers "
        "issue; the rank consensus guard turns the divergence into a fast group restart",
        "use mode Enforce (turns the guard on), or set spec.safety.overlapSchedule: Guarded",
    )

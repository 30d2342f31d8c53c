"""The entry points: a deployment's spec to each role's effective argv, env and findings
(`evaluate`, `evaluate_role`), and a role's watchdog (`watchdog_seconds`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from lockstep.api import constants as c
from lockstep.api.models import PDDeploymentSpec
from lockstep.core.policy.engine.checks import _check_env, _check_flags, _check_version
from lockstep.core.policy.engine.context import _Ctx, sglang_version
from lockstep.core.policy.engine.guards import (
    _rule_decode_queue,
    _rule_decode_transfer_hold,
    _rule_dist_timeout,
    _rule_hicache_prefetch,
    _rule_overlap_schedule,
    _rule_spec_grammar_dp_attention,
    _rule_step_bounds,
    _rule_watchdog,
)
from lockstep.core.policy.engine.result import PolicyResult, RolePolicy
from lockstep.core.policy.engine.rules import FLIGHT_RECORDER_ENV, PEER_FAILURE_ENV
from lockstep.core.policy.flags import (
    FlagTable,
    load_flag_table,
    split_args,
    supported_versions,
)


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

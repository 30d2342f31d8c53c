"""The checks every role passes first: the SGLang version, the flags (known, not
operator-owned, the right arity and value), the environment."""

from __future__ import annotations

from lockstep.api import constants as c
from lockstep.api.models import EnvVar
from lockstep.core.policy.engine.context import _Ctx, image_sglang_version
from lockstep.core.policy.engine.guards import _bounded_flags
from lockstep.core.policy.engine.result import Finding
from lockstep.core.policy.engine.rules import (
    GUARD_ENV_PREFIX,
    NCCL_GUARD_ENV,
    NCCL_GUARD_OFF,
    OWNED_ENV,
    OWNED_FLAGS,
    RUNTIME_GUARD_ENV,
)
from lockstep.core.policy.flags import (
    ArgItem,
    FlagSpec,
    check_value,
    supported_versions,
)

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

"""The rules that adjust or refuse flags (the overlap schedule, the watchdog, the step
bounds, the dist timeout, hicache prefetch, the decode's transfer and queue guards)."""

from __future__ import annotations

import math
from collections.abc import Callable

from lockstep.api import constants as c
from lockstep.core.policy.engine.context import _Ctx
from lockstep.core.policy.engine.result import Finding
from lockstep.core.policy.engine.rules import RULES
from lockstep.core.policy.flags import (
    ArgItem,
)


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

"""The safety-flag policy engine (pure): see `lockstep.core.policy.engine`."""

from lockstep.core.policy.engine import (
    RULES,
    Finding,
    PolicyResult,
    RolePolicy,
    Rule,
    evaluate,
    image_sglang_version,
    sglang_version,
    watchdog_seconds,
)
from lockstep.core.policy.flags import FlagTable, load_flag_table, supported_versions

__all__ = [
    "RULES",
    "Finding",
    "FlagTable",
    "PolicyResult",
    "RolePolicy",
    "Rule",
    "evaluate",
    "image_sglang_version",
    "load_flag_table",
    "sglang_version",
    "supported_versions",
    "watchdog_seconds",
]

"""The safety-flag policy engine (pure): see `lockstep.policy.engine`."""

from lockstep.policy.engine import RULES, Finding, PolicyResult, RolePolicy, Rule, evaluate
from lockstep.policy.flags import FlagTable, load_flag_table

__all__ = [
    "RULES",
    "Finding",
    "FlagTable",
    "PolicyResult",
    "RolePolicy",
    "Rule",
    "evaluate",
    "load_flag_table",
]

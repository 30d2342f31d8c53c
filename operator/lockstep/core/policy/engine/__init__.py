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

from lockstep.core.policy.engine.context import (
    IMAGE_TAG_VERSION,
    image_sglang_version,
    sglang_version,
)
from lockstep.core.policy.engine.evaluate import evaluate, evaluate_role, watchdog_seconds
from lockstep.core.policy.engine.result import Finding, PolicyResult, RolePolicy
from lockstep.core.policy.engine.rules import (
    FLIGHT_RECORDER_ENV,
    GUARD_ENV_PREFIX,
    NCCL_GUARD_ENV,
    NCCL_GUARD_OFF,
    OWNED_ENV,
    OWNED_FLAGS,
    PEER_FAILURE_ENV,
    RULES,
    RUNTIME_GUARD_ENV,
    Action,
    Rule,
    Severity,
)

__all__ = [
    "FLIGHT_RECORDER_ENV",
    "GUARD_ENV_PREFIX",
    "IMAGE_TAG_VERSION",
    "NCCL_GUARD_ENV",
    "NCCL_GUARD_OFF",
    "OWNED_ENV",
    "OWNED_FLAGS",
    "PEER_FAILURE_ENV",
    "RULES",
    "RUNTIME_GUARD_ENV",
    "Action",
    "Finding",
    "PolicyResult",
    "RolePolicy",
    "Rule",
    "Severity",
    "evaluate",
    "evaluate_role",
    "image_sglang_version",
    "sglang_version",
    "watchdog_seconds",
]

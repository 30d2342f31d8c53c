"""What the policy answers: each finding (the rule, the field or flag, the fix), each
role's effective argv and env, the deployment's result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lockstep.api.models import EnvVar
from lockstep.core.policy.engine.rules import Action, Severity


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

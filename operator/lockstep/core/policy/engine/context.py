"""One role's evaluation in progress (the spec, the flag table, the argv and env being
built, the findings) and the SGLang version a spec runs."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from lockstep.api import constants as c
from lockstep.api.models import EnvVar, PDDeploymentSpec, RoleSpec
from lockstep.core.policy.engine.result import Finding
from lockstep.core.policy.engine.rules import RULES, Action, Severity
from lockstep.core.policy.flags import (
    ArgItem,
    FlagTable,
    supported_versions,
)


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

"""Kubernetes' rules for values: resource quantities, image references, and the shape of
a violation the other rules report."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from lockstep.api.k8s_rules.names import IMAGE_NAME_MAX

# ----------------------------------------------------------------------- quantity

_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[KMGTPE]i|[eE][+-]?[0-9]+|[numkMGTPE])?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: int | str) -> Decimal:
    """A Kubernetes quantity's value; `ValueError` saying why when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    found = _QUANTITY_RE.fullmatch(value)
    if found is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number = Decimal(found["number"])
    if found["sign"] == "-":
        number = -number
    suffix = found["suffix"] or ""
    if suffix in _BINARY:
        return number * (Decimal(1024) ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    if suffix:
        return number.scaleb(int(suffix[1:]))
    return number


# ------------------------------------------------------------------ image reference

# distribution/reference's grammar, component by component.
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_IPV6 = r"\[(?:[a-fA-F0-9:]+)\]"
_DOMAIN = rf"(?:{_DOMAIN_NAME}|{_IPV6})(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_IMAGE_RE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
_ANCHORED_ID = re.compile(r"[a-f0-9]{64}")


def image_reference(value: str) -> str | None:
    """Why `value` is not an image reference the kubelet can pull, or None."""
    if value != value.strip():
        return "has leading or trailing whitespace"
    found = _IMAGE_RE.fullmatch(value)
    if found is None:
        if _IMAGE_RE.fullmatch(value.lower()):
            return "has capitals in its repository path, which must be lowercase"
        return "does not follow the grammar [registry[:port]/]path[:tag][@algorithm:digest]"
    if len(found["name"]) > IMAGE_NAME_MAX:
        return f"has a repository name longer than {IMAGE_NAME_MAX} characters"
    if _ANCHORED_ID.fullmatch(found["name"]):
        return "is a 64-character hexadecimal image id, not a repository name"
    return None


# ------------------------------------------------------------------- structures


@dataclass(frozen=True)
class Violation:
    """One value Kubernetes would refuse: where below the checked value (`""`: the value
    itself, `.key`, `[0].operator`), what is wrong and how to fix it."""

    path: str
    message: str
    fix: str


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _unknown(obj: Mapping[str, Any], known: tuple[str, ...], path: str) -> list[Violation]:
    return [
        Violation(
            f"{path}.{key}", "is not a field of this Kubernetes object", f"use {' or '.join(known)}"
        )
        for key in sorted(set(obj) - set(known))
    ]

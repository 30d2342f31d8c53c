"""Kubernetes' rules for scheduling: node selector requirements and terms, node affinity,
tolerations."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from lockstep.api.k8s_rules.names import FIX_LABEL_KEY, FIX_LABEL_VALUE, label_value, qualified_name
from lockstep.api.k8s_rules.values import Violation, _is_str_list, _unknown

_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def node_selector_requirement(req: Any, path: str) -> list[Violation]:
    """A `matchExpressions` entry of a node selector term: a label key, one of the node
    selector operators, and the values that operator takes."""
    if not isinstance(req, Mapping):
        return [Violation(path, "is not a mapping", "use {key, operator, values}")]
    out = _unknown(req, ("key", "operator", "values"), path)
    key, operator, values = req.get("key"), req.get("operator"), req.get("values", [])
    if not isinstance(key, str) or not key:
        out.append(Violation(f"{path}.key", "is missing", "give the node label key"))
    elif (why := qualified_name(key)) is not None:
        out.append(Violation(f"{path}.key", f"{key!r} is not a label key: it {why}", FIX_LABEL_KEY))
    if operator not in _SELECTOR_OPERATORS:
        out.append(
            Violation(
                f"{path}.operator",
                f"{operator!r} is not a node selector operator",
                f"use one of {', '.join(_SELECTOR_OPERATORS)}",
            )
        )
        return out
    if not _is_str_list(values):
        out.append(Violation(f"{path}.values", "is not a list of strings", "use a list of strings"))
        return out
    if operator in ("In", "NotIn") and not values:
        out.append(
            Violation(
                f"{path}.values", f"is empty: {operator} needs values", "give one or more values"
            )
        )
    elif operator in ("Exists", "DoesNotExist") and values:
        out.append(
            Violation(
                f"{path}.values",
                f"must be empty when the operator is {operator}",
                "remove values",
            )
        )
    elif operator in ("Gt", "Lt"):
        if len(values) != 1 or not re.fullmatch(r"[+-]?[0-9]+", values[0]):
            out.append(
                Violation(
                    f"{path}.values",
                    f"{operator} needs exactly one integer value, got {values}",
                    "give one integer, e.g. ['7']",
                )
            )
    else:
        for i, v in enumerate(values):
            if (why := label_value(v)) is not None:
                out.append(
                    Violation(
                        f"{path}.values[{i}]",
                        f"{v!r} can never match a node label: a label value {why}",
                        FIX_LABEL_VALUE,
                    )
                )
    return out


def node_selector_field_requirement(req: Any, path: str) -> list[Violation]:
    """A `matchFields` entry: only `metadata.name`, In or NotIn, exactly one value."""
    if not isinstance(req, Mapping):
        return [Violation(path, "is not a mapping", "use {key, operator, values}")]
    out = _unknown(req, ("key", "operator", "values"), path)
    if req.get("key") != "metadata.name":
        out.append(
            Violation(f"{path}.key", f"{req.get('key')!r} is not a node field", "use metadata.name")
        )
    if req.get("operator") not in ("In", "NotIn"):
        out.append(
            Violation(
                f"{path}.operator",
                f"{req.get('operator')!r} is not an operator of a node field selector",
                "use In or NotIn",
            )
        )
    values = req.get("values")
    if not (isinstance(values, list) and len(values) == 1 and isinstance(values[0], str)):
        out.append(
            Violation(
                f"{path}.values",
                "a node field selector takes exactly one value",
                "give one node name (one entry per node)",
            )
        )
    return out


def node_selector_term(term: Any, path: str) -> list[Violation]:
    """A node selector term: `matchExpressions` on node labels, `matchFields`."""
    if not isinstance(term, Mapping):
        return [Violation(path, "is not a mapping", "use {matchExpressions, matchFields}")]
    out = _unknown(term, ("matchExpressions", "matchFields"), path)
    expressions, fields = term.get("matchExpressions", []), term.get("matchFields", [])
    for name, entries, check in (
        ("matchExpressions", expressions, node_selector_requirement),
        ("matchFields", fields, node_selector_field_requirement),
    ):
        if not isinstance(entries, list):
            out.append(Violation(f"{path}.{name}", "is not a list", "use a list of requirements"))
            continue
        for i, req in enumerate(entries):
            out.extend(check(req, f"{path}.{name}[{i}]"))
    if not expressions and not fields:
        out.append(
            Violation(path, "is empty: an empty term matches no node", "give it matchExpressions")
        )
    return out


def node_affinity(affinity: Mapping[str, Any], path: str = "") -> list[Violation]:
    """A `NodeAffinity` given as a mapping (its unknown top-level fields are the caller's
    to report): the required node selector and the weighted preferences."""
    out: list[Violation] = []
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    req_path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    if required is not None:
        if not isinstance(required, Mapping):
            out.append(Violation(req_path, "is not a mapping", "use {nodeSelectorTerms: [...]}"))
        else:
            out.extend(_unknown(required, ("nodeSelectorTerms",), req_path))
            terms = required.get("nodeSelectorTerms")
            if not isinstance(terms, list) or not terms:
                out.append(
                    Violation(
                        f"{req_path}.nodeSelectorTerms",
                        "must be a list of at least one term",
                        "give one or more terms (a node matching any one of them is used)",
                    )
                )
            else:
                for i, term in enumerate(terms):
                    out.extend(node_selector_term(term, f"{req_path}.nodeSelectorTerms[{i}]"))
    preferred = affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
    pref_path = f"{path}.preferredDuringSchedulingIgnoredDuringExecution"
    if preferred is not None:
        if not isinstance(preferred, list):
            out.append(Violation(pref_path, "is not a list", "use a list of {weight, preference}"))
            return out
        for i, item in enumerate(preferred):
            item_path = f"{pref_path}[{i}]"
            if not isinstance(item, Mapping):
                out.append(Violation(item_path, "is not a mapping", "use {weight, preference}"))
                continue
            out.extend(_unknown(item, ("weight", "preference"), item_path))
            weight = item.get("weight")
            if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
                out.append(
                    Violation(f"{item_path}.weight", f"is {weight!r}", "use an integer in 1..100")
                )
            if "preference" not in item:
                out.append(
                    Violation(f"{item_path}.preference", "is missing", "give a node selector term")
                )
            else:
                out.extend(node_selector_term(item["preference"], f"{item_path}.preference"))
    return out


def toleration(
    key: str | None,
    operator: str,
    value: str | None,
    effect: str | None,
    seconds: int | None,
    path: str = "",
) -> list[Violation]:
    """A toleration's fields against each other, as the API server checks them."""
    out: list[Violation] = []
    if key:
        if (why := qualified_name(key)) is not None:
            out.append(
                Violation(f"{path}.key", f"{key!r} is not a taint key: it {why}", FIX_LABEL_KEY)
            )
    elif operator != "Exists":
        out.append(
            Violation(
                f"{path}.operator",
                f"is {operator} with no key: only Exists may leave the key empty (it "
                "tolerates every taint)",
                "set key, or use operator: Exists",
            )
        )
    if operator == "Exists" and value:
        out.append(
            Violation(f"{path}.value", "must be empty when the operator is Exists", "remove value")
        )
    elif operator == "Equal" and value and (why := label_value(value)) is not None:
        out.append(
            Violation(f"{path}.value", f"{value!r} is not a taint value: it {why}", FIX_LABEL_VALUE)
        )
    if seconds is not None and effect != "NoExecute":
        out.append(
            Violation(
                f"{path}.tolerationSeconds",
                f"is set but effect is {effect or 'empty'}: only a NoExecute toleration "
                "has a time limit",
                "set effect: NoExecute, or remove tolerationSeconds",
            )
        )
    return out

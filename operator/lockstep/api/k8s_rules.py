"""Kubernetes' own rules for the values lockstep writes into Kubernetes objects.

Pure: no I/O, no Kubernetes client. `lockstep check`, the admission webhook and the
operator's reconcile run these (through `lockstep.api.models.cross_field_problems`), so a
value the API server, the kubelet or Kueue would refuse on every pod is refused when the
PDDeployment is written, naming the field and the fix, instead of leaving groups that
never start.

Each rule is Kubernetes' published one, rewritten here from its definition:
- names and labels, from k8s.io/apimachinery/pkg/util/validation (`IsDNS1123Label`,
  `IsDNS1123Subdomain`, `IsDNS1035Label`, `IsQualifiedName` for label keys,
  `IsValidLabelValue`, `IsEnvVarName`, `IsConfigMapKey`) and the "Object Names and IDs"
  and "Labels and Selectors" pages of kubernetes.io;
- quantities, from the grammar in the doc comment of k8s.io/apimachinery/pkg/api/
  resource/quantity.go (signed decimal number; binary `Ki`..`Ei`, decimal `n u m k M G T
  P E` or an `e`/`E` exponent) and the suffixes its parser accepts;
- node selector requirements, tolerations, env var sources and container resources,
  from k8s.io/kubernetes/pkg/apis/core/validation (`ValidateNodeSelectorRequirement`,
  `ValidateNodeFieldSelectorRequirement`, `validateTolerations`, `validateEnvVarValueFrom`,
  `ValidateResourceRequirements`) and the API reference of `NodeAffinity`, `Toleration`,
  `EnvVarSource` and `ResourceRequirements`;
- image references, from the grammar of github.com/distribution/reference (the one the
  kubelet parses an image with before it pulls; what does not parse ends the container
  in `InvalidImageName`);
- Kueue's queue name: the `kueue.x-k8s.io/queue-name` label names a LocalQueue, so Kueue
  refuses a value that is not a DNS-1123 subdomain (its job framework's validation).

Why no library: the operator's pure core may not import the Kubernetes client (the
`pure-core` import contract in pyproject.toml), and the client has no validator for
names, labels, selectors or images anyway; its one parser, `kubernetes.utils.
parse_quantity`, is laxer than the API server (it takes "NaN", "1K", "1_000" and " 1",
which the API server refuses). `kubernetes-validate` checks manifests against the
OpenAPI schemas, which carry no name or label patterns, and is a development tool, not a
dependency of the operator. No well-kept Python package implements the rules above.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

# --------------------------------------------------------------------- primitives

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
LABEL_VALUE_MAX = 63
QUALIFIED_NAME_MAX = 63
CONFIG_MAP_KEY_MAX = 253
IMAGE_NAME_MAX = 255

_DNS1123_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL_RE = re.compile(_DNS1123_LABEL)
_DNS1123_SUBDOMAIN_RE = re.compile(rf"{_DNS1123_LABEL}(?:\.{_DNS1123_LABEL})*")
_DNS1035_LABEL_RE = re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME_RE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")
_ENV_VAR_NAME_RE = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_CONFIG_MAP_KEY_RE = re.compile(r"[-._a-zA-Z0-9]+")

# What the fix says for each kind of value, with an example that passes.
FIX_DNS1123_LABEL = (
    "use at most 63 lowercase letters, digits and '-', starting and ending with a letter "
    "or digit (e.g. gpu-serving)"
)
FIX_DNS1123_SUBDOMAIN = (
    "use at most 253 lowercase letters, digits, '-' and '.', each dot-separated part "
    "starting and ending with a letter or digit (e.g. high-priority)"
)
FIX_DNS1035_LABEL = (
    "use lowercase letters, digits and '-', starting with a letter and ending with a "
    "letter or digit"
)
FIX_LABEL_KEY = (
    "use a label key: an optional DNS subdomain prefix and '/', then a name of at most 63 "
    "letters, digits, '-', '_' or '.' that starts and ends with a letter or digit "
    "(e.g. topology.kubernetes.io/zone)"
)
FIX_LABEL_VALUE = (
    "use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
    "or digit, or the empty string"
)
FIX_ENV_VAR_NAME = "use letters, digits, '_', '-' or '.', not starting with a digit (e.g. HF_HOME)"
FIX_QUANTITY = (
    "use a Kubernetes quantity: a non-negative number with an optional suffix Ki, Mi, Gi, "
    "Ti, Pi, Ei, n, u, m, k, M, G, T, P, E or an exponent (e.g. 500m, 64Gi, 8)"
)
FIX_IMAGE = (
    "use an image reference [registry[:port]/]path[:tag][@sha256:digest], with a "
    "lowercase path (e.g. lmsysorg/sglang:v0.5.23-cu130)"
)


def dns1123_label(value: str) -> str | None:
    """Why `value` is not a DNS-1123 label (a Service's, a hostname's), or None."""
    if len(value) > DNS1123_LABEL_MAX:
        return f"must be no more than {DNS1123_LABEL_MAX} characters (it has {len(value)})"
    if not _DNS1123_LABEL_RE.fullmatch(value):
        return (
            "must be a DNS-1123 label: lowercase letters, digits and '-', starting and "
            "ending with a letter or digit"
        )
    return None


def dns1123_subdomain(value: str) -> str | None:
    """Why `value` is not a DNS-1123 subdomain (most object names), or None."""
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        return f"must be no more than {DNS1123_SUBDOMAIN_MAX} characters (it has {len(value)})"
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        return (
            "must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', each "
            "dot-separated part starting and ending with a letter or digit"
        )
    return None


def dns1035_label(value: str) -> str | None:
    """Why `value` is not a DNS-1035 label (a Service name), or None."""
    if len(value) > DNS1123_LABEL_MAX:
        return f"must be no more than {DNS1123_LABEL_MAX} characters (it has {len(value)})"
    if not _DNS1035_LABEL_RE.fullmatch(value):
        return (
            "must be a DNS-1035 label: lowercase letters, digits and '-', starting with a "
            "letter and ending with a letter or digit"
        )
    return None


def qualified_name(value: str) -> str | None:
    """Why `value` is not a qualified name (a label key, a resource name), or None."""
    prefix, slash, name = value.rpartition("/")
    if slash:
        if "/" in prefix:
            return "may contain at most one '/' (between a DNS subdomain prefix and a name)"
        if not prefix:
            return "has an empty prefix before '/'"
        why = dns1123_subdomain(prefix)
        if why is not None:
            return f"has a prefix {prefix!r} that {why}"
    if not name:
        return "has an empty name part"
    if len(name) > QUALIFIED_NAME_MAX:
        return f"has a name part of {len(name)} characters (at most {QUALIFIED_NAME_MAX})"
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        return (
            f"has a name part {name!r} that is not letters, digits, '-', '_' or '.' "
            "starting and ending with a letter or digit"
        )
    return None


def label_value(value: str) -> str | None:
    """Why `value` is not a label value, or None (the empty string is one)."""
    if len(value) > LABEL_VALUE_MAX:
        return f"must be no more than {LABEL_VALUE_MAX} characters (it has {len(value)})"
    if value and not _QUALIFIED_NAME_RE.fullmatch(value):
        return (
            "must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    return None


def env_var_name(value: str) -> str | None:
    """Why `value` is not an environment variable name Kubernetes accepts, or None."""
    if not _ENV_VAR_NAME_RE.fullmatch(value):
        return "must be letters, digits, '_', '-' or '.', and must not start with a digit"
    if value in (".", "..") or value.startswith(".."):
        return "must not be '.' or '..' or start with '..'"
    return None


def config_map_key(value: str) -> str | None:
    """Why `value` is not a ConfigMap or Secret key, or None."""
    if len(value) > CONFIG_MAP_KEY_MAX:
        return f"must be no more than {CONFIG_MAP_KEY_MAX} characters"
    if not _CONFIG_MAP_KEY_RE.fullmatch(value):
        return "must be letters, digits, '-', '_' or '.'"
    if value in (".", "..") or value.startswith(".."):
        return "must not be '.' or '..' or start with '..'"
    return None


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


# The env var sources a container takes, and the pod fields an env var may read.
ENV_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
ENV_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
_ENV_FIELD_SUBSCRIPT = re.compile(r"metadata\.(labels|annotations)\['(?P<key>[^']+)'\]")
ENV_RESOURCES = tuple(
    f"{kind}.{res}"
    for kind in ("limits", "requests")
    for res in ("cpu", "memory", "ephemeral-storage")
)


def env_var_source(source: Mapping[str, Any], container: str, path: str = "") -> list[Violation]:
    """An `EnvVarSource` given as a mapping: exactly one source, each well formed."""
    given = [k for k in ENV_SOURCES if k in source]
    out = _unknown(source, ENV_SOURCES, path)
    if len(given) != 1:
        out.append(
            Violation(
                path,
                "names no source"
                if not given
                else f"names {len(given)} sources ({', '.join(given)})",
                f"use exactly one of {', '.join(ENV_SOURCES)}",
            )
        )
    for kind in given:
        ref, ref_path = source[kind], f"{path}.{kind}"
        if not isinstance(ref, Mapping):
            out.append(Violation(ref_path, "is not a mapping", "see the Kubernetes EnvVarSource"))
        elif kind in ("configMapKeyRef", "secretKeyRef"):
            out.extend(_key_ref(ref, kind, ref_path))
        elif kind == "fieldRef":
            out.extend(_unknown(ref, ("apiVersion", "fieldPath"), ref_path))
            field_path = ref.get("fieldPath")
            sub = (
                _ENV_FIELD_SUBSCRIPT.fullmatch(field_path) if isinstance(field_path, str) else None
            )
            if sub is not None and qualified_name(sub["key"]) is not None:
                sub = None
            if field_path not in ENV_FIELD_PATHS and sub is None:
                out.append(
                    Violation(
                        f"{ref_path}.fieldPath",
                        f"{field_path!r} is not a pod field an env var can read",
                        f"use one of {', '.join(ENV_FIELD_PATHS)}, metadata.labels['KEY'] or "
                        "metadata.annotations['KEY']",
                    )
                )
        else:
            out.extend(_unknown(ref, ("containerName", "resource", "divisor"), ref_path))
            resource = ref.get("resource")
            if resource not in ENV_RESOURCES and not (
                isinstance(resource, str)
                and re.fullmatch(r"(limits|requests)\.hugepages-.+", resource)
            ):
                out.append(
                    Violation(
                        f"{ref_path}.resource",
                        f"{resource!r} is not a container resource an env var can read",
                        f"use one of {', '.join(ENV_RESOURCES)}",
                    )
                )
            name = ref.get("containerName")
            if name not in (None, "", container):
                out.append(
                    Violation(
                        f"{ref_path}.containerName",
                        f"{name!r} is not this container (it is named {container!r})",
                        "remove containerName",
                    )
                )
            if "divisor" in ref:
                out.extend(_quantity_violations(ref["divisor"], f"{ref_path}.divisor"))
    return out


def _key_ref(ref: Mapping[str, Any], kind: str, path: str) -> list[Violation]:
    out = _unknown(ref, ("name", "key", "optional"), path)
    obj = "Secret" if kind == "secretKeyRef" else "ConfigMap"
    name, key = ref.get("name"), ref.get("key")
    if not isinstance(name, str) or not name:
        out.append(Violation(f"{path}.name", "is missing", f"give the {obj}'s name"))
    elif (why := dns1123_subdomain(name)) is not None:
        out.append(
            Violation(
                f"{path}.name", f"{name!r} is not a {obj} name: it {why}", FIX_DNS1123_SUBDOMAIN
            )
        )
    if not isinstance(key, str) or not key:
        out.append(Violation(f"{path}.key", "is missing", f"give the key in the {obj}"))
    elif (why := config_map_key(key)) is not None:
        out.append(
            Violation(
                f"{path}.key",
                f"{key!r} is not a {obj} key: it {why}",
                "use letters, digits, '-', '_' or '.'",
            )
        )
    if "optional" in ref and not isinstance(ref["optional"], bool):
        out.append(Violation(f"{path}.optional", "is not true or false", "use true or false"))
    return out


def _quantity_violations(value: Any, path: str) -> list[Violation]:
    try:
        amount = parse_quantity(value)
    except ValueError as err:
        return [Violation(path, str(err), FIX_QUANTITY)]
    if amount < 0:
        return [Violation(path, f"{value!r} is negative", "use a value >= 0")]
    return []


# Resources a container may request without a domain prefix.
STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def _is_native(name: str) -> bool:
    prefix = name.partition("/")[0] if "/" in name else ""
    return not prefix or prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")


def container_resources(
    requests: Mapping[str, int | str],
    limits: Mapping[str, int | str],
    path: str = "",
) -> list[Violation]:
    """A container's requests and limits: resource names, quantities, requests within
    limits, and extended resources (not overcommitted: whole numbers, request = limit)."""
    out: list[Violation] = []
    values: dict[str, dict[str, Decimal]] = {"requests": {}, "limits": {}}
    for kind, given in (("requests", requests), ("limits", limits)):
        for name, raw in given.items():
            at = f"{path}.{kind}.{name}"
            if (why := _resource_name(name)) is not None:
                out.append(
                    Violation(
                        at,
                        why,
                        "use cpu, memory, ephemeral-storage, hugepages-<size> or a prefixed "
                        "extended resource (e.g. rdma/ib)",
                    )
                )
                continue
            bad = _quantity_violations(raw, at)
            if bad:
                out.extend(bad)
                continue
            values[kind][name] = parse_quantity(raw)
    for name, request in values["requests"].items():
        limit = values["limits"].get(name)
        at = f"{path}.requests.{name}"
        if limit is not None and request > limit:
            out.append(
                Violation(
                    at,
                    f"{requests[name]!r} is above its limit {limits[name]!r}",
                    f"make requests.{name} <= limits.{name}",
                )
            )
        if not _is_native(name) or name.startswith("hugepages-"):
            if limit is None:
                out.append(
                    Violation(
                        at,
                        f"{name} cannot be overcommitted: a request needs an equal limit",
                        f"set limits.{name} to {requests[name]!r} (or give only the limit)",
                    )
                )
            elif request != limit:
                out.append(
                    Violation(
                        at,
                        f"{name} cannot be overcommitted: request {requests[name]!r} differs "
                        f"from limit {limits[name]!r}",
                        "make them equal (or give only the limit)",
                    )
                )
    for kind in ("requests", "limits"):
        for name, amount in values[kind].items():
            if not _is_native(name) and amount != amount.to_integral_value():
                out.append(
                    Violation(
                        f"{path}.{kind}.{name}",
                        f"{name} is counted in whole units, got {amount}",
                        "use a whole number",
                    )
                )
    return out


def _resource_name(name: str) -> str | None:
    why = qualified_name(name)
    if why is not None:
        return f"{name!r} is not a resource name: it {why}"
    if "/" not in name:
        if name in STANDARD_CONTAINER_RESOURCES:
            return None
        if name.startswith("hugepages-"):
            try:
                parse_quantity(name.removeprefix("hugepages-"))
            except ValueError:
                return f"{name!r} does not name a page size (e.g. hugepages-2Mi)"
            return None
        return f"{name!r} is not a resource a container can request"
    if _is_native(name):
        return (
            f"{name!r} is in the kubernetes.io domain, which has no container resource of that name"
        )
    return None

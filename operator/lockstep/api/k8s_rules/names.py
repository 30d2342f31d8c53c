"""Kubernetes' rules for names: DNS-1123 labels and subdomains, DNS-1035 labels,
qualified names (label and annotation keys), label values, environment variable names,
ConfigMap keys; each with the fix a message names."""

from __future__ import annotations

import re

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

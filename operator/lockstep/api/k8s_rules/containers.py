"""Kubernetes' rules for a container's environment (value sources, field paths, resource
fields) and resources (requests and limits)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from lockstep.api.k8s_rules.names import (
    FIX_DNS1123_SUBDOMAIN,
    FIX_QUANTITY,
    config_map_key,
    dns1123_subdomain,
    qualified_name,
)
from lockstep.api.k8s_rules.values import Violation, _unknown, parse_quantity

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

"""Parsing and validation: a PDDeployment from the API server's dict, every problem named
by its field with the fix (the schema's, the rules across fields, the values Kubernetes
must accept), and the runtime image filled in."""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from lockstep.api import constants as c
from lockstep.api import k8s_rules as k8s
from lockstep.api.models.base import KUEUE_QUEUE_PATTERN, MAX_NAME_LENGTH, SGLANG_VERSION_PATTERN
from lockstep.api.models.resource import PDDeployment
from lockstep.api.models.roles import NODE_AFFINITY_FIELDS, WeightsVolume

# ----------------------------------------------------------------- validation

# The API server's bound on an object's annotations, keys and values together
# (apimachinery's TotalAnnotationSizeLimitB).
MAX_ANNOTATIONS_BYTES = 256 * 1024


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a PDDeployment: where, what, and how to fix it."""

    field: str
    message: str
    fix: str
    # "schema": the CR's own rules; "kubernetes": a value Kubernetes (the API server, the
    # kubelet, Kueue) would refuse in the objects the operator writes.
    rule: str = "schema"

    def __str__(self) -> str:
        return f"{self.field}: {self.message} (fix: {self.fix})"


class InvalidPDDeployment(ValueError):
    """The object is not a valid PDDeployment; `problems` lists every reason."""

    def __init__(self, problems: list[SpecProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def parse_pddeployment(obj: Mapping[str, Any], *, strict: bool = False) -> PDDeployment:
    """Validate a PDDeployment object (schema, then cross-field rules).

    `strict`: JSON types as the API server checks them against the CRD's schema (a string
    where a boolean or an integer belongs is refused, not read as one): what `lockstep
    check` says of a file before the API server sees it. Objects read back from the API
    server have passed that schema already.

    Raises `InvalidPDDeployment` with every problem found, each naming its field path.
    """
    problems: list[SpecProblem] = []
    if obj.get("apiVersion") != c.API_VERSION:
        problems.append(
            SpecProblem("apiVersion", f"is {obj.get('apiVersion')!r}", f"use {c.API_VERSION}")
        )
    if obj.get("kind") != c.KIND:
        problems.append(SpecProblem("kind", f"is {obj.get('kind')!r}", f"use {c.KIND}"))
    try:
        if strict:
            pdd = PDDeployment.model_validate_json(json.dumps(dict(obj), default=str), strict=True)
        else:
            pdd = PDDeployment.model_validate(dict(obj))
    except ValidationError as err:
        problems.extend(_schema_problems(err))
        raise InvalidPDDeployment(problems) from None
    problems.extend(cross_field_problems(pdd))
    if problems:
        raise InvalidPDDeployment(problems)
    return pdd


def metadata_problems(pdd: PDDeployment) -> list[SpecProblem]:
    """The API server's rules for the PDDeployment's own labels and annotations
    (k8s.io/apimachinery's ValidateLabels and ValidateAnnotations)."""
    problems: list[SpecProblem] = []
    meta = pdd.metadata
    for key, value in sorted(meta.labels.items()):
        path = f"metadata.labels[{key!r}]"
        why = k8s.qualified_name(key)
        if why is not None:
            problems.append(SpecProblem(path, f"key {why}", k8s.FIX_LABEL_KEY, "kubernetes"))
        why = k8s.label_value(value)
        if why is not None:
            problems.append(
                SpecProblem(path, f"value {value!r} {why}", k8s.FIX_LABEL_VALUE, "kubernetes")
            )
    size = 0
    for key, value in sorted(meta.annotations.items()):
        size += len(key) + len(value)
        why = k8s.qualified_name(key.lower())
        if why is not None:
            problems.append(
                SpecProblem(
                    f"metadata.annotations[{key!r}]", f"key {why}", k8s.FIX_LABEL_KEY, "kubernetes"
                )
            )
    if size > MAX_ANNOTATIONS_BYTES:
        problems.append(
            SpecProblem(
                "metadata.annotations",
                f"total {size} bytes, more than the API server's {MAX_ANNOTATIONS_BYTES}",
                "move large values out of annotations (a ConfigMap)",
                "kubernetes",
            )
        )
    return problems


def cross_field_problems(pdd: PDDeployment) -> list[SpecProblem]:
    """Rules that span fields; each problem names the field to change."""
    problems: list[SpecProblem] = []
    name = pdd.metadata.name
    why = k8s.dns1035_label(name)
    if why is None and len(name) > MAX_NAME_LENGTH:
        why = f"has {len(name)} characters"
    if why is not None:
        problems.append(
            SpecProblem(
                "metadata.name",
                f"{name!r} {why}: the name prefixes the pod names <name>-<role>-<group>-"
                "<rank> (hostnames of at most 63 characters), the group Services (DNS-1035 "
                "labels) and the Kueue pod-group labels, so it must be a DNS-1035 label of "
                f"at most {MAX_NAME_LENGTH} characters",
                f"use at most {MAX_NAME_LENGTH} characters; {k8s.FIX_DNS1035_LABEL}",
            )
        )
    problems.extend(metadata_problems(pdd))
    spec = pdd.spec
    for role_name in c.ROLES:
        role = spec.role(role_name)
        path = f"spec.{role_name}"
        if role.tp != role.gpus_per_pod * role.pods_per_group:
            want = role.gpus_per_pod * role.pods_per_group
            problems.append(
                SpecProblem(
                    f"{path}.tp",
                    f"tp={role.tp} but gpusPerPod*podsPerGroup="
                    f"{role.gpus_per_pod}*{role.pods_per_group}={want}",
                    f"set tp to {want}, or change gpusPerPod/podsPerGroup so their product "
                    f"is {role.tp}",
                )
            )
        if role.dp_attention and role.dp < 2:
            problems.append(
                SpecProblem(
                    f"{path}.dp",
                    "dpAttention needs dp > 1",
                    "set dp to the number of attention DP ranks (e.g. equal to tp), or set "
                    "dpAttention: false",
                )
            )
        if role.tp % role.dp:
            problems.append(
                SpecProblem(
                    f"{path}.dp",
                    f"dp={role.dp} does not divide tp={role.tp}",
                    "use a dp that divides tp",
                )
            )
        if role.tp % role.ep:
            problems.append(
                SpecProblem(
                    f"{path}.ep",
                    f"ep={role.ep} does not divide tp={role.tp}",
                    "use an ep that divides tp (usually ep = tp or 1)",
                )
            )
        node_affinity = role.placement.node_affinity or {}
        unknown = sorted(set(node_affinity) - NODE_AFFINITY_FIELDS)
        if unknown:
            problems.append(
                SpecProblem(
                    f"{path}.placement.nodeAffinity",
                    f"has unknown field(s) {', '.join(unknown)}",
                    "use " + " and/or ".join(sorted(NODE_AFFINITY_FIELDS)),
                )
            )
        keys = [s.topology_key for s in role.placement.spread]
        for key in sorted({k for k in keys if keys.count(k) > 1}):
            problems.append(
                SpecProblem(
                    f"{path}.placement.spread",
                    f"topologyKey {key!r} is listed more than once (the API server refuses "
                    "a pod with two spread constraints on one key)",
                    "keep one entry per topologyKey",
                )
            )
        if role.replicas < 1 and not spec.paused:
            problems.append(
                SpecProblem(
                    f"{path}.replicas",
                    "is 0: a PD deployment needs at least one group of each role",
                    "set replicas >= 1, or set spec.paused: true to stop serving",
                )
            )
    prefill_backend = spec.transfer_for("prefill").backend
    decode_backend = spec.transfer_for("decode").backend
    if prefill_backend != decode_backend:
        problems.append(
            SpecProblem(
                "spec.decode.transfer.backend",
                f"decode uses {decode_backend!r} but prefill uses {prefill_backend!r}: KV "
                "cannot move between different transfer backends",
                "use the same backend for both roles (set it once in spec.transfer)",
            )
        )
    if spec.health.timeout_seconds > spec.health.period_seconds:
        problems.append(
            SpecProblem(
                "spec.health.timeoutSeconds",
                f"{spec.health.timeout_seconds}s exceeds periodSeconds "
                f"{spec.health.period_seconds}s: probes would overlap",
                "make timeoutSeconds <= periodSeconds",
            )
        )
    backoff = spec.recovery.backoff
    if backoff.base_seconds > backoff.max_seconds:
        problems.append(
            SpecProblem(
                "spec.recovery.backoff.maxSeconds",
                f"{backoff.max_seconds}s is below baseSeconds {backoff.base_seconds}s",
                "make maxSeconds >= baseSeconds",
            )
        )
    safety = spec.safety
    if safety.watchdog_timeout_seconds > safety.max_watchdog_timeout_seconds:
        problems.append(
            SpecProblem(
                "spec.safety.watchdogTimeoutSeconds",
                f"{safety.watchdog_timeout_seconds}s exceeds maxWatchdogTimeoutSeconds "
                f"{safety.max_watchdog_timeout_seconds}s",
                "lower watchdogTimeoutSeconds or raise maxWatchdogTimeoutSeconds",
            )
        )
    weights = spec.model.weights
    if weights and weights.persistent_volume_claim and weights.host_path:
        problems.append(
            SpecProblem(
                "spec.model.weights",
                "sets both persistentVolumeClaim and hostPath",
                "keep one of them",
            )
        )
    steps = spec.health.step_bounds
    if steps.max_seconds is not None and steps.min_seconds > steps.max_seconds:
        # A step is never hung before minSeconds and always hung past maxSeconds: both
        # cannot hold, and lockstep does not pick one for you.
        problems.append(
            SpecProblem(
                "spec.health.stepBounds.minSeconds",
                f"{steps.min_seconds}s is above maxSeconds {steps.max_seconds}s",
                "make minSeconds <= maxSeconds",
            )
        )
    problems.extend(kubernetes_problems(pdd))
    return problems


# ---------------------------------------------------- values Kubernetes must accept

# The paths the operator mounts into the SGLang container itself.
RESERVED_MOUNT_PATHS = ("/dev/shm", c.RUNTIME_MOUNT)


def kubernetes_problems(pdd: PDDeployment) -> list[SpecProblem]:
    """Every value of the spec the operator writes into a Kubernetes object, checked with
    Kubernetes' own rules (`lockstep.api.k8s_rules`): what the API server, the kubelet or
    Kueue would refuse on every pod is refused here, naming the field and the fix."""
    spec = pdd.spec
    found: list[tuple[str, str, str]] = []

    def add(field: str, violations: list[k8s.Violation]) -> None:
        found.extend((field + v.path, v.message, v.fix) for v in violations)

    def check(
        field: str, value: str, rule: Callable[[str], str | None], what: str, fix: str
    ) -> None:
        why = rule(value)
        if why is not None:
            found.append((field, f"{value!r} is not {what}: it {why}", fix))

    # The runtime's image and Python are used only when the runtime is injected.
    injected = spec.runtime.inject
    for fld, image in (
        ("spec.image", spec.image),
        ("spec.runtime.image", spec.runtime.image if injected else None),
        ("spec.router.image", spec.router.image),
    ):
        if image is not None:
            check(fld, image, k8s.image_reference, "an image reference", k8s.FIX_IMAGE)
    if injected:
        found.extend(_runtime_python_problems(spec.runtime.python))
    weights = spec.model.weights
    if weights is not None:
        found.extend(_weights_problems(weights))
    for role_name in c.ROLES:
        role = spec.role(role_name)
        path = f"spec.{role_name}"
        for key, value in role.node_selector.items():
            check(f"{path}.nodeSelector", key, k8s.qualified_name, "a label key", k8s.FIX_LABEL_KEY)
            check(
                f"{path}.nodeSelector.{key}", value, k8s.label_value, "a label value",
                k8s.FIX_LABEL_VALUE,
            )  # fmt: skip
        for i, t in enumerate(role.tolerations):
            add(
                f"{path}.tolerations[{i}]",
                k8s.toleration(t.key, t.operator, t.value, t.effect, t.toleration_seconds),
            )
        if role.priority_class_name is not None:
            check(
                f"{path}.priorityClassName", role.priority_class_name, k8s.dns1123_subdomain,
                "a PriorityClass name", k8s.FIX_DNS1123_SUBDOMAIN,
            )  # fmt: skip
        placement = role.placement
        if placement.topology_key is not None:
            check(
                f"{path}.placement.topologyKey", placement.topology_key, k8s.qualified_name,
                "a node label key", k8s.FIX_LABEL_KEY,
            )  # fmt: skip
        for i, spread in enumerate(placement.spread):
            check(
                f"{path}.placement.spread[{i}].topologyKey", spread.topology_key,
                k8s.qualified_name, "a node label key", k8s.FIX_LABEL_KEY,
            )  # fmt: skip
        if placement.scheduler_name is not None:
            check(
                f"{path}.placement.schedulerName", placement.scheduler_name,
                k8s.dns1123_subdomain, "a scheduler name", k8s.FIX_DNS1123_SUBDOMAIN,
            )  # fmt: skip
        if placement.node_affinity:
            add(f"{path}.placement.nodeAffinity", k8s.node_affinity(placement.node_affinity))
        requests, limits = role.resources.requests, role.resources.limits
        add(
            f"{path}.resources",
            k8s.container_resources(
                {k: v for k, v in requests.items() if k != GPU_RESOURCE},
                {k: v for k, v in limits.items() if k != GPU_RESOURCE},
            ),
        )
        for kind, given in (
            ("requests", role.resources.requests),
            ("limits", role.resources.limits),
        ):
            if GPU_RESOURCE in given:
                found.append(
                    (
                        f"{path}.resources.{kind}.{GPU_RESOURCE}",
                        "is set by the operator from gpusPerPod (the value here would be replaced)",
                        f"remove it; set {path}.gpusPerPod instead",
                    )
                )
        for i, var in enumerate(role.env):
            check(
                f"{path}.env[{i}].name", var.name, k8s.env_var_name,
                "an environment variable name", k8s.FIX_ENV_VAR_NAME,
            )  # fmt: skip
            if var.value_from is not None:
                if var.value:
                    found.append(
                        (
                            f"{path}.env[{i}]",
                            "sets both value and valueFrom",
                            "keep one of them",
                        )
                    )
                # "sglang": the container the builders put the role's env into.
                add(f"{path}.env[{i}].valueFrom", k8s.env_var_source(var.value_from, "sglang"))
    return [SpecProblem(f, m, fix, rule="kubernetes") for f, m, fix in found]


# The GPU resource the operator sets from gpusPerPod.
GPU_RESOURCE = "nvidia.com/gpu"


def _runtime_python_problems(python: str) -> list[tuple[str, str, str]]:
    """`spec.runtime.python` is the SGLang container's command[0]: the container runtime
    executes it as one file, found on the image's PATH only when it has no '/'."""
    fld = "spec.runtime.python"
    fix = "use an absolute path (e.g. /usr/bin/python3) or a command on the image's PATH (python3)"
    if not python.strip() or python != python.strip() or any(ch.isspace() for ch in python):
        return [
            (
                fld,
                f"{python!r} holds whitespace: it is executed as one file name, with no "
                "shell to split off arguments",
                fix,
            )
        ]
    if "/" in python and not python.startswith("/"):
        return [
            (
                fld,
                f"{python!r} is a relative path: it would be looked up from the image's "
                "working directory, which the operator does not know",
                fix,
            )
        ]
    if python.startswith("~") or "$" in python:
        return [(fld, f"{python!r} needs a shell to expand it; none runs it", fix)]
    return []


def _weights_problems(weights: WeightsVolume) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    fld = "spec.model.weights"
    mount = weights.mount_path
    if not mount.startswith("/") or "/../" in f"{mount}/":
        out.append(
            (
                f"{fld}.mountPath",
                f"{mount!r} is not an absolute path without '..'",
                "use an absolute path, e.g. /models",
            )
        )
    elif mount.rstrip("/") in RESERVED_MOUNT_PATHS:
        out.append(
            (
                f"{fld}.mountPath",
                f"{mount!r} is where the operator mounts its own volume",
                "use another path, e.g. /models",
            )
        )
    host = weights.host_path
    if host is not None and (not host.startswith("/") or "/../" in f"{host}/"):
        out.append(
            (
                f"{fld}.hostPath",
                f"{host!r} is not an absolute path without '..'",
                "use the absolute path of the directory on the node",
            )
        )
    claim = weights.persistent_volume_claim
    if claim is not None and (why := k8s.dns1123_subdomain(claim)) is not None:
        out.append(
            (
                f"{fld}.persistentVolumeClaim",
                f"{claim!r} is not a PersistentVolumeClaim name: it {why}",
                k8s.FIX_DNS1123_SUBDOMAIN,
            )
        )
    return out


# --------------------------------------------------------- pydantic error mapping

_FIXES: dict[str, str] = {
    "missing": "add this field",
    "int_type": "use an integer",
    "int_parsing": "use an integer",
    "int_from_float": "use a whole number",
    "bool_type": "use true or false",
    "bool_parsing": "use true or false",
    "string_type": "use a string",
    "list_type": "use a list",
    "dict_type": "use a mapping",
    "model_type": "use a mapping of the documented fields",
    "model_attributes_type": "use a mapping of the documented fields",
    "float_type": "use a number",
    "float_parsing": "use a number",
}


# What to write instead of a string that does not match a field's pattern.
_PATTERN_FIXES: dict[str, str] = {
    KUEUE_QUEUE_PATTERN: "use the name of a Kueue LocalQueue: at most 63 lowercase letters, "
    "digits, '-' and '.', each dot-separated part starting and ending with a letter or digit "
    "(e.g. team-a-gpu)",
    SGLANG_VERSION_PATTERN: "use a release number such as 0.5.23",
}


def _schema_problems(err: ValidationError) -> list[SpecProblem]:
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = _path(loc)
        kind = e["type"]
        ctx = e.get("ctx") or {}
        if kind == "extra_forbidden":
            known = _field_names_at(loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            fix = f"did you mean {close[0]!r}?" if close else "remove it"
            problems.append(SpecProblem(path, "unknown field", fix))
            continue
        if kind == "literal_error":
            fix = f"use one of {ctx.get('expected')}"
        elif kind in ("greater_than_equal", "less_than_equal"):
            bound = ctx.get("ge", ctx.get("le"))
            fix = f"use a value {'>=' if kind == 'greater_than_equal' else '<='} {bound}"
        elif kind in ("string_too_short", "too_short"):
            fix = "give it a value"
        elif kind in ("too_long", "string_too_long"):
            fix = "shorten it"
        elif kind == "string_pattern_mismatch":
            fix = _PATTERN_FIXES.get(str(ctx.get("pattern")), "see `lockstep crd` for the schema")
        else:
            fix = _FIXES.get(kind, "see `lockstep crd` for the schema")
        problems.append(SpecProblem(path, e["msg"], fix))
    return problems


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _field_names_at(loc: tuple[int | str, ...]) -> list[str]:
    """The wire names of the fields of the model found at `loc`, for suggestions."""
    model: Any = PDDeployment
    for part in loc:
        if isinstance(part, int):
            continue
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        field = fields.get(str(part))
        if field is None:
            return []
        nested = _model_in(field.annotation)
        if nested is None:
            return []
        model = nested
    return [(f.alias or n) for n, f in model.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def with_runtime_image(pdd: PDDeployment, image: str | None) -> PDDeployment:
    """`pdd` with `spec.runtime.image` set to `image` when the spec leaves it unset (the
    operator's configured runtime image: its own)."""
    if image is None or pdd.spec.runtime.image is not None:
        return pdd
    runtime = pdd.spec.runtime.model_copy(update={"image": image})
    return pdd.model_copy(update={"spec": pdd.spec.model_copy(update={"runtime": runtime})})

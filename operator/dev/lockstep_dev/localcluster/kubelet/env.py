"""A container's environment and volumes, as local values and directories.

Stands in for the parts of the real kubelet that build a container's runtime options
(`pkg/kubelet/kubelet_pods.go`: `makeEnvironmentVariables`, the downward API's fieldRef
values, secretKeyRef through the Secret manager, `makeMounts`) and for its volume manager,
with no mount namespace: an `emptyDir` is a directory of the pod's own, a `hostPath` is
that path, and a container's view of its mounts becomes real paths in its env and argv
(`rewrite_mounts`).

Pure except `read_secret` (one GET) and `volume_dirs` (which creates the `emptyDir`
directories).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from lockstep_dev.localcluster.kubelet.common import (
    HOST_IP,
    ContainerConfigError,
    KubeletError,
    MissingConfig,
    checked,
)

INHERITED_ENV: tuple[str, ...] = (
    "PATH",
    "PYTHONPATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "TZ",
    "VIRTUAL_ENV",
)
"""Variables of the kubelet's own environment every container also gets."""

SecretLookup = Callable[[str], Mapping[str, str] | None]
"""A Secret's decoded `data` by name (in the pod's namespace), or None when there is none."""


# -- environment variables -------------------------------------------------------------

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand_refs(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined references are replaced, `$$` is a `$`,
    anything else is left as written."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REF.sub(one, text)


_LABEL_PATH = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str) -> str:
    """The value of a `valueFrom.fieldRef.fieldPath` this kubelet supports."""
    meta = pod.get("metadata") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": (pod.get("spec") or {}).get("nodeName"),
        "status.podIP": pod_ip,
        "status.hostIP": HOST_IP,
    }
    if path in simple:
        return str(simple[path] or "")
    match = _LABEL_PATH.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ContainerConfigError(f"fieldRef {path!r} is not supported by the process kubelet")


def secret_value(
    container: str, var: str, ref: Mapping[str, Any], secrets: SecretLookup | None
) -> str | None:
    """The value of a `valueFrom.secretKeyRef`, or None for a missing optional one.

    Raises `MissingConfig` (naming the Secret and key) when a required one is missing."""
    name, key = str(ref.get("name", "")), str(ref.get("key", ""))
    data = secrets(name) if secrets is not None and name else None
    if data is not None and key in data:
        return data[key]
    if ref.get("optional"):
        return None
    what = f'secret "{name}" not found' if data is None else f'key "{key}" not in secret "{name}"'
    raise MissingConfig(f"container {container}: env {var} (secretKeyRef {name}/{key}): {what}")


def read_secret(http: httpx.Client, namespace: str, name: str) -> dict[str, str] | None:
    """A Secret's decoded data, or None when it does not exist."""
    try:
        response = http.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if response.status_code == 404:
            return None
        body = checked(response, f"reading secret {namespace}/{name}")
    except (httpx.HTTPError, KubeletError) as exc:  # the API server may be restarting
        raise MissingConfig(f'reading secret "{name}": {exc}') from exc
    data = {k: base64.b64decode(v).decode() for k, v in (body.get("data") or {}).items()}
    data.update(body.get("stringData") or {})
    return data


def container_env(
    container: Mapping[str, Any],
    pod: Mapping[str, Any],
    *,
    pod_ip: str,
    pod_dir: Path,
    inherited: Mapping[str, str],
    secrets: SecretLookup | None = None,
    mounts: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one container's process. Raises `MissingConfig` for a Secret
    or key that is not there (yet), `ContainerConfigError` for anything this kubelet
    cannot provide (envFrom, config map references). Literal values naming a path under
    one of the container's `mounts` name its local directory instead."""
    name = container.get("name", "")
    if container.get("envFrom"):
        raise ContainerConfigError(f"container {name}: envFrom is not supported")
    env = dict(inherited)
    env["LOCKSTEP_POD_IP"] = pod_ip
    env["LOCKSTEP_POD_DIR"] = str(pod_dir)
    for var in container.get("env") or []:
        key = var["name"]
        source = var.get("valueFrom")
        if source is None:
            env[key] = rewrite_mounts(expand_refs(str(var.get("value", "")), env), mounts or {})
        elif set(source) == {"fieldRef"}:
            env[key] = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip)
        elif set(source) == {"secretKeyRef"}:
            value = secret_value(name, key, source["secretKeyRef"], secrets)
            if value is not None:
                env[key] = value
        else:
            kinds = ", ".join(sorted(source))
            raise ContainerConfigError(
                f"container {name}: env {key} uses valueFrom {kinds}, which the process "
                "kubelet cannot resolve (only fieldRef and secretKeyRef)"
            )
    return env


# -- volumes and mounts ----------------------------------------------------------------


def volume_dirs(pod: Mapping[str, Any], pod_dir: Path) -> dict[str, Path]:
    """Where each volume of the pod lives here: an `emptyDir` is a directory of the pod's
    own (created now, kept across container restarts, gone with the pod), a `hostPath`
    is that path; other kinds have no local form and are left out."""
    dirs: dict[str, Path] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if "emptyDir" in volume:
            path = pod_dir / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            dirs[volume["name"]] = path
        elif "hostPath" in volume:
            dirs[volume["name"]] = Path(volume["hostPath"]["path"])
    return dirs


def mount_map(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> dict[str, str]:
    """A container's mount paths -> the local directories of their volumes (mounts of a
    volume with no local form, and `/dev/shm`, which every process here shares, are
    left alone)."""
    out: dict[str, str] = {}
    for mount in container.get("volumeMounts") or []:
        path = str(mount["mountPath"]).rstrip("/")
        local = volumes.get(mount["name"])
        if local is not None and path and path != "/dev/shm":
            out[path] = str(local)
    return out


def rewrite_mounts(text: str, mounts: Mapping[str, str]) -> str:
    """`text` with every path under a mount path (as a whole path: at the start of the
    text or after a space, `=`, `:` or a quote) moved to the mount's local directory:
    there is no mount namespace here, so a container's view of its volumes becomes
    real paths in its argv and env."""
    for path in sorted(mounts, key=len, reverse=True):
        pattern = re.compile(r"(^|[\s=:'\"])" + re.escape(path) + r"(?=$|[/\s:'\"])")
        # A function, not a template: the local directory is inserted verbatim.
        text = pattern.sub(lambda m, local=mounts[path]: m.group(1) + local, text)  # type: ignore[misc]
    return text

"""What every part of the process kubelet shares: its errors, the API server's time
formats, the one check of an API response, and the names and addresses it writes.

Stands in for no one part of the real kubelet; these are the few words its parts have in
common (as `k8s.io/apimachinery`'s `metav1.Time` and `MicroTime` are for the real one).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

Obj = dict[str, Any]

HOST_IP = "127.0.0.1"
"""Every node's one address (InternalIP), each pod's hostIP, and where logs are served."""

FIELD_MANAGER = "lockstep-process-kubelet"
LOG_NAME = "container.log"
"""The log of a pod's first container, in the pod's directory."""

REQUEST_TIMEOUT = 10.0
"""Seconds an API request may take (a watch's read waits longer)."""


class KubeletError(RuntimeError):
    """The process kubelet could not start, or was used before it started."""


class ContainerConfigError(ValueError):
    """A container's spec cannot be turned into a local process (the message says why)."""


class CannotRun(ValueError):
    """A container's command has no local meaning (no mapping, no such executable)."""


class MissingConfig(ContainerConfigError):
    """A container refers to configuration that may still appear (a Secret or one of its
    keys): the container waits and the start is tried again."""


def rfc3339(epoch_seconds: float) -> str:
    """A Kubernetes `Time` (second precision, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_seconds))


def micro_time(epoch_seconds: float) -> str:
    """A Kubernetes `MicroTime` (microsecond precision, UTC), as Leases use."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_seconds))
    return f"{whole}.{int((epoch_seconds % 1) * 1_000_000):06d}Z"


def checked(response: httpx.Response, what: str) -> Obj:
    """The body of a successful response; `KubeletError` naming `what` otherwise."""
    if response.is_success:
        body: Obj = response.json()
        return body
    raise KubeletError(f"{what}: HTTP {response.status_code}: {response.text[:1000]}")

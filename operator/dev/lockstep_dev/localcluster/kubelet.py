"""A process kubelet: fake GPU nodes whose pods run as local processes.

`ProcessKubelet` registers Node objects with `nvidia.com/gpu` capacity on a
`LocalControlPlane`, keeps them Ready with heartbeats (a Lease in `kube-node-lease` and
the Ready condition's `lastHeartbeatTime`), and turns every Pod the real scheduler binds to
them into local processes, one process group per container, on the pod's own loopback
address (from 127.0.64.0/18 by default, starting at a random one). It reports pod status the way a kubelet does
(phase, podIP, container statuses with restart counts, conditions merged by type so the
operator's readiness gate is never overwritten), probes readiness, restarts containers
after a back-off, and finishes deletions after the grace period.

Typical use::

    with LocalControlPlane() as cp, ProcessKubelet(cp, nodes=2) as kubelet:
        ...  # create pods; kubelet.pod_dir(ns, name) / "container.log" holds their output

    kubelet = ProcessKubelet(nodes=2)            # or as a control-plane extension
    with LocalControlPlane(extensions=[kubelet]):
        ...

What a container becomes (`COMMANDS` is the default table; pass `commands=` to change it;
its keys are leading words of command + args, so `("python3", "-m", "sglang_router...")`
can map one program without mapping every `python3`):

- command `["lockstep-sglang"]` runs `[sys.executable, "-m", "lockstep_standin",
  *args]`, the CPU stand-in of the SGLang image; the image itself is ignored. With
  `engine=engine("sglang")` it runs the real launcher and the real SGLang server on CPU
  instead, with what a CPU-only machine needs added (`lockstep_dev.localcluster.engines`);
- `["python3", "-m", "sglang_router.launch_router", ...]` (the router the operator renders)
  runs the real sglang-router launcher with this interpreter (`sglang-router` installed
  here), exactly with the pod's args;
- any other command runs as written when its executable exists here; otherwise the
  container stays Waiting with reason `ContainerCannotRun` and a message naming it;
- the operator image's `["lockstep", "operator"]` (the chart's Deployment) runs this
  checkout's `python -m lockstep.cli operator` with `--bind-address <pod IP>` added;
- every pod shares this machine's network, so a wildcard `--host 0.0.0.0` (or `::`)
  becomes `--host <pod IP>`;
- there is no cluster DNS, so the host of `--dist-init-addr HOST:PORT` is replaced by the
  pod IP of the pod named by HOST's first DNS label in the same namespace (the start
  waits for that pod to have an IP);
- the environment is the container's `env` (`value`; `valueFrom.fieldRef` for
  metadata.name/namespace/uid, labels and annotations, spec.nodeName, status.podIP and
  status.hostIP; `valueFrom.secretKeyRef`, read through the API when the container starts:
  a missing Secret or key keeps the container Waiting with reason
  `CreateContainerConfigError` and a message naming them, and is tried again, unless the
  reference is `optional`), `LOCKSTEP_POD_IP`, `LOCKSTEP_POD_DIR`, and a few variables of
  this process (`INHERITED_ENV`: PATH, PYTHONPATH, HOME, ...); `$(VAR)` references are
  expanded as Kubernetes does;
- a pod with a `serviceAccountName` (and `automountServiceAccountToken` not false) gets
  `KUBECONFIG`: a kubeconfig minted by the control plane for
  `system:serviceaccount:<namespace>:<name>` in that account's groups, so the API server
  enforces the RBAC bound to it, as it would with the account's token.

Logs: each run of a container appends to `<pod dir>/container.log` after a header line;
`log_tail()` reads it here, and the API server's pods/log (`kubectl logs [--previous]`, the
operator's incident evidence) reaches it through `lockstep_dev.localcluster.containerlogs`,
served on 127.0.0.1 at the port each Node advertises.

Pods are watched (list, then watch from the list's resourceVersion, relisting on 410);
each pod is run by its own thread, which owns the pod's processes. Requests go through
httpx, as in `LocalControlPlane`, with the admin client certificate.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from lockstep_dev.localcluster.containerlogs import ContainerLogServer, run_header
from lockstep_dev.localcluster.controlplane import ControlPlaneError, LocalControlPlane
from lockstep_dev.localcluster.engines import (
    CommandTable,
    ContainerContext,
    Engine,
    EngineError,
    engine,
)

Obj = dict[str, Any]

COMMANDS: CommandTable = engine("standin").commands
"""The default table: the SGLang image's entry point runs the CPU stand-in, and the
router image's runs the real sglang-router with this interpreter (see
:mod:`lockstep_dev.localcluster.engines`; `ProcessKubelet(engine=engine("sglang"))` runs the
real SGLang server instead)."""

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

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
NODE_LABEL = "lockstep.dev/process-kubelet"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# Not a well-known Kubernetes label (zone and region are); the name follows their scheme,
# and the local cluster's topology-aware placement tests select on it.
RACK_LABEL = "topology.kubernetes.io/rack"
NODE_PREFIX = "lockstep-gpu"
LEASE_NAMESPACE = "kube-node-lease"
FIELD_MANAGER = "lockstep-process-kubelet"
HOST_IP = "127.0.0.1"
LOG_NAME = "container.log"
LOG_MAX_BYTES = 16 * 1024 * 1024
DIST_INIT_FLAG = "--dist-init-addr"
DIST_INIT_FLAGS = (DIST_INIT_FLAG, "--nccl-init-addr")  # SGLang takes both spellings

# How often each pod's thread looks at its processes when nothing else wakes it.
_TICK_SECONDS = 0.1
_WATCH_SECONDS = 30
_REQUEST_TIMEOUT = 10.0
_LEASE_SECONDS = 40
_RESEND_SECONDS = 30.0
_CONFIG_RETRY_SECONDS = 1.0


class KubeletError(RuntimeError):
    """The process kubelet could not start, or was used before it started."""


class ContainerConfigError(ValueError):
    """A container's spec cannot be turned into a local process (the message says why)."""


class CannotRun(ValueError):
    """A container's command has no local meaning (no mapping, no such executable)."""


class MissingConfig(ContainerConfigError):
    """A container refers to configuration that may still appear (a Secret or one of its
    keys): the container waits and the start is tried again."""


SecretLookup = Callable[[str], Mapping[str, str] | None]
"""A Secret's decoded `data` by name (in the pod's namespace), or None when there is none."""


# -- pure logic: nodes -----------------------------------------------------------------


def rfc3339(epoch_seconds: float) -> str:
    """A Kubernetes `Time` (second precision, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_seconds))


def micro_time(epoch_seconds: float) -> str:
    """A Kubernetes `MicroTime` (microsecond precision, UTC), as Leases use."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_seconds))
    return f"{whole}.{int((epoch_seconds % 1) * 1_000_000):06d}Z"


@dataclass(frozen=True)
class NodeShape:
    """What every fake node offers."""

    gpus: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)


def build_node(name: str, shape: NodeShape, extra_labels: Mapping[str, str] | None = None) -> Obj:
    """The Node object a process kubelet registers (status is set separately):
    the kubelet's own labels, then the shape's, then this node's `extra_labels`."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        GPU_PRODUCT_LABEL: shape.gpu_product,
        "nvidia.com/gpu.count": str(shape.gpus),
        NODE_LABEL: "true",
        **shape.labels,
        **(extra_labels or {}),
    }
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def build_node_status(
    name: str,
    shape: NodeShape,
    *,
    now: float,
    ready_since: float,
    version: str,
    kubelet_port: int = 0,
) -> Obj:
    """A Ready node status with a fresh heartbeat. The only address is the InternalIP:
    the API server tries a Hostname address first, and node names do not resolve."""
    capacity = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": str(shape.pods),
        GPU_RESOURCE: str(shape.gpus),
    }

    def condition(kind: str, status: str, reason: str, message: str) -> Obj:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": rfc3339(now),
            "lastTransitionTime": rfc3339(ready_since),
        }

    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "no pressure"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "no pressure"),
            condition("Ready", "True", "KubeletReady", "lockstep process kubelet is posting"),
        ],
        "addresses": [{"type": "InternalIP", "address": HOST_IP}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "kubeletVersion": version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "containerRuntimeVersion": "lockstep-process://1",
            "kernelVersion": os.uname().release,
            "osImage": "local processes",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def node_names(count: int, prefix: str = NODE_PREFIX) -> list[str]:
    """The names of a process kubelet's nodes: `<prefix>-0` ... `<prefix>-<count - 1>`."""
    return [f"{prefix}-{i}" for i in range(count)]


def rack_labels(node_names: Sequence[str], racks: int) -> dict[str, dict[str, str]]:
    """Spread nodes over `racks` racks round-robin: node i gets `RACK_LABEL: rack-<i % racks>`
    (a `node_labels` value for `ProcessKubelet`)."""
    if racks < 1:
        raise ValueError("racks must be at least 1")
    return {name: {RACK_LABEL: f"rack-{i % racks}"} for i, name in enumerate(node_names)}


def node_schedulable(node: Mapping[str, Any]) -> bool:
    """Ready, and the node lifecycle controller has lifted its not-ready taint."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(t.get("key") == NOT_READY_TAINT for t in taints)


# -- pure logic: containers ------------------------------------------------------------

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


SERVICE_ACCOUNT_GROUPS = ("system:serviceaccounts", "system:authenticated")


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


def service_account_of(pod: Mapping[str, Any]) -> str | None:
    """The ServiceAccount whose credentials a pod's containers get: its
    `serviceAccountName` unless `automountServiceAccountToken` is false. Pods without a
    name get none here (a kubelet would mount `default`'s, which grants nothing)."""
    spec = pod.get("spec") or {}
    name = spec.get("serviceAccountName") or spec.get("serviceAccount")
    if not name or spec.get("automountServiceAccountToken") is False:
        return None
    return str(name)


def service_account_identity(namespace: str, account: str) -> tuple[str, list[str]]:
    """The user and groups the API server gives a ServiceAccount's token."""
    user = f"system:serviceaccount:{namespace}:{account}"
    return user, [
        *SERVICE_ACCOUNT_GROUPS[:1],
        f"system:serviceaccounts:{namespace}",
        *SERVICE_ACCOUNT_GROUPS[1:],
    ]


def read_secret(http: httpx.Client, namespace: str, name: str) -> dict[str, str] | None:
    """A Secret's decoded data, or None when it does not exist."""
    try:
        response = http.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if response.status_code == 404:
            return None
        body = _ok(response, f"reading secret {namespace}/{name}")
    except (httpx.HTTPError, KubeletError) as exc:  # the API server may be restarting
        raise MissingConfig(f'reading secret "{name}": {exc}') from exc
    data = {k: base64.b64decode(v).decode() for k, v in (body.get("data") or {}).items()}
    data.update(body.get("stringData") or {})
    return data


def local_argv(
    container: Mapping[str, Any],
    env: Mapping[str, str],
    commands: CommandTable,
    mounts: Mapping[str, str] | None = None,
) -> list[str]:
    """The argv that runs a container here, before `--dist-init-addr` is resolved: the
    longest key of `commands` that the container's words start with is replaced by its
    local program (the words are matched as the container sees them); the container's
    own words that name a path under one of its `mounts` name the local directory.

    Raises `CannotRun` when the command is neither in `commands` nor an executable found
    on the container's PATH."""
    command = [expand_refs(str(a), env) for a in container.get("command") or []]
    args = [expand_refs(str(a), env) for a in container.get("args") or []]
    mounts = mounts or {}
    name = container.get("name", "")
    if not command:
        raise CannotRun(
            f"container {name} has no command; the entrypoint of image "
            f"{container.get('image', '?')} has no local mapping"
        )
    words = [*command, *args]
    matches = [key for key in commands if key and tuple(words[: len(key)]) == key]
    if matches:
        key = max(matches, key=len)
        return [*commands[key], *(rewrite_mounts(w, mounts) for w in words[len(key) :])]
    command = [rewrite_mounts(w, mounts) for w in command]
    args = [rewrite_mounts(w, mounts) for w in args]
    executable = command[0]
    if "/" in executable:
        found = executable if os.path.isfile(executable) and os.access(executable, os.X_OK) else ""
    else:
        found = shutil.which(executable, path=env.get("PATH")) or ""
    if not found:
        mapped = sorted(" ".join(key) for key in commands) or "none"
        raise CannotRun(
            f"container {name}: command {command!r} is not mapped by the process kubelet "
            f"(mapped: {mapped}) and {executable!r} is not an executable on this machine"
        )
    return [*command, *args]


def dist_init_target(argv: Sequence[str]) -> tuple[int, str, str] | None:
    """`(index, host, port)` of the `--dist-init-addr` value in `argv`, if there is one.
    `index` is where the value is (the flag's own index for `--flag=value`)."""
    for i, arg in enumerate(argv):
        value: str | None = None
        if arg in DIST_INIT_FLAGS and i + 1 < len(argv):
            value, index = argv[i + 1], i + 1
        elif arg.split("=", 1)[0] in DIST_INIT_FLAGS and "=" in arg:
            value, index = arg.split("=", 1)[1], i
        if value is not None:
            host, sep, port = value.rpartition(":")
            if not sep:
                return None
            return index, host, port
    return None


def dist_init_pod(host: str) -> str | None:
    """The pod named by a rendezvous host (its first DNS label), or None for an IP
    address or localhost."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        label = host.split(".", 1)[0]
        return None if label in ("", "localhost") else label
    return None


def with_dist_init_ip(argv: Sequence[str], ip: str) -> list[str]:
    """`argv` with the host of its `--dist-init-addr` (or `--nccl-init-addr`) replaced by
    `ip`."""
    target = dist_init_target(argv)
    out = list(argv)
    if target is None:
        return out
    index, _, port = target
    if out[index].split("=", 1)[0] in DIST_INIT_FLAGS:  # the --flag=value spelling
        out[index] = f"{out[index].split('=', 1)[0]}={ip}:{port}"
    else:
        out[index] = f"{ip}:{port}"
    return out


WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")
HOST_FLAG = "--host"


def with_pod_host(argv: Sequence[str], ip: str) -> list[str]:
    """`argv` with a wildcard `--host` (0.0.0.0, ::) replaced by the pod's address: in a
    pod the wildcard means the pod's own addresses, and here every pod shares the host's
    network, so two pods binding 0.0.0.0 on one port would collide."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == HOST_FLAG and i + 1 < len(out) and out[i + 1] in WILDCARD_HOSTS:
            out[i + 1] = ip
        elif arg.startswith(HOST_FLAG + "=") and arg.split("=", 1)[1] in WILDCARD_HOSTS:
            out[i] = f"{HOST_FLAG}={ip}"
    return out


def exit_code(returncode: int) -> tuple[int, int | None]:
    """`(exitCode, signal)` as a container runtime reports them (128 + signal)."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


_STANDIN = engine("standin")


# -- pure logic: pod status ------------------------------------------------------------


@dataclass(frozen=True)
class ContainerView:
    """What a pod status needs to know about one container."""

    name: str
    image: str
    state: Obj
    last_state: Obj
    restart_count: int
    ready: bool
    started: bool
    container_id: str = ""

    def status(self) -> Obj:
        out: Obj = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "state": self.state,
            "lastState": self.last_state,
            "restartCount": self.restart_count,
            "ready": self.ready,
            "started": self.started,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def pod_phase(containers: Sequence[ContainerView], restart_policy: str) -> str:
    """Pending until a container has started; Succeeded/Failed once every container is
    terminated for good (only without restartPolicy Always); Running otherwise."""
    if (
        containers
        and restart_policy != "Always"
        and all("terminated" in c.state for c in containers)
    ):
        ok = all(c.state["terminated"]["exitCode"] == 0 for c in containers)
        return "Succeeded" if ok else "Failed"
    if any(c.started or c.restart_count > 0 or c.last_state for c in containers):
        return "Running"
    return "Pending"


def gate_states(pod: Mapping[str, Any]) -> dict[str, bool]:
    """Each readiness gate of the pod and whether its condition is True."""
    conditions = {
        c["type"]: c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    }
    gates = (pod.get("spec") or {}).get("readinessGates") or []
    return {g["conditionType"]: conditions.get(g["conditionType"], False) for g in gates}


def pod_conditions(
    pod: Mapping[str, Any],
    containers: Sequence[ContainerView],
    pending_init: Sequence[str] = (),
) -> list[tuple[str, bool, str, str]]:
    """`(type, status, reason, message)` of the conditions a kubelet owns. Initialized
    waits for every init container (`pending_init`: those not completed yet); Ready
    needs every container ready and every readiness gate True; the gates' own
    conditions belong to whoever sets them and are never written here."""
    not_ready = [c.name for c in containers if not c.ready]
    containers_ready = not not_ready
    gates = gate_states(pod)
    false_gates = sorted(g for g, ok in gates.items() if not ok)
    if not containers_ready:
        reason, message = "ContainersNotReady", f"containers with unready status: {not_ready}"
    elif false_gates:
        reason = "ReadinessGatesNotReady"
        message = f"corresponding condition of pod readiness gate {false_gates} is not True"
    else:
        reason, message = "", ""
    ready = containers_ready and not false_gates
    initialized = not pending_init
    init_message = "" if initialized else f"containers with incomplete status: {list(pending_init)}"
    return [
        ("PodScheduled", True, "", ""),
        (
            "Initialized",
            initialized,
            "" if initialized else "ContainersNotInitialized",
            init_message,
        ),
        ("ContainersReady", containers_ready, "" if containers_ready else reason, ""),
        ("Ready", ready, reason, message),
    ]


# -- the process kubelet ---------------------------------------------------------------


class AddressPool:
    """Loopback addresses for pods, handed out round robin so that a released address
    (whose sockets may linger in TIME_WAIT) is not reused at once. The round starts at
    a random address unless `first` is given: two local clusters on one machine (CI
    jobs, engineers' drills) then almost never hand out the same address, whose fixed
    ports (HTTP, agent, rendezvous) would collide."""

    def __init__(self, network: str, *, first: int | None = None) -> None:
        self._network = ipaddress.IPv4Network(network)
        if not self._network.is_loopback:
            raise ValueError(f"{network} is not a loopback network")
        self._hosts = [str(h) for h in self._network.hosts() if str(h) != HOST_IP]
        self._used: set[str] = set()
        self._next = random.randrange(len(self._hosts)) if first is None else first
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            for step in range(len(self._hosts)):
                candidate = self._hosts[(self._next + step) % len(self._hosts)]
                if candidate not in self._used:
                    self._used.add(candidate)
                    self._next = (self._next + step + 1) % len(self._hosts)
                    return candidate
        raise KubeletError(f"address pool {self._network} is exhausted")

    def release(self, address: str) -> None:
        with self._lock:
            self._used.discard(address)


# Process groups still running when the interpreter exits (a caller that never stopped
# its kubelet) are killed here.
_running: weakref.WeakSet[ProcessKubelet] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for kubelet in list(_running):
        with contextlib.suppress(Exception):
            kubelet.kill_all()


class ProcessKubelet:
    """Fake GPU nodes whose pods run as local processes; see the module docstring.

    A context manager (`start()` / `stop()`), and also a `ControlPlaneExtension`: an
    instance made without a control plane is called with one, returns itself, and is
    entered by `LocalControlPlane` once the control plane is ready.

    `root_dir` holds one directory per pod incarnation, `pods/<namespace>_<name>_<uid>/`,
    with `container.log` (the first container's output; others write
    `container-<name>.log`). Without `root_dir` a temporary directory is used and removed
    on stop. `stop()` kills every process the kubelet started, and with
    `remove_nodes_on_stop` deletes its nodes (and their leases) so the scheduler stops
    using them; pod objects are left as they are.

    Nodes are named `<node_prefix>-<i>`; `node_labels` (by node name, e.g.
    `rack_labels(names, racks)`) adds labels to one node on top of the shape's. The
    kubelet writes a node's metadata only when it registers it (an adopted node left by
    an earlier kubelet gets its labels merged in, keeping others'); heartbeats patch the
    status subresource only, so labels added by others (`kubectl label`) and a cordon
    (`spec.unschedulable` and its taint, `kubectl cordon` or `drain`) stay as they are.
    Evicting a pod (the eviction API, as `kubectl drain` does) is a graceful deletion:
    its processes get SIGTERM, then SIGKILL after the grace period, and the pod object
    is removed.
    """

    def __init__(
        self,
        controlplane: LocalControlPlane | None = None,
        *,
        nodes: int = 1,
        node_prefix: str = NODE_PREFIX,
        shape: NodeShape | None = None,
        node_labels: Mapping[str, Mapping[str, str]] | None = None,
        root_dir: Path | None = None,
        address_pool: str = "127.0.64.0/18",
        commands: CommandTable | None = None,
        engine: Engine | None = None,
        inherit_env: Sequence[str] = INHERITED_ENV,
        extra_env: Mapping[str, str] | None = None,
        heartbeat_seconds: float = 10.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 10.0,
        backoff_reset: float = 60.0,
        rendezvous_timeout: float = 60.0,
        start_timeout: float = 60.0,
        remove_nodes_on_stop: bool = True,
    ) -> None:
        if nodes < 1:
            raise ValueError("a process kubelet needs at least one node")
        self._cp = controlplane
        self.node_names = node_names(nodes, node_prefix)
        self.shape = shape or NodeShape()
        unknown = sorted(set(node_labels or {}) - set(self.node_names))
        if unknown:
            raise ValueError(f"node_labels for nodes this kubelet does not have: {unknown}")
        self.node_labels = {n: dict((node_labels or {}).get(n, {})) for n in self.node_names}
        self._given_root = root_dir
        self._root: Path | None = None
        self._addresses = AddressPool(address_pool)
        self.engine = engine
        self.commands = dict(commands if commands is not None else (engine or _STANDIN).commands)
        self._inherit = tuple(inherit_env)
        self._extra_env = dict(extra_env or {})
        self.heartbeat_seconds = heartbeat_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.backoff_reset = backoff_reset
        self.rendezvous_timeout = rendezvous_timeout
        self._start_timeout = start_timeout
        self._remove_nodes = remove_nodes_on_stop
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._workers: dict[str, _PodWorker] = {}  # by pod UID
        self._finished: set[str] = set()  # UIDs whose worker is done: never run again
        self._pods: dict[tuple[str, str], Obj] = {}  # every pod seen, by (namespace, name)
        self._groups: set[int] = set()  # process groups alive, for the safety nets
        self._accounts: dict[tuple[str, str], Path] = {}  # ServiceAccount kubeconfigs
        self._accounts_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._watch_socket: socket.socket | None = None
        self._logs = ContainerLogServer(self._log_path)
        self._logs_port = 0
        self._ready_since = time.time()
        self._started = False
        self.errors: list[str] = []
        """Unexpected errors of the background threads (they keep going), newest last."""

    # -- as an extension and a context manager ----------------------------------------

    def __call__(self, controlplane: LocalControlPlane) -> Self:
        """The `ControlPlaneExtension` protocol: bind to the ready control plane."""
        if self._cp is not None and self._cp is not controlplane:
            raise KubeletError("this kubelet already belongs to another control plane")
        self._cp = controlplane
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """Register the nodes, start heartbeats and the pod watch, and wait (bounded by
        `start_timeout`) until the scheduler may place pods on every node."""
        if self._cp is None:
            raise KubeletError("no control plane: pass one, or use the kubelet as extension")
        if self._started:
            raise KubeletError("already started")
        self._started = True
        self._stopping.clear()
        _running.add(self)
        try:
            if self._given_root is not None:
                self._given_root.mkdir(parents=True, exist_ok=True)
                self._root = self._given_root.resolve()
            else:
                self._root = Path(tempfile.mkdtemp(prefix="lockstep-kubelet-"))
            (self._root / "pods").mkdir(exist_ok=True)
            self._logs_port = self._logs.start()
            with self._http() as http:
                for name in self.node_names:
                    self._register_node(http, name)
                self._heartbeat(http)
            self._spawn_thread("heartbeat", self._heartbeat_loop)
            self._spawn_thread("pod-watch", self._watch_loop)
            self._wait_schedulable()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every process this kubelet started, stop its threads and (by default)
        remove its nodes; idempotent. Pod objects are left as they are."""
        if not self._started:
            return
        self._stopping.set()
        # Shutting the watch's socket down ends its blocking read at once.
        with contextlib.suppress(Exception):
            if self._watch_socket is not None:
                self._watch_socket.shutdown(socket.SHUT_RDWR)
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.wake()
        for worker in workers:
            worker.join(timeout=10.0)
        for thread in self._threads:
            thread.join(timeout=5.0)
        self.kill_all()
        self._logs.stop()
        if self._remove_nodes and self._cp is not None and self._cp.running:
            with contextlib.suppress(Exception), self._http() as http:
                for name in self.node_names:
                    http.delete(f"/api/v1/nodes/{name}")
                    http.delete(
                        f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}"
                    )
        if self._root is not None and self._given_root is None:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root = None
        self._threads.clear()
        with self._lock:
            self._workers.clear()
            self._pods.clear()
            self._finished.clear()
        with self._accounts_lock:
            self._accounts.clear()
        self._started = False
        _running.discard(self)

    def kill_all(self) -> None:
        """SIGKILL every process group this kubelet started that may still be alive."""
        with self._lock:
            groups = list(self._groups)
            self._groups.clear()
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)

    # -- what the dev tooling and tests read -------------------------------------------

    @property
    def root_dir(self) -> Path:
        if self._root is None:
            raise KubeletError("the kubelet is not running")
        return self._root

    def pod_dir(self, namespace: str, name: str) -> Path | None:
        """The directory of the pod's current incarnation on this kubelet, if it runs here."""
        worker = self._worker(namespace, name)
        return worker.dir if worker is not None else None

    def address_of(self, namespace: str, name: str) -> str | None:
        """The loopback address of a pod running on this kubelet."""
        worker = self._worker(namespace, name)
        return worker.ip if worker is not None else None

    def processes(self) -> dict[tuple[str, str], int]:
        """`(namespace, name)` -> pid of the pod's first container, for running pods."""
        with self._lock:
            workers = list(self._workers.values())
        out: dict[tuple[str, str], int] = {}
        for worker in workers:
            pid = worker.pid()
            if pid is not None and not worker.terminating:
                out[(worker.namespace, worker.name)] = pid
        return out

    def log_tail(self, namespace: str, name: str, *, lines: int = 100) -> str:
        """The last `lines` lines of the pod's first container log ('' when none)."""
        directory = self.pod_dir(namespace, name)
        if directory is None:
            return ""
        try:
            with open(directory / LOG_NAME, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 256 * 1024))
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _log_path(self, namespace: str, name: str, container: str) -> Path | None:
        """The log file of a container of a pod this kubelet runs (also while it ends)."""
        with self._lock:
            found = [
                w for w in self._workers.values() if (w.namespace, w.name) == (namespace, name)
            ]
        found.sort(key=lambda w: w.terminating)  # the live incarnation first
        for worker in found:
            for run in worker.containers:
                if run.name == container:
                    return run.log_path
        return None

    def _worker(self, namespace: str, name: str) -> _PodWorker | None:
        with self._lock:
            found = [
                w
                for w in self._workers.values()
                if w.namespace == namespace and w.name == name and not w.terminating
            ]
        return found[-1] if found else None

    # -- nodes -------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        assert self._cp is not None
        return self._cp.http_client(timeout=_REQUEST_TIMEOUT)

    def _register_node(self, http: httpx.Client, name: str) -> None:
        node = build_node(name, self.shape, self.node_labels[name])
        response = http.post("/api/v1/nodes", json=node, params={"fieldManager": FIELD_MANAGER})
        if response.status_code == 409:  # left by an earlier kubelet: adopt it
            response = http.patch(
                f"/api/v1/nodes/{name}",
                headers={"Content-Type": "application/merge-patch+json"},
                json={"metadata": {"labels": node["metadata"]["labels"]}},
            )
        _ok(response, f"registering node {name}")

    def _heartbeat(self, http: httpx.Client) -> None:
        assert self._cp is not None
        now = time.time()
        version = self._cp.info.kubernetes_version
        for name in self.node_names:
            status = build_node_status(
                name,
                self.shape,
                now=now,
                ready_since=self._ready_since,
                version=version,
                kubelet_port=self._logs_port,
            )
            _ok(
                http.patch(
                    f"/api/v1/nodes/{name}/status",
                    headers={"Content-Type": "application/strategic-merge-patch+json"},
                    json={"status": status},
                ),
                f"node {name} status",
            )
            self._renew_lease(http, name, now)

    def _renew_lease(self, http: httpx.Client, name: str, now: float) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        renewed = http.patch(
            f"{path}/{name}",
            headers={"Content-Type": "application/merge-patch+json"},
            json={"spec": {"renewTime": micro_time(now)}},
        )
        if renewed.status_code != 404:
            _ok(renewed, f"lease of node {name}")
            return
        node = _ok(http.get(f"/api/v1/nodes/{name}"), f"reading node {name}")
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": name,
                        "uid": node["metadata"]["uid"],
                    }
                ],
            },
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": _LEASE_SECONDS,
                "renewTime": micro_time(now),
            },
        }
        created = http.post(path, json=lease)
        if created.status_code != 409:
            _ok(created, f"creating the lease of node {name}")

    def _heartbeat_loop(self) -> None:
        with self._http() as http:
            while not self._stopping.wait(self.heartbeat_seconds):
                try:
                    self._heartbeat(http)
                except Exception as exc:  # the next beat may succeed; keep beating
                    self._record(f"heartbeat: {exc!r}")

    def _wait_schedulable(self) -> None:
        deadline = time.monotonic() + self._start_timeout
        with self._http() as http:
            while True:
                nodes = [
                    _ok(http.get(f"/api/v1/nodes/{n}"), f"reading node {n}")
                    for n in self.node_names
                ]
                if all(node_schedulable(n) for n in nodes):
                    return
                if time.monotonic() > deadline:
                    raise KubeletError(
                        f"nodes {self.node_names} not schedulable after "
                        f"{self._start_timeout:.0f}s (is the node lifecycle controller up?)"
                    )
                time.sleep(0.2)

    # -- pods --------------------------------------------------------------------------

    def _spawn_thread(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"kubelet-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _record(self, error: str) -> None:
        if not self._stopping.is_set():
            self.errors.append(error)
            del self.errors[:-100]

    def _watch_loop(self) -> None:
        """List every pod, then watch from the list's resourceVersion; relist on 410 or
        after a failure, with a bounded back-off between attempts."""
        delay = 0.2
        with self._http() as http:
            while not self._stopping.is_set():
                try:
                    version = self._relist(http)
                    while not self._stopping.is_set():
                        version = self._watch_once(http, version)
                    return
                except _Gone:
                    delay = 0.2
                except Exception as exc:
                    self._record(f"pod watch: {exc!r}")
                    self._stopping.wait(delay)
                    delay = min(delay * 2, 5.0)

    def _relist(self, http: httpx.Client) -> str:
        listed = _ok(http.get("/api/v1/pods"), "listing pods")
        seen = set()
        for pod in listed.get("items") or []:
            seen.add(pod["metadata"]["uid"])
            self._observe(pod, gone=False)
        with self._lock:
            vanished = [w for uid, w in self._workers.items() if uid not in seen]
            known = {
                (ns, n): p for (ns, n), p in self._pods.items() if p["metadata"]["uid"] in seen
            }
            self._pods = known
        for worker in vanished:
            worker.update(None)
        return str(listed["metadata"]["resourceVersion"])

    def _watch_once(self, http: httpx.Client, version: str) -> str:
        params = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(_WATCH_SECONDS),
        }
        timeout = httpx.Timeout(_REQUEST_TIMEOUT, read=_WATCH_SECONDS + 15.0)
        with http.stream("GET", "/api/v1/pods", params=params, timeout=timeout) as response:
            stream = response.extensions.get("network_stream")
            self._watch_socket = stream.get_extra_info("socket") if stream else None
            if self._stopping.is_set():
                return version
            if response.status_code == 410:
                raise _Gone()
            if not response.is_success:
                response.read()
                raise KubeletError(f"watching pods: HTTP {response.status_code}: {response.text}")
            for line in response.iter_lines():
                if self._stopping.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise KubeletError(f"pod watch error: {obj.get('message')}")
                version = obj["metadata"].get("resourceVersion", version)
                if kind != "BOOKMARK":
                    self._observe(obj, gone=kind == "DELETED")
        return version

    def _observe(self, pod: Obj, *, gone: bool) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        uid = meta["uid"]
        with self._lock:
            if gone:
                if self._pods.get(key, {}).get("metadata", {}).get("uid") == uid:
                    del self._pods[key]
            else:
                self._pods[key] = pod
            worker = self._workers.get(uid)
            if (
                worker is None
                and not gone
                and uid not in self._finished
                and not self._stopping.is_set()
                and (pod.get("spec") or {}).get("nodeName") in self.node_names
                and (
                    meta.get("deletionTimestamp")
                    or (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                )
            ):
                worker = _PodWorker(self, pod)
                self._workers[uid] = worker
                worker.start()
                return
        if worker is not None:
            worker.update(None if gone else pod)

    def _forget(self, worker: _PodWorker) -> None:
        with self._lock:
            if self._workers.get(worker.uid) is worker:
                del self._workers[worker.uid]
            if not self._stopping.is_set():
                self._finished.add(worker.uid)

    def rendezvous_ip(self, namespace: str, name: str) -> str | None:
        """The address of a live pod by name: from this kubelet's own pods first (known
        before their status lands), then from any pod's reported podIP."""
        with self._lock:
            for worker in self._workers.values():
                if (worker.namespace, worker.name) == (namespace, name) and not worker.terminating:
                    return worker.ip
            pod = self._pods.get((namespace, name))
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        ip = (pod.get("status") or {}).get("podIP")
        return str(ip) if ip else None

    def service_account_kubeconfig(self, http: httpx.Client, namespace: str, account: str) -> Path:
        """A kubeconfig for a ServiceAccount (minted once per account and kubelet).
        Raises `MissingConfig` while the account does not exist."""
        assert self._cp is not None
        key = (namespace, account)
        with self._accounts_lock:
            path = self._accounts.get(key)
            if path is not None:
                return path
            try:
                found = http.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}")
                if found.status_code != 404:
                    _ok(found, f"reading serviceaccount {namespace}/{account}")
            except (httpx.HTTPError, KubeletError) as exc:
                raise MissingConfig(f'reading serviceaccount "{account}": {exc}') from exc
            if found.status_code == 404:
                raise MissingConfig(f'serviceaccount "{account}" not found')
            directory = self.root_dir / "serviceaccounts"
            directory.mkdir(exist_ok=True)
            user, groups = service_account_identity(namespace, account)
            try:
                path = self._cp.user_kubeconfig(
                    user, groups, path=directory / f"{namespace}_{account}.kubeconfig"
                )
            except ControlPlaneError as exc:
                raise MissingConfig(f'credentials of serviceaccount "{account}": {exc}') from exc
            self._accounts[key] = path
            return path

    def _inherited_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in self._inherit if k in os.environ}
        env.update(self._extra_env)
        return env

    def _track(self, group: int, alive: bool) -> None:
        with self._lock:
            if alive:
                self._groups.add(group)
            else:
                self._groups.discard(group)


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


def _ok(response: httpx.Response, what: str) -> Obj:
    if response.is_success:
        body: Obj = response.json()
        return body
    raise KubeletError(f"{what}: HTTP {response.status_code}: {response.text[:1000]}")


@dataclass
class _Container:
    """One container of a pod and its current process; touched by its pod's thread only."""

    spec: Obj
    log_path: Path
    restart_count: int = 0
    process: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    started_mono: float = 0.0
    waiting: tuple[str, str] = ("ContainerCreating", "")
    terminated: Obj | None = None  # final (no restart coming)
    last_terminated: Obj | None = None
    next_start: float = 0.0
    backoff: float = 0.0
    permanent: bool = False  # a waiting reason no retry can change
    ready: bool = False
    probe_next: float = 0.0
    probe_failures: int = 0
    probe_successes: int = 0
    rendezvous_since: float | None = None
    restart_pending: bool = False  # the next start is a restart (restartCount + 1)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def view(self) -> ContainerView:
        if self.process is not None:
            state: Obj = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None:
            state = {"terminated": self.terminated}
        else:
            reason, message = self.waiting
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        return ContainerView(
            name=self.name,
            image=str(self.spec.get("image", "")),
            state=state,
            last_state={"terminated": self.last_terminated} if self.last_terminated else {},
            restart_count=self.restart_count,
            ready=self.ready and self.process is not None,
            started=self.process is not None,
            container_id=f"process://{self.process.pid}" if self.process is not None else "",
        )


class _PodWorker(threading.Thread):
    """Runs one pod incarnation (one UID): its address, directory and processes."""

    def __init__(self, kubelet: ProcessKubelet, pod: Obj) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.kubelet = kubelet
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.ip = kubelet._addresses.allocate()
        self.dir = kubelet.root_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.terminating = False
        self._pod: Obj | None = pod
        self._gone = False
        self._wake = threading.Event()
        self._pod_lock = threading.Lock()
        self._start_time = rfc3339(time.time())
        self._transitions: dict[str, tuple[bool, str]] = {}
        self._last_sent: Obj | None = None
        self._last_sent_at = 0.0
        previous = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}
        self.containers: list[_Container] = []
        for i, spec in enumerate(pod["spec"]["containers"]):
            log = self.dir / (LOG_NAME if i == 0 else f"container-{spec['name']}.log")
            # A pod that an earlier kubelet ran continues its restart count.
            before = previous.get(spec["name"], {})
            self.containers.append(
                _Container(
                    spec=spec,
                    log_path=log,
                    restart_count=int(before.get("restartCount", 0)),
                    restart_pending=bool(before.get("started") or before.get("lastState")),
                )
            )
        self._restart_policy = str(pod["spec"].get("restartPolicy", "Always"))
        self.volumes = volume_dirs(pod, self.dir)
        # Init containers run one after the other, each to success, before any container
        # starts (a failed one is run again after a back-off); once all succeeded the pod
        # is initialized for good (container restarts do not run them again).
        previous_init = {
            s["name"]: s for s in (pod.get("status") or {}).get("initContainerStatuses") or []
        }
        self.init_containers = [
            _Container(
                spec=spec,
                log_path=self.dir / f"init-{spec['name']}.log",
                restart_count=int(previous_init.get(spec["name"], {}).get("restartCount", 0)),
                waiting=("PodInitializing", "") if i else ("ContainerCreating", ""),
            )
            for i, spec in enumerate(pod["spec"].get("initContainers") or [])
        ]
        if self.init_containers:
            for container in self.containers:
                container.waiting = ("PodInitializing", "")

    # called from other threads
    def update(self, pod: Obj | None) -> None:
        with self._pod_lock:
            if pod is None:
                self._gone = True
            else:
                self._pod = pod
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def pid(self) -> int | None:
        process = self.containers[0].process if self.containers else None
        return process.pid if process is not None else None

    # the pod's thread
    def run(self) -> None:
        kubelet = self.kubelet
        http = kubelet._http()
        try:
            while not kubelet._stopping.is_set():
                with self._pod_lock:
                    pod, gone = self._pod, self._gone
                assert pod is not None
                if gone or pod["metadata"].get("deletionTimestamp"):
                    self._terminate(http, gone)
                    return
                self._step(pod, http)
                try:
                    self._report(http, pod)
                except Exception as exc:
                    kubelet._record(f"status of {self.namespace}/{self.name}: {exc!r}")
                self._wake.wait(_TICK_SECONDS)
                self._wake.clear()
        except Exception as exc:
            kubelet._record(f"pod {self.namespace}/{self.name}: {exc!r}")
        finally:
            for container in [*self.init_containers, *self.containers]:
                self._kill(container, signal.SIGKILL, wait=5.0)
            http.close()
            kubelet._addresses.release(self.ip)
            kubelet._forget(self)

    def pending_init(self) -> list[str]:
        """The init containers that have not completed yet."""
        return [c.name for c in self.init_containers if c.terminated is None]

    def _step_init(self, pod: Obj, http: httpx.Client) -> bool:
        """Run the init containers in order; True once every one completed."""
        for container in self.init_containers:
            if container.terminated is not None:
                continue
            if container.process is not None:
                self._init_exited(container)
            elif not container.permanent and time.monotonic() >= container.next_start:
                self._start(container, pod, http)
            return False
        return True

    def _init_exited(self, container: _Container) -> None:
        process = container.process
        assert process is not None
        if not _leader_exited(process):
            return
        returncode = _reap_group(process)
        self.kubelet._track(process.pid, alive=False)
        code, sig = exit_code(returncode)
        terminated: Obj = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": container.started_at,
            "finishedAt": rfc3339(time.time()),
            "containerID": f"process://{process.pid}",
        }
        if sig is not None:
            terminated["signal"] = sig
        container.process = None
        if code == 0:
            container.terminated = terminated
            return
        container.last_terminated = terminated
        container.restart_pending = True
        message = f"back-off restarting failed init container {container.name} (exit code {code})"
        self._backoff(container, ("Init:CrashLoopBackOff", message))

    def _step(self, pod: Obj, http: httpx.Client) -> None:
        if not self._step_init(pod, http):
            return
        now = time.monotonic()
        for container in self.containers:
            if container.process is not None:
                if self._exited(container):
                    continue
                self._probe(container, now)
            elif (
                not container.permanent
                and container.terminated is None
                and now >= container.next_start
            ):
                self._start(container, pod, http)

    def _start(self, container: _Container, pod: Obj, http: httpx.Client) -> None:
        kubelet = self.kubelet
        try:
            inherited = kubelet._inherited_env()
            account = service_account_of(pod)
            if account is not None:
                inherited["KUBECONFIG"] = str(
                    kubelet.service_account_kubeconfig(http, self.namespace, account)
                )
            env = container_env(
                container.spec,
                pod,
                pod_ip=self.ip,
                pod_dir=self.dir,
                inherited=inherited,
                secrets=lambda name: read_secret(http, self.namespace, name),
                mounts=mount_map(container.spec, self.volumes),
            )
            mounts = mount_map(container.spec, self.volumes)
            argv = local_argv(container.spec, env, kubelet.commands, mounts)
        except CannotRun as exc:
            container.waiting, container.permanent = ("ContainerCannotRun", str(exc)), True
            return
        except MissingConfig as exc:
            # As a kubelet does for a Secret that is not there yet: say so and try again.
            container.waiting = ("CreateContainerConfigError", str(exc))
            container.next_start = time.monotonic() + _CONFIG_RETRY_SECONDS
            return
        except ContainerConfigError as exc:
            container.waiting, container.permanent = ("CreateContainerConfigError", str(exc)), True
            return
        target = dist_init_target(argv)
        peer = dist_init_pod(target[1]) if target else None
        if target is not None and peer is not None:
            ip = self.ip if peer == self.name else kubelet.rendezvous_ip(self.namespace, peer)
            if ip is None:
                now = time.monotonic()
                if container.rendezvous_since is None:
                    container.rendezvous_since = now
                what = f"the IP of pod {peer} ({DIST_INIT_FLAG} {target[1]}:{target[2]})"
                # Past the bound the wait goes on (the pod may still come), but the
                # status says it is stuck, as a kubelet does for a missing ConfigMap.
                if now - container.rendezvous_since > kubelet.rendezvous_timeout:
                    limit = f"{kubelet.rendezvous_timeout:g}s"
                    container.waiting = ("CreateContainerConfigError", f"no {what} after {limit}")
                else:
                    container.waiting = ("ContainerCreating", f"waiting for {what}")
                return
            argv = with_dist_init_ip(argv, ip)
        container.rendezvous_since = None
        argv = with_pod_host(argv, self.ip)
        try:
            argv, env = (kubelet.engine or _STANDIN).complete(
                argv, env, ContainerContext(container.spec, pod, self.ip, self.dir, mounts)
            )
        except EngineError as exc:
            self._backoff(container, ("RunContainerError", str(exc)))
            return
        _rotate(container.log_path)
        started = time.time()
        with open(container.log_path, "ab") as log:
            restart = container.restart_count + (1 if container.restart_pending else 0)
            log.write(run_header(rfc3339(started), restart, argv))
            log.flush()
            try:
                process = subprocess.Popen(
                    argv,
                    cwd=self.dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                self._backoff(container, ("RunContainerError", f"starting {argv[0]}: {exc}"))
                return
        kubelet._track(process.pid, alive=True)
        if container.restart_pending:
            container.restart_count += 1
            container.restart_pending = False
        container.process = process
        container.started_at = rfc3339(started)
        container.started_mono = time.monotonic()
        container.ready = False
        container.probe_failures = container.probe_successes = 0
        probe = container.spec.get("readinessProbe") or {}
        container.probe_next = container.started_mono + float(probe.get("initialDelaySeconds", 0))

    def _exited(self, container: _Container) -> bool:
        """Reap the container's process if it exited, killing what it left in its group."""
        process = container.process
        assert process is not None
        if not _leader_exited(process):
            return False
        returncode = _reap_group(process)
        self.kubelet._track(process.pid, alive=False)
        code, sig = exit_code(returncode)
        finished = rfc3339(time.time())
        terminated: Obj = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": container.started_at,
            "finishedAt": finished,
            "containerID": f"process://{process.pid}",
        }
        if sig is not None:
            terminated["signal"] = sig
        container.process = None
        container.ready = False
        restart = self._restart_policy == "Always" or (
            self._restart_policy == "OnFailure" and code != 0
        )
        if not restart:
            container.terminated = terminated
            return True
        container.last_terminated = terminated
        container.restart_pending = True
        if time.monotonic() - container.started_mono >= self.kubelet.backoff_reset:
            container.backoff = 0.0
        message = f"back-off restarting failed container {container.name} (exit code {code})"
        self._backoff(container, ("CrashLoopBackOff", message))
        return True

    def _backoff(self, container: _Container, waiting: tuple[str, str]) -> None:
        kubelet = self.kubelet
        container.backoff = (
            kubelet.backoff_initial
            if container.backoff <= 0
            else min(container.backoff * 2, kubelet.backoff_max)
        )
        container.next_start = time.monotonic() + container.backoff
        reason, message = waiting
        container.waiting = (reason, f"{message}; next try in {container.backoff:g}s")

    def _probe(self, container: _Container, now: float) -> None:
        probe = container.spec.get("readinessProbe")
        if not probe:
            container.ready = True
            return
        if now < container.probe_next:
            return
        period = float(probe.get("periodSeconds", 10))
        container.probe_next = now + period
        ok = run_probe(probe, container.spec, self.ip, float(probe.get("timeoutSeconds", 1)))
        if ok:
            container.probe_failures = 0
            container.probe_successes += 1
            if container.probe_successes >= int(probe.get("successThreshold", 1)):
                container.ready = True
        else:
            container.probe_successes = 0
            container.probe_failures += 1
            if container.probe_failures >= int(probe.get("failureThreshold", 3)):
                container.ready = False

    def _report(self, http: httpx.Client, pod: Obj) -> None:
        views = [c.view() for c in self.containers]
        init_views = [c.view() for c in self.init_containers]
        now = rfc3339(time.time())
        conditions = []
        for kind, holds, reason, message in pod_conditions(pod, views, self.pending_init()):
            previous = self._transitions.get(kind)
            if previous is None or previous[0] != holds:
                self._transitions[kind] = (holds, now)
            condition: Obj = {
                "type": kind,
                "status": "True" if holds else "False",
                "lastProbeTime": None,
                "lastTransitionTime": self._transitions[kind][1],
            }
            # null deletes a field in a strategic merge patch: a condition that holds
            # again keeps no stale reason or message from when it did not.
            condition["reason"] = reason or None
            condition["message"] = message or None
            conditions.append(condition)
        status: Obj = {
            "phase": pod_phase(views, self._restart_policy),
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self._start_time,
            "conditions": conditions,
            "containerStatuses": [v.status() for v in views],
        }
        if init_views:
            status["initContainerStatuses"] = [v.status() for v in init_views]
        # Unchanged status is sent again now and then, in case another writer replaced it.
        if status == self._last_sent and time.monotonic() - self._last_sent_at < _RESEND_SECONDS:
            return
        # The uid in the patch is a precondition: a pod recreated under the same name
        # (the next epoch) never receives this incarnation's status.
        response = http.patch(
            f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status",
            headers={"Content-Type": "application/strategic-merge-patch+json"},
            params={"fieldManager": FIELD_MANAGER},
            json={"metadata": {"uid": self.uid}, "status": status},
        )
        if response.status_code in (404, 409):
            return
        _ok(response, f"status of pod {self.namespace}/{self.name}")
        self._last_sent = status
        self._last_sent_at = time.monotonic()

    def _terminate(self, http: httpx.Client, gone: bool) -> None:
        """SIGTERM every container's group, SIGKILL after the grace period, then remove
        the pod object the way a kubelet does."""
        with self.kubelet._lock:
            self.terminating = True
        started = time.monotonic()
        for container in self.init_containers:
            self._kill(container, signal.SIGKILL, wait=5.0)
        for container in self.containers:
            self._kill(container, signal.SIGTERM, wait=0.0)
        while any(c.process is not None for c in self.containers):
            with self._pod_lock:
                pod = self._pod
            assert pod is not None
            grace = 0.0 if gone else float(pod["metadata"].get("deletionGracePeriodSeconds", 0))
            if time.monotonic() - started >= grace or self.kubelet._stopping.is_set():
                break
            for container in self.containers:
                if container.process is not None and _leader_exited(container.process):
                    self._kill(container, signal.SIGKILL, wait=5.0)
            self._wake.wait(_TICK_SECONDS)
            self._wake.clear()
        for container in self.containers:
            self._kill(container, signal.SIGKILL, wait=5.0)
        if gone:
            return
        response = http.request(
            "DELETE",
            f"/api/v1/namespaces/{self.namespace}/pods/{self.name}",
            json={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
        )
        if response.status_code not in (404, 409):
            _ok(response, f"deleting pod {self.namespace}/{self.name}")

    def _kill(self, container: _Container, sig: signal.Signals, *, wait: float) -> None:
        process = container.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        if sig != signal.SIGKILL:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)
        if process.returncode is not None:
            self.kubelet._track(process.pid, alive=False)
            container.process = None


def run_probe(
    probe: Mapping[str, Any], container: Mapping[str, Any], ip: str, timeout: float
) -> bool:
    """One readiness check (httpGet or tcpSocket) against the pod's address."""
    ports = {
        p["name"]: int(p["containerPort"]) for p in container.get("ports") or [] if "name" in p
    }

    def port_of(value: Any) -> int | None:
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            return int(value)
        return ports.get(str(value))

    if "httpGet" in probe:
        get = probe["httpGet"]
        port = port_of(get.get("port"))
        if port is None:
            return False
        scheme = str(get.get("scheme", "HTTP")).lower()
        host = get.get("host") or ip
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
        url = f"{scheme}://{host}:{port}{get.get('path', '/')}"
        try:
            response = httpx.get(
                url, headers=headers, timeout=timeout, verify=False, trust_env=False
            )
        except httpx.HTTPError:
            return False
        return 200 <= response.status_code < 400
    if "tcpSocket" in probe:
        port = port_of(probe["tcpSocket"].get("port"))
        if port is None:
            return False
        try:
            with socket.create_connection((probe["tcpSocket"].get("host") or ip, port), timeout):
                return True
        except OSError:
            return False
    return False


def _leader_exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether a container's main process exited, without reaping it: until it is reaped
    its process group id cannot be reused, so killing the group stays safe."""
    if process.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return True
    return info is not None


def _reap_group(process: subprocess.Popen[bytes]) -> int:
    """Kill whatever the exited main process left in its group, then reap it."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.wait()


def _rotate(path: Path) -> None:
    """Keep a container log bounded: past `LOG_MAX_BYTES` it moves to `<name>.1`."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > LOG_MAX_BYTES:
            path.replace(path.with_name(path.name + ".1"))

"""What a container runs here: its command and args as a local argv.

Stands in for the real kubelet's command expansion (`ExpandContainerCommandAndArgs` in
`pkg/kubelet/container/helpers.go`: `$(VAR)` references in command and args) and for
what a container image and a pod network would give it: there are no images, so a
container's leading words are mapped to a local program (`COMMANDS`, an engine's table,
`lockstep_dev.localcluster.engines`); there is one shared network and no cluster DNS, so
a wildcard `--host` becomes the pod's address and the host of `--dist-init-addr` becomes
the address of the pod it names.

Pure: the caller resolves a rendezvous pod's address (`dist_init_pod` says which pod) and
passes it to `with_dist_init_ip`.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from lockstep_dev.localcluster.engines import CommandTable, engine
from lockstep_dev.localcluster.kubelet.common import CannotRun
from lockstep_dev.localcluster.kubelet.env import expand_refs, rewrite_mounts

COMMANDS: CommandTable = engine("standin").commands
"""The default table: the SGLang image's entry point runs the CPU stand-in, and the
router image's runs the real sglang-router with this interpreter (see
:mod:`lockstep_dev.localcluster.engines`; `ProcessKubelet(engine=engine("sglang"))` runs the
real SGLang server instead)."""

STANDIN_ENGINE = engine("standin")
"""The engine of a kubelet given none: it completes what `COMMANDS` maps."""

DIST_INIT_FLAG = "--dist-init-addr"
DIST_INIT_FLAGS = (DIST_INIT_FLAG, "--nccl-init-addr")  # SGLang takes both spellings
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")
HOST_FLAG = "--host"
# Every flag whose wildcard value means "the pod's addresses": the server's, and the
# sglang-router's metrics listener (two routers on this machine collided on it).
HOST_FLAGS = (HOST_FLAG, "--prometheus-host")


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


def with_pod_host(argv: Sequence[str], ip: str) -> list[str]:
    """`argv` with a wildcard `--host` or `--prometheus-host` (0.0.0.0, ::) replaced by
    the pod's address: in a pod the wildcard means the pod's own addresses, and here every
    pod shares the host's network, so two pods binding 0.0.0.0 on one port would collide."""
    out = list(argv)
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if arg in HOST_FLAGS and i + 1 < len(out) and out[i + 1] in WILDCARD_HOSTS:
            out[i + 1] = ip
        elif eq and flag in HOST_FLAGS and value in WILDCARD_HOSTS:
            out[i] = f"{flag}={ip}"
    return out

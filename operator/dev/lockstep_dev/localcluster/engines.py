"""What an SGLang pod's container runs on the local cluster: the CPU stand-in or the
real SGLang server.

The operator renders every SGLang pod with the image's entrypoint `lockstep-sglang` and
SGLang's own argv; the process kubelet maps that entrypoint to a local program:

- `standin` (the default, fast): `python -m lockstep_standin`, real gloo ranks
  running a scheduler loop shaped like SGLang's with lockstep's real runtime pieces;
- `sglang` (the reference): `python -m lockstep_sglang.launcher`, the product's own
  entrypoint running the real SGLang 0.5.23 server with lockstep's hooks, on CPU. What a
  CPU-only machine adds around it (the tiny model's flags, `sgl_kernel`'s stand-in, the
  mooncake libraries) comes from :mod:`lockstep_dev.localcluster.sglang_cpu`, as a CPU image
  would carry it; the pod keeps its rendered argv and env otherwise. Each pod also gets
  its own state directory (a pod's `/dev/shm`: here every pod shares the machine's), its
  agent bound to the pod's address, the test-only fault switch
  (`LOCKSTEP_TEST_FAULT_FILE=<pod dir>/fault.json`) that the operator never renders, and
  the local patches of `images/sglang-cpu/site/lockstep_local_patches.py` (the
  rendezvous store on the pod's address; a request log like the stand-in's).

Where the two differ, the stand-in is wrong.

A pod of a stock SGLang image gets lockstep's runtime from an init container
(`lockstep-runtime-install <volume>`, see `lockstep_sglang.install`), mapped here to this
checkout's `python -m lockstep_sglang.install`: it copies the runtime into the pod's own
volume directory. Its SGLang container then runs `python3 <volume>/launch.py`: on the
`sglang` engine that is exactly what runs (this interpreter, the copied launcher and
hooks, the real server); the stand-in, which is not part of the copied runtime, runs in
its place once the copy is there (a missing `launch.py` fails the start as it would in a
container).

Either engine also runs the operator image's entrypoint (`lockstep operator`, as the
chart's Deployment renders it) as this checkout's `python -m lockstep.cli operator`, with
`--bind-address <pod IP>` added: its servers (liveness, metrics, webhook) listen on the
pod's own address, since every pod shares the machine's network here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lockstep.api import constants as c
from lockstep_dev.localcluster import sglang_cpu

EngineName = Literal["standin", "sglang"]
ENGINES: tuple[EngineName, ...] = ("standin", "sglang")

ENTRYPOINT = "lockstep-sglang"
ROUTER_MODULE = "sglang_router.launch_router"
LAUNCHER = (sys.executable, "-m", "lockstep_sglang.launcher")
# A stock image's entrypoint as the operator renders it (lockstep.api.constants): the
# image's Python on the launcher its init container copied into the runtime volume.
RUNTIME_MOUNT = c.RUNTIME_MOUNT
INJECTED_ENTRYPOINT = ("python3", c.RUNTIME_LAUNCH)
RUNTIME_INSTALL = (c.RUNTIME_INSTALL,)
INSTALLER = (sys.executable, "-m", "lockstep_sglang.install")
# The real engine runs the injected launcher itself: `complete` puts the local path of
# the pod's copy in place of this word.
INJECTED_LAUNCH = "<runtime volume>/launch.py"
STANDIN = (sys.executable, "-m", "lockstep_standin")
OPERATOR_ENTRYPOINT = ("lockstep", "operator")  # charts/lockstep/templates/deployment.yaml
OPERATOR = (sys.executable, "-m", "lockstep.cli", "operator")
BIND_ADDRESS_FLAG = "--bind-address"
FAULT_FILE_ENV = "LOCKSTEP_TEST_FAULT_FILE"  # lockstep_sglang.faults (not importable here)
FAULT_FILE = "fault.json"
REQUEST_LOG = "requests.jsonl"  # the stand-in's name (lockstep_dev.traffic reads it)
GPU_RESOURCE = "nvidia.com/gpu"


class EngineError(RuntimeError):
    """A container this engine cannot start as rendered (the message says why)."""


CommandTable = Mapping[tuple[str, ...], Sequence[str]]
"""Leading words of a container's command + args -> the local argv that replaces them
(the longest matching key wins; the remaining words follow)."""


@dataclass(frozen=True)
class ContainerContext:
    """What the kubelet knows of the container it is about to start."""

    container: Mapping[str, Any]
    pod: Mapping[str, Any]
    pod_ip: str
    pod_dir: Path
    # The container's mount paths -> their local directories.
    mounts: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """The GPUs the container asked for (one local rank each)."""
        resources = self.container.get("resources") or {}
        raw = (resources.get("limits") or {}).get(GPU_RESOURCE) or (
            resources.get("requests") or {}
        ).get(GPU_RESOURCE)
        try:
            return max(1, int(str(raw or "1")))
        except ValueError:
            return 1


@dataclass(frozen=True)
class Engine:
    """An entrypoint table and how a mapped container's argv and env are completed.

    `image_env`: environment the local SGLang image carries, as a Dockerfile's ENV would
    (a container's own env wins): how the baseline drill runs SGLang pods without
    lockstep's consensus, which no PDDeployment may switch off."""

    name: EngineName
    commands: CommandTable
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    image_env: Mapping[str, str] = field(default_factory=dict)

    def complete(
        self, argv: list[str], env: dict[str, str], ctx: ContainerContext
    ) -> tuple[list[str], dict[str, str]]:
        """The container's final argv and env (the router and others pass unchanged)."""
        if tuple(argv[: len(OPERATOR)]) == OPERATOR:
            if _flag_value(argv, BIND_ADDRESS_FLAG) is None:
                argv = [*argv, f"{BIND_ADDRESS_FLAG}={ctx.pod_ip}"]
            return argv, env
        injected = _injected_launch(ctx)
        if self.image_env and _runs_sglang(argv, injected):
            own = {str(e.get("name")) for e in ctx.container.get("env") or []}
            env = {**env, **{k: v for k, v in self.image_env.items() if k not in own}}
        if injected is not None:
            launch = Path(injected)
            if not launch.is_file() or not (launch.parent / "lockstep_sglang").is_dir():
                raise EngineError(
                    f"{launch} is missing: the runtime volume holds no lockstep runtime "
                    "(did the init container lockstep-runtime-install run?)"
                )
        if injected is not None and argv[:2] == [sys.executable, INJECTED_LAUNCH]:
            argv = [sys.executable, injected, *argv[2:]]
        if self.name != "sglang" or not (
            tuple(argv[: len(LAUNCHER)]) == LAUNCHER
            or (injected is not None and argv[:2] == [sys.executable, injected])
        ):
            return argv, env
        mode = _flag_value(argv, "--disaggregation-mode")
        argv = [*argv, *sglang_cpu.cpu_flags(mode)]
        env = sglang_cpu.cpu_env(env, cores=[i % self.cores for i in range(ctx.gpus)])
        env["LOCKSTEP_STATE_DIR"] = str(ctx.pod_dir / "state")
        env["LOCKSTEP_AGENT_HOST"] = ctx.pod_ip
        env[FAULT_FILE_ENV] = str(ctx.pod_dir / FAULT_FILE)
        # images/sglang-cpu/site/lockstep_local_patches.py: the rendezvous store bound to
        # the pod's address, and the request log the drills read (as the stand-in's).
        env["LOCKSTEP_LOCAL_POD"] = "1"
        env["LOCKSTEP_REQUEST_LOG"] = str(ctx.pod_dir / REQUEST_LOG)
        return argv, env


def _runs_sglang(argv: Sequence[str], injected: str | None) -> bool:
    """Whether a mapped argv runs an SGLang server (the stand-in or the launcher)."""
    return (
        tuple(argv[: len(STANDIN)]) == STANDIN
        or tuple(argv[: len(LAUNCHER)]) == LAUNCHER
        or (
            injected is not None
            and list(argv[:2]) in ([sys.executable, injected], [sys.executable, INJECTED_LAUNCH])
        )
    )


def _injected_launch(ctx: ContainerContext) -> str | None:
    """The local path of the injected launcher when the container runs it."""
    command = list(ctx.container.get("command") or [])
    if tuple(command[:2]) != INJECTED_ENTRYPOINT or RUNTIME_MOUNT not in ctx.mounts:
        return None
    return f"{ctx.mounts[RUNTIME_MOUNT]}/launch.py"


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def engine(name: EngineName = "standin", image_env: Mapping[str, str] | None = None) -> Engine:
    """The engine called `name` (`image_env`: see `Engine`); the router's entrypoint is
    the real router either way."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; one of {', '.join(ENGINES)}")
    commands: dict[tuple[str, ...], Sequence[str]] = {
        (ENTRYPOINT,): STANDIN if name == "standin" else LAUNCHER,
        # The injected launcher: the real one from the runtime volume, or the stand-in.
        INJECTED_ENTRYPOINT: STANDIN if name == "standin" else (sys.executable, INJECTED_LAUNCH),
        RUNTIME_INSTALL: INSTALLER,
        ("python3", "-m", ROUTER_MODULE): (sys.executable, "-m", ROUTER_MODULE),
        OPERATOR_ENTRYPOINT: OPERATOR,
    }
    return Engine(name, commands, image_env=dict(image_env or {}))

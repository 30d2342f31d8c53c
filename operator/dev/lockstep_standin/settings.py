"""What a stand-in pod reads: SGLang's argv, the pod's environment, and each rank's spec.

Pure: argv and a mapping in, frozen dataclasses out; a malformed value raises
``ValueError`` naming the flag or variable, and the pod exits 2 with that message.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lockstep_sglang.config import RuntimeConfig

POD_IP_ENV = "LOCKSTEP_POD_IP"
POD_DIR_ENV = "LOCKSTEP_POD_DIR"
IDLE_ENV = "LOCKSTEP_STANDIN_IDLE_S"
STEP_ENV = "LOCKSTEP_STANDIN_STEP_S"
REQUEST_TIMEOUT_ENV = "LOCKSTEP_STANDIN_REQUEST_TIMEOUT_S"
RENDEZVOUS_TIMEOUT_ENV = "LOCKSTEP_STANDIN_RENDEZVOUS_TIMEOUT_S"
RANK_SPEC_ENV = "LOCKSTEP_STANDIN_RANK_SPEC"

DEFAULT_POD_IP = "127.0.0.1"
# Longest idle wait of rank 0 for a request: bounds idle iterations (a 2-rank idle group
# costs about 2% of a core per rank at 0.25 s, 5% at 0.05 s), not latency: a request or
# probe wakes rank 0 at once.
DEFAULT_IDLE_S = 0.25
DEFAULT_STEP_S = 0.002  # time one "forward" takes besides its all-reduce
DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0
MAX_PENDING = 1024  # requests waiting for an answer before the server answers 503
MAX_RUNNING = 256  # requests in one batch


@dataclass(frozen=True)
class ServerArgs:
    """The part of SGLang's server argv the stand-in models; the rest is in ``ignored``."""

    model_path: str
    served_model_name: str
    disaggregation_mode: str
    tp_size: int
    nnodes: int
    node_rank: int
    host: str
    port: int
    dist_init_addr: str | None
    bootstrap_port: int
    transfer_backend: str
    dp_size: int
    ignored: tuple[str, ...]

    @property
    def local_ranks(self) -> range:
        """Global ranks of this pod: ``node_rank * tp/nnodes`` onwards."""
        per_node = self.tp_size // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)


def _parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: an unknown SGLang flag must never be taken for a prefix of ours.
    p = argparse.ArgumentParser(prog="lockstep-standin", add_help=False, allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--disaggregation-mode", choices=("null", "prefill", "decode"), default="null")
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    return p


class _ArgvError(ValueError):
    pass


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and sys.exit
        raise _ArgvError(message)


def parse_server_args(argv: Sequence[str]) -> ServerArgs:
    """Parse the argv the operator rendered; unknown flags are kept (with values) as ignored."""
    base = _parser()
    parser = _RaisingParser(prog=base.prog, add_help=False, allow_abbrev=False, parents=[base])
    ns, unknown = parser.parse_known_args(list(argv))
    tp, nnodes, node_rank = ns.tp_size, ns.nnodes, ns.node_rank
    if tp < 1 or nnodes < 1:
        raise ValueError(f"--tp-size ({tp}) and --nnodes ({nnodes}) must be at least 1")
    if tp % nnodes:
        raise ValueError(f"--tp-size {tp} is not a multiple of --nnodes {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank {node_rank} is outside 0..{nnodes - 1}")
    if nnodes > 1 and not ns.dist_init_addr:
        raise ValueError("--dist-init-addr is required when --nnodes is above 1")
    if ns.dist_init_addr:
        split_addr(ns.dist_init_addr)
    return ServerArgs(
        model_path=ns.model_path,
        served_model_name=ns.served_model_name or ns.model_path,
        disaggregation_mode=ns.disaggregation_mode,
        tp_size=tp,
        nnodes=nnodes,
        node_rank=node_rank,
        host=ns.host,
        port=ns.port,
        dist_init_addr=ns.dist_init_addr,
        bootstrap_port=ns.disaggregation_bootstrap_port,
        transfer_backend=ns.disaggregation_transfer_backend,
        dp_size=ns.dp_size,
        ignored=tuple(unknown),
    )


def split_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) into its parts."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dist-init-addr must be HOST:PORT, got {addr!r}")
    return host.strip("[]"), int(port)


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"{name} must be a non-negative number of seconds, got {raw!r}")
    return value


@dataclass(frozen=True)
class PodSettings:
    """Everything one stand-in pod runs with."""

    server: ServerArgs
    runtime: RuntimeConfig
    pod_ip: str
    pod_dir: Path
    pod_name: str | None
    epoch: str | None
    idle_s: float
    step_s: float
    request_timeout_s: float
    rendezvous_timeout_s: float

    @classmethod
    def from_env(cls, server: ServerArgs, env: Mapping[str, str]) -> PodSettings:
        """Read the pod's environment; the rank state lives under the pod directory."""
        pod_ip = env.get(POD_IP_ENV, "").strip() or DEFAULT_POD_IP
        raw_dir = env.get(POD_DIR_ENV, "").strip()
        pod_dir = Path(raw_dir) if raw_dir else Path(tempfile.mkdtemp(prefix="lockstep-pod-"))
        runtime = RuntimeConfig.from_env(env)
        runtime = dataclasses.replace(runtime, state_dir=pod_dir / "state", agent_host=pod_ip)
        return cls(
            server=server,
            runtime=runtime,
            pod_ip=pod_ip,
            pod_dir=pod_dir,
            pod_name=env.get("LOCKSTEP_POD_NAME") or None,
            epoch=env.get("LOCKSTEP_GROUP_EPOCH") or None,
            idle_s=_seconds(env, IDLE_ENV, DEFAULT_IDLE_S),
            step_s=_seconds(env, STEP_ENV, DEFAULT_STEP_S),
            request_timeout_s=_seconds(env, REQUEST_TIMEOUT_ENV, DEFAULT_REQUEST_TIMEOUT_S)
            or DEFAULT_REQUEST_TIMEOUT_S,
            rendezvous_timeout_s=_seconds(env, RENDEZVOUS_TIMEOUT_ENV, DEFAULT_RENDEZVOUS_TIMEOUT_S)
            or DEFAULT_RENDEZVOUS_TIMEOUT_S,
        )

    def store_addr(self) -> tuple[str, int] | None:
        """Where global rank 0 hosts the rendezvous store (None: any free port, one pod)."""
        if self.server.dist_init_addr:
            return split_addr(self.server.dist_init_addr)
        return None


@dataclass(frozen=True)
class RankSpec:
    """What one rank process needs, handed over in ``LOCKSTEP_STANDIN_RANK_SPEC`` (JSON)."""

    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    store_host: str
    store_port: int
    store_fd: int  # the listening socket global rank 0 serves the store on, else -1
    inbox_fd: int  # rank 0 only: requests from the HTTP server, else -1
    outbox_fd: int  # rank 0 only: replies to the HTTP server, else -1
    pod_dir: str
    state_dir: str
    local_ranks: list[int]
    consensus: bool
    consensus_pause_s: float
    gloo_timeout_s: float
    rendezvous_timeout_s: float
    idle_s: float
    step_s: float
    epoch: str | None
    disaggregation_mode: str

    def to_json(self) -> str:
        """The env form."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> RankSpec:
        """Parse the env form."""
        return cls(**json.loads(raw))

"""The real SGLang 0.5.23 server on a CPU-only machine: what the local cluster and the
real-SGLang test tier add around it.

None of this is on a production path. A real GPU pod runs the image's SGLang with its
real kernels; here (no GPU, no model hub) the same server runs on CPU with:

- a tiny random Qwen2 and its tokenizer generated locally (deterministic seed), by
  `images/sglang-cpu/make_tiny_model.py` into `<cache>/tiny-qwen2`;
- `images/sglang-cpu/site` first on `PYTHONPATH`: a stand-in for the two CPU kernels of
  `sgl_kernel` SGLang imports on CPU (its CPU build is not on PyPI), and a
  `sitecustomize` with the CPU-only patches (each says why);
- environment: `SGLANG_USE_CPU_ENGINE=1` (else SGLang takes the CUDA path),
  `SGLANG_NCCL_SO_PATH` at a missing file (torch's wheel bundles libnccl, so SGLang's
  pynccl would try CUDA), `SGLANG_CPU_OMP_THREADS_BIND` (one core per rank),
  `LD_LIBRARY_PATH` with the Debian libraries mooncake's TCP transfer needs (extracted
  by `.ci/setup-sglang-cpu`, not installed), `MC_FORCE_TCP=1` (mooncake over TCP, no
  RDMA), `SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX=0` (else a CUDA stream on
  a prefix hit), and `TORCHDYNAMO_DISABLE=1` unless the caller sets it: SGLang wraps a
  few small functions in `torch.compile` (the vocab-parallel mask under TP > 1, the
  sampler's), which on CPU means Inductor's C++ code compiled by gcc at each cold start
  into the pod's compile cache. Measured here (a TP2 server alone on this 2-core machine,
  start to deep probe 200): 63.2 s with an empty cache, 37.1 s with Dynamo off; under a
  drill's load (five servers on two cores, a recreated pod starting cold) it was minutes.
  A 2-layer random model gains nothing from the fused kernels; a GPU image keeps them
  (and its compile cache, `SGLANG_CACHE_DIR`, on the pod's volume);
- flags: the CPU device, torch-native attention and sampling, no CUDA graphs, float32, a
  small KV pool, sleep when idle; decode keeps retraction backups in CPU tensors.

Pure functions: paths and dictionaries, no torch import (this package never imports it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from lockstep_dev.localcluster.controlplane import repo_root

MODEL_DIR_NAME = "tiny-qwen2"
LIBS_DIR_NAME = "sglang-cpu-libs"
SERVED_NAME = "tiny"

CPU_FLAGS: tuple[str, ...] = (
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--sampling-backend",
    "pytorch",
    "--disable-cuda-graph",
    "--dtype",
    "float32",
    "--max-total-tokens",
    "4096",
    "--max-running-requests",
    "8",
    "--sleep-on-idle",
)
"""The flags every CPU server gets (the tiny model, no GPU). `--sleep-on-idle`: an idle
rank otherwise busy-polls (about 55 % of a core each), which a 2-core machine running
several servers cannot afford; TP rank 0 then sleeps in its request poll and the other
ranks wait in the request broadcast."""

DECODE_FLAGS: tuple[str, ...] = ("--disaggregation-decode-retraction-backup", "cpu_tensor")
"""PD decode on CPU: retraction backups in CPU tensors (the default registers CUDA host
memory)."""


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where built artefacts live (`LOCKSTEP_CACHE`, default `~/.cache/lockstep`)."""
    env = os.environ if environ is None else environ
    raw = env.get("LOCKSTEP_CACHE")
    return Path(raw) if raw else Path.home() / ".cache" / "lockstep"


def support_dir() -> Path:
    """`images/sglang-cpu` of this checkout."""
    root = repo_root()
    if root is None:
        raise RuntimeError("the real SGLang engine runs from a source checkout (images/ missing)")
    return root / "images" / "sglang-cpu"


def site_dir() -> Path:
    """The directory put first on the SGLang processes' `PYTHONPATH`."""
    return support_dir() / "site"


def model_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The generated tiny model (see :func:`ensure_model`)."""
    return cache_dir(environ) / MODEL_DIR_NAME


def libs_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The extracted Debian libraries mooncake needs (`.ci/setup-sglang-cpu`)."""
    return cache_dir(environ) / LIBS_DIR_NAME


def library_path(environ: Mapping[str, str] | None = None) -> str:
    """`LD_LIBRARY_PATH` entries of the extracted libraries (every lib dir found)."""
    root = libs_dir(environ)
    found = sorted({str(p.parent) for p in root.rglob("*.so*")}) if root.is_dir() else []
    return os.pathsep.join(found)


def ensure_model(python: str = sys.executable, timeout: float = 600.0) -> Path:
    """Generate the tiny model once (a no-op when it is there); returns its directory."""
    target = model_dir()
    script = support_dir() / "make_tiny_model.py"
    subprocess.run(
        [python, str(script), str(target)], check=True, timeout=timeout, capture_output=True
    )
    return target


def cpu_env(
    base: Mapping[str, str], *, cores: Sequence[int], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """`base` plus what the real SGLang server needs on CPU; `cores`: one per local rank
    (SGLang binds each rank's OpenMP threads to its entry)."""
    env = dict(base)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["SGLANG_NCCL_SO_PATH"] = "/nonexistent/lockstep-cpu/libnccl.so"
    env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(c) for c in cores)
    env["SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX"] = "0"
    # Eager on CPU (see the module docstring); a caller may turn Dynamo back on.
    env.setdefault("TORCHDYNAMO_DISABLE", "1")
    # No RDMA here: mooncake's TCP transport (what SGLang's `mooncake_tcp` backend sets),
    # so the operator's rendered `--disaggregation-transfer-backend mooncake` stays.
    env["MC_FORCE_TCP"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site_dir()), base.get("PYTHONPATH", "")) if p
    )
    libs = library_path(environ)
    if libs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libs, base.get("LD_LIBRARY_PATH", "")) if p
        )
    return env


def cpu_flags(disaggregation_mode: str | None = None) -> list[str]:
    """The CPU flags, plus decode's when `disaggregation_mode` is "decode"."""
    flags = list(CPU_FLAGS)
    if disaggregation_mode == "decode":
        flags += DECODE_FLAGS
    return flags

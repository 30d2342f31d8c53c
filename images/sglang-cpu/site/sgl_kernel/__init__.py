"""Stand-in for the two CPU kernels of ``sgl_kernel`` that SGLang 0.5.23 imports on CPU.

``sgl_kernel``'s CPU build is not on PyPI, yet with ``SGLANG_USE_CPU_ENGINE=1`` two
SGLang modules import it at module level (``mem_cache/allocation.py`` and
``kernels/ops/kvcache/cache_move.py``). On a CPU without AMX SGLang's other ops use
their pure-torch paths, so these two, written here in plain torch, are all the tiny
model needs. Local cluster and test support only: never on a production path (the
real image has the real ``sgl_kernel``).
"""

from __future__ import annotations

import ctypes

import torch

__version__ = "0.0.0+lockstep-cpu-standin"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[req, start:end] = out_cache_loc[...]``, requests packed in order."""
    del pool_len  # the row length is req_to_token's own
    offset = 0
    for req, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        n = end - start
        if n > 0:
            req_to_token[req, start:end] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every buffer (a raw address and its row size in bytes), copy row src -> tgt."""
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist(), strict=True))
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        rows = [
            ctypes.string_at(base + src * stride, stride) for _, src in pairs
        ]  # read all first: the copy may be in place
        for (tgt, _), row in zip(pairs, rows, strict=True):
            ctypes.memmove(base + tgt * stride, row, stride)


def __getattr__(name: str) -> object:
    """Any other kernel imports (SGLang imports several at module level on CPU) but
    fails loudly when called: the tiny model's path never calls one."""
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*_args: object, **_kwargs: object) -> None:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not in lockstep's CPU stand-in (images/sglang-cpu); "
            "the local cluster's tiny model should not need it"
        )

    missing.__name__ = name
    return missing

"""Runtime patch that lets SGLang 0.5.23's PD prefill server send KV on a CPU-only machine.

Python runs this file at start-up in every process that has ``images/sglang-cpu/site``
on ``PYTHONPATH`` (the server, its scheduler subprocesses, and any other tool). So it
does nothing unless ``SGLANG_USE_CPU_ENGINE=1``, and even then it imports neither torch
nor SGLang: it only puts an import hook in front of ``sys.meta_path`` that patches a
module right after that module is first executed. Local cluster and test support only,
like the ``sgl_kernel`` stand-in next to it.

Patches:

``sglang.srt.disaggregation.mooncake.conn``: ``MooncakeKVSender.supports_host_tensor_indices``
    set to False. When True, the prefill scheduler (``prefill.py`` ``_send_kv_chunk``)
    copies the KV page indices into a pinned host tensor (``pin_memory=True``) and
    records a ``torch.cuda.Event`` so the D2H copy overlaps scheduling. Both need CUDA:
    on CPU the first KV send raises "Found no NVIDIA driver" and the prefill scheduler
    dies. With False it takes the plain path (``kv_to_page_indices`` on the CPU tensor)
    that the other transfer backends use. There is no flag or env var for it.

With ``LOCKSTEP_LOCAL_POD=1`` (the local cluster's real engine) also the patches of
``lockstep_local_patches``: the rendezvous store bound to the pod's address, and a
request log.
"""

from __future__ import annotations

import os
import sys


def _no_host_tensor_indices(module) -> None:
    module.MooncakeKVSender.supports_host_tensor_indices = False


def _local(name: str):  # a patch of lockstep_local_patches, imported when it applies
    def patch(module) -> None:
        import lockstep_local_patches

        getattr(lockstep_local_patches, name)(module)

    return patch


_PATCHES = {
    "sglang.srt.disaggregation.mooncake.conn": _no_host_tensor_indices,
}
if os.environ.get("LOCKSTEP_LOCAL_POD") == "1":
    # One machine standing in for many pods (lockstep_local_patches.py says why).
    _PATCHES["torch.distributed.rendezvous"] = _local("bind_store_to_host")
    _PATCHES["sglang.srt.entrypoints.http_server"] = _local("log_requests")


class _PatchAfterExec:
    """Meta path finder: finds a patched module with the other finders, then wraps
    its loader's ``exec_module`` so the patch runs once the module body has run."""

    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
    sys.meta_path.insert(0, _PatchAfterExec())

"""Collective tracing: publish, per call, which collective the scheduler thread is in.

A wrapper around a collective function (``torch.distributed.all_reduce``, SGLang's
``broadcast_pyobj``, a region such as ``run_batch``) marks the rank state on entry and
clears it on exit. The cost on the hot path is a thread-identity check and a few memory
stores into the rank state; other threads (the consensus checker's, KV transfer
threads) pass straight through, so the state always describes the scheduler thread.

Modules that did ``from torch.distributed import all_reduce`` hold their own reference,
so :func:`patch_everywhere` replaces the function in every loaded module under the given
prefixes, not only where it is defined.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ParamSpec, TypeVar

from lockstep_sglang.rank_state import RankStateWriter

P = ParamSpec("P")
R = TypeVar("R")

# torch.distributed functions that block the caller until peers join. Async variants
# (isend/irecv) return at once and are covered by the wrappers that wait on them.
TORCH_COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "broadcast",
    "barrier",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "gather",
    "gather_object",
    "scatter",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast_object_list",
    "send",
    "recv",
    "monitored_barrier",
)

WORLD = b"world"


def _group_position(fn: Callable[..., Any], names: Iterable[str]) -> tuple[str, int] | None:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    for name in names:
        if name in params:
            return name, params.index(name)
    return None


class CollectiveTracer:
    """Wraps collective functions so that the rank state shows the one in progress.

    Bound to one thread (the scheduler's), chosen at construction or by :meth:`bind`.
    """

    def __init__(self, state: RankStateWriter, *, thread: threading.Thread | None = None) -> None:
        self.state = state
        self._thread_id = (thread or threading.current_thread()).ident
        self._names: dict[int, bytes] = {}

    def bind(self, thread: threading.Thread | None = None) -> None:
        """Trace calls made by ``thread`` (default: the calling thread) from now on."""
        self._thread_id = (thread or threading.current_thread()).ident

    def name_group(self, group: object, name: str) -> None:
        """Give ``group`` an explicit name in the rank state."""
        self._names[id(group)] = name.encode()

    def group_name(self, group: object) -> bytes:
        """The name shown for ``group``: explicit, else its ``group_desc``, else ``pg<n>``."""
        if group is None:
            return WORLD
        key = id(group)
        name = self._names.get(key)
        if name is None:
            desc = getattr(group, "group_desc", None)
            if not desc or desc == "undefined":
                desc = f"pg{getattr(group, 'group_name', key)}"
            name = str(desc).encode()
            self._names[key] = name
        return name

    def wrap(
        self,
        fn: Callable[P, R],
        op: str | None = None,
        *,
        group: bytes | None = None,
        group_param: Iterable[str] = ("group", "dist_group"),
        opaque: bool = False,
    ) -> Callable[P, R]:
        """A traced version of ``fn``.

        ``group`` fixes the group name; otherwise it is read from the call's
        ``group``/``dist_group`` argument. ``opaque`` hides the collectives ``fn``
        issues inside itself (``broadcast_pyobj`` shows as itself, not as two
        ``broadcast`` calls).
        """
        op_name = str(op or getattr(fn, "__name__", None) or "collective").encode()
        position = None if group is not None else _group_position(fn, group_param)
        state = self.state
        get_ident = threading.get_ident
        tracer = self

        @functools.wraps(fn)
        def traced(*args: P.args, **kwargs: P.kwargs) -> R:
            if get_ident() != tracer._thread_id:
                return fn(*args, **kwargs)
            if group is not None:
                name = group
            elif position is None:
                name = WORLD
            else:
                key, index = position
                value = (
                    kwargs[key] if key in kwargs else (args[index] if len(args) > index else None)
                )
                name = tracer.group_name(value)
            state.enter_collective(op_name, name, opaque=opaque)
            try:
                return fn(*args, **kwargs)
            finally:
                state.exit_collective()

        traced.__lockstep_traced__ = True  # type: ignore[attr-defined]
        return traced

    @contextlib.contextmanager
    def region(self, op: str, group: str) -> Iterator[None]:
        """Mark a region (e.g. a model forward) as a collective on ``group``."""
        if threading.get_ident() != self._thread_id:
            yield
            return
        self.state.enter_collective(op.encode(), group.encode())
        try:
            yield
        finally:
            self.state.exit_collective()


def is_traced(fn: object) -> bool:
    """Whether ``fn`` is a :class:`CollectiveTracer` wrapper."""
    return bool(getattr(fn, "__lockstep_traced__", False))


def patch_everywhere(
    original: object, replacement: object, module_prefixes: Iterable[str]
) -> list[str]:
    """Replace ``original`` by ``replacement`` in every loaded module under the prefixes.

    Returns ``module.attribute`` for each replacement made.
    """
    prefixes = tuple(module_prefixes)
    patched: list[str] = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(prefixes):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            if value is original:
                setattr(module, attr, replacement)
                patched.append(f"{name}.{attr}")
    return patched


def trace_torch_distributed(
    tracer: CollectiveTracer, module_prefixes: Iterable[str] = ()
) -> list[str]:
    """Trace the blocking ``torch.distributed`` collectives, including by-name imports.

    Idempotent: an already traced function is left alone.
    """
    import torch.distributed as dist

    # Only the public namespace and the callers' modules: torch's own internals
    # (distributed_c10d calling its own functions) keep the originals.
    prefixes = tuple(module_prefixes)
    patched: list[str] = []
    for op in TORCH_COLLECTIVES:
        original = getattr(dist, op, None)
        if original is None or is_traced(original):
            continue
        traced = tracer.wrap(original, op)
        setattr(dist, op, traced)
        patched.append(f"torch.distributed.{op}")
        if prefixes:
            patched += patch_everywhere(original, traced, prefixes)
    return patched

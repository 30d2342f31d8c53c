"""Bounded timeouts for gloo process groups.

SGLang 0.5.23 creates every CPU (gloo) group of a ``GroupCoordinator`` with a fixed
two-hour timeout (``parallel_state.GroupCoordinator.__init__``, ``gloo_timeout``), and
groups made with ``new_group`` and no timeout get torch's 30-minute default. A rank whose
peer never arrives therefore waits up to two hours in ``broadcast_pyobj``. This module
caps the timeout of every gloo group created after :func:`install` so that a wait in a
gloo collective raises after ``LOCKSTEP_GLOO_TIMEOUT_S`` (default 600 s, the NCCL
watchdog's default), and the scheduler exits through SGLang's own exception path.

The cap is a backstop behind the decision consensus (which fires within seconds): it
must stay above the longest legitimate gloo wait, such as a peer loading weights or
capturing CUDA graphs while the others wait in a barrier.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

TIMEOUT_ENV = "LOCKSTEP_GLOO_TIMEOUT_S"
# The name the operator's pod builder renders (operator/lockstep/api/constants.py); accepted
# until the two sides settle on one.
TIMEOUT_ENV_ALIAS = "LOCKSTEP_GLOO_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT_S = 600.0


def timeout_from_env(environ: Mapping[str, str] | None = None) -> timedelta:
    """The gloo cap from ``LOCKSTEP_GLOO_TIMEOUT_S`` (or its alias), seconds > 0."""
    env = os.environ if environ is None else environ
    values = {name: env[name].strip() for name in (TIMEOUT_ENV, TIMEOUT_ENV_ALIAS) if name in env}
    values = {name: raw for name, raw in values.items() if raw}
    if len(set(values.values())) > 1:
        raise ValueError(f"{TIMEOUT_ENV} and {TIMEOUT_ENV_ALIAS} disagree: {values}")
    name, raw = next(iter(values.items()), (TIMEOUT_ENV, ""))
    try:
        seconds = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {raw!r}")
    return timedelta(seconds=seconds)


def clamp(timeout: timedelta | None, limit: timedelta) -> timedelta:
    """``timeout`` bounded by ``limit``; an unset timeout becomes ``limit``."""
    if timeout is None or timeout > limit:
        return limit
    return timeout


def _is_gloo(backend: object, default_backend: Callable[[], str]) -> bool:
    if backend is None:
        try:
            return default_backend().lower() == "gloo"
        except (RuntimeError, ValueError):
            return False
    # "gloo", Backend.GLOO, or a device map such as "cpu:gloo,cuda:nccl" (not only gloo).
    text = str(backend).lower()
    return text == "gloo"


def install(limit: timedelta) -> bool:
    """Cap the timeout of gloo groups created by ``torch.distributed.new_group``.

    Returns False when already installed (idempotent; the first limit stays).
    """
    import torch.distributed as dist

    original = dist.new_group
    if getattr(original, "__lockstep_gloo_limit__", None) is not None:
        return False

    @functools.wraps(original)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        # Signature: new_group(ranks=None, timeout=None, backend=None, ...)
        backend = kwargs["backend"] if "backend" in kwargs else (args[2] if len(args) > 2 else None)
        if _is_gloo(backend, dist.get_backend):
            if len(args) > 1:
                args = (args[0], clamp(args[1], limit), *args[2:])
            else:
                kwargs["timeout"] = clamp(kwargs.get("timeout"), limit)
        return original(*args, **kwargs)

    new_group.__lockstep_gloo_limit__ = limit  # type: ignore[attr-defined]
    dist.new_group = new_group
    return True


def installed_limit() -> timedelta | None:
    """The cap currently installed, if any."""
    import torch.distributed as dist

    limit: timedelta | None = getattr(dist.new_group, "__lockstep_gloo_limit__", None)
    return limit


def group_timeout(group: object) -> timedelta:
    """The timeout a gloo process group was created with (for checks and tests)."""
    import torch

    backend = group._get_backend(torch.device("cpu"))  # type: ignore[attr-defined]
    timeout: timedelta = backend.options._timeout
    return timeout

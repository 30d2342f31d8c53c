"""The container's termination message: why it ended, where on-call looks.

Kubernetes shows the file at the container's ``terminationMessagePath`` (default
``/dev/termination-log``, at most 4096 bytes) as ``state.terminated.message`` of the pod's
container status, and with ``terminationMessagePolicy: FallbackToLogsOnError`` (what the
operator renders) the log's tail when a failed container wrote none. The launcher and the
engine write one line there before they refuse to start, ``RuntimeRefused: <why>``; the
operator lifts it into the group's status, the ``Degraded`` condition and a
``RuntimeRefused`` Event (`lockstep.core.verdicts.refusal`). ``LOCKSTEP_TERMINATION_LOG``
points elsewhere (the local cluster's process kubelet maps the container path to a file
of the pod's directory). Writing never raises: a refusal must still be printed and exit.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PATH_ENV = "LOCKSTEP_TERMINATION_LOG"
DEFAULT_PATH = "/dev/termination-log"
MAX_BYTES = 4096  # the kubelet's own cap
REFUSED = "RuntimeRefused"
PREFIX = "lockstep-sglang refuses to start: "


def path() -> Path:
    """Where this container's termination message goes."""
    return Path(os.environ.get(PATH_ENV, "").strip() or DEFAULT_PATH)


def message(reason: str, text: str) -> str:
    """``<reason>: <text>`` on one line, without the launcher's own prefix, bounded."""
    body = " ".join(text.removeprefix(PREFIX).split())
    line = f"{reason}: {body}"
    data = line.encode()[:MAX_BYTES]
    return data.decode(errors="ignore")


def write(reason: str, text: str) -> None:
    """Replace the termination message with ``<reason>: <text>`` (best effort)."""
    with contextlib.suppress(OSError):
        path().write_text(message(reason, text) + "\n", encoding="utf-8")


def refused(text: str) -> None:
    """The container refuses to start, for the reason in ``text``."""
    write(REFUSED, text)

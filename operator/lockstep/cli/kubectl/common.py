"""What the subcommands share: exit codes, the error a person reads, durations and ages,
a group named `role/N`, a group's pods and runtime, and rendering with rich."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.table import Table

from lockstep.api import constants as c
from lockstep.api import objects
from lockstep.core.builders import group_runtime
from lockstep.core.evidence import SECTION

EXIT_OK, EXIT_FAILED = 0, 1
Obj = dict[str, Any]
REQUEST_TIMEOUT = (5.0, 30.0)  # connect, read (seconds) for every API call
SUMMARY_LINES = 8  # lines of an incident's evidence summary `incidents` shows
# The request id's readable part: what `--reason` keeps (letters, digits, `.`, `_`, `-`).
REQUEST_SLUG_CHARS = 40
_NOT_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
_GROUP_ARG = re.compile(r"^(?P<role>[a-z]+)/(?P<group>[0-9]+)$")
# A section of captured evidence (`lockstep.core.evidence.fit_capture`): `[<pod>] ranks|stacks|log:`.
_SECTION = SECTION


class PluginError(Exception):
    """What went wrong, for the user: printed as `error: ...`, exit code 1."""


# ------------------------------------------------------------------------- pure helpers


def human_duration(seconds: float) -> str:
    """A duration as kubectl prints ages (`45s`, `3m12s`, `2h5m`, `3d4h`)."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d"


def _seconds(value: Any) -> str:
    """A figure of seconds from status (`0.7s`, `3m12s`); `-` when absent."""
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.1f}s" if value < 120 else human_duration(value)


def parse_group(text: str) -> tuple[str, int]:
    """`ROLE/GROUP` (`decode/0`) as (role, group); PluginError naming the argument."""
    m = _GROUP_ARG.match(text.strip())
    if m is None or m["role"] not in c.ROLES:
        raise PluginError(
            f"ROLE/GROUP {text!r}: expected a role ({' or '.join(c.ROLES)}) and a group "
            "number, e.g. decode/0"
        )
    return m["role"], int(m["group"])


def _groups(status: Mapping[str, Any], role: str) -> list[Mapping[str, Any]]:
    return list((status.get(role) or {}).get("groups") or [])


def _group_pods(pods: Sequence[Mapping[str, Any]], role: str, group: int) -> list[Obj]:
    return [
        dict(p)
        for p in pods
        if objects.label(p, c.LABEL_ROLE) == role and objects.label(p, c.LABEL_GROUP) == str(group)
    ]


def _runtime(group: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The runtime a group runs: from status when it records one; else what its pods
    run (the current epoch's, else any): the runtime init container's image, or the
    SGLang image when the runtime is built into it (`spec.runtime.inject: false`)."""
    recorded = group.get("runtime") or group.get("runtimeImage")
    if isinstance(recorded, Mapping):
        recorded = recorded.get("image")
    if isinstance(recorded, str) and recorded:
        return recorded
    current = [p for p in pods if objects.label(p, c.LABEL_EPOCH) == str(group.get("epoch"))]
    return group_runtime(current or pods)


def _table(*columns: str) -> Table:
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0))
    for col in columns:
        table.add_column(col, no_wrap=True, overflow="ignore", header_style="")
    return table


def _indented(renderable: RenderableType, spaces: int = 2) -> Padding:
    return Padding(renderable, (0, 0, 0, spaces))


def _render(*parts: RenderableType) -> str:
    """Tables and lines as plain text (no colour, no wrapping, no trailing blanks)."""
    buf = io.StringIO()
    console = Console(
        file=buf, width=1000, color_system=None, highlight=False, markup=False, emoji=False
    )
    for part in parts:
        console.print(part, soft_wrap=isinstance(part, str))
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"

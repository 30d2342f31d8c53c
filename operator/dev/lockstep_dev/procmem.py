"""Memory of local process trees, from `/proc` (Linux): what a pod of the local cluster
costs this machine.

PSS (proportional set size: shared pages divided among the processes that map them) is
summed over a process and every descendant, from `/proc/<pid>/smaps_rollup`, so pods
that share library pages are not each charged for all of them. Read-only, best effort:
a process that ends while being read counts as nothing.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def _children(proc: Path = PROC) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1:
            out.setdefault(int(fields[1]), []).append(int(entry.name))
    return out


def tree(root: int, proc: Path = PROC) -> list[int]:
    """`root` and every live descendant."""
    children = _children(proc)
    found, todo = [root], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pss_kib(pid: int, proc: Path = PROC) -> int:
    """PSS of one process in KiB (0 when it is gone or unreadable)."""
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def tree_pss_mib(root: int, proc: Path = PROC) -> float:
    """PSS of `root`'s whole process tree, in MiB."""
    return round(sum(pss_kib(pid, proc) for pid in tree(root, proc)) / 1024.0, 1)

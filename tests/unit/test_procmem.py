"""The local cluster's per-pod memory figure: PSS summed over a process tree."""

from __future__ import annotations

from pathlib import Path

from lockstep_dev.procmem import tree, tree_pss_mib


def fake_proc(root: Path, procs: dict[int, tuple[int, int | None]]) -> Path:
    """pid -> (parent pid, PSS KiB or None for an unreadable smaps_rollup)."""
    for pid, (ppid, pss) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        # comm with a space and a parenthesis, as /proc allows.
        (d / "stat").write_text(f"{pid} (sglang::sched (x)) S {ppid} {pid} {pid} 0")
        if pss is not None:
            (d / "smaps_rollup").write_text(f"Rss:  9999 kB\nPss:  {pss} kB\nShared: 1 kB\n")
    (root / "self").mkdir()
    return root


def test_pss_adds_up_over_the_whole_tree_and_nothing_else(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        {
            10: (1, 1024),  # the launcher
            11: (10, 2048),  # the agent
            12: (10, 4096),  # the engine
            13: (12, 1024),  # a scheduler, grandchild
            14: (12, None),  # one that ended while read
            20: (1, 8192),  # another pod
        },
    )
    assert sorted(tree(10, proc)) == [10, 11, 12, 13, 14]
    assert tree_pss_mib(10, proc) == 8.0
    assert tree_pss_mib(20, proc) == 8.0
    assert tree_pss_mib(99, proc) == 0.0  # gone

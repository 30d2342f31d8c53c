"""Start real multi-process gloo groups (``dist_harness.py``) and always kill them.

Every rank is its own process (its own session, so the kill reaches anything it
started); the fixture kills every process it started when the test ends, passed or
failed. Waits are bounded: a test that would hang fails instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from dist_support import HARNESS, RankGroup


@pytest.fixture
def launch_ranks() -> Iterator[Callable[..., RankGroup]]:
    """``launch_ranks(world, *harness_args)`` starts one harness process per rank."""
    groups: list[RankGroup] = []
    # Short path: ZMQ ipc:// endpoints must fit in a unix socket name (~107 bytes).
    workdirs: list[str] = []

    def launch(world: int, *args: str) -> RankGroup:
        workdir = tempfile.mkdtemp(prefix="ls-dist-")
        workdirs.append(workdir)
        group = RankGroup(Path(workdir))
        groups.append(group)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
        for rank in range(world):
            cmd = [sys.executable, str(HARNESS), "--rank", str(rank), "--world", str(world)]
            cmd += ["--workdir", workdir, *args]
            with (
                open(group.workdir / f"rank-{rank}.out", "wb") as out,
                open(group.workdir / f"rank-{rank}.err", "wb") as err,
            ):
                group.procs.append(
                    subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)
                )
        return group

    try:
        yield launch
    finally:
        for group in groups:
            group.kill()
        for workdir in workdirs:
            shutil.rmtree(workdir, ignore_errors=True)

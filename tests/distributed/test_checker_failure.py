"""A consensus checker whose comparison collective fails ends its rank (it never dies
silently and leaves the rank running unguarded)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest

WORLD = 2


def rank_main(rank: int, store: str) -> None:
    import torch.distributed as dist

    from lockstep_sglang import gloo_timeout
    from lockstep_sglang.consensus import ConsensusChecker

    gloo_timeout.install(timedelta(seconds=5))
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=30),
    )
    group = dist.new_group(list(range(WORLD)), backend="gloo")
    checker = ConsensusChecker([group], pause_s=0.01)
    checker.start()
    checker.record("decision batch 1")
    time.sleep(1.0)
    if rank == 1:
        os._exit(0)  # the peer is gone: no close, no more collectives
    for i in range(200):
        checker.record(f"decision batch {i + 2}")
        time.sleep(0.05)
    os._exit(0)  # reached only if the checker never noticed


@pytest.mark.timeout(90)
def test_failed_comparison_ends_the_rank(tmp_path: Path) -> None:
    from lockstep_sglang.consensus import CHECK_FAILED_EXIT_CODE

    ctx = mp.get_context("spawn")
    store = str(tmp_path / "store")
    procs = [ctx.Process(target=rank_main, args=(r, store)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(60)
        assert procs[1].exitcode == 0
        assert procs[0].exitcode == CHECK_FAILED_EXIT_CODE
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)

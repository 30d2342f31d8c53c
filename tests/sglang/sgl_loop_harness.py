"""One TP rank running SGLang 0.5.23's real ``event_loop_overlap_disagg_decode`` body.

The scheduler methods the loop calls are small stand-ins (no model, no KV transfer):
requests fan out with SGLang's real ``broadcast_pyobj`` on a gloo "TP CPU" group, a
batch runs as an all-reduce on a gloo "device" group, and the decision consensus is
SGLang's own ``rank_consensus_checker`` configured the way ``Scheduler`` does it, with
lockstep's hooks installed exactly as the launcher installs them in a scheduler process.

``--diverge-at N``: the last rank finds its batch empty at decision N (a per-rank abort),
so it idles while its peers run the batch — the hang the consensus must turn into a
crash with evidence. Without it the group runs ``--iterations`` and stops cleanly.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# Like the launcher: the checker is switched on before SGLang is imported.
if "--no-consensus" not in sys.argv:
    os.environ["SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"] = "1"

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # SGLang's CUDA-only import warnings on CPU
    import torch
    import torch.distributed as dist
    from sglang.srt.disaggregation.decode import SchedulerDisaggregationDecodeMixin
    from sglang.srt.managers.schedule_batch import NextBatchPlan
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.utils import common as sglang_common
    from sglang.srt.utils import rank_consensus_checker as rcc

    from lockstep_sglang import hooks
    from lockstep_sglang.config import RuntimeConfig


class FakeBatch:
    """What the loop and the decision hook read of a ``ScheduleBatch``."""

    def __init__(self, rids: list[str]) -> None:
        self.reqs = [SimpleNamespace(rid=r) for r in rids]
        self.forward_mode = ForwardMode.DECODE

    def copy(self) -> FakeBatch:
        return FakeBatch([r.rid for r in self.reqs])

    def is_empty(self) -> bool:
        return not self.reqs


class StandInScheduler:
    """The attributes and methods ``event_loop_overlap_disagg_decode`` touches.

    Every attribute it sets, except its own ``harness_*`` bookkeeping, is one the real
    ``Scheduler`` has (tests/sglang checks them against the real class); the parallel
    layout is published in SGLang's own ``get_parallel()``, where a real scheduler
    process finds it.
    """

    def __init__(self, rank: int, world: int, args: argparse.Namespace) -> None:
        self.harness_args = args
        self.tp_size = world
        ranks = list(range(world))
        self.tp_group = SimpleNamespace(
            cpu_group=dist.new_group(ranks, backend="gloo", group_desc="tp:cpu"),
            device_group=dist.new_group(ranks, backend="gloo", group_desc="tp:device"),
            ranks=ranks,
        )
        get_parallel().override_permanently(tp_rank=rank, tp_size=world, tp_group=self.tp_group)
        self.harness_rank = rank
        self._engine_paused = False
        self.disagg_decode_prealloc_queue = SimpleNamespace(
            prefetch_prefill_dp_rank_queries=lambda: None
        )
        self.ngram_embedding_manager = SimpleNamespace(
            prepare_for_forward=lambda batch, chunked_req=None: batch
        )
        self.chunked_req = None
        self.running_batch = FakeBatch([])
        self.harness_steps_left: dict[str, int] = {}
        self.harness_decisions = 0
        self.harness_ingested = 0

    @property
    def gracefully_exit(self) -> bool:
        return (
            self.harness_args.iterations > 0
            and self.harness_ingested >= self.harness_args.iterations
        )

    # Same call as Scheduler.init_rank_consensus_checker for a plain TP group.
    def init_rank_consensus_checker(self) -> None:
        rcc.configure([self.tp_group])

    def ingest_requests(self) -> list[Any]:
        self.harness_ingested += 1
        payload: list[Any] | None = [] if self.harness_rank == 0 else None
        # Through the module attribute, as SGLang's receiver resolves it.
        return sglang_common.broadcast_pyobj(
            payload, self.harness_rank, self.tp_group.cpu_group, src=0
        )

    def process_decode_queue(self) -> None:
        # Transfers complete identically on every rank.
        if self.harness_ingested % 4 == 1:
            rid = f"req-{self.harness_ingested}"
            self.harness_steps_left[rid] = 6

    def get_next_disagg_decode_batch_to_run(self, running_batch: FakeBatch) -> NextBatchPlan:
        self.harness_decisions += 1
        diverging = (
            self.harness_args.diverge_at and self.harness_decisions == self.harness_args.diverge_at
        )
        if diverging and self.harness_rank == self.tp_size - 1:
            self.harness_steps_left.clear()  # this rank alone saw the aborts
            (Path(self.harness_args.workdir) / "diverged").write_text(str(time.time()))
        batch = FakeBatch(sorted(self.harness_steps_left)) if self.harness_steps_left else None
        return NextBatchPlan(batch_to_run=batch, running_batch=batch or FakeBatch([]))

    def is_disable_overlap_for_batch(self, batch: Any, last_batch: Any) -> bool:
        return False

    def run_batch(self, batch: FakeBatch) -> str:
        dist.all_reduce(torch.ones(8), group=self.tp_group.device_group)
        return "result"

    def _apply_war_barrier(self) -> None:
        pass

    def process_batch_result(self, batch: FakeBatch, result: str) -> None:
        for rid in [r.rid for r in batch.reqs]:
            if rid in self.harness_steps_left:
                self.harness_steps_left[rid] -= 1
                if self.harness_steps_left[rid] <= 0:
                    del self.harness_steps_left[rid]

    def on_idle(self) -> None:
        time.sleep(0.001)

    def launch_batch_sample_if_needed(self, batch_result: Any, batch: Any) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--diverge-at", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=0)
    parser.add_argument("--no-consensus", action="store_true")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    config = RuntimeConfig.from_env({"LOCKSTEP_STATE_DIR": str(workdir / "state")})
    # What lockstep's scheduler entry does, plus the stand-in class's own methods.
    hooks.install_scheduler_hooks(config)
    hooks.install_loop_hooks(StandInScheduler)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{workdir / 'store'}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=120),
    )
    scheduler = StandInScheduler(args.rank, args.world, args)
    scheduler.init_rank_consensus_checker()
    assert hooks.runtime() is not None, "the runtime hook did not start"
    # The real loop body from SGLang 0.5.23, unmodified.
    SchedulerDisaggregationDecodeMixin.event_loop_overlap_disagg_decode(scheduler)
    rcc.shutdown()  # compares what is still queued before a clean exit
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cost of decision consensus and rank-state publication per scheduler-loop iteration.

A 2-rank gloo group runs a loop shaped like SGLang's PD decode loop (request broadcast,
transfer-queue poll all-reduce, batch-vs-idle decision, batch all-reduce) in three modes,
interleaved in rounds within the same processes:

- ``baseline``: plain functions, nothing recorded;
- ``rank_state``: collectives traced into the rank state, decisions published;
- ``consensus``: the same plus every decision and queue poll sent to the consensus
  checker, whose thread compares them across ranks on a dedicated gloo group.

It prints one JSON object: per-iteration time of each mode (median of the rounds, and
the range over rounds), the ratio to baseline and the microseconds added per iteration
(medians of per-round pairs), plus single-process micro-costs of the hot-path calls and
what they add up to on the scheduler thread per iteration. The loop does
nothing but collectives (~100 µs per iteration on loopback gloo), so the ratio is a
worst case; an SGLang decode step on a GPU takes milliseconds, and the added
microseconds are what carries over.

    .venv/bin/python benchmarks/runtime_consensus.py [--iterations 100] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lockstep_sglang.standalone import broadcast_pyobj

MODES = ("baseline", "rank_state", "consensus")
BATCH_SIZE = 64


class Worker:
    """One rank: groups, rank state, tracer, consensus checker; runs loop modes."""

    def __init__(self, rank: int, world: int, workdir: Path) -> None:
        import torch.distributed as dist

        from lockstep_sglang.collectives import CollectiveTracer
        from lockstep_sglang.consensus import (
            ConsensusChecker,
            DecisionRecorder,
            create_dedicated_groups,
        )
        from lockstep_sglang.rank_state import RankStateWriter

        self.rank = rank
        dist.init_process_group(
            "gloo",
            init_method=f"file://{workdir / 'store'}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=120),
        )
        ranks = list(range(world))
        self.cpu_group = dist.new_group(ranks, backend="gloo", group_desc="tp:cpu")
        self.device_group = dist.new_group(ranks, backend="gloo", group_desc="tp:device")
        self.state = RankStateWriter.create(workdir / "state", rank=rank, tp_rank=rank)
        self.tracer = CollectiveTracer(self.state)
        self.checker = ConsensusChecker(create_dedicated_groups([ranks]), state=self.state)
        self.checker.start()
        self.plain = SimpleNamespace(
            bcast=broadcast_pyobj, all_reduce=dist.all_reduce, recorder=None, state=None
        )
        traced = SimpleNamespace(
            bcast=self.tracer.wrap(broadcast_pyobj, "broadcast_pyobj", opaque=True),
            all_reduce=self.tracer.wrap(dist.all_reduce, "all_reduce"),
        )
        self.modes: dict[str, SimpleNamespace] = {
            "baseline": self.plain,
            "rank_state": SimpleNamespace(
                **vars(traced), recorder=DecisionRecorder(None, self.state), state=self.state
            ),
            "consensus": SimpleNamespace(
                **vars(traced),
                recorder=DecisionRecorder(self.checker.record, self.state),
                state=self.state,
            ),
        }
        rids = [f"req-{i:05d}-{'x' * 24}" for i in range(BATCH_SIZE)]
        self.batch = SimpleNamespace(
            reqs=[SimpleNamespace(rid=r) for r in rids], forward_mode="DECODE"
        )
        self.on_probe: Callable[[Any], None] | None = None
        self.pull: Callable[[], list[Any] | None] = lambda: [] if rank == 0 else None

    def iteration(self, mode: SimpleNamespace) -> None:
        """One loop iteration in ``mode``."""
        import torch

        if mode.state is not None:
            mode.state.begin_iteration()
        reqs = mode.bcast(self.pull(), self.rank, self.cpu_group)
        if self.on_probe is not None:
            for req in reqs:
                self.on_probe(req)
        if mode.recorder is not None:
            mode.recorder.queue_poll("decode.transfer", 4)
        mode.all_reduce(torch.ones(4, dtype=torch.int32), group=self.cpu_group)
        if mode.recorder is not None:
            mode.recorder.decision(self.batch)
        if mode.state is not None:
            with self.tracer.region("run_batch", "tp:device"):
                mode.all_reduce(torch.ones(256), group=self.device_group)
        else:
            mode.all_reduce(torch.ones(256), group=self.device_group)

    def run(self, mode_name: str, iterations: int) -> float:
        """Mean microseconds per iteration of ``iterations`` in ``mode_name``."""
        import torch.distributed as dist

        mode = self.modes[mode_name]
        dist.barrier(group=self.cpu_group)
        start = time.perf_counter()
        for _ in range(iterations):
            self.iteration(mode)
        elapsed = time.perf_counter() - start
        return elapsed / iterations * 1e6

    def close(self) -> None:
        import torch.distributed as dist

        self.checker.close()
        dist.barrier(group=self.cpu_group)
        dist.destroy_process_group()


def micro_costs() -> dict[str, float]:
    """Single-process nanoseconds per call of the hot-path pieces."""
    import queue

    from lockstep_sglang.collectives import CollectiveTracer
    from lockstep_sglang.consensus import DecisionRecorder
    from lockstep_sglang.rank_state import RankStateWriter

    def per_call(fn: Callable[[], object], n: int = 20000) -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n * 1e9

    with tempfile.TemporaryDirectory() as tmp:
        state = RankStateWriter.create(Path(tmp), rank=0, tp_rank=0)
        tracer = CollectiveTracer(state)

        def noop(group: object = None) -> None:
            return None

        traced = tracer.wrap(noop, "all_reduce")
        q: queue.Queue[str] = queue.Queue()
        batch = SimpleNamespace(
            reqs=[SimpleNamespace(rid=f"req-{i:05d}-{'x' * 24}") for i in range(BATCH_SIZE)],
            forward_mode="DECODE",
        )
        state_only = DecisionRecorder(None, state)
        with_sink = DecisionRecorder(q.put, state)

        def enter_exit() -> None:
            state.enter_collective(b"all_reduce", b"tp:cpu")
            state.exit_collective()

        def drain() -> None:
            while not q.empty():
                q.get_nowait()

        costs = {
            "collective_publish_ns": per_call(enter_exit),
            "traced_call_overhead_ns": per_call(traced) - per_call(noop),
            "decision_publish_ns_batch64": per_call(lambda: state_only.decision(batch)),
            "decision_publish_and_enqueue_ns_batch64": per_call(lambda: with_sink.decision(batch)),
            "iteration_publish_ns": per_call(state.begin_iteration),
            "event_enqueue_ns": per_call(lambda: with_sink.queue_poll("decode.transfer", 4)),
        }
        drain()
        state.close()
    return {k: round(v, 1) for k, v in costs.items()}


def worker_main(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir)
    worker = Worker(args.rank, args.world, workdir)
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    worker.run("baseline", max(100, args.iterations // 10))  # warm-up
    for round_index in range(args.rounds):
        # Rotate the order: whatever a mode leaves behind (the comparing thread finishing
        # its batch) lands on a different mode each round.
        shift = round_index % len(MODES)
        for mode in MODES[shift:] + MODES[:shift]:
            samples[mode].append(worker.run(mode, args.iterations))
    worker.close()
    if args.rank == 0:
        (workdir / "result.json").write_text(json.dumps(samples))
    return 0


def spawn(script: Path, world: int, workdir: Path, extra: list[str]) -> list[int]:
    """Run ``script`` as ``world`` rank processes; return their exit codes."""
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, str(script), "--rank", str(r), "--world", str(world)),
                *("--workdir", str(workdir), *extra),
            ],
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        for r in range(world)
    ]
    try:
        return [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--workdir")
    args = parser.parse_args()
    if args.rank is not None:
        return worker_main(args)
    with tempfile.TemporaryDirectory(prefix="ls-bench-") as tmp:
        workdir = Path(tmp)
        extra = ["--iterations", str(args.iterations), "--rounds", str(args.rounds)]
        codes = spawn(Path(__file__).resolve(), args.world, workdir, extra)
        if codes != [0] * args.world:
            print(json.dumps({"benchmark": "runtime_consensus", "error": f"ranks exited {codes}"}))
            return 1
        samples = json.loads((workdir / "result.json").read_text())
    per_iter = {m: statistics.median(v) for m, v in samples.items()}
    # Paired per round (the three modes run back to back), so a slow phase of a shared
    # machine weighs on all modes of that round alike.
    paired_ratio = {
        m: statistics.median(x / b for x, b in zip(v, samples["baseline"], strict=True))
        for m, v in samples.items()
    }
    paired_added = {
        m: statistics.median(x - b for x, b in zip(v, samples["baseline"], strict=True))
        for m, v in samples.items()
    }
    micro = micro_costs()
    # What the scheduler thread itself executes per iteration of this loop: 4 traced
    # collectives (2 inside broadcast_pyobj are hidden, still traced), 1 iteration,
    # 1 decision, and for consensus also the queue-poll event.
    traced = 4 * micro["traced_call_overhead_ns"] + micro["iteration_publish_ns"]
    hot_path = {
        "rank_state": (traced + micro["decision_publish_ns_batch64"]) / 1000,
        "consensus": (
            traced + micro["decision_publish_and_enqueue_ns_batch64"] + micro["event_enqueue_ns"]
        )
        / 1000,
    }
    print(
        json.dumps(
            {
                "benchmark": "runtime_consensus",
                "world": args.world,
                "batch_size": BATCH_SIZE,
                "iterations_per_round": args.iterations,
                "rounds": args.rounds,
                "per_iteration_us": {m: round(v, 2) for m, v in per_iter.items()},
                # Round-to-round range: differences inside it are noise, not cost.
                "round_range_us": {
                    m: [round(min(v), 1), round(max(v), 1)] for m, v in samples.items()
                },
                "ratio_to_baseline": {m: round(v, 3) for m, v in paired_ratio.items()},
                "added_us_per_iteration": {m: round(v, 1) for m, v in paired_added.items()},
                "scheduler_thread_us_per_iteration": {k: round(v, 1) for k, v in hot_path.items()},
                "micro": micro,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

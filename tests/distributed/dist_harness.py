"""One rank of a TP group running a scheduler loop shaped like SGLang's PD decode loop.

Run as a script, one process per rank (``python dist_harness.py --rank 0 ...``); the
tests in this folder start them, talk to rank 0 like SGLang's tokenizer does (a ZMQ
PUSH into rank 0, a PULL for the replies) and read the rank state files.

The loop mirrors ``event_loop_overlap_disagg_decode``: every iteration rank 0 pulls
requests and broadcasts them over the TP CPU group (``broadcast_pyobj``), every rank
polls its transfer queue (an all-reduce SGLang skips when the local queue is empty),
decides batch vs idle from rank-local state, and runs the batch as an all-reduce on the
"device" group (gloo here, NCCL in SGLang). ``--diverge-at N`` makes the last rank
decide idle at iteration N while its peers run a batch — the divergence that hangs a
real decode group after a burst of aborts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import zmq

from lockstep_sglang import gloo_timeout
from lockstep_sglang.consensus import create_dedicated_groups
from lockstep_sglang.probe import ProbeRequest, drop_expired
from lockstep_sglang.standalone import StandaloneRank, broadcast_pyobj


class Batch:
    """Just enough of ``ScheduleBatch`` for the decision recorder."""

    def __init__(self, rids: list[str]) -> None:
        self.reqs = [type("Req", (), {"rid": r})() for r in rids]
        self.forward_mode = "DECODE"


class Rank:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = args.rank
        self.world = args.world
        self.workdir = Path(args.workdir)
        self.log = open(  # noqa: SIM115 - kept open for the process's life
            self.workdir / f"rank-{self.rank}.events.jsonl", "a", buffering=1
        )
        if args.gloo_timeout:
            gloo_timeout.install(timedelta(seconds=args.gloo_timeout))
        dist.init_process_group(
            "gloo",
            init_method=f"file://{self.workdir / 'store'}",
            rank=self.rank,
            world_size=self.world,
            timeout=timedelta(seconds=120),
        )
        ranks = list(range(self.world))
        self.cpu_group = dist.new_group(ranks, backend="gloo", group_desc="tp:cpu")
        self.device_group = dist.new_group(ranks, backend="gloo", group_desc="tp:device")
        self.side_group = dist.new_group(ranks, backend="gloo", group_desc="side:cpu")
        self.runtime = StandaloneRank.start(
            self.workdir / "state",
            rank=self.rank,
            tp_rank=self.rank,
            cpu_group=self.cpu_group,
            device_group=self.device_group,
            consensus_groups=create_dedicated_groups([ranks]),
            consensus=args.consensus,
        )
        self.state = self.runtime.state
        if args.slow_evidence_rank == self.rank:
            # A rank whose evidence write is slow (a busy node, a slow disk): its peers
            # must not exit, breaking its scheduler's collectives, before it has written.
            write = self.state.record_failure

            def slow_write(evidence: Any) -> Path:
                time.sleep(args.slow_evidence_s)
                return write(evidence)

            self.state.record_failure = slow_write  # type: ignore[method-assign]
        self.tracer = self.runtime.tracer
        self.recorder = self.runtime.recorder
        self.broadcast = self.tracer.wrap(broadcast_pyobj, "broadcast_pyobj", opaque=True)
        self.transfer_queue: list[str] = []
        self.running: dict[str, int] = {}
        self.iteration = 0
        self.dropped_expired = 0
        self.stop = False
        if self.rank == 0:
            ctx = zmq.Context.instance()
            self.inbox = ctx.socket(zmq.PULL)
            self.inbox.bind(f"ipc://{self.workdir / 'inbox'}")
            self.outbox = ctx.socket(zmq.PUSH)
            self.outbox.connect(f"ipc://{self.workdir / 'outbox'}")
            threading.Thread(target=self._release_watcher, daemon=True).start()
        self.emit("ready")

    def emit(self, kind: str, **fields: Any) -> None:
        self.log.write(json.dumps({"t": time.time(), "kind": kind, **fields}) + "\n")

    # -- the loop -------------------------------------------------------------------
    def run(self) -> None:
        while not self.stop:
            self.iteration += 1
            self.state.begin_iteration()
            self.handle(self.ingest())
            if self.stop:
                break
            self.process_transfer_queue()
            batch = self.next_batch()
            self.recorder.decision(batch)
            if batch:
                with self.tracer.region("run_batch", "tp:device"):
                    dist.all_reduce(torch.ones(4), group=self.device_group)
                self.finish_steps()
            else:
                time.sleep(0.001)  # on_idle
            time.sleep(self.args.step_sleep)
        self.shutdown()

    def ingest(self) -> list[Any]:
        reqs: list[Any] | None = None
        if self.rank == 0:
            reqs = []
            while True:
                try:
                    reqs.append(self.inbox.recv_pyobj(zmq.NOBLOCK))
                except zmq.Again:
                    break
            before = len(reqs)
            reqs = drop_expired(
                reqs,
                time.time(),
                lambda m: m["req"].deadline if m["type"] == "probe" else None,
            )
            self.dropped_expired += before - len(reqs)
        return self.broadcast(reqs, self.rank, self.cpu_group)

    def handle(self, reqs: list[Any]) -> None:
        for msg in reqs:
            if msg["type"] == "probe":
                self.run_probe(msg["req"])
            elif msg["type"] == "stall" and self.rank == msg["rank"]:
                # Stuck in a collective the peers never issue (released by rank 0's
                # watcher thread joining it when the test creates the release file).
                self.emit("stall")
                dist.all_reduce(torch.ones(1), group=self.side_group)
                self.emit("unstall")
            elif msg["type"] == "stop":
                self.stop = True

    def run_probe(self, req: ProbeRequest) -> None:
        reply = self.runtime.handle_probe(req, self.iteration)
        self.emit("probe", rid=req.rid)
        if reply is not None:
            self.outbox.send_pyobj(reply)

    def process_transfer_queue(self) -> None:
        # Same arrivals on every rank: what the broadcast requests would have added.
        if self.iteration % 3 == 0:
            self.transfer_queue.append(f"req-{self.iteration}")
        self.recorder.queue_poll("transfer", len(self.transfer_queue))
        if not self.transfer_queue:
            return  # SGLang skips the poll's all-reduce on an empty local queue
        ready = torch.ones(len(self.transfer_queue), dtype=torch.int32)
        dist.all_reduce(ready, op=dist.ReduceOp.MIN, group=self.cpu_group)
        popped, self.transfer_queue = self.transfer_queue, []
        self.recorder.queue_pop("transfer", popped)
        for rid in popped:
            self.running[rid] = 5

    def next_batch(self) -> Batch | None:
        diverging = self.args.diverge_at and self.iteration == self.args.diverge_at
        if diverging and self.rank == self.world - 1:
            # Per-rank abort handling emptied this rank's batch only.
            self.running.clear()
            self.emit("diverged")
        return Batch(sorted(self.running)) if self.running else None

    def finish_steps(self) -> None:
        for rid in list(self.running):
            self.running[rid] -= 1
            if self.running[rid] <= 0:
                del self.running[rid]

    def _release_watcher(self) -> None:
        release = self.workdir / "release"
        while not release.exists():
            time.sleep(0.02)
        dist.all_reduce(torch.ones(1), group=self.side_group)

    def shutdown(self) -> None:
        self.runtime.close()
        self.emit("stopped", iteration=self.iteration, dropped_expired=self.dropped_expired)
        dist.barrier(group=self.cpu_group)
        dist.destroy_process_group()


def gloo_timeout_scenario(args: argparse.Namespace) -> None:
    """Rank 1 waits in an all-reduce that rank 0 joins only after the bound has passed."""
    workdir = Path(args.workdir)
    gloo_timeout.install(timedelta(seconds=args.gloo_timeout))
    dist.init_process_group(
        "gloo",
        init_method=f"file://{workdir / 'store'}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=120),
    )
    ranks = list(range(args.world))
    unset = dist.new_group(ranks, backend="gloo")
    two_hours = dist.new_group(ranks, backend="gloo", timeout=timedelta(hours=2))
    result: dict[str, Any] = {
        "unset_s": gloo_timeout.group_timeout(unset).total_seconds(),
        "two_hours_s": gloo_timeout.group_timeout(two_hours).total_seconds(),
    }
    if args.rank == 1:
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=two_hours)
            result["raised"] = None
        except RuntimeError as exc:
            result["raised"] = str(exc)[:500]
        result["waited_s"] = time.monotonic() - start
    else:
        time.sleep(args.gloo_timeout * 2 + 1)
    (workdir / f"gloo-{args.rank}.json").write_text(json.dumps(result))
    os._exit(0)  # the group is broken by design; skip teardown that would wait on it


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="decode-loop")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--consensus", action="store_true")
    parser.add_argument("--diverge-at", type=int, default=0)
    parser.add_argument("--gloo-timeout", type=float, default=60.0)
    parser.add_argument("--step-sleep", type=float, default=0.002)
    parser.add_argument("--slow-evidence-rank", type=int, default=-1)
    parser.add_argument("--slow-evidence-s", type=float, default=1.5)
    args = parser.parse_args()
    if args.scenario == "gloo-timeout":
        gloo_timeout_scenario(args)
    Rank(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

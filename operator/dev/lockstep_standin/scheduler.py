"""One TP rank of the stand-in: a real gloo rank running a scheduler loop shaped like SGLang's.

Started by the pod (:mod:`lockstep_standin.pod`) as
``python -m lockstep_standin.scheduler --rank N`` with its :class:`RankSpec` in
``LOCKSTEP_STANDIN_RANK_SPEC``. The process:

1. bounds every gloo group's timeout (:mod:`lockstep_sglang.gloo_timeout`), then joins
   the group's world through a ``TCPStore`` that global rank 0 serves on the
   ``--dist-init-addr`` socket the pod bound for it (torch's own store would listen on
   every address, and every pod of the local cluster shares one network namespace); the
   store keys carry the group epoch;
2. creates SGLang-like groups: ``tp:cpu`` (requests, probes), ``tp:device`` (the
   forward's all-reduce; NCCL in SGLang), the runtime's dedicated consensus groups, and a
   group only the ``hang`` fault uses;
3. runs :class:`Scheduler`: per iteration, rank 0 pulls requests from the HTTP server and
   broadcasts them on ``tp:cpu`` (SGLang's ``broadcast_pyobj``), probes are answered at
   the top of the loop, every rank decides batch vs idle from the shared state and
   records the decision through the consensus before the forward's collective. The
   forward's collective gathers each rank's batch size and ``slow`` fault: every rank
   checks the sizes agree, then waits out the slowest rank's extra step time, so slow
   steps start and stop at the same iteration on every rank (each rank reads its own
   ``fault.json``; with a rank sleeping before the collective, a peer that read the file
   a moment earlier waited in it for the whole slow step, past the gloo timeout: a 60 s
   step failed a drill that way).

The loop never exits on its own: any exception (a gloo timeout, a peer that vanished)
ends the process with status 1, and the consensus ends it with status 1 on a divergence;
the pod then ends every other local rank and exits non-zero. The process also dies with
its parent (``PR_SET_PDEATHSIG``), so a killed pod leaves no rank behind.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from lockstep_sglang import gloo_timeout, timeline
from lockstep_sglang.consensus import create_dedicated_groups
from lockstep_sglang.faults import FAULT_FILE, FaultWatcher
from lockstep_sglang.probe import ProbeRequest, drop_expired
from lockstep_sglang.standalone import StandaloneRank, broadcast_pyobj
from lockstep_standin.kernel_wait import wait_in_kernel
from lockstep_standin.protocol import (
    AbortRequest,
    GenerateRequest,
    GenerateResult,
    Ready,
    TokenChunk,
    deadline_of,
    detokenize,
    prompt_tokens,
    token_id,
)
from lockstep_standin.settings import MAX_RUNNING, RANK_SPEC_ENV, RankSpec

logger = logging.getLogger("lockstep_standin.scheduler")

MAX_PULL = 512  # messages rank 0 takes from the HTTP server per iteration
KERNEL_WAIT_S = 900  # the stuck-in-kernel fault: longer than any drill waits
PR_SET_PDEATHSIG = 1


@dataclass
class Running:
    """A request every rank holds, with the tokens made so far."""

    req: GenerateRequest
    first_iteration: int
    output_ids: list[int] = field(default_factory=list)

    @property
    def rid(self) -> str:
        return self.req.rid


@dataclass
class Batch:
    """Just enough of SGLang's ``ScheduleBatch`` for :func:`consensus.decision_of`."""

    reqs: list[Running]
    forward_mode: str

    def __len__(self) -> int:
        return len(self.reqs)


@dataclass
class Groups:
    """The process groups of one rank."""

    world: list[int]
    cpu: dist.ProcessGroup
    device: dist.ProcessGroup
    hang: dist.ProcessGroup
    consensus: list[dist.ProcessGroup]


class Scheduler:
    """The per-rank loop (see the module docstring); runs on the process's main thread."""

    def __init__(
        self,
        spec: RankSpec,
        runtime: StandaloneRank,
        groups: Groups,
        *,
        inbox: Connection | None = None,
        outbox: Connection | None = None,
    ) -> None:
        self.spec = spec
        self.rank = spec.rank
        self.runtime = runtime
        self.groups = groups
        self.inbox = inbox
        self.outbox = outbox
        self.faults = FaultWatcher(Path(spec.pod_dir) / FAULT_FILE)
        self.iteration = 0
        self.waiting: list[Running] = []
        self.running: dict[str, Running] = {}
        tracer = runtime.tracer
        self.broadcast = tracer.wrap(broadcast_pyobj, "broadcast_pyobj", opaque=True)
        # Opaque, as in SGLang where the host waits in run_batch while NCCL runs: every
        # rank of a hung group shows the same op, whatever it waits on inside.
        self.forward = tracer.wrap(self._forward, "run_batch", group=b"tp:device", opaque=True)
        self.stuck_broadcast = tracer.wrap(
            self._stuck, "broadcast_pyobj", group=b"tp:cpu", opaque=True
        )

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        """Serve until the process ends (it never returns)."""
        state, recorder = self.runtime.state, self.runtime.recorder
        timeline.mark(self.spec.state_dir, "scheduler_loop", rank=self.rank)
        while True:
            self.iteration += 1
            state.begin_iteration()
            fault = self.faults.current()
            mine = fault.targets(self.rank, self.spec.local_ranks, self.spec.epoch)
            pulled = self.pull() if self.inbox is not None else None
            if mine and fault.kind == "hang" and not (self.running or self.waiting):
                # An idle group hangs in the request broadcast, a busy one in run_batch:
                # either way every rank shows the same collective.
                self.stuck_broadcast()
            self.dispatch(self.broadcast(pulled, self.rank, self.groups.cpu))
            batch = self.next_batch()
            if mine and fault.kind == "desync":
                batch = self.diverge(batch)
            recorder.decision(batch)
            if batch:
                stuck = mine and fault.kind == "hang"
                slow_s = fault.step_seconds if mine and fault.kind == "slow" else 0.0
                in_kernel = mine and fault.kind == "stuck-in-kernel"
                self.forward(len(batch), stuck, slow_s, in_kernel)
                self.advance(batch)

    def pull(self) -> list[Any]:
        """Rank 0: requests from the HTTP server, expired ones dropped, aborts added.

        Waits up to ``idle_s`` for the first one when there is nothing to run, so an
        idle group costs a wake-up per ``idle_s``, not a spinning core.
        """
        assert self.inbox is not None
        msgs: list[Any] = []
        timeout = 0.0 if (self.running or self.waiting) else self.spec.idle_s
        if self.inbox.poll(timeout):
            while len(msgs) < MAX_PULL and self.inbox.poll(0):
                msgs.append(self.inbox.recv())
        now = time.time()
        kept = drop_expired(msgs, now, deadline_of)
        if len(kept) < len(msgs):
            logger.info("dropped %d expired request(s) before the broadcast", len(msgs) - len(kept))
        # The caller has given up on these; every rank must drop them at the same step.
        expired = [r.rid for r in [*self.waiting, *self.running.values()] if r.req.deadline < now]
        return kept + [AbortRequest(rid) for rid in expired]

    def dispatch(self, msgs: Sequence[Any]) -> None:
        """Apply what rank 0 broadcast; identical on every rank."""
        for msg in msgs:
            if isinstance(msg, ProbeRequest):
                reply = self.runtime.handle_probe(msg, self.iteration)
                if reply is not None:
                    self.reply(reply)
            elif isinstance(msg, GenerateRequest):
                self.waiting.append(Running(msg, self.iteration))
            elif isinstance(msg, AbortRequest):
                self.running.pop(msg.rid, None)
                self.waiting = [r for r in self.waiting if r.rid != msg.rid]

    def next_batch(self) -> Batch | None:
        """Every running request, plus waiting ones up to the batch cap (FIFO)."""
        room = MAX_RUNNING - len(self.running)
        admitted, self.waiting = self.waiting[:room], self.waiting[room:]
        for r in admitted:
            self.running[r.rid] = r
        if not self.running:
            return None
        mode = "EXTEND" if admitted else "DECODE"
        return Batch(list(self.running.values()), mode)

    def diverge(self, batch: Batch | None) -> Batch | None:
        """The ``desync`` fault: decide the opposite of the peers (idle, or a phantom batch)."""
        if batch:
            logger.warning("fault desync: idling at iteration %d while peers batch", self.iteration)
            return None
        logger.warning("fault desync: phantom batch at iteration %d", self.iteration)
        phantom = GenerateRequest(f"phantom-{self.iteration}", "", 1, float("inf"), time.time())
        return Batch([Running(phantom, self.iteration)], "DECODE")

    def _forward(self, size: int, stuck: bool, slow_s: float, in_kernel: bool = False) -> None:
        # A model step, timed in the rank state (as the real runtime times run_batch).
        with self.runtime.state.step():
            if stuck:
                self._stuck()
            if in_kernel:
                # A driver call that never returns: uninterruptible until killed.
                logger.warning("fault stuck-in-kernel at iteration %d", self.iteration)
                wait_in_kernel(KERNEL_WAIT_S)
            if self.spec.step_s > 0:
                time.sleep(self.spec.step_s)
            mine = torch.tensor([size, round(slow_s * 1000)], dtype=torch.int64)
            gathered = [torch.zeros_like(mine) for _ in self.groups.world]
            dist.all_gather(gathered, mine, group=self.groups.device)
            sizes = [int(t[0]) for t in gathered]
            if any(other != size for other in sizes):
                raise RuntimeError(f"forward all-gather gave batch sizes {sizes} for {size}")
            slowest_s = max(int(t[1]) for t in gathered) / 1000
            if slowest_s > 0:
                time.sleep(slowest_s)

    def _stuck(self) -> None:
        """The ``hang`` fault: wait in a receive no peer ever matches, up to the gloo bound.

        Called inside a traced collective (``run_batch`` or ``broadcast_pyobj``), whose
        peers then wait for this rank until their own gloo timeout.
        """
        logger.warning("fault hang: rank %d stuck at iteration %d", self.rank, self.iteration)
        world = self.groups.world
        if len(world) > 1:
            peer = world[(world.index(self.rank) + 1) % len(world)]
            dist.recv(torch.zeros(1), src=peer, group=self.groups.hang)
        else:
            time.sleep(self.spec.gloo_timeout_s)
        raise TimeoutError("hung rank released by the gloo timeout")

    def advance(self, batch: Batch) -> None:
        """One token for every request of the batch; rank 0 answers the finished ones."""
        for r in batch.reqs:
            if len(r.output_ids) < r.req.max_new_tokens:
                r.output_ids.append(token_id(r.req.text, len(r.output_ids)))
                if r.req.stream and len(r.output_ids) < r.req.max_new_tokens:
                    self.reply(TokenChunk(r.rid, list(r.output_ids)))
            if len(r.output_ids) >= r.req.max_new_tokens:
                self.running.pop(r.rid, None)
                self.reply(
                    GenerateResult(
                        rid=r.rid,
                        output_ids=list(r.output_ids),
                        text=detokenize(r.output_ids),
                        prompt_tokens=prompt_tokens(r.req.text),
                        first_iteration=r.first_iteration,
                        last_iteration=self.iteration,
                        finished_at=time.time(),
                    )
                )

    def reply(self, msg: object) -> None:
        """Send to the HTTP server (rank 0 only; other ranks have no outbox)."""
        if self.outbox is not None:
            self.outbox.send(msg)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the pod ended before the request took effect
        os._exit(1)


def _end_on_thread_death(args: threading.ExceptHookArgs) -> None:
    """A helper thread that dies (the consensus thread after a gloo timeout) ends the rank.

    Otherwise the rank would go on without its consensus, silently.
    """
    if args.exc_type is SystemExit:
        return
    logger.critical(
        "thread %s died; ending the rank",
        getattr(args.thread, "name", "?"),
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(1)


def join_group(spec: RankSpec) -> Groups:
    """Rendezvous with the other ranks (across pods) and create the groups."""
    gloo_timeout.install(timedelta(seconds=spec.gloo_timeout_s))
    rendezvous = timedelta(seconds=spec.rendezvous_timeout_s)
    if spec.store_fd >= 0:
        store = TCPStore(
            spec.store_host,
            spec.store_port,
            spec.world_size,
            True,
            rendezvous,
            wait_for_workers=False,
            master_listen_fd=spec.store_fd,
        )
    else:
        store = TCPStore(spec.store_host, spec.store_port, spec.world_size, False, rendezvous)
    # A rank of another epoch that reaches this store never sees these keys.
    prefixed = PrefixStore(f"lockstep-standin/epoch-{spec.epoch or 0}", store)
    dist.init_process_group(
        "gloo",
        store=prefixed,
        rank=spec.rank,
        world_size=spec.world_size,
        timeout=timedelta(seconds=spec.gloo_timeout_s),
    )
    world = list(range(spec.world_size))
    cpu = dist.new_group(world, backend="gloo", group_desc="tp:cpu")
    device = dist.new_group(world, backend="gloo", group_desc="tp:device")
    hang = dist.new_group(world, backend="gloo", group_desc="standin:hang")
    consensus = create_dedicated_groups([world])
    assert isinstance(cpu, dist.ProcessGroup) and isinstance(device, dist.ProcessGroup)
    assert isinstance(hang, dist.ProcessGroup)
    return Groups(world, cpu, device, hang, consensus)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry of one rank process; returns only on a start-up error."""
    parser = argparse.ArgumentParser(prog="lockstep-standin-rank")
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args(argv)
    spec = RankSpec.from_json(os.environ[RANK_SPEC_ENV])
    if spec.rank != args.rank:
        raise SystemExit(f"--rank {args.rank} does not match the spec's rank {spec.rank}")
    _die_with_parent()
    threading.excepthook = _end_on_thread_death
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s standin rank {spec.rank} %(levelname)s %(name)s: %(message)s",
    )
    inbox = Connection(spec.inbox_fd, writable=False) if spec.inbox_fd >= 0 else None
    outbox = Connection(spec.outbox_fd, readable=False) if spec.outbox_fd >= 0 else None
    try:
        groups = join_group(spec)
        runtime = StandaloneRank.start(
            Path(spec.state_dir),
            rank=spec.rank,
            tp_rank=spec.rank,
            cpu_group=groups.cpu,
            device_group=groups.device,
            consensus_groups=groups.consensus,
            consensus=spec.consensus,
            consensus_pause_s=spec.consensus_pause_s,
        )
        scheduler = Scheduler(spec, runtime, groups, inbox=inbox, outbox=outbox)
        logger.info(
            "rank %d of %d running (consensus %s, gloo timeout %gs)",
            spec.rank,
            spec.world_size,
            "on" if runtime.checker is not None else "off",
            spec.gloo_timeout_s,
        )
        scheduler.reply(Ready(spec.world_size, os.getpid(), time.time(), ["tp:cpu", "tp:device"]))
        scheduler.run()
    except BaseException:
        logger.exception("rank %d ends", spec.rank)
    finally:
        # os._exit: a normal exit would tear down gloo groups whose peers are gone and
        # join the consensus thread, either of which can wait; the pod restarts anyway.
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())

"""The lockstep runtime of one rank for scheduler loops that are not SGLang's.

:mod:`lockstep_sglang.hooks` assembles these pieces inside SGLang's scheduler; this
module assembles the same ones around any loop built on ``torch.distributed`` (the CPU
stand-in server of the local cluster, the distributed tests, the benchmarks), so both
publish the same rank state, record the same consensus events and answer the same
probes. A loop using it::

    rank = StandaloneRank.start(
        state_dir, rank=r, tp_rank=r, cpu_group=cpu, device_group=dev,
        consensus_groups=create_dedicated_groups([ranks]),
    )
    broadcast = rank.tracer.wrap(my_broadcast_pyobj, "broadcast_pyobj", opaque=True)
    while serving:
        rank.state.begin_iteration()
        reqs = broadcast(pulled_on_rank_0, r, cpu)      # drop_expired() before, on rank 0
        for req in probes_in(reqs):
            reply = rank.handle_probe(req, iteration)   # every rank; rank 0 gets a reply
        batch = next_batch()
        rank.recorder.decision(batch)                   # before the collectives it gates
        if batch:
            with rank.tracer.region("run_batch", "tp:device"):
                run(batch)
    rank.close()
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep_sglang.collectives import CollectiveTracer, trace_torch_distributed
from lockstep_sglang.consensus import DEFAULT_PAUSE_S, ConsensusChecker, DecisionRecorder
from lockstep_sglang.probe import ProbeGroup, ProbeReply, ProbeRequest, run_collective_probe
from lockstep_sglang.rank_state import RankStateWriter

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


@dataclass
class StandaloneRank:
    """Rank state, collective tracing, decision consensus and probe handling of a rank."""

    state: RankStateWriter
    tracer: CollectiveTracer
    recorder: DecisionRecorder
    checker: ConsensusChecker | None
    probe_groups: list[ProbeGroup]
    tp_rank: int

    @classmethod
    def start(
        cls,
        state_dir: Path,
        *,
        rank: int,
        tp_rank: int,
        cpu_group: ProcessGroup,
        device_group: ProcessGroup | None = None,
        consensus_groups: Sequence[ProcessGroup] = (),
        consensus: bool = True,
        trace_torch: bool = True,
        consensus_pause_s: float = DEFAULT_PAUSE_S,
    ) -> StandaloneRank:
        """Set up the rank; call from the scheduler thread, after the groups exist.

        ``consensus_groups`` should be dedicated gloo groups
        (:func:`lockstep_sglang.consensus.create_dedicated_groups`); ``trace_torch``
        traces the blocking ``torch.distributed`` collectives process-wide.
        """
        state = RankStateWriter.create(state_dir, rank=rank, tp_rank=tp_rank)
        tracer = CollectiveTracer(state)
        if trace_torch:
            trace_torch_distributed(tracer)
        checker = None
        if consensus and consensus_groups:
            checker = ConsensusChecker(consensus_groups, state=state, pause_s=consensus_pause_s)
            checker.start()
        probe_groups = [ProbeGroup("tp:cpu", cpu_group)]
        if device_group is not None:
            probe_groups.append(ProbeGroup("tp:device", device_group))
        return cls(
            state=state,
            tracer=tracer,
            recorder=DecisionRecorder(None if checker is None else checker.record, state),
            checker=checker,
            probe_groups=probe_groups,
            tp_rank=tp_rank,
        )

    def handle_probe(self, req: ProbeRequest, iteration: int = 0) -> ProbeReply | None:
        """Run the probe's all-reduces (every rank must); TP rank 0 returns the reply."""
        handled_at = time.time()
        ok, groups_ms, error = run_collective_probe(self.probe_groups)
        if self.tp_rank != 0:
            return None
        return ProbeReply(
            rid=req.rid,
            ok=ok,
            groups_ms=groups_ms,
            tp_rank=self.tp_rank,
            iteration=iteration or self.state.iteration,
            queued_ms=max(0.0, (handled_at - req.sent_at) * 1000.0),
            error=error,
        )

    def close(self) -> None:
        """Compare what is still queued and stop the consensus thread."""
        if self.checker is not None:
            self.checker.close()


def broadcast_pyobj(data: list[Any] | None, rank: int, group: Any, src: int = 0) -> list[Any]:
    """SGLang's ``broadcast_pyobj`` protocol on a gloo group: a size, then pickled bytes.

    The one copy used by the stand-in server, the distributed tests and the benchmarks
    (SGLang's own lives in ``sglang.srt.utils.common`` and is traced by the hooks).
    """
    import torch
    import torch.distributed as dist

    if rank == src:
        payload = pickle.dumps(data or [])
        size = torch.tensor([len(payload)], dtype=torch.long)
        dist.broadcast(size, src=src, group=group)
        dist.broadcast(
            torch.frombuffer(bytearray(payload), dtype=torch.uint8), src=src, group=group
        )
        return data or []
    size = torch.tensor([0], dtype=torch.long)
    dist.broadcast(size, src=src, group=group)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(buf, src=src, group=group)
    result: list[Any] = pickle.loads(bytes(buf.numpy()))
    return result

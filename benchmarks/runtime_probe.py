"""Cost of one collective probe, against the same scheduler loop without probes.

A 2-rank gloo group runs the SGLang-shaped loop of ``runtime_consensus.py`` with the full
runtime on (rank state, collective tracing, consensus). This process plays the tokenizer:
it sends probes through a :class:`lockstep_sglang.probe.ProbeGate` into rank 0's input,
which broadcasts them; every rank runs the probe's all-reduces at the top of its loop.
First the loop runs without probes, then with one probe every ``--interval`` seconds.

It prints one JSON object: probe round-trip latency (client side), the mean loop
iteration with and without a probe and their ratio, the time one probe adds to the loop,
and what that costs at a probe period (the share of loop time spent on probes).

    .venv/bin/python benchmarks/runtime_probe.py [--quiet-s 4] [--probing-s 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import runtime_consensus

PERIODS_S = (1.0, 5.0, 10.0)


def worker_main(args: argparse.Namespace) -> int:
    import zmq

    from lockstep_sglang.probe import (
        ProbeGroup,
        ProbeReply,
        ProbeRequest,
        drop_expired,
        run_collective_probe,
    )

    workdir = Path(args.workdir)
    worker = runtime_consensus.Worker(args.rank, args.world, workdir)
    mode = worker.modes["consensus"]
    groups = [ProbeGroup("tp:cpu", worker.cpu_group), ProbeGroup("tp:device", worker.device_group)]
    flags = {"probe": False, "stop": False}
    outbox = None
    if args.rank == 0:
        ctx = zmq.Context.instance()
        inbox = ctx.socket(zmq.PULL)
        inbox.bind(f"ipc://{workdir / 'inbox'}")
        outbox = ctx.socket(zmq.PUSH)
        outbox.connect(f"ipc://{workdir / 'outbox'}")

        def pull() -> list[Any]:
            msgs: list[Any] = []
            while True:
                try:
                    msgs.append(inbox.recv_pyobj(zmq.NOBLOCK))
                except zmq.Again:
                    break
            return drop_expired(
                msgs,
                time.time(),
                lambda m: m["req"].deadline if m["type"] == "probe" else None,
            )

        worker.pull = pull

    def on_message(msg: dict[str, Any]) -> None:
        if msg["type"] == "stop":
            flags["stop"] = True
            return
        req: ProbeRequest = msg["req"]
        ok, groups_ms, error = run_collective_probe(groups)
        flags["probe"] = True
        if outbox is not None:
            outbox.send_pyobj(ProbeReply(rid=req.rid, ok=ok, groups_ms=groups_ms, error=error))

    worker.on_probe = on_message
    (workdir / f"ready-{args.rank}").touch()
    samples: list[tuple[float, bool]] = []
    while not flags["stop"]:
        flags["probe"] = False
        start = time.perf_counter()
        worker.iteration(mode)
        samples.append((time.perf_counter() - start, flags["probe"]))
    worker.close()
    if args.rank == 0:
        (workdir / "result.json").write_text(json.dumps(samples))
    return 0


async def drive(workdir: Path, quiet_s: float, probing_s: float, interval: float) -> list[float]:
    import zmq

    from lockstep_sglang.probe import ProbeGate, ProbeReply, ProbeRequest

    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(f"ipc://{workdir / 'inbox'}")
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"ipc://{workdir / 'outbox'}")
    pull.setsockopt(zmq.RCVTIMEO, 100)

    def send(req: ProbeRequest) -> None:
        push.send_pyobj({"type": "probe", "req": req})

    gate = ProbeGate(send)
    done = threading.Event()

    def receive() -> None:
        while not done.is_set():
            try:
                reply = pull.recv_pyobj()
            except zmq.Again:
                continue
            assert isinstance(reply, ProbeReply)
            gate.deliver(reply)

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    latencies: list[float] = []
    try:
        await asyncio.sleep(quiet_s)
        end = time.monotonic() + probing_s
        while time.monotonic() < end:
            outcome = await gate.probe(5.0)
            if outcome["ok"]:
                latencies.append(outcome["latency_ms"])
            await asyncio.sleep(interval)
        push.send_pyobj({"type": "stop"})
    finally:
        done.set()
        receiver.join(2)
    ctx.destroy(linger=1000)
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quiet-s", type=float, default=4.0)
    parser.add_argument("--probing-s", type=float, default=8.0)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--workdir")
    args = parser.parse_args()
    if args.rank is not None:
        return worker_main(args)
    with tempfile.TemporaryDirectory(prefix="ls-probe-") as tmp:
        workdir = Path(tmp)
        procs = [
            subprocess.Popen(
                [
                    *(sys.executable, __file__, "--rank", str(r)),
                    *("--world", str(args.world), "--workdir", tmp),
                ],
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            for r in range(args.world)
        ]
        try:
            deadline = time.monotonic() + 120
            while not all((workdir / f"ready-{r}").exists() for r in range(args.world)):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    print(
                        json.dumps({"benchmark": "runtime_probe", "error": "ranks did not start"})
                    )
                    return 1
                time.sleep(0.05)
            latencies = asyncio.run(drive(workdir, args.quiet_s, args.probing_s, args.interval))
            codes = [p.wait(timeout=60) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if codes != [0] * args.world or not latencies:
            print(json.dumps({"benchmark": "runtime_probe", "error": f"ranks exited {codes}"}))
            return 1
        samples = json.loads((workdir / "result.json").read_text())
    plain = [t for t, probed in samples if not probed]
    probed = [t for t, probed in samples if probed]
    plain_ms = statistics.median(plain) * 1000
    probed_ms = statistics.median(probed) * 1000
    added_ms = probed_ms - plain_ms
    lat = sorted(latencies)
    print(
        json.dumps(
            {
                "benchmark": "runtime_probe",
                "world": args.world,
                "probes": len(lat),
                "probe_latency_ms": {
                    "p50": round(statistics.median(lat), 3),
                    "p90": round(lat[int(0.9 * (len(lat) - 1))], 3),
                    "max": round(lat[-1], 3),
                },
                "iteration_ms": {
                    "without_probe": round(plain_ms, 3),
                    "with_probe": round(probed_ms, 3),
                },
                "ratio_probe_iteration_to_plain": round(probed_ms / plain_ms, 3),
                "added_ms_per_probe": round(added_ms, 3),
                "loop_share_at_period": {
                    f"{p:g}s": round(max(0.0, added_ms) / (p * 1000), 6) for p in PERIODS_S
                },
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

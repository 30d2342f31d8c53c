"""Prober capacity: deep probes per CPU-second, and groups one core can probe at the
default period, against fake rank-0 endpoints on distinct loopback addresses.

The fake endpoints run in a separate process (a minimal asyncio HTTP server), so the
prober's own CPU time is what is measured (`time.process_time` of this process). Prints
JSON. Usage: python benchmarks/prober_capacity.py [--groups 1000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import time

import httpx

from lockstep.api.models import HealthSpec
from lockstep.clients.prober import ProbeBook, Prober, ProbeTarget
from lockstep.handlers.operator import PROBE_POOL as POOL

RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n"
    b'Connection: keep-alive\r\n\r\n{"ok":true}'
)


def address(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


def serve(port: int, ready: mp.synchronize.Event) -> None:  # type: ignore[name-defined]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head:
                    break
                writer.write(RESPONSE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "0.0.0.0", port, backlog=4096)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


async def run(groups: int, seconds: float, port: int, period: float) -> dict[str, float]:
    book = ProbeBook()
    book.set_targets(
        "bench",
        "m",
        [
            ProbeTarget(
                key=("bench", "m", "decode", i),
                epoch=0,
                probe_url=f"http://{address(i)}:{port}/lockstep/probe",
                agents=(),
                period=period,
                timeout=3.0,
            )
            for i in range(groups)
        ],
    )
    count = 0

    def on_sample(sample: object) -> None:
        nonlocal count
        count += 1

    # The operator's client settings (lockstep.handlers.operator): a bounded pool. A pool as large
    # as the number of pods made every request scan it (67 probes per CPU-second at 1000
    # groups in our first run, against about 950 with this pool).
    client = httpx.AsyncClient(limits=POOL)
    try:
        prober = Prober(book, client, concurrency=64, tick=0.05, on_sample=on_sample)
        stop = asyncio.Event()
        task = asyncio.create_task(prober.run(stop))
        await asyncio.sleep(2.0)  # warm up: connections opened
        count = 0
        cpu0, wall0 = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        done = count
        stop.set()
        await task
    finally:
        await client.aclose()
    failed = sum(
        1 for i in range(groups) for s in book.samples(("bench", "m", "decode", i)) if not s.ok
    )
    return {"probes": done, "cpu_seconds": cpu, "wall_seconds": wall, "failed_samples": failed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=18080)
    args = parser.parse_args()
    ready = mp.Event()
    server = mp.Process(target=serve, args=(args.port, ready), daemon=True)
    server.start()
    ready.wait(10)
    default_period = float(HealthSpec().period_seconds)
    # A short period saturates the prober, so the CPU cost per probe is measured under load.
    result = asyncio.run(run(args.groups, args.seconds, args.port, 0.5))
    server.terminate()
    server.join(5)
    per_cpu_s = result["probes"] / result["cpu_seconds"] if result["cpu_seconds"] else 0.0
    print(
        json.dumps(
            {
                "benchmark": "prober_capacity",
                "groups": args.groups,
                "probes": result["probes"],
                "failed_samples": result["failed_samples"],
                "wall_seconds": round(result["wall_seconds"], 2),
                "prober_cpu_seconds": round(result["cpu_seconds"], 2),
                "probes_per_cpu_second": round(per_cpu_s, 1),
                "probes_per_wall_second": round(result["probes"] / result["wall_seconds"], 1),
                "default_period_seconds": default_period,
                "groups_per_core_at_default_period": int(per_cpu_s * default_period),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

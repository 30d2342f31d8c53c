"""What one CPU stand-in group costs: start-up, idle CPU and memory, request and probe latency.

Starts one TP group of ``--pods`` stand-in pods (``--tp`` ranks in all) on loopback
addresses, as the process kubelet does, waits until it serves, then measures:

- ``startup_s``: from launch to ``/health`` 200 (dominated by each rank's torch import);
- idle CPU over ``--idle-s`` seconds, from ``/proc/<pid>/stat`` (utime + stime), per
  process (pod main processes and rank processes) and in all, as % of one core;
- memory: RSS and PSS (``/proc/<pid>/smaps_rollup``; PSS shares torch's libraries fairly
  between the processes that map them) per process;
- ``/generate`` latency (``--requests`` sequential requests of ``--tokens`` tokens) and
  ``/lockstep/probe`` latency, p50 and max.

Prints one JSON object. Usage::

    .venv/bin/python benchmarks/standin_group.py [--pods 2] [--tp 2] [--idle-s 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def memory_kib(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in {"Rss", "Pss"}:
            out[key.lower() + "_mib"] = int(rest.split()[0]) // 1024
    return out


def launch(
    args: argparse.Namespace, workdir: Path
) -> list[tuple[str, Path, subprocess.Popen[bytes]]]:
    net = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
    ips = [f"{net}.{10 + i}" for i in range(args.pods)]
    pods = []
    for node, ip in enumerate(ips):
        pod_dir = workdir / f"pod-{node}"
        pod_dir.mkdir()
        argv = [
            "--model-path", "/models/tiny", "--disaggregation-mode", "decode",
            "--tp-size", str(args.tp), "--nnodes", str(args.pods), "--host", "0.0.0.0",
            "--port", "30000", "--node-rank", str(node), "--dist-init-addr", f"{ips[0]}:20001",
        ]  # fmt: skip
        env = {
            **os.environ,
            "LOCKSTEP_POD_IP": ip,
            "LOCKSTEP_POD_DIR": str(pod_dir),
            "LOCKSTEP_AGENT_PORT": "8999",
            "LOCKSTEP_GROUP_EPOCH": "1",
        }
        with open(pod_dir / "pod.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lockstep_standin", *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        pods.append((ip, pod_dir, proc))
    return pods


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def measure(
    args: argparse.Namespace, pods: list[tuple[str, Path, subprocess.Popen[bytes]]]
) -> dict[str, Any]:
    leader = f"http://{pods[0][0]}:30000"
    # One client: a bare httpx.get builds a new TLS context per call (~100 ms).
    client = httpx.Client(timeout=30)
    started = time.monotonic()
    deadline = started + 180
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if client.get(f"{leader}/health", timeout=2).status_code == 200:
                break
        if time.monotonic() > deadline or any(p.poll() is not None for _, _, p in pods):
            raise SystemExit("the group did not start; see the pod logs")
        time.sleep(0.1)
    startup_s = time.monotonic() - started
    time.sleep(2.0)  # let the first iterations and the consensus settle

    procs: dict[str, int] = {}
    for node, (_, pod_dir, proc) in enumerate(pods):
        procs[f"pod-{node}/main"] = proc.pid
        for r in json.loads((pod_dir / "ranks.json").read_text())["ranks"]:
            procs[f"pod-{node}/rank-{r['rank']}"] = int(r["pid"])
    before = {name: cpu_ticks(pid) for name, pid in procs.items()}
    time.sleep(args.idle_s)
    idle = {
        name: round((cpu_ticks(pid) - before[name]) / CLK_TCK / args.idle_s * 100, 2)
        for name, pid in procs.items()
    }
    memory = {name: memory_kib(pid) for name, pid in procs.items()}

    gen_ms: list[float] = []
    for i in range(args.requests):
        t = time.perf_counter()
        body = {"text": f"prompt {i}", "sampling_params": {"max_new_tokens": args.tokens}}
        resp = client.post(f"{leader}/generate", json=body)
        resp.raise_for_status()
        gen_ms.append((time.perf_counter() - t) * 1000)
    probe_ms: list[float] = []
    for _ in range(args.requests):
        t = time.perf_counter()
        client.get(f"{leader}/lockstep/probe", timeout=10).raise_for_status()
        probe_ms.append((time.perf_counter() - t) * 1000)
    client.close()
    return {
        "pods": args.pods,
        "tp": args.tp,
        "startup_s": round(startup_s, 2),
        "idle_window_s": args.idle_s,
        "idle_cpu_percent_of_one_core": {"total": round(sum(idle.values()), 2), **idle},
        "memory": memory,
        "pss_total_mib": sum(m.get("pss_mib", 0) for m in memory.values()),
        "generate": {
            "requests": args.requests,
            "tokens": args.tokens,
            "p50_ms": percentile(gen_ms, 0.5),
            "max_ms": round(max(gen_ms), 2),
            "per_token_ms": round(statistics.median(gen_ms) / args.tokens, 3),
        },
        "probe": {"p50_ms": percentile(probe_ms, 0.5), "max_ms": round(max(probe_ms), 2)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ls-standin-bench-") as tmp:
        pods = launch(args, Path(tmp))
        try:
            result = measure(args, pods)
        finally:
            for _, _, proc in pods:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

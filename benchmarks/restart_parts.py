"""Where a whole-group restart's time goes, part by part (JSON out).

One desync drill (`Drill("desync")`, in-place restart) on the local cluster per engine;
the parts come from the operator's records (the affected group's steps, sampled by the
drill) and from the start-up timeline every pod's runtime keeps
(`lockstep_sglang.timeline`, in the pod's state dir), for the incarnation after the
restart:

- `operator_before_restart_s`: verdict to the first pod told to restart (`restarted`:
  drain, evidence, the restart slot, the ask);
- `container_restart_s`: that to the last new container's first line
  (`container_start`: the old containers ending, the kubelet starting them again);
- `launcher_s`: that to the engine process started (`engine_start`);
- `imports_s`: the engine's pin check and SGLang's imports (`sglang_imported`);
- `model_load_s`: that to every scheduler of the group in its loop (`scheduler_loop`:
  processes started, distributed init, weights loaded, KV cache allocated);
  `subprocess_start` says how the real engine started them after the restart (forked
  from the engine process or spawned, `lockstep_sglang.start_method`);
- `warmup_s`: that to the leader's first passing deep probe (`probe_ok`: the HTTP server
  up, SGLang's warm-up request served);
- `operator_after_probe_s`: that to re-admission (the operator seeing the probe, the
  readiness gates, the routers).

Each part is the slowest pod's (a group serves when its last rank does). The stand-in has
no SGLang to import: its `imports_s` is the stand-in's own start.

Usage: python benchmarks/restart_parts.py --engine standin|sglang (about 1 minute on the
stand-in, 5 on the real engine, on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from lockstep_dev.drills import Drill
from lockstep_dev.drills.figures import ts
from lockstep_sglang import timeline

GROUP = ("decode", 0)


def pod_timelines(workdir: Path, namespace: str, prefix: str) -> dict[str, list[dict[str, Any]]]:
    """Every pod's timeline, by pod name (the process kubelet keeps each pod's dir)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for directory in sorted((workdir / "kubelet" / "pods").glob(f"{namespace}_{prefix}*")):
        name = directory.name.split("_", 2)[1]
        events = timeline.read(directory / "state")
        if events:
            out.setdefault(name, []).extend(events)
    return out


def first(events: list[dict[str, Any]], event: str, after: float) -> float | None:
    return next((e["at"] for e in events if e["event"] == event and e["at"] >= after), None)


def parts(result: Any, timelines: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The parts of the one restart the drill made (see the module docstring)."""
    inc = next(i for i in result.incidents if i["role"] == GROUP[0] and i["group"] == GROUP[1])
    verdict = ts(inc.get("detectedTime"))
    assert verdict is not None
    phases = result.phases
    # The end of the recovery as the drill sampled the steps (every 0.25 s).
    readmitted = verdict + sum(phases.values())
    asked: float | None = None
    marks: dict[str, float] = {}
    methods: set[str] = set()
    for events in timelines.values():
        ended = first(events, "restarted", verdict)
        if ended is None:
            continue
        asked = ended if asked is None else min(asked, ended)
        methods |= {
            str(e.get("method"))
            for e in events
            if e["event"] == "subprocess_start" and e["at"] >= ended
        }
        row = {
            "restarted": ended,
            "container_start": first(events, "container_start", ended),
            "engine_start": first(events, "engine_start", ended),
            "sglang_imported": first(events, "sglang_imported", ended),
            "scheduler_loop": first(events, "scheduler_loop", ended),
            "probe_ok": first(events, "probe_ok", ended),
        }
        for key, at in row.items():
            if at is not None:
                marks[key] = max(marks.get(key, at), at)
    chain = [
        ("operator_before_restart_s", verdict, asked),
        ("container_restart_s", asked, marks.get("container_start")),
        ("launcher_s", marks.get("container_start"), marks.get("engine_start")),
        ("imports_s", marks.get("engine_start") or marks.get("container_start"),
         marks.get("sglang_imported")),
        ("model_load_s", marks.get("sglang_imported") or marks.get("container_start"),
         marks.get("scheduler_loop")),
        ("warmup_s", marks.get("scheduler_loop"), marks.get("probe_ok")),
        ("operator_after_probe_s", marks.get("probe_ok"), readmitted),
    ]  # fmt: skip
    out: dict[str, Any] = {
        name: (round(b - a, 2) if a is not None and b is not None else None) for name, a, b in chain
    }
    out["verdict_to_readmitted_s"] = round(readmitted - verdict, 2)
    out["restart_mode"] = result.restart_mode
    out["subprocess_start"] = sorted(methods) or None
    out["phases"] = phases
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["standin", "sglang"], default="standin")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lockstep-restart-parts-"))
    try:
        drill = Drill("desync", engine=args.engine, workdir=workdir)
        result = drill.run()
        timelines = pod_timelines(workdir, "lockstep-drill", f"drill-{GROUP[0]}-{GROUP[1]}-")
        figures = parts(result, timelines) if result.passed else {"failed": result.reason}
        print(json.dumps({"engine": args.engine, "passed": result.passed, **figures}, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

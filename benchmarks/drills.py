"""Recovery figures from drills on the local cluster, per engine (JSON out).

`--engine standin` (default): the desync and hang drills N times each, the slow drill
(steps of 5, 15, 30 and 60 s under traffic and the default step bounds: restarts and
warning Events per length, must be 0), the stuck-step drill (a step that never ends:
time to the Hung verdict under the drill's 10 s floor and under the default 90 s) and
the baseline (the same
desync without lockstep's guard and recovery), each on a fresh local cluster, with
medians: time to detect (from the injection, and the operator's first failed probe to
verdict), time to recover (verdict to re-admission; on CPU stand-ins the restart is
dominated by starting torch processes, not by weights), requests failed on the affected
group before and after its drain, and on the other groups.

`--engine sglang` / `--engine both`: the `sequence` drill through the real sglang-router
(a desync restarted in place, then, within the escalation window and recreated, a rank
SIGSTOPped on the real engine; a killed rank, a hang and a deleted pod on the stand-in)
on the real SGLang 0.5.23 server on CPU, and, with
`both`, the same drill on the stand-in in the same run for a side-by-side: time to ready
per group, injection to verdict and verdict to re-admission per incident and restart
mode, the time in each recovery step, every failed request with its latency (a hanging
one ends at the drill client's 5 s timeout), and the memory (PSS) of each pod.

Usage: python benchmarks/drills.py [--runs 3] [--engine standin|sglang|both]
(about a minute per stand-in drill on 2 cores; about 12 minutes per real sequence)
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict
from typing import Any

from lockstep_dev.drills import run_drill

FIGURES = (
    "passed",
    "verdict",
    "time_to_detect_s",
    "probe_time_to_detect_s",
    "time_to_recover_s",
    "affected_failed_before_drain",
    "affected_failed_after_drain",
    "other_groups_failed",
    "restarts",
    "requests",
)
SEQUENCE_FIGURES = (
    "engine",
    "passed",
    "reason",
    "time_to_ready_s",
    "ready_s",
    "memory_mib",
    "steps",
    "requests",
    "failed_requests",
)


def median(values: list[Any]) -> float | None:
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return round(statistics.median(nums), 3) if nums else None


def standin_scenarios(runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    plan = [("desync", runs), ("hang", runs), ("slow", 1), ("baseline", 1)]
    for scenario, n in plan:
        results = []
        for _ in range(n):
            r = asdict(run_drill(scenario))
            results.append({k: r[k] for k in FIGURES})
            if scenario == "slow":
                results[-1]["per_step_length"] = r["slow"]
        out[scenario] = {
            "runs": results,
            "median_time_to_detect_s": median([r["time_to_detect_s"] for r in results]),
            "median_probe_time_to_detect_s": median([r["probe_time_to_detect_s"] for r in results]),
            "median_time_to_recover_s": median([r["time_to_recover_s"] for r in results]),
            "false_restarts": sum(sum(r["restarts"].values()) for r in results)
            if scenario == "slow"
            else None,
        }
    # A step that never ends, under the drill's floor (10 s) and the default (90 s).
    for label, bounds in (("stuck-step", None), ("stuck-step-default-bounds", {})):
        r = asdict(run_drill("stuck-step", step_bounds=bounds))
        out[label] = {k: r[k] for k in FIGURES}
    return out


def sequence(engine: str) -> dict[str, Any]:
    r = asdict(run_drill("sequence", engine=engine, router=True))
    return {k: r[k] for k in SEQUENCE_FIGURES}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--engine", choices=("standin", "sglang", "both"), default="standin")
    args = parser.parse_args()
    out: dict[str, Any] = {"benchmark": "drills", "engine": args.engine}
    if args.engine == "standin":
        out["runs"] = args.runs
        out["scenarios"] = standin_scenarios(args.runs)
    else:
        engines = ["standin", "sglang"] if args.engine == "both" else ["sglang"]
        out["sequence"] = {engine: sequence(engine) for engine in engines}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

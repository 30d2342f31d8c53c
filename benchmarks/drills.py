"""Recovery figures from repeated drills on the local cluster (JSON out).

Runs the desync and hang drills N times each, the slow drill (false restarts under
legitimately long steps: must be 0), and the baseline (the same desync without lockstep's
guard and recovery), each on a fresh local cluster, and prints per-run figures and
medians: time to detect (from the injection, and the operator's first-failed-probe to
verdict), time to recover (verdict to re-admission; on CPU stand-ins the restart is
dominated by starting torch processes, not by weights), requests failed on the affected
group before and after its drain, and on the other groups.

Usage: python benchmarks/drills.py [--runs 3]   (about a minute per drill on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict
from typing import Any

from lockstep.dev.drills import run_drill

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


def median(values: list[Any]) -> float | None:
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return round(statistics.median(nums), 3) if nums else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    out: dict[str, Any] = {"benchmark": "drills", "runs": args.runs, "scenarios": {}}
    plan = [("desync", args.runs), ("hang", args.runs), ("slow", 1), ("baseline", 1)]
    for scenario, runs in plan:
        results = []
        for _ in range(runs):
            r = asdict(run_drill(scenario))
            results.append({k: r[k] for k in FIGURES})
        out["scenarios"][scenario] = {
            "runs": results,
            "median_time_to_detect_s": median([r["time_to_detect_s"] for r in results]),
            "median_probe_time_to_detect_s": median([r["probe_time_to_detect_s"] for r in results]),
            "median_time_to_recover_s": median([r["time_to_recover_s"] for r in results]),
            "false_restarts": sum(sum(r["restarts"].values()) for r in results)
            if scenario == "slow"
            else None,
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

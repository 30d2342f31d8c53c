"""InPlace vs Recreate: time to recover the same faults, side by side, from one run (JSON).

Runs the desync and hang drills in each recovery mode, alternating the modes run by run
so that both see the same machine load, each on a fresh local cluster, and prints per
run: time to recover (verdict to re-admission), the seconds spent in each recovery step
of the affected group, requests failed on it, and the medians per (scenario, mode).

What the local cluster can and cannot show: its pods are processes on one machine with no
image to pull, no scheduling delay worth the name and no weights to load, so Recreate
costs little more here than InPlace: the figures measure the mechanisms' own overhead
(delete + create + schedule vs. an agent call + a container restart). On GPU nodes the
restart itself dominates (image pull and hundreds of GB of weights after a reschedule;
an in-place restart keeps the node, the image and the page cache).

Usage: python benchmarks/recovery_modes.py [--runs 2] [--scenarios desync,hang]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict
from typing import Any

from lockstep_dev.drills import run_drill

MODES = ("InPlace", "Recreate")
FIGURES = (
    "passed",
    "reason",
    "verdict",
    "restart_mode",
    "time_to_detect_s",
    "time_to_recover_s",
    "phases",
    "affected_failed_before_drain",
    "affected_failed_after_drain",
    "other_groups_failed",
)


def median(values: list[Any]) -> float | None:
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return round(statistics.median(nums), 3) if nums else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--scenarios", default="desync,hang")
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        s: {m: [] for m in MODES} for s in scenarios
    }
    for i in range(args.runs):
        for scenario in scenarios:
            # Alternate which mode goes first, so neither always runs on a warmer machine.
            for mode in MODES if i % 2 == 0 else tuple(reversed(MODES)):
                r = asdict(run_drill(scenario, recovery_mode=mode))
                runs[scenario][mode].append({k: r[k] for k in FIGURES})
    out: dict[str, Any] = {"benchmark": "recovery_modes", "runs": args.runs, "scenarios": {}}
    for scenario, by_mode in runs.items():
        summary: dict[str, Any] = {}
        for mode, results in by_mode.items():
            steps = sorted({k for r in results for k in r["phases"]})
            summary[mode] = {
                "passed": sum(bool(r["passed"]) for r in results),
                "median_time_to_recover_s": median([r["time_to_recover_s"] for r in results]),
                "median_phase_s": {
                    step: median([r["phases"].get(step) for r in results]) for step in steps
                },
                "runs": results,
            }
        a = summary["InPlace"]["median_time_to_recover_s"]
        b = summary["Recreate"]["median_time_to_recover_s"]
        summary["recreate_over_inplace"] = round(b / a, 2) if a and b else None
        out["scenarios"][scenario] = summary
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

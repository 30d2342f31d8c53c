"""Drills through the real sglang-router (JSON out): what users see of a broken group.

Each scenario runs on a fresh local cluster with the deployment's router (as the
operator renders it) in front and all traffic through it. Per run: requests failed
through the router between the injection and the drain (the detection window) and
after the drain (must be 0), requests the router sent to the drained group while it was
drained (must be 0; from the stand-ins' request logs), to the other decode group
meanwhile, and to the group after its re-admission, how long it was drained, workers the
router kept for pods that are gone, and the drill's own detection and recovery times.

Usage: python benchmarks/router_drills.py [--runs 1] [--scenarios desync hang pod-delete]
(about a minute per drill on 2 cores)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from lockstep_dev.drills import run_drill

FIGURES = (
    "passed",
    "reason",
    "verdict",
    "time_to_detect_s",
    "time_to_recover_s",
    "router_failed_before_drain",
    "router_failed_after_drain",
    "affected_received_while_drained",
    "others_received_while_drained",
    "affected_received_after_readmission",
    "drained_for_s",
    "router_stale_workers",
    "requests",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--scenarios", nargs="+", default=["desync", "hang", "pod-delete"])
    args = parser.parse_args()
    out: dict[str, Any] = {"benchmark": "router_drills", "runs": args.runs, "scenarios": {}}
    for scenario in args.scenarios:
        results = []
        for _ in range(args.runs):
            r = asdict(run_drill(scenario, router=True))
            results.append({k: r[k] for k in FIGURES})
        out["scenarios"][scenario] = {
            "runs": results,
            "failed_before_drain": sum(r["router_failed_before_drain"] for r in results),
            "failed_after_drain": sum(r["router_failed_after_drain"] for r in results),
            "sent_to_drained_group": sum(r["affected_received_while_drained"] for r in results),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

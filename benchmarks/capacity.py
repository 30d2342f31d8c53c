"""Capacity lost to incidents, with and without a warm spare (JSON out).

The `capacity` drill (`lockstep_dev.drills.scenarios.capacity`) once with no spare and
once with one, on one engine: decode's serving groups (two on the stand-in, one on the
real engine) in a decode pool with no free GPU, traffic through the real router; a
desync, a hang and a killed rank in a serving group, a node drain held 30 s, then a
scale-up by one group once two nodes of room joined the pool. Per step: the
group-seconds decode served short of its wanted count, and the time from the fault to
the role whole again (its serving count and its spares back); for the scale-up, the
time until one more group serves.

Usage: python benchmarks/capacity.py --engine standin|sglang [--spares 0,1] (about 4
minutes per run on the stand-in, on 2 cores).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from lockstep_dev.drills import Drill
from lockstep_dev.drills.scenarios.capacity import cluster_nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["standin", "sglang"], default="standin")
    parser.add_argument("--spares", default="0,1")
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    serving = 1 if args.engine == "sglang" else 2
    for spares in (int(s) for s in args.spares.split(",")):
        nodes = {"nodes": cluster_nodes(serving, spares), "gpus_per_node": 1}
        result = Drill(
            "capacity", engine=args.engine, spares=spares, cluster_options=nodes, timeout_s=420
        ).run()
        runs.append(
            {
                "spares": spares,
                "passed": result.passed,
                "reason": None if result.passed else result.reason,
                "steps": result.steps,
                "scale_up": result.scaling,
            }
        )
    print(json.dumps({"engine": args.engine, "serving_groups": serving, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()

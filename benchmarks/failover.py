"""Requests caught by an incident, as the users of the served model see them (JSON out).

One local cluster per engine, the drill deployment (one prefill group, two decode groups
of TP2 over two pods) behind the real sglang-router, traffic through the router from a
client that waits as a real one does (two minutes, `lockstep_dev.traffic`), and one
incident after another in decode group 0, each recovered before the next: a desync, a
hang, a killed rank (the decode killed mid-stream: a long stream is under way on the
group each time) and a deleted pod. Per incident:

- `caught`: requests in flight at the fault or sent before the group left the routers;
  how many ended 200, with an HTTP error, or cut (no answer: a broken connection or the
  client's own limit);
- `longest_wait_past_verdict_s`: how long the slowest of them waited after lockstep's
  verdict;
- `streams`: how each long stream ended (`aborted`: the engine's abort event, visible;
  `cut`: a truncated body; `completed`; `error`: an HTTP error before any event) and
  whether decode group 0 held it when the fault landed (`held`);
- `outliers`: the ranks, pods and nodes the incident named; `checks_passed`: whether the
  drill's checks of this incident passed;
- `loads_before` / `loads_after`: requests held and KV tokens used by every serving
  group while idle, before the first incident and after this one (SGLang's `/v1/loads`;
  a runtime without it reports nothing).

Usage: python benchmarks/failover.py --engine standin|sglang [--incidents desync,hang,...]
(`stall-rank`, a rank SIGSTOPped, is one more incident it can run)
(about 2 minutes on the stand-in, 10 on the real engine, on 2 cores). The same script
measured lockstep before its failover existed: run from a checkout of that commit with
this file and its drills and traffic modules (then operator/lockstep/dev/) copied in
(see docs/failover.md).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, cast

from lockstep_dev.drills import Drill
from lockstep_dev.faults import FaultKind

VERDICTS: dict[str, str] = {
    "desync": "Desynced",
    "hang": "Hung",
    "kill-rank": "RankDown",
    "stall-rank": "RankDown",
    "delete-pod": "RankDown",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["standin", "sglang"], default="standin")
    parser.add_argument("--incidents", default="desync,hang,kill-rank,delete-pod")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.incidents.split(",") if k.strip()]
    sequence = [(VERDICTS[k], cast(FaultKind, k)) for k in kinds]
    drill = Drill("sequence", engine=args.engine, router=True, sequence=sequence, keep_going=True)
    result = drill.run()
    incidents: list[dict[str, Any]] = []
    for step in result.steps:
        fo = step.get("failover") or {}
        incidents.append(
            {
                "incident": step["fault"],
                "verdict": step["verdict"],
                "restart_mode": step["restart_mode"],
                "time_to_detect_s": step["time_to_detect_s"],
                "time_to_recover_s": step["time_to_recover_s"],
                "caught": fo.get("caught"),
                "ended_200": fo.get("caught_ok"),
                "ended_error": fo.get("caught_error"),
                "cut": fo.get("caught_cut"),
                "longest_wait_past_verdict_s": fo.get("longest_wait_past_verdict_s"),
                # How each stream ended, and whether the affected group held it.
                "streams": [
                    {"how": s.get("how"), "held": s.get("held")} for s in fo.get("streams", [])
                ],
                "loads_before": fo.get("loads_before"),
                "loads_after": fo.get("loads_after"),
                "failed": fo.get("caught_failed"),
                "outliers": step.get("outliers"),
                "checks_passed": step["passed"],
            }
        )
    out = {
        "engine": args.engine,
        "passed": result.passed,
        "reason": result.reason,
        "duration_s": result.duration_s,
        "incidents": incidents,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

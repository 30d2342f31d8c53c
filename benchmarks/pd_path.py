"""The PD path's faults as the users of the served model see them, and the pair probe's
cost (JSON out).

One local cluster: two prefill and two decode groups behind the real sglang-router,
traffic through the router from a client that waits as a real one does (two minutes,
`lockstep_dev.traffic`), the pair probe at its defaults. First a healthy run of
`--soak-seconds` under that traffic (`soak`): the verdicts it gave (there must be none),
the pair probe's warning Events, the operator's frees of the KV of ended requests
(`ended_kv_frees`: none either), each pair's last try, and the probe requests each group
served a second (counted in the stand-ins' request logs). Then the `pd-path` drill's
faults, one after the other, each recovered before the next: `transfer-stall` in
prefill/0 and `bootstrap-down` in prefill/1. Per fault:

- `time_to_detect_s`: from the fault to the verdict; `verdict` and `blamed`: what was
  judged and which group the incident is in;
- `caught`: requests in flight at the fault or sent before the group left the router;
  how many ended 200, with an HTTP error, or cut; `longest_wait_past_verdict_s`;
- `restarted`: the groups whose epoch moved (only the prefill at fault should);
- `loads_after`: requests held and KV tokens used by every group while idle after it.

Then, on the same cluster, the KV of ended requests: `kv-leak` in decode/0 under an abort
wave (`kv_leak`: the KV it held for ended requests, the time from the first report of it
to its free, KV held by ended requests on every group before and after, the groups
blamed: none should be) and the abort storm (`abort_storm`: per round, the streams
cancelled mid-stream and before their first token, what every group held once quiet).

With `--engine sglang` the same cluster runs the real SGLang server on CPU (the faults
through lockstep's hooks in it, `lockstep_sglang.pd_faults`; the KV of ended requests
as its deep probe reports it, `lockstep_sglang.held_kv`): the same steps; the probe
requests per group are not counted there (no request log).

Usage: python benchmarks/pd_path.py [--engine standin|sglang] [--soak-seconds 600]
(stand-in: about 1 minute plus the soak on 2 cores; real engine: about 4 minutes plus
the soak).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lockstep_dev.drills import Drill


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["standin", "sglang"], default="standin")
    parser.add_argument("--soak-seconds", type=float, default=600.0)
    args = parser.parse_args()
    result = Drill(
        "pd-path",
        engine=args.engine,
        router=True,
        keep_going=True,
        soak_s=args.soak_seconds,
        timeout_s=300.0 if args.engine == "standin" else 900.0,
    ).run()
    faults: list[dict[str, Any]] = []
    kv: dict[str, Any] = {}
    for step in result.steps:
        if step["fault"] in ("kv-leak", "abort-storm"):
            kv[step["fault"].replace("-", "_")] = step
            continue
        fo = step.get("failover") or {}
        faults.append(
            {
                "fault": step["fault"],
                "group": step["group"],
                "verdict": step["verdict"],
                "blamed": step["blamed"],
                "time_to_detect_s": step["time_to_detect_s"],
                "restarted": step["restarted"],
                "caught": fo.get("caught"),
                "ended_200": fo.get("caught_ok"),
                "ended_error": fo.get("caught_error"),
                "cut": fo.get("caught_cut"),
                "longest_wait_past_verdict_s": fo.get("longest_wait_past_verdict_s"),
                "loads_after": fo.get("loads_after"),
                "pair_events": step.get("events"),
                "checks_passed": step["passed"],
            }
        )
    out = {
        "engine": args.engine,
        "passed": result.passed,
        "reason": result.reason,
        "duration_s": result.duration_s,
        "requests": result.requests,
        "soak": result.soak,
        "faults": faults,
        **kv,
    }
    print(json.dumps(out, indent=2))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())

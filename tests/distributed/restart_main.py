"""A launcher-like container main process, for the pod agent's restart (no SGLang).

What ``lockstep-sglang`` does around SGLang, with SGLang's processes replaced by rank
processes that publish rank state, ignore ``SIGTERM`` and sleep (a wedged rank), one of
them with a child of its own: install the restart handler, start the real pod agent as
its own process with this pid, write ``ready.json`` (every pid), then wait. It ends by
itself after ``--lifetime`` seconds, so a failed test cannot leave it behind.

    python restart_main.py --workdir DIR --epoch E --lifetime S   (agent env: LOCKSTEP_*)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lockstep_sglang.config import RuntimeConfig
from lockstep_sglang.launcher import install_restart_handler, start_agent
from lockstep_sglang.rank_state import state_path

RANK = """
import signal, subprocess, sys, time
from pathlib import Path
from lockstep_sglang.rank_state import RankStateWriter
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank, state_dir, child = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
writer = RankStateWriter(state_dir / f"rank-{rank}.state", rank=rank, tp_rank=rank)
writer.begin_iteration()
if child:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
time.sleep(120)
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--epoch", default=None)
    parser.add_argument("--lifetime", type=float, default=60.0)
    args = parser.parse_args()
    config = RuntimeConfig.from_env()
    install_restart_handler()
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANK, str(r), str(config.state_dir), str(r)])
        for r in (0, 1)
    ]
    agent = start_agent(config, epoch=args.epoch)
    deadline = time.monotonic() + 20
    while not all(state_path(config.state_dir, r).exists() for r in (0, 1)):
        if time.monotonic() > deadline:
            return 1
        time.sleep(0.05)
    ready = {"main": os.getpid(), "agent": agent.pid, "ranks": [p.pid for p in ranks]}
    tmp = args.workdir / "ready.json.tmp"
    tmp.write_text(json.dumps(ready))
    os.replace(tmp, args.workdir / "ready.json")
    time.sleep(args.lifetime)
    for proc in [*ranks, agent]:
        proc.send_signal(signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())

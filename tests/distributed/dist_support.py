"""Helpers for the distributed tests: bounded waits and a handle on a rank group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lockstep_sglang.rank_state import RankStateJSON, read_rank_states

HARNESS = Path(__file__).with_name("dist_harness.py")


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


@dataclass
class RankGroup:
    """The processes of one harness group and its working directory."""

    workdir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    def events(self, rank: int) -> list[dict[str, Any]]:
        path = self.workdir / f"rank-{rank}.events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def event(self, rank: int, kind: str) -> dict[str, Any] | None:
        return next((e for e in self.events(rank) if e["kind"] == kind), None)

    def wait_event(self, rank: int, kind: str, timeout: float) -> dict[str, Any]:
        found: dict[str, Any] = wait_until(
            lambda: self.event(rank, kind), timeout, f"rank {rank} event {kind!r}"
        )
        return found

    def states(self) -> dict[int, RankStateJSON]:
        return {s["rank"]: s for s in read_rank_states(self.state_dir)}

    def stderr(self, rank: int) -> str:
        return (self.workdir / f"rank-{rank}.err").read_text(errors="replace")

    def wait_exit(self, timeout: float) -> list[int]:
        def all_done() -> bool:
            return all(p.poll() is not None for p in self.procs)

        wait_until(all_done, timeout, "every rank to exit")
        return [int(p.returncode) for p in self.procs]

    def alive(self) -> list[bool]:
        return [p.poll() is None for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()

"""Drill traffic: deterministic `/generate` requests to every serving group, like a router.

A router sends requests only to Ready pods; so does this generator: every round it lists
the rank-0 pods of the deployment and targets those whose `Ready` condition is True
(which includes the readiness gate `lockstep.dev/group-healthy` the operator flips to
drain a group). Each group gets at most one request in flight; outcomes are recorded per
group with their times, so a drill can count failures inside and outside windows
(before the drain, while drained, after re-admission).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from lockstep import constants as c

Targets = Callable[[], dict[str, str]]  # group key ("decode/0") -> base URL of rank 0


@dataclass(frozen=True)
class Outcome:
    """One request: to which group, when, whether it succeeded."""

    group: str
    sent_at: float
    ok: bool
    latency_s: float
    error: str | None = None


@dataclass
class GroupStats:
    """Counts of one group's requests."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    last_error: str | None = None


@dataclass
class Traffic:
    """Sends requests to every Ready group until stopped (a background thread)."""

    targets: Targets
    interval_s: float = 0.25
    timeout_s: float = 5.0
    clock: Callable[[], float] = time.time
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Traffic:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)

    def stats(self, since: float = 0.0, until: float | None = None) -> dict[str, GroupStats]:
        """Per-group counts of requests sent in [since, until)."""
        out: dict[str, GroupStats] = {}
        with self._lock:
            outcomes = list(self.outcomes)
        for o in outcomes:
            if o.sent_at < since or (until is not None and o.sent_at >= until):
                continue
            s = out.setdefault(o.group, GroupStats())
            s.sent += 1
            if o.ok:
                s.ok += 1
            else:
                s.failed += 1
                s.last_error = o.error
        return out

    async def _run(self) -> None:
        inflight: dict[str, asyncio.Task[None]] = {}
        async with httpx.AsyncClient() as client:
            while not self._stop.is_set():
                try:
                    targets = await asyncio.to_thread(self.targets)
                except Exception:  # the API server may be restarting in a drill
                    targets = {}
                for group, url in targets.items():
                    task = inflight.get(group)
                    if task is None or task.done():
                        inflight[group] = asyncio.create_task(self._one(client, group, url))
                await asyncio.sleep(self.interval_s)
            for task in inflight.values():
                task.cancel()
            await asyncio.gather(*inflight.values(), return_exceptions=True)

    async def _one(self, client: httpx.AsyncClient, group: str, url: str) -> None:
        sent = self.clock()
        start = time.monotonic()
        body = {"text": f"drill {group} {sent:.3f}", "sampling_params": {"max_new_tokens": 8}}
        ok, error = False, None
        try:
            resp = await client.post(f"{url}/generate", json=body, timeout=self.timeout_s)
            ok = resp.status_code == 200 and bool(resp.json().get("text"))
            if not ok:
                error = f"HTTP {resp.status_code}: {resp.text[:120]}"
        except (httpx.HTTPError, ValueError) as err:
            error = f"{type(err).__name__}: {err}"
        with self._lock:
            self.outcomes.append(Outcome(group, sent, ok, time.monotonic() - start, error))


def ready_leaders(pods: list[dict[str, Any]]) -> dict[str, str]:
    """`{"decode/0": "http://IP:30000"}` for every Ready rank-0 pod (what a router sees)."""
    out: dict[str, str] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(c.LABEL_RANK) != "0" or meta.get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        ready = any(
            cond.get("type") == "Ready" and cond.get("status") == "True"
            for cond in status.get("conditions") or []
        )
        ip = status.get("podIP")
        if ready and ip:
            key = f"{labels.get(c.LABEL_ROLE)}/{labels.get(c.LABEL_GROUP)}"
            out[key] = f"http://{ip}:{c.PORT_HTTP}"
    return out

"""The deep prober: one asyncio loop probing every TP group the operator owns.

Each group's rank-0 pod serves `GET /lockstep/probe` (the runtime runs a no-op
collective across every rank of the group and answers with per-group latency). When a
probe fails, the prober reads every pod agent of the group (`GET /ranks`, through
`lockstep.clients.agent_client`) so the verdict can tell a desync from a hang from a slow step. Results go into a `ProbeBook`, which the
reconcile loop (kopf handlers, in other threads) reads; the loop itself decides nothing.

httpx is the HTTP client (async, timeouts per request, connection pooling); concurrency
is bounded by a semaphore, and each group's next probe is jittered by +-10% of its
period so a thousand groups do not probe in lock step. Clock, sleep and randomness are
injected for tests.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from lockstep.clients.agent_client import RanksAnswer, read_ranks_async

GroupKey = tuple[str, str, str, int]  # namespace, deployment, role, group

HISTORY = 32  # samples kept per group


@dataclass(frozen=True)
class ProbeTarget:
    """One group to probe, as the reconcile loop last saw it."""

    key: GroupKey
    epoch: int
    probe_url: str  # http://<rank-0 pod IP>:30000/lockstep/probe
    agents: tuple[tuple[str, str], ...]  # (pod name, http://<pod IP>:8999) of every pod
    period: float
    timeout: float
    not_before: float = 0.0  # startup grace: no probe before this time
    token: str = field(default="", repr=False)  # the pod agents' bearer token


@dataclass(frozen=True)
class ProbeSample:
    """One probe of one group (and, on failure, what the pod agents said).

    `time` is the prober's monotonic clock at the start of the probe, `wall` the same
    instant on the wall clock (read once, with it: never recomputed from an offset, which
    drifts), and `id` is the sample's identity, given by the book when it records the
    sample: a round counts a sample once by it, however often it looks.
    """

    key: GroupKey
    epoch: int
    time: float
    ok: bool
    latency_s: float | None = None
    error: str | None = None
    detail: dict[str, Any] | None = None
    agents: tuple[RanksAnswer, ...] = ()
    wall: float | None = None
    id: str = ""


class ProbeBook:
    """Thread-safe store of targets and recent samples, shared by prober and handlers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[GroupKey, ProbeTarget] = {}
        self._samples: dict[GroupKey, deque[ProbeSample]] = {}
        # Sample ids: this book's own prefix (a new operator process never reuses an id
        # a persisted record holds), then a counter.
        self._prefix = f"{os.getpid():x}.{time.time_ns():x}"
        self._counter = itertools.count(1)

    def set_targets(self, namespace: str, name: str, targets: Iterable[ProbeTarget]) -> None:
        """Replace the targets of one deployment (groups gone are forgotten)."""
        fresh = {t.key: t for t in targets}
        with self._lock:
            for key in [k for k in self._targets if k[:2] == (namespace, name)]:
                if key not in fresh:
                    del self._targets[key]
                    self._samples.pop(key, None)
            for key, target in fresh.items():
                old = self._targets.get(key)
                if old is not None and old.epoch != target.epoch:
                    self._samples.pop(key, None)  # a new epoch starts a new history
                self._targets[key] = target

    def forget(self, namespace: str, name: str) -> None:
        """Drop every target and sample of a deployment."""
        self.set_targets(namespace, name, ())

    def targets(self) -> list[ProbeTarget]:
        """A snapshot of the targets."""
        with self._lock:
            return list(self._targets.values())

    def record(self, sample: ProbeSample) -> ProbeSample | None:
        """Add a sample, giving it its id (None: ignored, the target is gone or moved to a
        new epoch)."""
        with self._lock:
            target = self._targets.get(sample.key)
            if target is None or target.epoch != sample.epoch:
                return None
            sample = replace(sample, id=f"{self._prefix}.{next(self._counter)}")
            history = self._samples.setdefault(sample.key, deque(maxlen=HISTORY))
            if history and history[-1].agents:
                # Only the newest sample keeps the agents' answers (the verdict compares it
                # with the previous one, which the control round remembers itself): the
                # rank states of 16 ranks x 32 samples x 1000 groups would be hundreds of MiB.
                history[-1] = replace(history[-1], agents=())
            history.append(sample)
            return sample

    def samples(self, key: GroupKey) -> list[ProbeSample]:
        """Recent samples of a group, oldest first."""
        with self._lock:
            return list(self._samples.get(key, ()))


@dataclass
class Prober:
    """Probes every target of a `ProbeBook` at its period, with bounded concurrency."""

    book: ProbeBook
    client: httpx.AsyncClient
    concurrency: int = 64
    tick: float = 0.2
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)
    on_sample: Callable[[ProbeSample], None] | None = None
    _due: dict[GroupKey, float] = field(default_factory=dict)
    _inflight: set[GroupKey] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until `stop` is set."""
        sem = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                for target in self.due_targets():
                    self._inflight.add(target.key)
                    task = asyncio.create_task(self._probe_guarded(sem, target))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await self.sleep(self.tick)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def due_targets(self) -> list[ProbeTarget]:
        """Targets whose next probe is due now (and not already in flight)."""
        now = self.clock()
        due = []
        targets = self.book.targets()
        live = {t.key for t in targets}
        for key in [k for k in self._due if k not in live]:
            del self._due[key]
        for target in targets:
            if target.key in self._inflight or now < target.not_before:
                continue
            if now >= self._due.get(target.key, 0.0):
                # +-10% jitter so groups spread over the period.
                self._due[target.key] = now + target.period * self.rng.uniform(0.9, 1.1)
                due.append(target)
        return due

    async def _probe_guarded(self, sem: asyncio.Semaphore, target: ProbeTarget) -> None:
        try:
            async with sem:
                sample = await self.probe(target)
            recorded = self.book.record(sample)
            if recorded is not None and self.on_sample is not None:
                self.on_sample(recorded)
        finally:
            self._inflight.discard(target.key)

    async def probe(self, target: ProbeTarget) -> ProbeSample:
        """One deep probe; on failure, also the rank states of every pod agent."""
        start, wall = self.clock(), self.wall_clock()
        ok, error, detail = False, None, None
        try:
            resp = await self.client.get(target.probe_url, timeout=target.timeout)
            detail = _json_or_none(resp)
            ok = resp.status_code == 200 and (detail or {}).get("ok", True) is not False
            if not ok:
                error = f"HTTP {resp.status_code}: {_brief(detail, resp)}"
        except httpx.TimeoutException:
            error = f"timed out after {target.timeout:g}s"
        except httpx.HTTPError as err:
            error = f"{type(err).__name__}: {err}"
        latency = self.clock() - start
        if ok:
            return ProbeSample(
                target.key, target.epoch, start, True, latency, None, detail, wall=wall
            )
        agents = await self.read_agents(target)
        return ProbeSample(
            target.key, target.epoch, start, False, latency, error, detail, agents, wall=wall
        )

    async def read_agents(self, target: ProbeTarget) -> tuple[RanksAnswer, ...]:
        """Every pod agent's `GET /ranks`, concurrently, each bounded by the timeout."""
        return tuple(
            await asyncio.gather(
                *(
                    read_ranks_async(self.client, p, u, target.timeout, target.token)
                    for p, u in target.agents
                )
            )
        )


def _json_or_none(resp: httpx.Response) -> dict[str, Any] | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _brief(detail: dict[str, Any] | None, resp: httpx.Response) -> str:
    if detail and "error" in detail:
        return str(detail["error"])[:200]
    return resp.text[:200]

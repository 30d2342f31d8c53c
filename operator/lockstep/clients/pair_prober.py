"""The pair prober: the KV hand-off between prefill and decode groups, tried the way the
router pairs a request.

Each period of a deployment (`spec.health.pairProbe`; after a period with a failed try,
the next one at once) it tries the pairs
`lockstep.core.pairs.plan_pairs` names (max(N, M) of them, peers rotating): one request of
its own, one token, its own `bootstrap_room`, sent at once to the prefill group's leader
and the decode group's leader (`POST /generate` on both, the prefill's address and
bootstrap port as `bootstrap_host`/`bootstrap_port`, as sglang-router 0.3.2 sends them),
both bounded by the deadline, and beside them the prefill's bootstrap server is asked
`GET /health` (SGLang's own heartbeat route, one second). The try passed when both halves
answered 200 within the deadline and the bootstrap server answered. A bootstrap server
that does not answer fails the try even when the hand-off passed: a real SGLang decode
caches a prefill's route after its first room (so its hand-offs go on), but its own
heartbeat drops a prefill whose bootstrap `/health` failed twice, 5 s apart, and a decode
that restarts or joins cannot reach it at all; the prefill is the side at fault. When
the try failed, both halves of the room are ended at once through the leaders'
`POST /lockstep/abort` (the runtime hands them to SGLang's abort, which frees what they
held): a probe never leaves KV behind. Results go into a `PairBook`, which the control round reads; the loop
decides nothing (`lockstep.core.verdicts.pairs` judges).

Same client as the deep prober (httpx, async, bounded concurrency); clock, sleep and
randomness injected for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from lockstep.core.pairs import (
    PROBE_RID_PREFIX,
    PairEnd,
    PairResult,
    full_from_loads,
    plan_pairs,
    side_state,
)

DeploymentKey = tuple[str, str]  # namespace, deployment
HISTORY = 64  # results kept per deployment (at least two periods of its pairs)
PROMPT = "lockstep pair probe"
ABORT_REASON = "lockstep pair probe: deadline passed"


@dataclass(frozen=True)
class PairTargets:
    """One deployment's groups in service, as the control round last saw them."""

    key: DeploymentKey
    prefills: tuple[PairEnd, ...]
    decodes: tuple[PairEnd, ...]
    period: float
    timeout: float
    token: str = field(default="", repr=False)  # the leaders' bearer token (abort)


class PairBook:
    """Thread-safe store of the targets and recent results, shared by the pair prober and
    the control rounds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[DeploymentKey, PairTargets] = {}
        self._results: dict[DeploymentKey, deque[PairResult]] = {}

    def set_targets(self, targets: PairTargets | None, key: DeploymentKey) -> None:
        """Replace one deployment's targets (None: nothing to probe; results kept)."""
        with self._lock:
            if targets is None:
                self._targets.pop(key, None)
            else:
                self._targets[key] = targets

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deployment's targets and results."""
        with self._lock:
            self._targets.pop((namespace, name), None)
            self._results.pop((namespace, name), None)

    def targets(self) -> list[PairTargets]:
        with self._lock:
            return list(self._targets.values())

    def record(self, key: DeploymentKey, result: PairResult) -> None:
        with self._lock:
            self._results.setdefault(key, deque(maxlen=HISTORY)).append(result)

    def results(self, namespace: str, name: str) -> list[PairResult]:
        """A deployment's recent results, oldest first."""
        with self._lock:
            return list(self._results.get((namespace, name), ()))


@dataclass
class PairProber:
    """Tries every deployment's pairs at its period, with bounded concurrency."""

    book: PairBook
    client: httpx.AsyncClient
    concurrency: int = 16
    tick: float = 0.2
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)
    on_result: Callable[[DeploymentKey, PairResult], None] | None = None
    _due: dict[DeploymentKey, float] = field(default_factory=dict)
    _turn: dict[DeploymentKey, int] = field(default_factory=dict)
    _inflight: set[DeploymentKey] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until `stop` is set."""
        sem = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                for targets in self.due():
                    self._inflight.add(targets.key)
                    task = asyncio.create_task(self._period(sem, targets))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await self.sleep(self.tick)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def due(self) -> list[PairTargets]:
        """Deployments whose next period is due (and whose last one has ended)."""
        now = self.clock()
        out = []
        targets = self.book.targets()
        live = {t.key for t in targets}
        for key in [k for k in self._due if k not in live]:
            del self._due[key]
        for t in targets:
            if t.key in self._inflight or now < self._due.get(t.key, 0.0):
                continue
            self._due[t.key] = now + t.period * self.rng.uniform(0.9, 1.1)
            out.append(t)
        return out

    async def _period(self, sem: asyncio.Semaphore, targets: PairTargets) -> None:
        failed = False
        try:
            turn = self._turn.get(targets.key, 0)
            self._turn[targets.key] = turn + 1
            prefills = {e.group: e for e in targets.prefills}
            decodes = {e.group: e for e in targets.decodes}

            async def one(p: int, d: int) -> None:
                nonlocal failed
                async with sem:
                    result = await self.try_pair(targets, prefills[p], decodes[d], started)
                failed = failed or not result.ok
                self.book.record(targets.key, result)
                if self.on_result is not None:
                    self.on_result(targets.key, result)

            started = self.wall_clock()
            pairs = plan_pairs(list(prefills), list(decodes), turn)
            await asyncio.gather(*(one(p, d) for p, d in pairs))
        finally:
            self._inflight.discard(targets.key)
            if failed:
                # A failed hand-off is tried again at once with the next peers (the turn
                # moved on): the judge needs a second failure, or a pass, to place it.
                self._due[targets.key] = self.clock()

    async def try_pair(
        self, targets: PairTargets, p: PairEnd, d: PairEnd, started: float | None = None
    ) -> PairResult:
        """One try of the pair (see the module docstring), of the period that `started`."""
        room = self.rng.getrandbits(62)
        body: dict[str, Any] = {
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True},
            "bootstrap_host": p.ip,
            "bootstrap_port": p.bootstrap_port,
            "bootstrap_room": room,
            "rid": f"{PROBE_RID_PREFIX}{room}",
        }
        start, timeout = self.clock(), targets.timeout
        prefill_error, decode_error, bootstrap = await asyncio.gather(
            self._half(f"http://{p.ip}:{p.port}/generate", body, timeout),
            self._half(f"http://{d.ip}:{d.port}/generate", body, timeout),
            self._bootstrap(p),
        )
        latency = self.clock() - start
        if bootstrap is not None:
            prefill_error = f"{bootstrap}; {prefill_error}" if prefill_error else bootstrap
        ok = prefill_error is None and decode_error is None
        full = states = None
        if not ok:
            # A half that could not take the request in time (a full decode, a prefill
            # with every slot taken) is capacity, not a broken path: read before the
            # room is ended, while what held it back still does.
            loads = await asyncio.gather(self._loads(d), self._loads(p))
            full = full_from_loads("decode", loads[0]) or full_from_loads("prefill", loads[1])
            states = (side_state("prefill", loads[1]), side_state("decode", loads[0]))
            # Neither half may go on holding what it reserved for this room.
            await asyncio.gather(
                *(self._abort(e, room, targets.token) for e in (p, d)),
            )
        return PairResult(
            p.group,
            d.group,
            p.epoch,
            d.epoch,
            ok,
            self.wall_clock(),
            latency if ok else None,
            prefill_error,
            decode_error,
            room,
            started,
            full,
            *(states or (None, None)),
        )

    async def _loads(self, end: PairEnd) -> dict[str, Any] | None:
        """The leader's SGLang `GET /v1/loads` body (None: no answer within a second)."""
        try:
            resp = await self.client.get(f"http://{end.ip}:{end.port}/v1/loads", timeout=1.0)
            body = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    async def _half(self, url: str, body: dict[str, Any], timeout: float) -> str | None:
        try:
            resp = await self.client.post(url, json=body, timeout=timeout)
        except httpx.TimeoutException:
            return f"no answer within {timeout:g}s"
        except httpx.HTTPError as err:
            return f"{type(err).__name__}: {err}"[:200]
        if resp.status_code != 200:
            return f"HTTP {resp.status_code}: {resp.text[:160]}"
        return None

    async def _bootstrap(self, p: PairEnd) -> str | None:
        """Why the prefill's bootstrap server does not answer (None: it does)."""
        url = f"http://{p.ip}:{p.bootstrap_port}/health"
        try:
            resp = await self.client.get(url, timeout=1.0)
        except httpx.HTTPError as err:
            return (
                f"bootstrap server {p.ip}:{p.bootstrap_port} not answering ({type(err).__name__})"
            )
        if resp.status_code != 200:
            return f"bootstrap server {p.ip}:{p.bootstrap_port} answered HTTP {resp.status_code}"
        return None

    async def _abort(self, end: PairEnd, room: int, token: str) -> None:
        # A leader that does not answer holds nothing we can end.
        with contextlib.suppress(httpx.HTTPError):
            await self.client.post(
                f"http://{end.ip}:{end.port}/lockstep/abort",
                json={"rooms": [room], "reason": ABORT_REASON},
                headers={"Authorization": f"Bearer {token}"},
                timeout=2.0,
            )

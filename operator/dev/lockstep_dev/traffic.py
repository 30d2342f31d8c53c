"""Drill traffic: deterministic `/generate` requests, to every serving group or through the
router.

Without a router, this generator plays one: every round it lists the rank-0 pods of the
deployment and targets those whose `Ready` condition is True (which includes the
readiness gate `lockstep.dev/group-healthy` the operator flips to drain a group). With
the real sglang-router in front (`router_endpoint`), every request goes to the router and
the router picks the prefill and decode pods; which pods it picked is in the stand-ins'
request logs (`request_log_arrivals`). Each target gets at most `concurrency` requests
in flight; outcomes are recorded per target with their times, so a drill can count
failures inside and outside windows (before the drain, while drained, after
re-admission).

A figure is only as real as the client that measured it: by default a request waits as
long as a real client would (`CLIENT_TIMEOUT_S`, two minutes), so one that would hang for
minutes is seen hanging, and each outcome keeps when it ended, so a drill can say how
long a request caught by an incident waited past the verdict. `Stream` is one streaming
request read to its end, judged as a client would read it: completed, ended with the
engine's abort event (visible), or cut (a truncated body: the failure a client may miss).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from lockstep.api import constants as c

Targets = Callable[[], dict[str, str]]  # group key ("decode/0") or "router" -> base URL
ROUTER = "router"
_SEQUENCE = itertools.count(1)
MAX_NEW_TOKENS = 8
# How long a drill's client waits for an answer: as a real client does, minutes.
CLIENT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Outcome:
    """One request: to which group, when, whether it succeeded."""

    group: str
    sent_at: float
    ok: bool
    latency_s: float
    error: str | None = None
    status: int | None = None  # None: no HTTP answer (a transport error, the timeout)

    @property
    def ended_at(self) -> float:
        return self.sent_at + self.latency_s


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
    timeout_s: float = CLIENT_TIMEOUT_S
    concurrency: int = 1
    clock: Callable[[], float] = time.time
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _paused: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _inflight: int = 0

    def start(self) -> Traffic:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)

    def quiesce(self, timeout_s: float) -> bool:
        """Send nothing new and wait (up to `timeout_s`) until every request in flight has
        ended; True when none is left. `resume` sends again."""
        self._paused.set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._inflight == 0:
                    return True
            time.sleep(0.1)
        return False

    def resume(self) -> None:
        self._paused.clear()

    def outcomes_between(self, since: float, until: float | None = None) -> list[Outcome]:
        """Every request sent in [since, until) that has ended."""
        with self._lock:
            return [
                o
                for o in self.outcomes
                if o.sent_at >= since and (until is None or o.sent_at < until)
            ]

    def failures(self) -> list[Outcome]:
        """Every failed request so far, in the order they ended."""
        with self._lock:
            return [o for o in self.outcomes if not o.ok]

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
        inflight: dict[tuple[str, int], asyncio.Task[None]] = {}
        async with httpx.AsyncClient(trust_env=False) as client:
            while not self._stop.is_set():
                try:
                    targets = await asyncio.to_thread(self.targets)
                except Exception:  # the API server may be restarting in a drill
                    targets = {}
                if self._paused.is_set():
                    targets = {}
                for group, url in targets.items():
                    for slot in range(self.concurrency):
                        task = inflight.get((group, slot))
                        if task is None or task.done():
                            one = self._one(client, group, url)
                            inflight[(group, slot)] = asyncio.create_task(one)
                await asyncio.sleep(self.interval_s)
            for task in inflight.values():
                task.cancel()
            await asyncio.gather(*inflight.values(), return_exceptions=True)

    async def _one(self, client: httpx.AsyncClient, group: str, url: str) -> None:
        sent = self.clock()
        start = time.monotonic()
        text = f"drill {group} #{next(_SEQUENCE)} {sent:.3f}"
        # ignore_eos: the real tiny model may end at its first token; a request then
        # still generates all its tokens, as on the stand-in.
        params = {"max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
        body = {"text": text, "sampling_params": params}
        ok, error, status = False, None, None
        with self._lock:
            self._inflight += 1
        try:
            resp = await client.post(f"{url}/generate", json=body, timeout=self.timeout_s)
            status = resp.status_code
            answer = resp.json() if resp.status_code == 200 else {}
            ok = isinstance(answer.get("text"), str) and (
                answer.get("meta_info", {}).get("completion_tokens", MAX_NEW_TOKENS)
                == MAX_NEW_TOKENS
            )
            if not ok:
                error = f"HTTP {resp.status_code}: {resp.text[:120]}"
        except (httpx.HTTPError, ValueError) as err:
            error = f"{type(err).__name__}: {err}"
        finally:
            with self._lock:
                self._inflight -= 1
        with self._lock:
            self.outcomes.append(Outcome(group, sent, ok, time.monotonic() - start, error, status))


@dataclass
class Stream:
    """One streaming `/generate` request, read to its end on its own thread.

    `how` once ended: "completed" (the engine's last event has a normal finish reason,
    then `[DONE]`), "aborted" (the last event is the engine's abort, with its status: a
    client sees it), "error" (an HTTP error status before any event), "cut" (the body
    ended without `[DONE]`, or the connection broke: what a careless client takes for a
    short answer).
    """

    url: str
    text: str
    max_new_tokens: int = 4000
    timeout_s: float = CLIENT_TIMEOUT_S
    how: str | None = None
    status: int | None = None
    finish: dict[str, Any] | None = None
    tokens: int = 0
    ended_at: float | None = None
    # The engine's id of the request (its events' `meta_info.id`): what the serving
    # group's leader lists it under while it holds it.
    rid: str | None = None
    started: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    _thread: threading.Thread | None = None

    def start(self) -> Stream:
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float) -> bool:
        """Wait for the end; True when it ended."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.how is not None

    def _read(self) -> None:
        body = {
            "text": self.text,
            "stream": True,
            "sampling_params": {"max_new_tokens": self.max_new_tokens, "ignore_eos": True},
        }
        events: list[str] = []
        try:
            with httpx.stream(
                "POST", f"{self.url}/generate", json=body, timeout=self.timeout_s, trust_env=False
            ) as resp:
                self.status = resp.status_code
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: ") :])
                        if self.rid is None:
                            self.rid = event_rid(events[-1])
                        self.started.set()
        except httpx.HTTPError as err:
            self.error = f"{type(err).__name__}: {err}"[:200]
        self.ended_at = time.time()
        self.how = judge_stream(self.status, events, broke=self.error is not None)
        last = _last_payload(events)
        meta = last.get("meta_info") if isinstance(last, dict) else None
        if isinstance(meta, dict):
            self.finish = meta.get("finish_reason")
            self.tokens = int(meta.get("completion_tokens") or 0)
        self.started.set()


def event_rid(data: str) -> str | None:
    try:
        meta = json.loads(data).get("meta_info")
    except (ValueError, AttributeError):
        return None
    rid = meta.get("id") if isinstance(meta, dict) else None
    return rid if isinstance(rid, str) else None


def _last_payload(events: list[str]) -> Any:
    for data in reversed(events):
        if data != "[DONE]":
            try:
                return json.loads(data)
            except ValueError:
                return None
    return None


def judge_stream(status: int | None, events: list[str], *, broke: bool) -> str:
    """How a streamed response ended, as a client reading it sees it (see `Stream`)."""
    if status is not None and status != 200:
        return "error"
    if broke or not events or events[-1] != "[DONE]":
        return "cut"
    last = _last_payload(events)
    if isinstance(last, dict) and "error" in last:
        return "aborted"
    meta = last.get("meta_info") if isinstance(last, dict) else None
    finish = meta.get("finish_reason") if isinstance(meta, dict) else None
    if isinstance(finish, dict) and finish.get("type") == "abort":
        return "aborted"
    return "completed"


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


def router_endpoint(pods: list[dict[str, Any]]) -> dict[str, str]:
    """`{"router": "http://IP:8000"}` for the first Ready router pod (what a client's
    Service would reach), or `{}` while there is none."""
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(c.LABEL_COMPONENT) != "router":
            continue
        status = pod.get("status") or {}
        ready = any(
            cond.get("type") == "Ready" and cond.get("status") == "True"
            for cond in status.get("conditions") or []
        )
        if ready and status.get("podIP") and not meta.get("deletionTimestamp"):
            return {ROUTER: f"http://{status['podIP']}:{c.PORT_ROUTER}"}
    return {}


@dataclass(frozen=True)
class Arrival:
    """One request a stand-in pod received (from its request log)."""

    pod: str  # pod name
    uid: str  # pod incarnation
    role: str
    group: int
    at: float
    room: int | None
    prompt: str | None = None  # its first characters, as the stand-in logs them


def pod_dirs(kubelet_root: Path, namespace: str) -> Iterator[tuple[str, str, Path]]:
    """(name, uid, directory) of every incarnation of every pod in `namespace` the process
    kubelet ran (it keeps each one's directory)."""
    for directory in sorted((kubelet_root / "pods").glob(f"{namespace}_*")):
        _, name, uid = directory.name.split("_", 2)
        yield name, uid, directory


def request_log_arrivals(kubelet_root: Path, namespace: str, deployment: str) -> list[Arrival]:
    """Every request any incarnation of the deployment's serving pods received, from the
    stand-ins' `requests.jsonl` (the process kubelet keeps every incarnation's directory)."""
    out: list[Arrival] = []
    prefix = f"{deployment}-"
    for name, uid, directory in pod_dirs(kubelet_root, namespace):
        parts = name[len(prefix) :].rsplit("-", 2) if name.startswith(prefix) else []
        # `<deployment>-<role>-<group>[b]-<rank>` (b: a group's second name slot).
        if len(parts) != 3 or parts[0] not in c.ROLES or not parts[1].rstrip("b").isdigit():
            continue
        log = directory / "requests.jsonl"
        if not log.exists():
            continue
        for line in log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if event.get("event") == "received":
                room = event.get("room")
                group = int(parts[1].rstrip("b"))
                prompt = event.get("prompt")
                out.append(
                    Arrival(
                        name,
                        uid,
                        parts[0],
                        group,
                        float(event["at"]),
                        room,
                        prompt if isinstance(prompt, str) else None,
                    )
                )
    out.sort(key=lambda a: a.at)
    return out


@dataclass
class Wave:
    """One abort wave: `sent` streaming requests, all cancelled by the client at once
    `after_s` after they were sent; how far each had got when it was cancelled."""

    sent: int
    after_s: float
    streaming: int = 0  # had received tokens (the decode was generating)
    waiting: int = 0  # had received nothing yet (prefill, or the KV hand-off)
    finished: int = 0  # ended before the cancel
    errors: list[str] = field(default_factory=list)
    cancelled_at: float = 0.0
    first_token_s: list[float] = field(default_factory=list)  # of those that had one

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "after_s": self.after_s,
            "streaming": self.streaming,
            "waiting": self.waiting,
            "finished": self.finished,
            "errors": self.errors[:5],
            "first_token_s": {
                "fastest": min(self.first_token_s, default=None),
                "slowest": max(self.first_token_s, default=None),
            },
        }


def abort_wave(url: str, n: int, after_s: float, max_new_tokens: int = 4000) -> Wave:
    """`n` streaming `/generate` requests to `url` (the router), cancelled together by
    the client `after_s` seconds later (their connections closed, as a client that gives
    up on a batch does): some mid-stream, some still waiting for their first token."""
    return asyncio.run(_wave(url, n, after_s, max_new_tokens))


async def _wave(url: str, n: int, after_s: float, max_new_tokens: int) -> Wave:
    wave = Wave(n, after_s)
    events = [0] * n
    done = [False] * n
    first: list[float | None] = [None] * n
    tag = f"{time.time():.3f}"
    sent_at = time.monotonic()

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {
            "text": f"drill abort wave {tag} #{i}",
            "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True},
        }
        try:
            async with client.stream(
                "POST", f"{url}/generate", json=body, timeout=CLIENT_TIMEOUT_S
            ) as resp:
                if resp.status_code != 200:
                    wave.errors.append(f"HTTP {resp.status_code}")
                    return
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        events[i] += 1
                        first[i] = first[i] or round(time.monotonic() - sent_at, 3)
                        done[i] = done[i] or line == "data: [DONE]"
        except httpx.HTTPError as err:
            wave.errors.append(f"{type(err).__name__}: {err}"[:160])

    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(trust_env=False, limits=limits) as client:
        tasks = [asyncio.create_task(one(client, i)) for i in range(n)]
        await asyncio.sleep(after_s)
        wave.cancelled_at = time.time()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    wave.finished = sum(done)
    wave.streaming = sum(1 for e, d in zip(events, done, strict=True) if e and not d)
    wave.waiting = sum(1 for e in events if not e)
    wave.first_token_s = [f for f in first if f is not None]
    return wave

"""Requests caught by an incident, through the router: the long streams an incident
cuts, what each serving group holds (SGLang's `GET /v1/loads`), and the checks of what
the users of the served model saw (every request caught ended 200, none waited long past
the verdict, the cut stream ended with a visible error, the groups that stayed hold
nothing of it)."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from lockstep.api import constants as c
from lockstep_dev.drills.deployment import AFFECTED, NAME, NAMESPACE
from lockstep_dev.drills.figures import ts
from lockstep_dev.faults import agent_token, group_pods
from lockstep_dev.traffic import (
    CLIENT_TIMEOUT_S,
    ROUTER,
    Stream,
    pod_dirs,
    request_log_arrivals,
    router_endpoint,
)

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

# How long a request caught by an incident may wait past the verdict before it is served
# again through the router (the bound; 3 s of it is the router's retry backoff).
PAST_VERDICT_BOUND_S = {"standin": 5.0, "sglang": 15.0}
# The long stream each incident of the sequence catches on decode/0 (tokens: long enough
# to be under way when the fault lands, on each engine's speed here, and short enough
# that one landing elsewhere completes). Measured here: a held stream had made 50-102
# tokens on the stand-in, 10-11 on the real engine, when its abort came. One elsewhere
# must end within the stand-in's own request limit (30 s: with 4000 tokens one ended
# 504 "no answer within 30s" after 3291 tokens on this loaded machine) and within the
# client's two minutes on the real engine beside a recreated group importing SGLang
# (with 1500 tokens one on CI ended cut; how, the run did not record).
STREAM_TOKENS = {"standin": 1000, "sglang": 400}


KV_PATH_LINE = re.compile(
    r"KV-path send|sync status|Lost connection|prefill server info|ABORT|timed out|"
    r"bootstrap room|handshake|transfer",
    re.IGNORECASE,
)
KV_PATH_LINES_KEPT = 80
NOT_KV_PATH = ("server_args=", "Decode batch", "Prefill batch", "INFO:     ")
REQUEST_IDS = re.compile(r"[0-9a-f]{32}|\d{6,}")


def kv_path_log_lines(kubelet_dir: Path, kept: int = KV_PATH_LINES_KEPT) -> list[str]:
    """What the real SGLang pods logged of their KV path (the hand-off's warnings, theirs
    and lockstep's), each after its pod's name, the newest `kept` kinds: the evidence a
    failed real-engine drill leaves in its report, read from every pod's log, gone pods
    too. Lines of one pod in one second that differ only in request ids and rooms (an
    abort storm's) are one line, with how many there were."""
    seen: dict[tuple[str, str], list[Any]] = {}  # (pod, line sans ids) -> [stamp, line, n]
    for pod, _, directory in pod_dirs(kubelet_dir, NAMESPACE):
        try:
            text = (directory / "container.log").read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if not line.startswith("[") or any(n in line for n in NOT_KV_PATH):
                continue
            if KV_PATH_LINE.search(line):
                entry = seen.setdefault(
                    (pod, REQUEST_IDS.sub("*", line[:160])), [line[:21], line.strip()[:300], 0]
                )
                entry[2] += 1
    ordered = sorted(((e[0], pod, e[1], e[2]) for (pod, _), e in seen.items()))
    return [f"{pod}: {line}" + (f" (x{n})" if n > 1 else "") for _, pod, line, n in ordered][-kept:]


def kv_path_note(kubelet_dir: Path) -> str:
    """The note a failed real-engine drill ends with: :func:`kv_path_log_lines`."""
    lines = kv_path_log_lines(kubelet_dir)
    if not lines:
        return "no real pod logged anything of its KV path"
    return "the real pods' KV-path log lines (newest last):\n" + "\n".join(lines)


def leader_urls(drill: Drill) -> dict[str, str]:
    """`{"decode/0": "http://IP:30000"}` for every rank-0 pod with an address."""
    out: dict[str, str] = {}
    for pod in drill.cluster.pods(NAMESPACE, f"{drill.selector},{c.LABEL_RANK}=0"):
        labels = pod["metadata"].get("labels") or {}
        ip = (pod.get("status") or {}).get("podIP")
        if ip and not pod["metadata"].get("deletionTimestamp"):
            key = f"{labels.get(c.LABEL_ROLE)}/{labels.get(c.LABEL_GROUP)}"
            out[key] = f"http://{ip}:{c.PORT_HTTP}"
    return out


def loads(drill: Drill) -> dict[str, dict[str, int]]:
    """What each serving group's leader holds now (SGLang's `GET /v1/loads`; with the
    runtime's report of KV held by ended requests where it gives one)."""
    out: dict[str, dict[str, int]] = {}
    for key, url in sorted(leader_urls(drill).items()):
        try:
            load = httpx.get(f"{url}/v1/loads", timeout=10, trust_env=False).json()
            first = load["loads"][0]
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            continue
        out[key] = {
            "requests": int(first.get("num_running_reqs", 0))
            + int(first.get("num_waiting_reqs", 0)),
            "used_tokens": int(first.get("num_used_tokens", 0)),
        }
        ended = ((first.get("lockstep") or {}).get("ended_kv") or {}).get("tokens")
        if drill.engine == "sglang":
            ended = _probed_ended_kv(url)  # the real server's report rides its deep probe
        if isinstance(ended, int):
            out[key]["ended_kv_tokens"] = ended
    return out


def _probed_ended_kv(url: str) -> int | None:
    """The KV of ended requests a real server's deep probe reports (what the operator
    reads: `lockstep_sglang.held_kv`), None without an answer."""
    try:
        body = httpx.get(f"{url}/lockstep/probe", timeout=10, trust_env=False).json()
        tokens = body["kv"]["tokens"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    return tokens if isinstance(tokens, int) else None


def holds_no_more(after: Mapping[str, int] | None, before: Mapping[str, int] | None) -> bool:
    """A group holds nothing of an incident afterwards: no field of its load above what it
    held while idle before. (The operator's own pair-probe tries come and go on every
    group, one at a time: a baseline read during one is higher than a read between two.)"""
    if after is None or before is None:
        return after == before
    return all(after.get(k, 0) <= v for k, v in before.items()) and set(after) <= set(before)


def settled_loads(
    drill: Drill, before: Mapping[str, Mapping[str, int]], timeout: float = 15.0
) -> dict[str, dict[str, int]]:
    """`loads` once no group holds more than `before` (re-read for `timeout` seconds,
    so a pair-probe try in flight at the first read is not taken for a leak)."""
    deadline = time.monotonic() + timeout
    while True:
        now = loads(drill)
        if all(holds_no_more(now.get(k), v) for k, v in before.items()):
            return now
        if time.monotonic() > deadline:
            return now
        time.sleep(1.0)


def held_stream_rids(drill: Drill, key: str) -> frozenset[str] | None:
    """The ids of the streams the group's leader holds (its runtime's `GET
    /lockstep/requests`; None from a runtime without the route, as lockstep's before it
    had one). A look that fails is tried again: a busy leader may answer slowly."""
    url = leader_urls(drill).get(key)
    if url is None:
        return frozenset()
    role, index = key.split("/")
    pods = group_pods(drill.cluster.core(), NAMESPACE, NAME, role, int(index))
    token = agent_token(drill.cluster.core(), pods[0]) if pods else ""
    for attempt in range(3):
        try:
            resp = httpx.get(
                f"{url}/lockstep/requests",
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
                trust_env=False,
            )
            if resp.status_code == 404:
                return None
            resp.raise_for_status()
            held = resp.json()["requests"]
            return frozenset(str(r.get("rid")) for r in held if r.get("stream"))
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
            drill.note(f"{key} did not list its requests ({type(err).__name__}), try {attempt + 1}")
            time.sleep(1.0)
    drill.note(f"{key} did not list its requests in 3 tries: taken as holding no stream")
    return frozenset()


@dataclass
class CaughtStreams:
    """The long streams started before an incident, and the ids of those the affected
    group's leader held when the drill last looked, just before the fault (None: it
    cannot list them)."""

    started: list[Stream] = field(default_factory=list)
    held: frozenset[str] | None = frozenset()
    # On the stand-in, the prompts the affected group's pods received (their request
    # logs, read once the streams ended): a stream there is the group's even where the
    # leader's list missed it (its id in the stream's events not the one listed).
    received: frozenset[str] = frozenset()

    def on_affected(self, s: Stream) -> bool | None:
        if s.text in self.received:
            return True
        if self.held is None:
            return None
        return s.rid is not None and s.rid in self.held


def streams_on(drill: Drill, key: str, tries: int = 8) -> CaughtStreams:
    """Long streams through the router until one is under way on `key` (the router
    picks the decode); every one started is judged: those `key` held must end with the
    engine's abort, those elsewhere must complete."""
    url = router_endpoint(drill.cluster.pods(NAMESPACE, drill.selector)).get(ROUTER)
    out = CaughtStreams()
    if url is None:
        return out
    for i in range(tries):
        s = Stream(url, f"drill stream {i} {time.time():.3f}", STREAM_TOKENS[drill.engine])
        out.started.append(s.start())
        s.started.wait(60)
        out.held = held_stream_rids(drill, key)
        if out.held is None and i >= 1:
            drill.note(f"{key} cannot list its requests: {i + 1} streams started, unsorted")
            return out
        on = sum(1 for x in out.started if out.on_affected(x))
        if on:
            drill.note(f"{on} long stream(s) under way on {key} ({i + 1} started)")
            return out
    drill.note(f"no stream of {tries} landed on {key}")
    return out


def stream_checks(streams: CaughtStreams, key: str = AFFECTED) -> tuple[bool, str]:
    """Every stream ended; each the affected group held ended with the engine's abort
    event (at least one), each elsewhere completed. Unsorted (no list of what the group
    held): exactly one of them aborted, every other completed."""
    started = streams.started
    ended = all(s.how is not None for s in started)
    if streams.held is None:
        cut = [s for s in started if s.how != "completed"]
        ok = ended and len(cut) == 1 and cut[0].how == "aborted"
        return (
            ok,
            f"{key} cannot list its requests: exactly one stream must end with the "
            f"engine's abort event and every other complete: {[s.how for s in started]}",
        )
    where = [(s.how, "held" if streams.on_affected(s) else "elsewhere") for s in started]
    on = [s for s in started if streams.on_affected(s)]
    ok = (
        ended
        and bool(on)
        and all(s.how == ("aborted" if streams.on_affected(s) else "completed") for s in started)
    )
    return (
        ok,
        f"each stream {key} held must end with the engine's abort event and every other "
        f"complete: {where}",
    )


def failover_checks(
    drill: Drill, inc: Mapping[str, Any], streams: CaughtStreams | None, key: str = AFFECTED
) -> list[tuple[bool, str]]:
    """What the users of the served model saw of the incident in group `key`: every
    request caught by it ended 200, none waited long past the verdict, the stream it cut
    ended with a visible error (`streams`; None: no stream was aimed at it), and the
    groups that stayed hold nothing of it afterwards."""
    aimed = streams is not None
    streams = streams or CaughtStreams()
    assert drill.traffic is not None
    r = drill.result
    verdict_at = ts(inc.get("detectedTime")) or time.time()
    injected = r.injected_at or verdict_at
    drained = drill.drained_at or verdict_at
    # Every request in flight ends (the client waits up to CLIENT_TIMEOUT_S).
    settled = drill.traffic.quiesce(CLIENT_TIMEOUT_S + 10)
    for s in streams.started:
        s.join(CLIENT_TIMEOUT_S + 10)
    if drill.engine == "standin" and streams.started:
        streams.received = frozenset(
            a.prompt
            for a in request_log_arrivals(drill.workdir / "kubelet", NAMESPACE, NAME)
            if a.prompt and f"{a.role}/{a.group}" == key
        )
    caught = [o for o in drill.traffic.outcomes_between(0.0, drained) if o.ended_at > injected]
    waits = [o.ended_at - verdict_at for o in caught if o.ended_at > verdict_at]
    longest = round(max(waits, default=0.0), 2)
    caught_ok = sum(1 for o in caught if o.ok)
    # Not 200: an HTTP error the client saw, or no answer at all (a connection cut,
    # or the client's own two-minute limit).
    caught_error = sum(1 for o in caught if not o.ok and o.status is not None)
    caught_cut = sum(1 for o in caught if not o.ok and o.status is None)
    not_ok = [o for o in caught if not o.ok]
    caught_failed = [f"{round(o.sent_at - injected, 2)}s: {o.error}" for o in not_ok][:10]
    now = settled_loads(drill, {k: v for k, v in drill.idle_loads.items() if k != key})
    drill.traffic.resume()
    figures = {
        "caught": len(caught),
        "caught_ok": caught_ok,
        "caught_error": caught_error,
        "caught_cut": caught_cut,
        "caught_failed": caught_failed,
        "longest_wait_past_verdict_s": longest,
        "streams": [
            {
                "how": s.how,
                "held": streams.on_affected(s),
                "tokens": s.tokens,
                "finish": s.finish,
                "error": s.error,
            }
            for s in streams.started
        ],
        "loads_before": drill.idle_loads,
        "loads_after": now,
    }
    r.failover.append(figures)
    bound = PAST_VERDICT_BOUND_S[drill.engine]
    stayed = {k: v for k, v in now.items() if k != key}
    checks = [
        (settled, "requests still in flight two minutes after the incident"),
        (
            all(o.ok for o in caught),
            f"{len(caught) - caught_ok} of {len(caught)} request(s) caught by the "
            f"incident did not end 200: {caught_failed}",
        ),
        (
            longest <= bound,
            f"a request caught by the incident waited {longest}s past the verdict (bound {bound}s)",
        ),
        (
            all(holds_no_more(stayed.get(k), v) for k, v in drill.idle_loads.items() if k != key),
            f"the groups that stayed hold no more than before: {drill.idle_loads} -> {now}",
        ),
    ]
    return [*checks, stream_checks(streams, key)] if aimed else checks

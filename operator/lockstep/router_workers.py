"""Drain and re-admit a group in sglang-router's own worker registry.

What sglang-router 0.3.2 does with Kubernetes service discovery (measured on the local
cluster; evidence in docs/router.md): it adds a pod as a worker once the pod is Running
and Ready, and removes it only on the watch event that shows the pod's
`deletionTimestamp` — and only when the pod's phase and readiness in that event are the
ones it was added with. So

- a pod whose readiness gate turns False stays a worker and keeps receiving requests;
- a drained (not Ready) pod that is then deleted is never removed: a stale worker at a
  dead address, which the router keeps trying (its retries hide most failures, not all);
- a pod that becomes Ready again under the same name, address and phase (an in-place
  restart) is not added again, since the router believes it still tracks it.

The readiness gate alone therefore cannot drain a group. lockstep keeps the gate (it
keeps a drained pod out of router replicas that start later: discovery only adds Ready
pods) and also, for every router replica, removes the group's serving pod from the
replica's registry when it drains the group (`GET /workers`, `DELETE /workers/{id}`,
then waits until the replica no longer lists it) and adds it back when it re-admits the
group (`POST /workers`, which is idempotent per URL).

Those two calls are edge-triggered, and the router races with itself: a discovery
registration still in flight (it contacts the worker for seconds first) can finish after
lockstep removed the worker and put back a pod that has since died (seen once in the
real-SGLang drill; docs/router.md has the timeline). So the operator also sweeps every
replica's registry, level-triggered (`sweep_workers`, at most every few seconds per
deployment): a worker at a URL that is no admitted serving pod's (gone, being deleted,
or drained) and that no user flag names is removed.

Pure functions build the worker identities and decide what to delete; `drain_workers`
and `admit_workers` do the HTTP with a caller's `httpx.Client` and return the problems
they met (an unreachable replica is reported, never raised: the restart must go on).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from lockstep import constants as c
from lockstep import objects

BOOTSTRAP_PORT_ANNOTATION = "sglang.ai/bootstrap-port"
ROUTER_COMPONENT = "router"
WORKERS_PATH = "/workers"
REQUEST_TIMEOUT_S = 2.0
REMOVAL_WAIT_S = 3.0  # the router removes a worker in a background job


@dataclass(frozen=True)
class RouterWorker:
    """A serving pod as sglang-router's worker API names it."""

    url: str
    worker_type: str  # "prefill" | "decode"
    bootstrap_port: int | None = None

    def body(self) -> dict[str, Any]:
        """The `POST /workers` body."""
        out: dict[str, Any] = {"url": self.url, "worker_type": self.worker_type}
        if self.bootstrap_port is not None:
            out["bootstrap_port"] = self.bootstrap_port
        return out


def router_pod_selector(deployment: str) -> dict[str, str]:
    """Selects the router replicas of a deployment (as `builders.build_router` labels them)."""
    return {c.LABEL_DEPLOYMENT: deployment, c.LABEL_COMPONENT: ROUTER_COMPONENT}


def serving_workers(pods: Iterable[Mapping[str, Any]]) -> list[RouterWorker]:
    """The router workers among `pods`: rank-0 pods with an address (only they serve HTTP)."""
    out = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        role = objects.label(pod, c.LABEL_ROLE)
        if objects.label(pod, c.LABEL_RANK) != "0" or not ip or role not in c.ROLES:
            continue
        port = (objects.meta(pod).get("annotations") or {}).get(BOOTSTRAP_PORT_ANNOTATION)
        bootstrap = int(port) if role == "prefill" and port and str(port).isdigit() else None
        out.append(RouterWorker(f"http://{ip}:{c.PORT_HTTP}", str(role), bootstrap))
    return out


def admitted_urls(
    pods: Iterable[Mapping[str, Any]], gates: Mapping[str, bool] | None = None
) -> set[str]:
    """URLs of the serving pods the router may list: not being deleted, readiness gate
    True. `gates`: gate values set since `pods` was read (pod name -> value), which win
    over the pods' own conditions."""
    gates = gates or {}
    live = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        name = str(meta.get("name", ""))
        if name in gates:
            admitted = gates[name]
        else:
            conditions = (pod.get("status") or {}).get("conditions") or []
            admitted = any(
                cond.get("type") == c.READINESS_GATE and cond.get("status") == "True"
                for cond in conditions
            )
        if admitted:
            live.append(pod)
    return {w.url for w in serving_workers(live)}


def user_urls(args: Iterable[str]) -> set[str]:
    """URLs named in the user's router flags (static workers the sweep leaves alone)."""
    return {
        a.split("=", 1)[-1].rstrip("/")
        for a in args
        if a.split("=", 1)[-1].startswith(("http://", "https://"))
    }


def stale_workers(listing: Mapping[str, Any], keep: Iterable[str]) -> list[tuple[str, str]]:
    """(id, url) of the workers in a `GET /workers` answer whose URL is not in `keep`."""
    wanted = {u.rstrip("/") for u in keep}
    return [
        (str(w["id"]), str(w.get("url", "")))
        for w in listing.get("workers") or []
        if str(w.get("url", "")).rstrip("/") not in wanted and w.get("id")
    ]


def router_bases(router_pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """`http://IP:PORT` of every router replica that may be serving (has an address and
    is not being deleted); readiness does not matter, a replica may serve before it."""
    out = []
    for pod in router_pods:
        meta = pod.get("metadata") or {}
        ip = (pod.get("status") or {}).get("podIP")
        if ip and not meta.get("deletionTimestamp"):
            out.append(f"http://{ip}:{c.PORT_ROUTER}")
    return sorted(out)


def worker_ids(listing: Mapping[str, Any], urls: Iterable[str]) -> list[str]:
    """Ids, in a `GET /workers` answer, of the workers at `urls`."""
    wanted = {u.rstrip("/") for u in urls}
    return [
        str(w["id"])
        for w in listing.get("workers") or []
        if str(w.get("url", "")).rstrip("/") in wanted and w.get("id")
    ]


def _listing(http: httpx.Client, base: str) -> dict[str, Any]:
    response = http.get(base + WORKERS_PATH, timeout=REQUEST_TIMEOUT_S)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def _delete_worker(http: httpx.Client, base: str, worker_id: str) -> None:
    """`DELETE /workers/{id}` (202: removal queued; 404: already gone)."""
    response = http.delete(f"{base}{WORKERS_PATH}/{worker_id}", timeout=REQUEST_TIMEOUT_S)
    if response.status_code not in (200, 202, 204, 404):
        response.raise_for_status()


def drain_workers(
    http: httpx.Client,
    bases: Sequence[str],
    workers: Sequence[RouterWorker],
    *,
    wait_s: float = REMOVAL_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Remove `workers` from every router replica and wait (up to `wait_s`) until none
    lists them. Returns the problems met, one line each (empty: drained everywhere)."""
    urls = [w.url for w in workers]
    problems: list[str] = []
    if not urls:
        return problems
    for base in bases:
        try:
            deadline = clock() + wait_s
            ids = worker_ids(_listing(http, base), urls)
            for worker_id in ids:
                _delete_worker(http, base, worker_id)
            while ids:
                ids = worker_ids(_listing(http, base), urls)
                if ids and clock() > deadline:
                    problems.append(f"router {base} still lists {len(ids)} drained worker(s)")
                    break
                if ids:
                    sleep(0.05)
        except (httpx.HTTPError, ValueError) as err:
            problems.append(f"router {base}: {type(err).__name__}: {err}")
    return problems


def sweep_workers(
    http: httpx.Client, bases: Sequence[str], keep: Iterable[str]
) -> tuple[list[tuple[str, str]], list[str]]:
    """Remove from every router replica each worker whose URL is not in `keep`. Returns
    (what was removed, (replica, url) each; the problems met). It does not wait for the
    removals (a background job in the router): the next sweep checks again."""
    keep = set(keep)
    removed: list[tuple[str, str]] = []
    problems: list[str] = []
    for base in bases:
        try:
            for worker_id, url in stale_workers(_listing(http, base), keep):
                _delete_worker(http, base, worker_id)
                removed.append((base, url))
        except (httpx.HTTPError, ValueError) as err:
            problems.append(f"router {base}: {type(err).__name__}: {err}")
    return removed, problems


def admit_workers(
    http: httpx.Client, bases: Sequence[str], workers: Sequence[RouterWorker]
) -> list[str]:
    """Add `workers` to every router replica (idempotent). Returns the problems met."""
    problems: list[str] = []
    for base in bases:
        for worker in workers:
            try:
                response = http.post(
                    base + WORKERS_PATH, json=worker.body(), timeout=REQUEST_TIMEOUT_S
                )
                response.raise_for_status()
            except httpx.HTTPError as err:
                problems.append(f"router {base}, worker {worker.url}: {type(err).__name__}: {err}")
    return problems


def sync_router_workers(
    http: httpx.Client,
    group_pods: Iterable[Mapping[str, Any]],
    router_pods: Iterable[Mapping[str, Any]],
    *,
    admit: bool,
) -> list[str]:
    """The operator's one call: drain (`admit=False`; before the readiness gate turns
    False, so no request lands in between) or re-admit (`admit=True`; after the gate
    turns True) the serving pods among `group_pods` in every replica among
    `router_pods`. Returns the problems met."""
    workers = serving_workers(group_pods)
    bases = router_bases(router_pods)
    if not workers or not bases:
        return []
    if admit:
        return admit_workers(http, bases, workers)
    return drain_workers(http, bases, workers)

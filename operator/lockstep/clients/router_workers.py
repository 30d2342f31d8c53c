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
real-SGLang drill; docs/router.md has the timeline). An admission can be lost the other
way: `POST /workers` only queues a registration job (`{"worker_id": ...}`, 202), which
contacts the worker (`/health`, retried up to `--worker-startup-timeout-secs`; then
`/server_info`, 10 s a try, three tries) and, when that fails, records the job as failed
(`GET /workers/{id}`: `job_status`) and registers nothing (sglang-router 0.3.2's
`local_worker_registration` workflow); the group is admitted and gets no request. So the operator also sweeps every
replica's registry, level-triggered (`sweep_workers`, at most every few seconds per
deployment), both ways: a worker at a URL that is no admitted serving pod's (gone, being
deleted, or drained) and that no user flag names is removed; an admitted serving pod
that a replica does not list, and whose registration there is not pending, is added
again. `RouterBook` is what this needs to remember between rounds: the readiness gates
lockstep set that the pod cache does not show yet (a sweep must not take a just
re-admitted pod for a drained one), and the worker id of each registration it asked for.

Pure functions build the worker identities and decide what to delete; `drain_workers`
and `admit_workers` do the HTTP with a caller's `httpx.Client` and return the problems
they met (an unreachable replica is reported, never raised: the restart must go on).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from lockstep.api import constants as c
from lockstep.api import objects

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


@dataclass
class RouterBook:
    """What the operator remembers of a deployment's router registries between rounds."""

    # Readiness gates lockstep set (pod name -> value), kept until the pods' cache shows
    # them (`pending_gates`): the cache may still show a re-admitted pod's gate False.
    gates: dict[str, bool] = field(default_factory=dict)
    # (replica base URL, worker URL) -> the worker id its `POST /workers` answered.
    jobs: dict[tuple[str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sweep:
    """What a sweep did: removed (replica, url), added again (replica, url, why), and
    the problems met."""

    removed: list[tuple[str, str]] = field(default_factory=list)
    added: list[tuple[str, str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


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


def pending_gates(pods: Iterable[Mapping[str, Any]], gates: Mapping[str, bool]) -> dict[str, bool]:
    """The entries of `gates` that `pods` (the cache) does not show yet: a pod still
    listed, not being deleted, whose readiness-gate condition differs from the value."""
    out: dict[str, bool] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        name = str(meta.get("name", ""))
        if name not in gates or meta.get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        shown = any(
            cond.get("type") == c.READINESS_GATE and cond.get("status") == "True"
            for cond in conditions
        )
        if shown != gates[name]:
            out[name] = gates[name]
    return out


def admitted_workers(
    pods: Iterable[Mapping[str, Any]], gates: Mapping[str, bool] | None = None
) -> list[RouterWorker]:
    """The serving workers of the admitted pods among `pods` (see `admitted_urls`)."""
    urls = admitted_urls(pods, gates)
    return [w for w in serving_workers(pods) if w.url in urls]


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


def _job_status(http: httpx.Client, base: str, worker_id: str) -> dict[str, Any] | None:
    """The router's job status of a worker id (`GET /workers/{id}`), None when it has
    none (the worker is registered, or the router forgot the job: 404)."""
    response = http.get(f"{base}{WORKERS_PATH}/{worker_id}", timeout=REQUEST_TIMEOUT_S)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    status = response.json().get("job_status")
    return status if isinstance(status, dict) else None


def sweep_workers(
    http: httpx.Client,
    bases: Sequence[str],
    keep: Iterable[str],
    admitted: Sequence[RouterWorker] = (),
    jobs: dict[tuple[str, str], str] | None = None,
) -> Sweep:
    """Remove from every router replica each worker whose URL is not in `keep`, and add
    each of `admitted` that a replica does not list and whose registration there (by
    the ids in `jobs`, which this fills) is not pending. It waits for neither (the
    router's background jobs): the next sweep checks again."""
    keep = set(keep) | {w.url for w in admitted}
    jobs = {} if jobs is None else jobs
    done = Sweep()
    for base in bases:
        try:
            listing = _listing(http, base)
            for worker_id, url in stale_workers(listing, keep):
                _delete_worker(http, base, worker_id)
                done.removed.append((base, url))
            listed = {str(w.get("url", "")).rstrip("/") for w in listing.get("workers") or []}
            for worker in admitted:
                if worker.url in listed:
                    jobs.pop((base, worker.url), None)
                    continue
                known = jobs.get((base, worker.url))
                status = _job_status(http, base, known) if known else None
                if status and status.get("status") in ("pending", "processing"):
                    continue
                why = "it was not listed"
                if status and status.get("status") == "failed":
                    why = f"its registration failed: {str(status.get('message') or '')[:200]}"
                done.problems.extend(admit_workers(http, [base], [worker], jobs))
                done.added.append((base, worker.url, why))
        except (httpx.HTTPError, ValueError) as err:
            done.problems.append(f"router {base}: {type(err).__name__}: {err}")
    return done


def admit_workers(
    http: httpx.Client,
    bases: Sequence[str],
    workers: Sequence[RouterWorker],
    jobs: dict[tuple[str, str], str] | None = None,
) -> list[str]:
    """Add `workers` to every router replica (a registration job each; one for a URL
    the replica lists already fails harmlessly). Each worker id answered goes into
    `jobs`. Returns the problems met."""
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
                continue
            try:
                worker_id = response.json().get("worker_id")
            except (ValueError, AttributeError):
                worker_id = None
            if jobs is not None and isinstance(worker_id, str) and worker_id:
                jobs[(base, worker.url)] = worker_id
    return problems


def sync_router_workers(
    http: httpx.Client,
    group_pods: Iterable[Mapping[str, Any]],
    router_pods: Iterable[Mapping[str, Any]],
    *,
    admit: bool,
    jobs: dict[tuple[str, str], str] | None = None,
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
        return admit_workers(http, bases, workers, jobs)
    return drain_workers(http, bases, workers)

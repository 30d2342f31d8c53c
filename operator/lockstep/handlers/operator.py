"""Every kopf handler of the operator, and nothing else: each delegates at once.

- startup: settings (posting, scanning), the shared `Runtime` (with several replicas:
  its clients fenced by the leader election, `lockstep.handlers.ha`), the probers' tasks (deep, pair);
- indexes: the pods, Services, PDRoleScales and PodDisruptionBudgets of every
  PDDeployment (labelled with it), fed by kopf's watches: the control rounds read these
  caches, never list;
- the nodes (cordons and taints, `lockstep.core.maintenance.NodeState`): a node going into
  maintenance wakes every deployment with a pod on it, which moves its groups off;
- one daemon per PDDeployment runs its control rounds (`lockstep.control.run_round`):
  when something happens (a failed probe, a passing probe of a group that is not settled,
  a change of one of its pods, a spec change, a recovery step that asks to go on) and,
  as a safety net, every `--resync-seconds` (10);
- delete: forget the deployment (its children go by garbage collection).

Run with `lockstep operator` (or `kopf run -m lockstep.handlers.operator`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import kopf
from kubernetes import client as k8s

from lockstep.api import constants as c
from lockstep.clients.kube import FencedApiClient, Kube, api_client
from lockstep.clients.metrics import Metrics
from lockstep.clients.pair_prober import DeploymentKey, PairProber
from lockstep.clients.prober import ProbeBook, Prober, ProbeSample
from lockstep.control import Runtime, run_round, settled
from lockstep.core.maintenance import NodeState
from lockstep.core.pairs import PairResult
from lockstep.core.records import ANNOTATION_RESTART
from lockstep.core.rolescale import PLURAL as ROLE_SCALES
from lockstep.core.verdicts import reading_from_probe
from lockstep.handlers.ha import fence_hook
from lockstep.handlers.settings import operator_config

log = logging.getLogger(__name__)

# The prober's connection pool: bounded (httpcore scans the pool on every request, so a
# pool as large as the number of pods costs more CPU than the probes; see
# benchmarks/prober_capacity.py).
PROBE_POOL = httpx.Limits(max_connections=100, max_keepalive_connections=20)

# A round asked to run again "at once" still waits this long (no busy loop).
MIN_ROUND_INTERVAL = 0.05

DEPLOYMENT_LABELS: Mapping[str, Any] = {c.LABEL_DEPLOYMENT: kopf.PRESENT}


class Wakers:
    """One event per PDDeployment: set to run its next round now (from the loop)."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}

    def event(self, namespace: str | None, name: str) -> asyncio.Event:
        return self._events.setdefault((str(namespace), name), asyncio.Event())

    def wake(self, namespace: str | None, name: str) -> None:
        self.event(namespace, name).set()


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf, build the runtime and start the probers (deep and pair)."""
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60
    settings.persistence.finalizer = f"{c.GROUP}/finalizer"
    settings.execution.max_workers = 8
    config = operator_config(memo)
    if config.exact_namespaces:
        # Watching exact namespaces: no scan of namespaces (or CRDs) cluster-wide, which
        # a namespaced Role does not allow; the CRD is installed with the chart.
        settings.scanning.disabled = True
    elector = memo.get("elector")  # lockstep.handlers.ha: this replica leads, fenced
    metrics = memo.get("metrics")
    if not isinstance(metrics, Metrics):
        metrics = Metrics()
        if config.metrics_port:
            metrics.serve(config.metrics_port, config.bind_address)
        metrics.leader.set(1)  # one replica: it always acts
    book = ProbeBook()
    if elector is not None:
        # Every write of this replica passes the election first (lockstep.clients.leader).
        api: k8s.ApiClient = FencedApiClient(
            configuration=api_client().configuration, fence=elector.check
        )
        http = httpx.Client(event_hooks={"request": [fence_hook(elector)]})
    else:
        api, http = api_client(), httpx.Client()
    rt = Runtime(
        kube=Kube(api),
        book=book,
        metrics=metrics,
        http=http,
        runtime_image=config.runtime_image,
    )
    if elector is not None:
        since = elector.since.strftime("%Y-%m-%dT%H:%M:%SZ") if elector.since else None
        rt.leader = (elector.cfg.identity, since)
        rt.may_act = elector.holds
    wakers = Wakers()
    memo["runtime"] = rt
    memo["wakers"] = wakers
    client = httpx.AsyncClient(limits=PROBE_POOL)

    def on_sample(sample: ProbeSample) -> None:
        role = sample.key[2]
        metrics.probes.labels(role, "ok" if sample.ok else "failed").inc()
        if sample.ok and sample.latency_s is not None:
            metrics.probe_latency.labels(role).observe(sample.latency_s)
        # A failed probe is acted on at once; a passing one only matters to a group
        # that is starting, recovering or failing, or whose leader holds KV for ended
        # requests (the judge's clock of it starts with the round that sees it).
        held = reading_from_probe(0.0, sample.detail)
        if not sample.ok or not settled(rt, sample.key) or (held is not None and held.tokens):
            wakers.wake(sample.key[0], sample.key[1])

    def on_pair(key: DeploymentKey, result: PairResult) -> None:
        metrics.pair_probes.labels(key[0], key[1], "ok" if result.ok else "failed").inc()
        if result.ok and result.latency_s is not None:
            metrics.pair_probe_latency.labels(key[0], key[1]).observe(result.latency_s)
        else:
            wakers.wake(key[0], key[1])  # a failed hand-off is judged at once

    prober = Prober(book, client, on_sample=on_sample)
    pair_prober = PairProber(rt.pairs, client, on_result=on_pair)
    stop = asyncio.Event()
    memo["prober_stop"] = stop
    memo["prober_task"] = asyncio.create_task(prober.run(stop))
    memo["pair_prober_task"] = asyncio.create_task(pair_prober.run(stop))
    memo["prober_client"] = client


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the probers."""
    stop = memo.get("prober_stop")
    if stop is not None:
        stop.set()
        await asyncio.wait_for(memo["prober_task"], timeout=10)
        await asyncio.wait_for(memo["pair_prober_task"], timeout=10)
        await memo["prober_client"].aclose()


# ----------------------------------------------------------------------- the caches


def snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """What an index keeps of a watched object: a plain, private copy (kopf's body is a
    view of the watch event's object) without `metadata.managedFields`, which nothing
    here reads and which is about half of a pod's size."""
    obj = copy.deepcopy(dict(body))
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


@kopf.index("pods", labels=DEPLOYMENT_LABELS)
def deployment_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], dict[str, Any]]:
    """Every pod labelled with a PDDeployment (its SGLang pods and router replicas)."""
    return {(namespace, labels[c.LABEL_DEPLOYMENT]): snapshot(body)}


@kopf.index("services", labels=DEPLOYMENT_LABELS)
def deployment_services(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], dict[str, Any]]:
    """Every Service labelled with a PDDeployment (its group Services and router's)."""
    return {(namespace, labels[c.LABEL_DEPLOYMENT]): snapshot(body)}


@kopf.index("apps", "v1", "deployments", labels=DEPLOYMENT_LABELS)
def deployment_deployments(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], dict[str, Any]]:
    """Every apps/v1 Deployment labelled with a PDDeployment (its router)."""
    return {(namespace, labels[c.LABEL_DEPLOYMENT]): snapshot(body)}


@kopf.index(c.GROUP, c.VERSION, ROLE_SCALES, labels=DEPLOYMENT_LABELS)
def deployment_scales(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], dict[str, Any]]:
    """Every PDRoleScale (the per-role scale targets) of a PDDeployment."""
    return {(namespace, labels[c.LABEL_DEPLOYMENT]): snapshot(body)}


@kopf.index("policy", "v1", "poddisruptionbudgets", labels=DEPLOYMENT_LABELS)
def deployment_pdbs(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], dict[str, Any]]:
    """Every PodDisruptionBudget of a PDDeployment (one per group and name slot)."""
    return {(namespace, labels[c.LABEL_DEPLOYMENT]): snapshot(body)}


@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=DEPLOYMENT_LABELS)
async def deployment_pdb_changed(
    type: str | None, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """A group's disruption budget was deleted: the next round puts it back. Its status
    changes with every pod that becomes ready and needs no round; an edited spec is put
    back by the next periodic round."""
    if type == "DELETED":
        memo["wakers"].wake(namespace, labels[c.LABEL_DEPLOYMENT])


@kopf.on.event(c.GROUP, c.VERSION, ROLE_SCALES, labels=DEPLOYMENT_LABELS)
async def deployment_scaled(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """A scale target changed (an autoscaler or `kubectl scale`): reconcile."""
    memo["wakers"].wake(namespace, labels[c.LABEL_DEPLOYMENT])


@kopf.on.event("apps", "v1", "deployments", labels=DEPLOYMENT_LABELS)
async def deployment_router_changed(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """The router's Deployment changed (someone edited it, or it went): reconcile."""
    memo["wakers"].wake(namespace, labels[c.LABEL_DEPLOYMENT])


@kopf.on.event("pods", labels=DEPLOYMENT_LABELS)
async def deployment_pod_changed(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """A pod of a deployment changed (or went): its next round now."""
    memo["wakers"].wake(namespace, labels[c.LABEL_DEPLOYMENT])


@kopf.index("nodes")
def node_states(name: str, body: kopf.Body, **_: Any) -> dict[str, NodeState]:
    """Every node's cordon and taints (all a round needs to see maintenance)."""
    return {name: NodeState.from_k8s(body)}


@kopf.on.event("nodes")
async def node_changed(
    name: str, body: kopf.Body, type: str | None, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A node was added or went, or its cordon, taints, labels or GPUs changed: wake every
    deployment (one with pods on it may have to move; one with a group waiting unplaced
    may fit now). Status heartbeats (most node events) change none of it and cost a
    comparison; the initial listing (`type` None) only records."""
    seen: dict[str, NodeState] = memo.setdefault("node_seen", {})
    state = NodeState.from_k8s(body)
    before = seen.pop(name, None) if type == "DELETED" else seen.get(name)
    if type != "DELETED":
        seen[name] = state
    if type is None or (before == state and type != "DELETED"):
        return
    pods: kopf.Index[tuple[str | None, str], dict[str, Any]] = kwargs["deployment_pods"]
    for key in list(pods):
        memo["wakers"].wake(*key)


def current_nodes(index: kopf.Index[str, NodeState]) -> dict[str, NodeState]:
    """The node index as one mapping (one state per node)."""
    return {name: state for name in list(index) for state in index.get(name, [])}


# ----------------------------------------------------------------------- the rounds


def _collect(into: list[tuple[str, str, str]]) -> Callable[[str, str, str], None]:
    """An event sink for a round's thread; the daemon posts them (kopf's loop)."""

    def sink(type_: str, reason: str, message: str) -> None:
        into.append((type_, reason, message))

    return sink


# A daemon that fails is started again soon (its next round re-plans from the
# persisted records), not after kopf's default minute: recovery is time-critical.
@kopf.daemon(c.GROUP, c.VERSION, c.PLURAL, backoff=2.0, cancellation_timeout=10.0)
async def pddeployment_rounds(
    body: kopf.Body, name: str, namespace: str | None, memo: kopf.Memo, **kwargs: Any
) -> None:
    """The control loop of one PDDeployment: a round, then wait for a reason to run one."""
    deployment_pods: kopf.Index[tuple[str | None, str], dict[str, Any]] = kwargs["deployment_pods"]
    deployment_services: kopf.Index[tuple[str | None, str], dict[str, Any]] = kwargs[
        "deployment_services"
    ]
    deployment_deployments: kopf.Index[tuple[str | None, str], dict[str, Any]] = kwargs[
        "deployment_deployments"
    ]
    nodes_index: kopf.Index[str, NodeState] = kwargs["node_states"]
    scales_index: kopf.Index[tuple[str | None, str], dict[str, Any]] = kwargs["deployment_scales"]
    pdbs_index: kopf.Index[tuple[str | None, str], dict[str, Any]] = kwargs["deployment_pdbs"]
    rt: Runtime = memo["runtime"]
    resync = operator_config(memo).resync_seconds
    wake = memo["wakers"].event(namespace, name)
    while True:
        wake.clear()
        events: list[tuple[str, str, str]] = []
        pods = list(deployment_pods.get((namespace, name), []))
        services = list(deployment_services.get((namespace, name), []))
        deployments = list(deployment_deployments.get((namespace, name), []))
        scales = list(scales_index.get((namespace, name), []))
        pdbs = list(pdbs_index.get((namespace, name), []))
        result = await asyncio.to_thread(
            run_round, rt, copy.deepcopy(dict(body)), pods, services, _collect(events),
            deployments, current_nodes(nodes_index), scales, pdbs,
        )  # fmt: skip
        if rt.may_act is None or rt.may_act():
            for type_, reason, message in events:
                kopf.event(body, type=type_, reason=reason, message=message)
        delay = resync
        if result is not None and result.requeue_after is not None:
            delay = min(delay, max(result.requeue_after, MIN_ROUND_INTERVAL))
        if delay <= MIN_ROUND_INTERVAL:
            await asyncio.sleep(MIN_ROUND_INTERVAL)
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=delay)
        # Events arriving in a burst (a group's pods changing together) make one round.
        await asyncio.sleep(MIN_ROUND_INTERVAL)


@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL, field="spec")
async def pddeployment_spec_changed(
    name: str, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """A spec change: the deployment's next round now."""
    memo["wakers"].wake(namespace, name)


@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL, field=["metadata", "annotations", ANNOTATION_RESTART])
async def pddeployment_restart_requested(
    name: str, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """A manual restart request (`kubectl annotate pdd NAME lockstep.dev/restart=...`)."""
    memo["wakers"].wake(namespace, name)


@kopf.on.delete(c.GROUP, c.VERSION, c.PLURAL, optional=True)
def pddeployment_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Children are owned (garbage collection); only the operator's memory remains."""
    meta = body.get("metadata", {})
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    memo["runtime"].forget(namespace, name)

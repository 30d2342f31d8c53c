"""Every kopf handler of the operator, and nothing else: each delegates at once.

- startup: settings (peering, posting), the shared `Runtime`, the prober task;
- create/update (spec)/resume of a PDDeployment, and a short timer: one control round
  (`lockstep.control.run_round`);
- delete: forget the deployment's probe targets (children go by garbage collection).

Run with `lockstep operator` (or `kopf run -m lockstep.handlers`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import httpx
import kopf
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from lockstep import constants as c
from lockstep.control import Runtime, run_round
from lockstep.kube import Kube
from lockstep.metrics import Metrics
from lockstep.prober import ProbeBook, Prober

log = logging.getLogger(__name__)

# The prober's connection pool: bounded (httpcore scans the pool on every request, so a
# pool as large as the number of pods costs more CPU than the probes; see
# benchmarks/prober_capacity.py).
PROBE_POOL = httpx.Limits(max_connections=100, max_keepalive_connections=20)

# How often a round runs even without a change (the prober's results arrive this way).
TICK_SECONDS = float(os.environ.get("LOCKSTEP_TICK_SECONDS", "1.0"))


def api_client() -> k8s.ApiClient:
    """A Kubernetes client: in-cluster config, else the kubeconfig."""
    try:
        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
    return k8s.ApiClient()


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf, build the runtime and start the prober."""
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60
    settings.persistence.finalizer = f"{c.GROUP}/finalizer"
    settings.execution.max_workers = 8
    if os.environ.get("LOCKSTEP_EXACT_NAMESPACES") == "1":
        # Watching exact namespaces: no scan of namespaces (or CRDs) cluster-wide, which
        # a namespaced Role does not allow; the CRD is installed with the chart.
        settings.scanning.disabled = True
    metrics = Metrics()
    metrics_port = int(os.environ.get("LOCKSTEP_METRICS_PORT", "0"))
    if metrics_port:
        metrics.serve(metrics_port)
    book = ProbeBook()
    rt = Runtime(kube=Kube(api_client()), book=book, metrics=metrics, http=httpx.Client())
    memo["runtime"] = rt
    client = httpx.AsyncClient(limits=PROBE_POOL)

    def on_sample(sample: Any) -> None:
        role = sample.key[2]
        metrics.probes.labels(role, "ok" if sample.ok else "failed").inc()
        if sample.ok and sample.latency_s is not None:
            metrics.probe_latency.labels(role).observe(sample.latency_s)

    prober = Prober(book, client, on_sample=on_sample)
    stop = asyncio.Event()
    memo["prober_stop"] = stop
    memo["prober_task"] = asyncio.create_task(prober.run(stop))
    memo["prober_client"] = client


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the prober."""
    stop = memo.get("prober_stop")
    if stop is not None:
        stop.set()
        await asyncio.wait_for(memo["prober_task"], timeout=10)
        await memo["prober_client"].aclose()


def _events(body: kopf.Body) -> Any:
    def emit(type_: str, reason: str, message: str) -> None:
        kopf.event(body, type=type_, reason=reason, message=message)

    return emit


# A failed round is retried soon (the next tick re-plans from the persisted records),
# not after kopf's default minute: recovery is time-critical.
@kopf.on.resume(c.GROUP, c.VERSION, c.PLURAL, backoff=2.0)
@kopf.on.create(c.GROUP, c.VERSION, c.PLURAL, backoff=2.0)
@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL, field="spec", backoff=2.0)
def pddeployment_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A spec was created or changed (or the operator started): one round now."""
    rt: Runtime = memo["runtime"]
    run_round(rt, body, _events(body))


@kopf.timer(
    c.GROUP, c.VERSION, c.PLURAL, interval=TICK_SECONDS, initial_delay=TICK_SECONDS, backoff=2.0
)
def pddeployment_tick(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The control loop's heartbeat: probe results and pod changes are acted on here."""
    rt: Runtime = memo["runtime"]
    run_round(rt, body, _events(body))


@kopf.on.delete(c.GROUP, c.VERSION, c.PLURAL, optional=True)
def pddeployment_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Children are owned (garbage collection); only the prober's targets remain."""
    rt: Runtime = memo["runtime"]
    meta = body.get("metadata", {})
    rt.book.forget(str(meta.get("namespace")), str(meta.get("name")))

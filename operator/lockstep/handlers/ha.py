"""The operator process with several replicas: stand by, lead, and end when it lost.

`lockstep operator --leader-elect` (the chart's `ha.enabled`) runs this instead of a plain
`kopf.run`. The election (:mod:`lockstep.clients.leader`) runs on its own thread from the start;
the process has two phases, each one `kopf.run`:

1. **standby**: kopf with :data:`lockstep.handlers.admission.STANDBY` only: the admission webhook
   (every replica serves it, with the one certificate they share), kopf's liveness
   endpoint, and this process's metrics (`lockstep_leader` 0). It watches nothing and
   writes nothing: no handler, no finalizer, no Event, no round. It ends when the
   election makes this replica the leader (or on SIGTERM: the process then exits 0).
2. **leader**: the whole operator (every handler: watches, indexes, daemons, the prober,
   the webhook), its Kubernetes and HTTP clients fenced by the election
   (`lockstep.clients.kube.FencedApiClient`, and an httpx request hook): a write is sent only
   while this replica can prove it holds the lease. An Event on the Lease says who took
   over from whom; each PDDeployment's `status.operator` names the leader and since when.

When the election says the lease is lost (another replica took it over, or this one could
not renew it within the renew deadline: a pause, a partition), the process ends at once
with status 1, without kopf's graceful shutdown (which would write: finalizers, Events):
the kubelet restarts it, as a standby. controller-runtime managers and
kube-controller-manager do the same. On SIGTERM the leader gives the lease up before it
exits, so its successor need not wait out the lease duration.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

import httpx
import kopf

from lockstep.clients.leader import ElectionConfig, LeaderElector, LeaseIO, NotLeader
from lockstep.clients.metrics import Metrics

log = logging.getLogger(__name__)

# The memo keys the leader phase reads (lockstep.handlers.operator).
ELECTOR_KEY = "elector"
METRICS_KEY = "metrics"
EXIT_LOST = 1


def user_agent(identity: str) -> str:
    """The User-Agent of a replica's Kubernetes client: which replica sent a request, in
    the API server's audit log."""
    return f"lockstep-operator ({identity})"


def fence_hook(elector: LeaderElector) -> Any:
    """An httpx request hook: every request that may change something (not GET/HEAD) is
    refused unless this replica holds the lease (restarts, request endings, router
    changes are actions too)."""

    def hook(request: httpx.Request) -> None:
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            elector.check()

    return hook


def standby_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """The standby's kopf: nothing to post, nothing to scan (its registry has no resource
    handler; namespaced RBAC would not let it list namespaces anyway)."""
    settings.posting.enabled = False
    settings.scanning.disabled = True


def _lost(why: str) -> None:
    """The lease is lost: end the process now (no cleanup that could write)."""
    log.error("leader election lost (%s): exiting so a standby leads", why)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_LOST)


def run(
    cfg: ElectionConfig,
    memo: dict[str, Any],
    api: Any,
    metrics: Metrics,
    run_kwargs: dict[str, Any],
    *,
    webhook: bool,
) -> int:
    """Stand by, then lead, in this process (see the module docstring)."""
    api.user_agent = user_agent(cfg.identity)
    io = LeaseIO(api, cfg)
    became = threading.Event()

    def started(identity: str, previous: str | None) -> None:
        metrics.leader.set(1)
        io.event(
            "LeaderElected",
            f"{identity} became the leader" + (f" (took over from {previous})" if previous else ""),
        )
        became.set()

    elector = LeaderElector(io, cfg, on_started=started, on_lost=_lost).start()
    metrics.leader.set(0)
    log.info("leader election: %s stands by for %s/%s", cfg.identity, cfg.namespace, cfg.name)
    # 1. standby: the webhook only (or nothing but liveness and metrics).
    if webhook:
        from lockstep.handlers import admission
    standby = admission.STANDBY if webhook else kopf.OperatorRegistry()
    kopf.on.startup(registry=standby)(standby_startup)
    # A registry of one's own has no login handler; kopf's default registry's is this one.
    kopf.on.login(registry=standby)(kopf.login_via_client)
    kopf.run(registry=standby, memo=kopf.Memo({**memo}), stop_flag=became, **run_kwargs)
    if not elector.leading.is_set():
        elector.stop()
        return 0  # stopped (SIGTERM) while standing by
    # 2. leader: the whole operator, fenced by the election.
    memo = {**memo, ELECTOR_KEY: elector, METRICS_KEY: metrics}
    try:
        kopf.run(memo=kopf.Memo(memo), **run_kwargs)
    finally:
        elector.release()  # an orderly stop: the successor need not wait
    return 0


__all__ = ["ELECTOR_KEY", "METRICS_KEY", "NotLeader", "fence_hook", "run"]

"""Prometheus metrics of the operator (prometheus-client), on their own registry.

A registry per `Metrics` object (not the global default) keeps tests and several
operators in one process from colliding.

Every per-role series a dashboard or an alert takes `increase()` or `rate()` of exists
from the start, at zero (`_initialise`): a counter whose series is born at its first
event shows no increase for that event, so a cluster's first restart, verdict or time to
detect after an operator start would be missing from the dashboard (found by the real
Prometheus of the concurrent drill: two restarts shown as one, no time to detect at all).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from lockstep.api.constants import ROLES
from lockstep.core.verdicts import Verdict

_SECONDS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


class Metrics:
    """Every metric lockstep exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.probe_latency = Histogram(
            "lockstep_probe_latency_seconds",
            "Deep probe round trip (a no-op collective on every rank of a group).",
            ["role"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.probes = Counter(
            "lockstep_probes_total",
            "Deep probes by result.",
            ["role", "result"],
            registry=self.registry,
        )
        self.pair_probes = Counter(
            "lockstep_pair_probes_total",
            "Pair probes (one request's KV hand-off from a prefill group to a decode "
            "group) by result.",
            ["namespace", "deployment", "result"],
            registry=self.registry,
        )
        self.pair_probe_latency = Histogram(
            "lockstep_pair_probe_latency_seconds",
            "A passing pair probe's round trip (both halves answered).",
            ["namespace", "deployment"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.ended_kv_tokens = Gauge(
            "lockstep_ended_kv_tokens",
            "KV tokens a group's leader holds for requests that ended (its newest deep "
            "probe's report; 0 on a healthy server).",
            ["namespace", "deployment", "role", "group"],
            registry=self.registry,
        )
        self.ended_kv_freed = Counter(
            "lockstep_ended_kv_freed_tokens_total",
            "KV tokens of ended requests the operator had the runtime free.",
            ["namespace", "deployment", "role"],
            registry=self.registry,
        )
        self.verdicts = Counter(
            "lockstep_group_verdicts_total",
            "Group verdicts reached (Desynced, Hung, RankDown, ...).",
            ["role", "verdict"],
            registry=self.registry,
        )
        self.restarts = Counter(
            "lockstep_group_restarts_total",
            "Whole-group restarts.",
            ["role"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "lockstep_leader",
            "1 on the operator replica that leads (acts), 0 on a standby; 1 with one replica.",
            registry=self.registry,
        )
        self.requests_ended = Counter(
            "lockstep_requests_ended_total",
            "Requests ended with a retryable 503 because their group (or, for the other "
            "half of a PD pair, their peer) left service: by the role of that group.",
            ["role"],
            registry=self.registry,
        )
        self.incidents_open = Gauge(
            "lockstep_incidents_open",
            "Incidents not yet closed.",
            ["namespace", "deployment"],
            registry=self.registry,
        )
        self.time_to_detect = Histogram(
            "lockstep_time_to_detect_seconds",
            "First failed observation to verdict.",
            ["role"],
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.time_to_recover = Histogram(
            "lockstep_time_to_recover_seconds",
            "Verdict to re-admission of the restarted group.",
            ["role"],
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.desired_groups = Gauge(
            "lockstep_role_desired_groups",
            "Groups a role should run (the PDDeployment's or its PDRoleScale's count).",
            ["namespace", "deployment", "role"],
            registry=self.registry,
        )
        self.ready_groups = Gauge(
            "lockstep_role_ready_groups",
            "Groups of a role that are Healthy and admitted to the routers.",
            ["namespace", "deployment", "role"],
            registry=self.registry,
        )
        self.spare_groups = Gauge(
            "lockstep_role_spare_groups",
            "Warm spare groups of a role that are Healthy (deep-probed, out of every router).",
            ["namespace", "deployment", "role"],
            registry=self.registry,
        )
        self.quarantined = Gauge(
            "lockstep_groups_quarantined",
            "Groups quarantined after exhausting their restart budget.",
            ["namespace", "deployment"],
            registry=self.registry,
        )

        self._initialise()

    def _initialise(self) -> None:
        """Each role's series of the per-role counters and histograms, at zero."""
        for role in ROLES:
            self.probe_latency.labels(role)
            for result in ("ok", "failed"):
                self.probes.labels(role, result)
            for verdict in Verdict:
                if verdict.is_failure:
                    self.verdicts.labels(role, verdict.value)
            self.restarts.labels(role)
            self.requests_ended.labels(role)
            self.time_to_detect.labels(role)
            self.time_to_recover.labels(role)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on a background thread."""
        start_http_server(port, addr=addr, registry=self.registry)

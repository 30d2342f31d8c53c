"""A drill watched by a real Prometheus, as the chart's monitoring would watch it.

With `Drill(prometheus=[alert, ...])` a Prometheus (`lockstep_dev.localcluster.prometheus`)
scrapes the operator as the chart's ServiceMonitor selects it and evaluates the chart's
alerts (each `for` a 120th: see that module) from before the deployment is applied to
after the scenario ends. Then, once the named alerts are quiet again (bounded), it judges
what an on-call engineer would have seen:

- each named alert fired after the fault went in (none of them while every group served
  before it) and is resolved now;
- every query of the chart's Grafana dashboard returns data over the drill's window (a
  panel that draws something), and the restarts panel counts the restarts the drill saw.

The figures (`DrillResult.prometheus`): per alert its firing spans (first and last
firing sample, seconds after the injection), the alerts that fired besides, per dashboard query how many
samples it returned and its last value, the targets scraped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lockstep_dev.cluster import CHART_VALUES, checkout, wait_for
from lockstep_dev.drills.figures import restarts
from lockstep_dev.localcluster.prometheus import (
    LocalPrometheus,
    dashboard_exprs,
    drill_rules,
    firing_spans,
    grafana_expr,
    has_data,
    render_monitoring,
    seconds,
)

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

QUIET_TIMEOUT_S = 120.0
PANEL_STEP_S = 2.0


def start(drill: Drill) -> LocalPrometheus:
    """Prometheus for the drill's cluster (started, scraping the operator)."""
    assert drill.cluster.cp is not None
    monitor, rule = render_monitoring({**CHART_VALUES, **drill.cluster.chart_values})
    prom = LocalPrometheus(
        drill.workdir / "prometheus", drill.cluster.core(), monitor, drill_rules(rule)
    ).start()
    try:
        wait_for(prom.targets_up, 60, "prometheus scraping the operator (the ServiceMonitor's)")
    except TimeoutError:
        prom.stop()
        raise
    drill.note(f"prometheus scraping {', '.join(prom.targets_up())} with the chart's alerts")
    return prom


def judge(
    drill: Drill, prom: LocalPrometheus, expected: Sequence[str], since: float, serving: float
) -> None:
    """What Prometheus saw into `drill.result.prometheus`: the alerts that fired once
    every group served (`serving`; while the deployment starts its groups are not yet
    serving, and with every `for` a 120th a start of seconds reads as one of minutes),
    the dashboard over [since, now]. A failed check fails the drill (its reason says
    which)."""
    injected = drill.result.injected_at or since
    failed: list[str] = []

    def quiet() -> bool:
        return not any(a["labels"].get("alertname") in expected for a in prom.active_alerts())

    try:
        wait_for(quiet, QUIET_TIMEOUT_S, f"the alerts {', '.join(expected)} to resolve")
    except TimeoutError as err:
        failed.append(str(err))
    now = time.time()
    spans = firing_spans(
        prom.query_range('ALERTS{alertstate="firing"}', serving, now, 1.0), step=1.0
    )
    alerts = {
        name: [[round(first - injected, 1), round(last - injected, 1)] for first, last in runs]
        for name, runs in spans.items()
    }
    for name in expected:
        runs = spans.get(name, [])
        if not any(first >= injected for first, _ in runs):
            failed.append(f"alert {name} did not fire after the fault went in ({runs})")
        elif any(first < injected for first, _ in runs):
            # Still firing from the start when every group served: the gauges the rules
            # read lag the status by a round and a scrape, and every `for` is short here.
            drill.note(f"alert {name} was still resolving from the start as traffic began")
    dashboard = json.loads((checkout() / "charts/lockstep/dashboards/lockstep.json").read_text())
    rate_interval = 4 * seconds(prom.monitor["spec"]["endpoints"][0]["interval"])
    panels: dict[str, dict[str, Any]] = {}
    for expr in dashboard_exprs(dashboard):
        query = grafana_expr(expr, now - since, rate_interval)
        series = prom.query_range(query, since, now, PANEL_STEP_S)
        last = [float(s["values"][-1][1]) for s in series if s["values"]]
        panels[expr] = {"samples": has_data(series), "last": last}
        if not has_data(series):
            failed.append(f"dashboard query returned no data: {query}")
    restarts_panel = panels.get("sum(increase(lockstep_group_restarts_total[$__range]))")
    restarted = sum(restarts(drill.status()).values())
    drill.result.prometheus = {
        "alerts": alerts,
        "expected": list(expected),
        "others": sorted(set(alerts) - set(expected)),
        "dashboard": panels,
        "targets": prom.targets_up(),
    }
    if restarts_panel is not None:
        shown = max(restarts_panel["last"], default=0.0)
        drill.result.prometheus["restarts_shown"] = round(shown, 2)
        if round(shown) < restarted:
            failed.append(f"the restarts panel shows {shown:.2f}, the drill saw {restarted}")
    if failed:
        drill.result.passed = False
        drill.result.reason = "; ".join(filter(None, [drill.result.reason, *failed]))


class Watch:
    """The harness's hold on the drill's Prometheus: nothing at all when `alerts` is
    None; otherwise started once the cluster is up, told when every group serves,
    judged after the scenario, stopped with the cluster."""

    def __init__(self, drill: Drill, alerts: Sequence[str] | None) -> None:
        self.drill, self.alerts = drill, None if alerts is None else tuple(alerts)
        self.prom: LocalPrometheus | None = None
        self.since = self.serving = 0.0

    def start(self) -> None:
        if self.alerts is not None:
            self.prom = start(self.drill)
            self.since = time.time()

    def mark_serving(self) -> None:
        self.serving = time.time()

    def judge(self) -> None:
        if self.prom is not None and self.alerts is not None:
            judge(self.drill, self.prom, self.alerts, self.since, self.serving)

    def stop(self) -> None:
        if self.prom is not None:
            self.prom.stop()

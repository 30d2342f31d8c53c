"""The Prometheus set-up the Prometheus drill uses (lockstep_dev.localcluster.prometheus),
from what the chart renders, read by the real promtool: the scrape job a ServiceMonitor
stands for and the drill's rule file (the chart's alerts, each `for` a 120th) pass
`promtool check config`. The dashboard's queries, with Grafana's variables filled in as a
panel would, are run by a real Prometheus in the drill (tests/e2e/test_drills.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from test_alerts import run_promtool
from test_chart import REPO

from lockstep_dev.cluster import CHART_VALUES
from lockstep_dev.localcluster.prometheus import (
    TIME_SCALE,
    dashboard_exprs,
    drill_rules,
    endpoint_targets,
    firing_spans,
    grafana_expr,
    has_data,
    namespaces,
    render_monitoring,
    scrape_configs,
    seconds,
)

DASHBOARD = REPO / "charts/lockstep/dashboards/lockstep.json"


def test_the_scrape_job_and_the_drill_rules_pass_promtools_config_check(tmp_path: Path) -> None:
    monitor, rule = render_monitoring(CHART_VALUES)
    (job,) = scrape_configs(monitor, "http://127.0.0.1:1/targets")
    # What the chart's ServiceMonitor says: its Services by label in the release's
    # namespace, the `metrics` port, the metrics' own labels kept, its interval.
    assert job["honor_labels"] is True and job["metrics_path"] == "/metrics"
    assert job["scrape_interval"] == "1s" and namespaces(monitor) == ["lockstep-system"]
    keeps = {
        r["source_labels"][0]: r["regex"] for r in job["relabel_configs"] if r["action"] == "keep"
    }
    assert keeps["__meta_kubernetes_endpoint_port_name"] == "metrics"
    assert keeps["__meta_kubernetes_service_label_app_kubernetes_io_instance"] == "lockstep"
    rules = drill_rules(rule)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {"rule_files": ["rules.yaml"], "scrape_configs": [job]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    assert "SUCCESS" in run_promtool(tmp_path, "check", "config", "prometheus.yml")


def test_discovery_finds_each_selected_pod_and_port_with_kubernetes_sds_labels() -> None:
    services = [
        {
            "metadata": {
                "namespace": "ns",
                "name": "op-metrics",
                "labels": {"app.kubernetes.io/instance": "op"},
            },
            "spec": {
                "selector": {"app": "op"},
                "ports": [
                    {"name": "metrics", "port": 9090, "targetPort": "metrics"},
                    {"name": "hooks", "port": 443, "targetPort": 9443},
                ],
            },
        },
        {"metadata": {"namespace": "ns", "name": "no-selector"}, "spec": {"ports": [{"port": 1}]}},
    ]

    def pod(name: str, ip: str, ready: bool, **meta: object) -> dict[str, object]:
        return {
            "metadata": {"name": name, "labels": {"app": "op"}, **meta},
            "spec": {"containers": [{"ports": [{"name": "metrics", "containerPort": 9090}]}]},
            "status": {
                "podIP": ip,
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": str(ready)}],
            },
        }

    pods = [
        pod("op-1", "127.0.64.1", True),
        pod("op-2", "127.0.64.2", False),
        pod("gone", "127.0.64.3", True, deletionTimestamp="2026-12-07T00:00:00Z"),
        {**pod("other", "127.0.64.4", True), "metadata": {"name": "other", "labels": {"app": "x"}}},
    ]
    found = {g["targets"][0]: g["labels"] for g in endpoint_targets(services, pods)}
    assert sorted(found) == [
        "127.0.64.1:9090",
        "127.0.64.1:9443",
        "127.0.64.2:9090",
        "127.0.64.2:9443",
    ]
    ready = found["127.0.64.1:9090"]
    assert ready["__meta_kubernetes_service_label_app_kubernetes_io_instance"] == "op"
    assert ready["__meta_kubernetes_pod_name"] == "op-1"
    assert ready["__meta_kubernetes_endpoint_ready"] == "true"
    assert ready["__meta_kubernetes_endpoint_port_name"] == "metrics"
    assert found["127.0.64.2:9443"]["__meta_kubernetes_endpoint_ready"] == "false"


def test_the_drill_rules_keep_every_expression_and_shorten_every_for() -> None:
    _, rule = render_monitoring(CHART_VALUES)
    shipped = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    drill = {r["alert"]: r for g in drill_rules(rule)["groups"] for r in g["rules"]}
    assert drill.keys() == shipped.keys()
    for name, r in shipped.items():
        assert drill[name]["expr"] == r["expr"] and drill[name]["labels"] == r["labels"]
        if "for" in r:
            assert seconds(drill[name]["for"]) == max(1, round(seconds(r["for"]) / TIME_SCALE))
        else:
            assert "for" not in drill[name]
    assert seconds(drill["LockstepIncidentOpenTooLong"]["for"]) == 15  # 30m in the chart


def test_durations_parse_as_prometheus_writes_them() -> None:
    assert [seconds(d) for d in ("30s", "2m", "1h30m", "500ms", "1d")] == [
        30,
        120,
        5400,
        0.5,
        86400,
    ]
    for bad in ("", "5", "2 m", "1x"):
        try:
            seconds(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} parsed")


def test_every_dashboard_query_is_found_and_filled_in_as_grafana_would() -> None:
    exprs = dashboard_exprs(json.loads(DASHBOARD.read_text()))
    assert len(exprs) >= 8 and "sum(lockstep_incidents_open)" in exprs
    filled = [grafana_expr(e, 600.7, 4) for e in exprs]
    assert not any("$" in e for e in filled)
    assert "sum(increase(lockstep_group_restarts_total[600s]))" in filled


def test_firing_spans_and_data_read_a_range_query_answer() -> None:
    answer = [
        {"metric": {"alertname": "A", "role": "decode"}, "values": [[10, "1"], [11, "1"]]},
        {"metric": {"alertname": "A", "role": "prefill"}, "values": [[12, "1"], [20, "1"]]},
        {"metric": {"alertname": "B"}, "values": [[12, "1"]]},
    ]
    assert firing_spans(answer, step=1.0) == {
        "A": [[10.0, 12.0], [20.0, 20.0]],
        "B": [[12.0, 12.0]],
    }
    assert has_data(answer) == 5
    assert has_data([{"metric": {}, "values": [[1, "NaN"], [2, "NaN"]]}]) == 0
    assert has_data([]) == 0

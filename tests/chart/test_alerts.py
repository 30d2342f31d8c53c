"""lockstep's alerts as the chart ships them (a PrometheusRule), read by a real promtool.

promtool comes from the distribution's `prometheus` package (`.ci/fetch-prometheus`,
cached outside the repository). What the chart renders is written out as a rule file and
checked (`promtool check rules`) and unit-tested (`promtool test rules`,
tests/chart/alerts/lockstep.rules.test.yaml: every alert fires on the series it is for and
stays quiet on those it is not).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from test_chart import REPO, VALUE_SETS, find, one, render

from lockstep.clients.metrics import Metrics
from lockstep_dev.localcluster.prometheus import find_prometheus

RULES = REPO / "charts/lockstep/alerts/lockstep.rules.yaml"
UNIT_TESTS = Path(__file__).parent / "alerts" / "lockstep.rules.test.yaml"
RUNBOOKS = REPO / "docs/runbooks.md"
MONITORED = VALUE_SETS["servicemonitor-and-dashboard"]


def promtool() -> str:
    return str(find_prometheus() / "promtool")


def run_promtool(cwd: Path, *args: str) -> str:
    """promtool with `args` in `cwd`; its stdout, once it succeeded."""
    done = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rendered_groups(values: dict[str, Any]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = one(render(values), "PrometheusRule")["spec"]["groups"]
    return groups


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def test_the_rendered_alerts_pass_promtools_check_and_its_unit_tests(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rendered_groups(MONITORED)}))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    checked = run_promtool(tmp_path, "check", "rules", "rules.yaml")
    assert f"SUCCESS: {len(alerts(rendered_groups(MONITORED)))} rules found" in checked
    assert "SUCCESS" in run_promtool(tmp_path, "test", "rules", UNIT_TESTS.name)


def test_every_alert_is_unit_tested_has_a_runbook_and_reads_exported_metrics() -> None:
    shipped = alerts(yaml.safe_load(RULES.read_text())["groups"])
    assert len(shipped) >= 9
    tested = {
        case["alertname"]
        for group in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in group["alert_rule_test"]
    }
    assert tested == set(shipped)
    headings = set(re.findall(r"^## (\w+)$", RUNBOOKS.read_text(), re.MULTILINE))
    assert set(shipped) <= headings, sorted(set(shipped) - headings)
    exported = {
        name
        for family in Metrics().registry.collect()
        for name in (family.name, f"{family.name}_total", f"{family.name}_bucket")
    }
    for name, rule in shipped.items():
        read = set(re.findall(r"\blockstep_[a-z_]+", rule["expr"]))
        assert read <= exported, f"{name} reads {sorted(read - exported)}, never exported"


def test_alerts_are_off_by_default_and_runbook_links_only_when_asked() -> None:
    assert not find(render({}), "PrometheusRule")
    plain = alerts(rendered_groups({"metrics": {"prometheusRule": {"enabled": True}}}))
    assert plain == alerts(yaml.safe_load(RULES.read_text())["groups"])  # the file, as is
    linked = alerts(rendered_groups(MONITORED))
    base = MONITORED["metrics"]["prometheusRule"]["runbookBaseURL"]
    for name, rule in linked.items():
        assert rule["annotations"]["runbook_url"] == f"{base}#{name.lower()}"
        # Extra labels join the rule's own; they never replace its severity.
        assert rule["labels"] == {**plain[name]["labels"], "team": "serving"}
    monitor = one(render(MONITORED), "PrometheusRule")
    assert monitor["metadata"]["labels"]["release"] == "prom"

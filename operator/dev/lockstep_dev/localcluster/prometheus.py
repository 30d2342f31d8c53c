"""A real Prometheus beside the local cluster, set up from what the chart renders.

The chart ships its monitoring for the Prometheus Operator: a ServiceMonitor (what to
scrape) and a PrometheusRule (lockstep's alerts), plus a Grafana dashboard. The local
cluster runs no Prometheus Operator, so this module does its part by hand, from the
chart's own rendering (`helm template` with both on): the ServiceMonitor's endpoint
becomes a scrape job with the relabelling the Prometheus Operator generates for one (keep
the Services whose labels match its selector and the port it names, honor the metrics'
own labels, its interval and timeout), and the PrometheusRule's groups become a rule file.
Prometheus itself is the distribution's package (`.ci/fetch-prometheus`, no binary
downloaded from elsewhere, none committed).

Debian builds its Prometheus without Kubernetes service discovery (`promtool check
config` refuses `kubernetes_sd_configs`), so `EndpointsDiscovery` serves what that
discovery would: the Endpoints of the Services in the ServiceMonitor's namespaces, read
from the local API server, one target per address and port with the same
`__meta_kubernetes_*` labels, over Prometheus's HTTP service discovery. Which targets are
kept is still Prometheus's relabelling of those labels, as on a cluster.

A drill lasts minutes, the alerts' `for` clauses are minutes to half an hour: the rule
file a drill loads has every `for` divided by `TIME_SCALE` (a minute of the chart's is half a
second here: a stand-in group restarts in seconds), expressions untouched. What the chart ships, with its real `for` clauses, is
checked by `promtool test rules` (tests/chart/test_alerts.py).

The dashboard's queries are run as Grafana runs a time-series panel: a range query over
the window shown, `$__range` its length and `$__rate_interval` four scrape intervals.
"""

from __future__ import annotations

import functools
import json
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client as k8s

from lockstep_dev.localcluster.controlplane import find_helm, repo_root
from lockstep_dev.localcluster.serviceproxy import pod_ready, target_port

TIME_SCALE = 120
SCRAPE_INTERVAL = "1s"
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(duration: str) -> float:
    """A Prometheus duration ("1h30m", "2m", "500ms") in seconds."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * _SECONDS[u] for n, u in parts)


def _label_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def namespaces(monitor: Mapping[str, Any]) -> list[str]:
    """The namespaces a ServiceMonitor looks in (its own when it names none)."""
    names = list(monitor["spec"].get("namespaceSelector", {}).get("matchNames") or [])
    return names or [monitor["metadata"]["namespace"]]


def scrape_configs(monitor: Mapping[str, Any], discovery_url: str) -> list[dict[str, Any]]:
    """The scrape jobs a ServiceMonitor stands for (one per endpoint), their targets
    from `discovery_url` (an `EndpointsDiscovery`)."""
    spec = monitor["spec"]
    keep_service = [
        {
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_service_label_{_label_name(key)}"],
            "regex": re.escape(str(value)),
        }
        for key, value in sorted((spec["selector"].get("matchLabels") or {}).items())
    ]
    jobs = []
    for index, endpoint in enumerate(spec["endpoints"]):
        target = [
            {"action": "replace", "source_labels": [source], "target_label": label}
            for source, label in (
                ("__meta_kubernetes_namespace", "namespace"),
                ("__meta_kubernetes_service_name", "service"),
                ("__meta_kubernetes_pod_name", "pod"),
                ("__meta_kubernetes_service_name", "job"),
            )
        ]
        job: dict[str, Any] = {
            "job_name": f"serviceMonitor/{monitor['metadata']['name']}/{index}",
            "metrics_path": endpoint.get("path", "/metrics"),
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "http_sd_configs": [{"url": discovery_url, "refresh_interval": "2s"}],
            "relabel_configs": [
                *keep_service,
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                    "regex": re.escape(str(endpoint["port"])),
                },
                *target,
            ],
        }
        for key, name in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout")):
            if endpoint.get(key):
                job[name] = endpoint[key]
        jobs.append(job)
    return jobs


def endpoint_targets(
    services: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """What Kubernetes service discovery (role `endpoints`) finds for these Services and
    the pods of their namespace (plain dicts as the API server returns them): one target
    per pod the Service selects and port, with its `__meta_kubernetes_*` labels.

    The Endpoints are read from the pods as the endpoints controller writes them (the
    API server refuses the local cluster's loopback pod addresses in Endpoints, see
    `serviceproxy`): a pod with an address and not being deleted, ready when Ready."""
    groups = []
    for service in services:
        meta, selector = service["metadata"], (service.get("spec") or {}).get("selector")
        if not selector:
            continue
        labels = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_service_name": meta["name"],
        }
        for key, value in (meta.get("labels") or {}).items():
            labels[f"__meta_kubernetes_service_label_{_label_name(key)}"] = str(value)
            labels[f"__meta_kubernetes_service_labelpresent_{_label_name(key)}"] = "true"
        for pod in pods:
            pod_labels = pod["metadata"].get("labels") or {}
            ip = (pod.get("status") or {}).get("podIP")
            if pod["metadata"].get("deletionTimestamp") or not ip:
                continue
            if any(pod_labels.get(k) != v for k, v in selector.items()):
                continue
            for port in service["spec"].get("ports") or []:
                number = target_port(pod, port.get("targetPort", port["port"]))
                if number is None:
                    continue
                target = {
                    **labels,
                    "__meta_kubernetes_endpoint_ready": str(pod_ready(pod)).lower(),
                    "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_name": pod["metadata"]["name"],
                }
                groups.append({"targets": [f"{ip}:{number}"], "labels": target})
    return groups


def drill_rules(rule: Mapping[str, Any], scale: int = TIME_SCALE) -> dict[str, Any]:
    """A PrometheusRule's groups as a rule file, every `for` divided by `scale`."""
    groups = []
    for group in rule["spec"]["groups"]:
        rules = []
        for r in group["rules"]:
            r = dict(r)
            if "for" in r:
                r["for"] = f"{max(1, round(seconds(r['for']) / scale))}s"
            rules.append(r)
        groups.append({**group, "rules": rules})
    return {"groups": groups}


def dashboard_exprs(dashboard: Mapping[str, Any]) -> list[str]:
    """Every query of a Grafana dashboard (its panels' targets), in order."""

    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, Mapping):
            if isinstance(node.get("expr"), str):
                yield node["expr"]
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    return list(walk(dashboard.get("panels") or []))


def grafana_expr(expr: str, range_s: float, rate_interval_s: float) -> str:
    """`expr` with Grafana's interval variables filled in as a panel would."""
    return expr.replace("$__range", f"{int(range_s)}s").replace(
        "$__rate_interval", f"{int(rate_interval_s)}s"
    )


def render_monitoring(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The chart's ServiceMonitor and PrometheusRule, rendered with `values` and both on."""
    root = repo_root()
    if root is None:
        raise RuntimeError("the chart is read from a source checkout")
    monitoring = {
        "serviceMonitor": {"enabled": True, "interval": SCRAPE_INTERVAL, "scrapeTimeout": "1s"},
        "prometheusRule": {"enabled": True},
    }
    merged = {**values, "metrics": {**dict(values.get("metrics") or {}), **monitoring}}
    out = subprocess.run(
        [str(find_helm()), "template", "lockstep", str(root / "charts/lockstep"),
         "--namespace", "lockstep-system", "--values", "-"],
        input=yaml.safe_dump(merged), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    docs = {d["kind"]: d for d in yaml.safe_load_all(out.stdout) if d}
    return docs["ServiceMonitor"], docs["PrometheusRule"]


@functools.cache
def find_prometheus() -> Path:
    """The bin directory of the distribution's prometheus (`.ci/fetch-prometheus`)."""
    root = repo_root()
    if root is None:
        raise RuntimeError("prometheus is fetched by the checkout's .ci/fetch-prometheus")
    out = subprocess.run(
        ["bash", str(root / ".ci/fetch-prometheus")],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EndpointsDiscovery:
    """Prometheus's HTTP service discovery answered with what its Kubernetes discovery
    would find (`endpoint_targets`) in `namespaces`, read from the API server on every
    refresh."""

    def __init__(self, core: k8s.CoreV1Api, namespaces: Sequence[str]) -> None:
        self.core, self.namespaces = core, list(namespaces)
        self.server: ThreadingHTTPServer | None = None

    def targets(self) -> list[dict[str, Any]]:
        sanitize = self.core.api_client.sanitize_for_serialization
        out: list[dict[str, Any]] = []
        for namespace in self.namespaces:
            services = sanitize(self.core.list_namespaced_service(namespace).items)
            pods = sanitize(self.core.list_namespaced_pod(namespace).items)
            out += endpoint_targets(services, pods)
        return out

    def start(self) -> str:
        """Serve on a free local port; returns the URL to give Prometheus."""
        discovery = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    body, code = json.dumps(discovery.targets()).encode(), 200
                except Exception as err:  # Prometheus keeps its last targets on an error
                    body, code = str(err).encode(), 503
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/targets"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class LocalPrometheus:
    """A Prometheus process scraping what `monitor` selects (its targets discovered
    through `core`'s API server) and evaluating `rules`."""

    def __init__(
        self,
        workdir: Path,
        core: k8s.CoreV1Api,
        monitor: Mapping[str, Any],
        rules: Mapping[str, Any],
    ) -> None:
        self.workdir = workdir
        self.discovery = EndpointsDiscovery(core, namespaces(monitor))
        self.monitor, self.rules = monitor, rules
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 60.0) -> LocalPrometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        discovery_url = self.discovery.start()
        (self.workdir / "rules.yaml").write_text(yaml.safe_dump(dict(self.rules)))
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "1s"},
            "rule_files": [str(self.workdir / "rules.yaml")],
            "scrape_configs": scrape_configs(self.monitor, discovery_url),
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        with (self.workdir / "prometheus.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [str(find_prometheus() / "prometheus"),
                 f"--config.file={self.workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log_tail = (self.workdir / "prometheus.log").read_text()[-2000:]
                raise RuntimeError(f"prometheus did not become ready:\n{log_tail}")
            time.sleep(0.25)
        return self

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.discovery.stop()

    def _get(self, path: str, **params: Any) -> Any:
        answer = httpx.get(f"{self.url}{path}", params=params, timeout=10, trust_env=False)
        answer.raise_for_status()
        return answer.json()["data"]

    def targets_up(self) -> list[str]:
        """The scrape targets whose last scrape succeeded (their addresses)."""
        active = self._get("/api/v1/targets", state="active")["activeTargets"]
        return sorted(t["labels"].get("instance", "") for t in active if t["health"] == "up")

    def active_alerts(self) -> list[dict[str, Any]]:
        """Alerts pending or firing now."""
        return list(self._get("/api/v1/alerts")["alerts"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Any]:
        data = self._get("/api/v1/query_range", query=expr, start=start, end=end, step=step)
        return list(data["result"])


def firing_spans(series: Sequence[Mapping[str, Any]], step: float) -> dict[str, list[list[float]]]:
    """From a range query of `ALERTS{alertstate="firing"}` at `step`: each alert's
    firing spans ([first, last] sample, UNIX times; samples more than a step and a half
    apart are two spans), by alert name, in time order."""
    times: dict[str, set[float]] = {}
    for s in series:
        times.setdefault(s["metric"]["alertname"], set()).update(float(t) for t, _ in s["values"])
    spans: dict[str, list[list[float]]] = {}
    for name, seen in times.items():
        for at in sorted(seen):
            runs = spans.setdefault(name, [])
            if runs and at - runs[-1][1] <= 1.5 * step:
                runs[-1][1] = at
            else:
                runs.append([at, at])
    return spans


def has_data(series: Sequence[Mapping[str, Any]]) -> int:
    """How many of a range query's samples are numbers (not NaN): what a panel draws."""
    return sum(
        1 for s in series for _, v in s["values"] if v.lower() not in ("nan", "+inf", "-inf")
    )

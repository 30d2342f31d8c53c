"""The harness every scenario runs in: one scenario on one fresh local cluster.

A drill starts a fresh `DevCluster` (the scenario's cluster options, and its `prepare` before
the deployment exists), applies the drill deployment (`examples/local-drill.yaml`, with the
scenario's spec overrides), waits until every group is healthy (and routed), sends traffic to
every Ready group the whole time (as a router would), runs the scenario's `act` (inject its
fault into decode group 0, wait for the expected outcome with a hard bound, judge), and returns
the figures (`lockstep_dev.drills.figures`).

With `engine="sglang"` every SGLang pod runs the real launcher and the real SGLang 0.5.23
server on CPU (the tiny model; PD over mooncake TCP) instead of the stand-in, and the router is
always on: a real PD decode server serves only with the prefill bootstrap the router adds. Only
the scenarios that list the engine (`REAL_SGLANG_SCENARIOS`) run on it.

With `router=True` the real sglang-router runs too (as the operator renders it), every request
goes through it, and the figures say what it did around the drain (`figures`).
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from lockstep.api import constants as c
from lockstep_dev.cluster import DevCluster, wait_for
from lockstep_dev.drills import failover, figures, monitoring
from lockstep_dev.drills.deployment import (
    AFFECTED,
    NAME,
    NAMESPACE,
    RESTARTING_STEPS,
    RecoveryMode,
    drill_spec,
    group_key,
)
from lockstep_dev.drills.failover import loads
from lockstep_dev.drills.figures import DrillResult, ts
from lockstep_dev.drills.registry import REAL_SGLANG_SCENARIOS, lookup
from lockstep_dev.faults import FaultKind, inject
from lockstep_dev.localcluster import sglang_cpu
from lockstep_dev.localcluster.engines import ENGINES, EngineName
from lockstep_dev.procmem import tree_pss_mib
from lockstep_dev.traffic import ROUTER, Traffic, ready_leaders, router_endpoint

Observer = Callable[["Drill", str], None]


class Drill:
    """One scenario on one fresh local cluster."""

    def __init__(
        self,
        scenario: str,
        *,
        workdir: Path | None = None,
        observer: Observer | None = None,
        timeout_s: float = 240.0,
        cluster_options: Mapping[str, Any] | None = None,
        router: bool = False,
        recovery_mode: RecoveryMode = "InPlace",
        engine: EngineName = "standin",
        slow_steps: Sequence[float] | None = None,
        step_bounds: Mapping[str, Any] | None = None,
        sequence: Sequence[tuple[str, FaultKind]] | None = None,
        keep_going: bool = False,
        spares: int = 0,
        suspect_nodes: Mapping[str, Any] | None = None,
        soak_s: float = 0.0,
        prometheus: Sequence[str] | None = None,
    ) -> None:
        """`cluster_options` go to :class:`DevCluster` (e.g. an operator identity and the audit
        log for the least-privilege drill); `router` puts the real sglang-router in front and
        sends the traffic through it; `recovery_mode`: the deployment's `recovery.mode`;
        `engine` is what the SGLang pods run (see the module docstring); `slow_steps`: the
        slow drill's step lengths (default: its `SLOW_STEPS`); `step_bounds`: the
        deployment's `health.stepBounds` (None: the drill's, `{}`: the defaults); `sequence`:
        the sequence scenario's incidents (default: the engine's); `keep_going`: go on after
        an incident that failed its checks (a benchmark measures every one); `spares`:
        decode's warm spares in the capacity scenario; `suspect_nodes`: the deployment's
        `recovery.suspectNodes` (the sequence drill then judges the nodes its incidents'
        outliers ran on, `drills.suspects`; with `cordon` the chart is installed with
        `rbac.cordonNodes`); `soak_s`: the pd-path drill's healthy run under traffic before
        its faults (`benchmarks/pd_path.py`); `prometheus`: the alerts a real Prometheus
        must see fire and resolve (`drills.monitoring`)."""
        definition = lookup(scenario)
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
        if engine not in definition.engines:
            raise ValueError(
                f"scenario {scenario!r} runs on the stand-in only; on the real SGLang engine: "
                f"{', '.join(REAL_SGLANG_SCENARIOS)}"
            )
        self.definition, self.scenario, self.engine = definition, scenario, engine
        self.sequence = tuple(sequence) if sequence is not None else None
        self.keep_going, self.soak_s, self.spares = keep_going, soak_s, spares
        self.watch = monitoring.Watch(self, prometheus)
        self.slow_steps = tuple(slow_steps) if slow_steps is not None else None
        self.step_bounds = None if step_bounds is None else dict(step_bounds)
        real = engine == "sglang"  # a real server loads the model and warms up; three of
        self.ready_timeout_s = 600.0 if real else 240.0  # them share two cores here
        if real:
            router = True  # a real PD decode server needs the router's prefill bootstrap
            timeout_s = max(timeout_s, 420.0)
        self.suspect_nodes = None if suspect_nodes is None else dict(suspect_nodes)
        options = dict(cluster_options or {})
        if self.suspect_nodes and self.suspect_nodes.get("cordon"):
            values = dict(options.get("chart_values") or {})
            values["rbac"] = {**values.get("rbac", {}), "cordonNodes": True}
            options["chart_values"] = values
        for key, value in definition.cluster_options.items():
            options.setdefault(key, copy.deepcopy(value))
        recovery_mode = definition.recovery_mode or recovery_mode
        router = router or definition.router
        self._own_dir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"lockstep-drill-{scenario}-"))
        self.observer, self.timeout_s = observer, timeout_s
        self.cluster = DevCluster(self.workdir, engine=engine, **options)
        self.traffic: Traffic | None = None
        self.router, self.recovery_mode = router, recovery_mode
        self.result = DrillResult(
            scenario, router=router, recovery_mode=recovery_mode, engine=engine
        )
        self.watched = AFFECTED  # the group whose drain `drained_at` notes
        self.drained_at: float | None = None
        self.readmitted_at: float | None = None
        self.samples: list[tuple[float, dict[str, str]]] = []  # (time, group -> step)
        self.first_injection: float | None = None
        # Whether decode/0 had a serving (Ready, not deleting) leader (node-drain's `watch`).
        self.serving: list[tuple[float, bool]] = []
        # (time, serving groups short of the role's wanted count): the spares drill's `watch`.
        self.capacity: list[tuple[float, int]] = []
        # Groups a fault was injected into and no verdict yet: they serve nothing.
        self.down: set[str] = set()
        # When each group was first seen Retiring (by poll(); the scale drill's figure).
        self.retiring_since: dict[str, float] = {}
        # Through the router: what each serving group holds while idle (/v1/loads).
        self.idle_loads: dict[str, dict[str, int]] = {}

    # ----------------------------------------------------------------- helpers

    def note(self, text: str) -> None:
        self.result.notes.append(text)
        if self.observer is not None:
            self.observer(self, text)

    def status(self) -> dict[str, Any]:
        return dict(self.cluster.pdd(NAMESPACE, NAME).get("status") or {})

    def records(self) -> dict[str, Any]:
        meta = self.cluster.pdd(NAMESPACE, NAME)["metadata"]
        return dict(json.loads((meta.get("annotations") or {}).get("lockstep.dev/groups", "{}")))

    def group(self, key: str) -> dict[str, Any]:
        role, index = key.split("/")
        for g in (self.status().get(role) or {}).get("groups") or []:
            if g["index"] == int(index):
                return dict(g)
        return {}

    def groups(self, role: str) -> dict[int, dict[str, Any]]:
        """The role's groups in status, by index."""
        return {int(g["index"]): g for g in (self.status().get(role) or {}).get("groups") or []}

    def all_healthy(self) -> bool:
        st = self.status()
        for cond in st.get("conditions") or []:
            if cond.get("reason") == "InvalidSpec":
                raise RuntimeError(f"the operator refused the drill spec: {cond.get('message')}")
        want_p = int((st.get("prefill") or {}).get("replicas", -1))
        want_d = int((st.get("decode") or {}).get("replicas", -1))
        return bool(
            st.get("prefillReady") == f"{want_p}/{want_p}"
            and st.get("decodeReady") == f"{want_d}/{want_d}"
        )

    @property
    def selector(self) -> str:
        return f"{c.LABEL_DEPLOYMENT}={NAME}"

    def router_routes_everywhere(self) -> bool:
        """The router lists a healthy worker for every group (traffic may start)."""
        # The groups the operator runs (status: a PDRoleScale may override the spec).
        st = self.status()
        want = sum(int((st.get(role) or {}).get("replicas", 0)) for role in c.ROLES)
        url = router_endpoint(self.cluster.pods(NAMESPACE, self.selector)).get(ROUTER)
        if url is None:
            return False
        try:
            workers = httpx.get(f"{url}/workers", timeout=2, trust_env=False).json()["workers"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return sum(1 for w in workers if w.get("is_healthy")) == want

    def readmission_time(self, key: str = AFFECTED) -> float | None:
        """When the operator set the group's readiness gate True again (the condition's
        lastTransitionTime, whole seconds: rounded down, so never late)."""
        role, index = key.split("/")
        sel = f"{self.selector},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index},{c.LABEL_RANK}=0"
        for pod in self.cluster.pods(NAMESPACE, sel):
            for cond in (pod.get("status") or {}).get("conditions") or []:
                if cond.get("type") == c.READINESS_GATE and cond.get("status") == "True":
                    at = cond.get("lastTransitionTime")
                    return ts(at if isinstance(at, str) else None)
        return None

    def uids(self, key: str) -> set[str]:
        role, index = key.split("/")
        sel = f"{c.LABEL_DEPLOYMENT}={NAME},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index}"
        return {p["metadata"]["uid"] for p in self.cluster.pods(NAMESPACE, sel)}

    def group_pods(self, key: str) -> list[dict[str, Any]]:
        """The group's pods that are not being deleted, rank 0 first (as the faults
        take them: the last is the one a fault goes into)."""
        role, index = key.split("/")
        sel = f"{self.selector},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index}"
        live = [
            p
            for p in self.cluster.pods(NAMESPACE, sel)
            if not p["metadata"].get("deletionTimestamp")
        ]
        live.sort(key=lambda p: int((p["metadata"].get("labels") or {}).get(c.LABEL_RANK, "0")))
        return live

    def nodes(self) -> dict[str, dict[str, Any]]:
        """Every node (as a dict) by name."""
        api = self.cluster.api
        items = self.cluster.core().list_node().items
        plain = [api.sanitize_for_serialization(n) for n in items]  # type: ignore[no-untyped-call]
        return {str(n["metadata"]["name"]): dict(n) for n in plain}

    def poll(self) -> None:
        """Called while waiting: notes the drain time, samples the recovery steps (and
        whatever the scenario watches)."""
        recs = self.records()
        if self.definition.watch is not None:
            self.definition.watch(self)
        for key, rec in recs.items():
            if rec.get("step") == "Retiring":
                self.retiring_since.setdefault(key, time.time())
        self.samples.append(
            (time.time(), {k: str(v.get("step", "Healthy")) for k, v in recs.items()})
        )
        # Only after the injection: while the deployment starts, its groups pass through
        # the same steps (Creating, WaitingProbe, Readmitting).
        if self.drained_at is None and self.result.injected_at is not None:
            step = recs.get(self.watched, {}).get("step")
            if step in ("CapturingEvidence", "AwaitingRestart", *RESTARTING_STEPS):
                self.drained_at = time.time()

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        def check() -> Any:
            self.poll()
            return predicate()

        return wait_for(check, timeout, what, poll=0.25)

    def inject(self, kind: FaultKind, key: str = AFFECTED, **kw: Any) -> None:
        assert self.cluster.kubelet is not None
        role, index = key.split("/")
        root = self.workdir / "kubelet"
        text = inject(self.cluster.core(), root, NAMESPACE, NAME, role, int(index), kind, **kw)
        self.note(text)

    def incident(
        self, key: str = AFFECTED, closed: bool = True, after: int = 0
    ) -> dict[str, Any] | None:
        """The group's newest incident (closed only, by default), if it has more than
        `after` incidents."""
        mine = [i for i in self.status().get("incidents") or [] if group_key(i) == key]
        if len(mine) <= after:
            return None
        for inc in reversed(mine[after:]):
            if not closed or inc["state"] == "Closed":
                return dict(inc)
        return None

    def incident_count(self, key: str = AFFECTED) -> int:
        return sum(1 for i in self.status().get("incidents") or [] if group_key(i) == key)

    # ------------------------------------------------------------------- run

    def run(self) -> DrillResult:
        started = time.time()
        try:
            self.cluster.start()
            self.note(
                "local cluster up: control plane, process kubelet, operator"
                + (" (the Helm chart's)" if self.cluster.operator_mode == "chart" else "")
            )
            self.watch.start()
            if self.definition.prepare is not None:
                self.definition.prepare(self)
            self.cluster.apply(drill_spec(**self.spec_overrides()))
            applied = time.time()
            self.note(
                "applied the drill PDDeployment; waiting for every group to be healthy"
                + (
                    " (real SGLang servers on CPU: model load and warm-up)"
                    if self.engine == "sglang"
                    else ""
                )
            )

            def all_started() -> bool:
                self.note_ready_groups(applied)
                return self.all_healthy()

            self.wait(all_started, self.ready_timeout_s, "every group healthy")
            self._start_traffic(applied)
            self.watch.mark_serving()
            time.sleep(3)
            self.act()
            time.sleep(3)
            self.watch.judge()
        except (TimeoutError, RuntimeError, AssertionError) as err:
            self.result.passed = False
            self.result.reason = str(err)
        finally:
            if self.traffic is not None:
                self.traffic.stop()
                self._figures()
            self.result.phases = self.phases()
            try:
                self.result.incidents = list(self.status().get("incidents") or [])
                self.result.restarts = figures.restarts(self.status())
            except Exception as err:  # the cluster may be gone after a failure
                self.result.notes.append(f"could not read final status: {err}")
            self.watch.stop()
            self.cluster.stop()
            self.result.duration_s = round(time.time() - started, 1)
            if not self.result.passed and self.engine == "sglang":
                self.result.notes.append(failover.kv_path_note(self.workdir / "kubelet"))
            elif self._own_dir and self.result.passed:
                shutil.rmtree(self.workdir, ignore_errors=True)
        return self.result

    def act(self) -> None:
        """The scenario's fault and checks, once every group is healthy and traffic
        flows (a subclass may add its own after them)."""
        self.definition.act(self)

    def _start_traffic(self, applied: float) -> None:
        """Every group healthy (and, through the router, routed): the ready figures, then
        traffic to every Ready group's leader or through the router."""
        if self.router:
            self.wait(self.router_routes_everywhere, 120, "the router routing to every group")
            self.result.time_to_ready_s = round(time.time() - applied, 1)
            self._ready_figures(applied)
            self.note("every group healthy and in the router; traffic through the router")
            # What every serving group holds while nothing runs: a request caught by an
            # incident must leave nothing behind on the groups that stay.
            self.idle_loads = loads(self)
            self.traffic = Traffic(
                lambda: router_endpoint(self.cluster.pods(NAMESPACE, self.selector)),
                concurrency=2,
                # A client that waits as a real one does (CLIENT_TIMEOUT_S, minutes):
                # how long a request caught by an incident waits is its figure.
            ).start()
        else:
            self.result.time_to_ready_s = round(time.time() - applied, 1)
            self._ready_figures(applied)
            self.note("every group healthy; traffic on")
            self.traffic = Traffic(
                lambda: ready_leaders(self.cluster.pods(NAMESPACE, self.selector))
            ).start()

    def note_ready_groups(self, applied: float) -> None:
        """Record when each group is first Healthy in status (polled while starting)."""
        st = self.status()
        for role in c.ROLES:
            for g in (st.get(role) or {}).get("groups") or []:
                key = f"{role}/{g['index']}"
                if g.get("state") == "Healthy" and key not in self.result.ready_s:
                    self.result.ready_s[key] = round(time.time() - applied, 1)

    def _ready_figures(self, applied: float) -> None:
        """What each pod costs in memory once every group is ready."""
        self.note_ready_groups(applied)
        assert self.cluster.kubelet is not None
        for (namespace, name), pid in sorted(self.cluster.kubelet.processes().items()):
            if namespace == NAMESPACE:
                self.result.memory_mib[name] = tree_pss_mib(pid)

    def spec_overrides(self) -> dict[str, Any]:
        overrides = self.definition.overrides(self)
        if self.engine == "sglang":
            # The tiny model generated on this machine; probes with room for a loaded CPU.
            overrides["model"] = {"path": str(sglang_cpu.model_dir())}
            overrides["image"] = "lmsysorg/sglang:v0.5.23-local-cpu"
            overrides["health"] = {
                "periodSeconds": 2,
                "timeoutSeconds": 2,
                "startupGraceSeconds": 600,
            }
        if self.router:
            overrides["router"] = {"enabled": True}
        overrides["recovery"] = {**overrides.get("recovery", {}), "mode": self.recovery_mode}
        if self.suspect_nodes is not None:
            overrides["recovery"]["suspectNodes"] = self.suspect_nodes
        return overrides

    # ---------------------------------------------------------------- judging

    def phases(self) -> dict[str, float]:
        """Time in each step of the affected group after the injection (see
        `figures.phases`)."""
        return figures.phases(self.samples, self.result.injected_at)

    def _figures(self) -> None:
        assert self.traffic is not None
        r = self.result
        r.failed_requests = figures.failed_requests(self.traffic, self.first_injection or 0.0)
        if self.router:
            kubelet_root = self.workdir / "kubelet"
            figures.router_figures(
                r, self.traffic, self.drained_at, self.readmitted_at, kubelet_root
            )
        else:
            figures.group_figures(r, self.traffic, self.drained_at, self.definition.faulted)

    def figures_now(self) -> None:
        if self.traffic is not None:
            self._figures()

    def judge_incident(self, inc: Mapping[str, Any]) -> None:
        figures.judge_incident(self.result, inc)

    def conclude(self, checks: list[tuple[bool, str]]) -> None:
        """Judge: passed when every check holds and no request to another group failed."""
        self.figures_now()
        if self.result.other_groups_failed:
            checks.append(
                (False, f"{self.result.other_groups_failed} requests to other groups failed")
            )
        failed = [why for ok, why in checks if not ok]
        self.result.passed = not failed
        self.result.reason = "; ".join(failed) or "expected outcome"


def run_drill(scenario: str, **kw: Any) -> DrillResult:
    """Run one scenario on a fresh local cluster."""
    return Drill(scenario, **kw).run()

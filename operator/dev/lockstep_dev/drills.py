"""Incident drills on the local cluster: inject a fault, watch lockstep handle it, judge.

Each scenario runs on a fresh `DevCluster` with the drill deployment
(`examples/local-drill.yaml`: one prefill group, two decode groups of TP2 spanning two
pods each), sends traffic to every Ready group the whole time (as a router would), injects
its fault into decode group 0 (both decode groups for `concurrent`), waits for the
expected outcome with a hard bound, and returns figures: verdict, time to detect (from the
injection and from the first failed probe), time to recover, requests sent and failed per
group (and for the affected group before and after its drain), restarts per group, and
the incidents. `passed` is True only when the scenario's expected outcome happened.

With `engine="sglang"` every SGLang pod runs the real launcher and the real SGLang
0.5.23 server on CPU (the tiny model; PD over mooncake TCP) instead of the stand-in, and
the router is always on: a real PD decode server serves only with the prefill bootstrap
the router adds. Only the scenarios of `REAL_SGLANG_SCENARIOS` run on it.

With `router=True` the deployment's real sglang-router runs too (as the operator renders
it) and every request goes through it; the figures then also say, from the stand-ins'
request logs, how many requests the router sent to the affected group while it was
drained (must be none), to the other groups meanwhile, and to the affected group after
its re-admission (must be some), and how many requests failed through the router before
the drain (the detection window) and after it (must be none).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml

from lockstep import constants as c
from lockstep.agent_client import agent_url
from lockstep.records import ANNOTATION_RESTART
from lockstep.router_workers import serving_workers
from lockstep_dev.cluster import ChartOperator, DevCluster, restart_count, wait_for
from lockstep_dev.faults import FaultKind, agent_token, group_pods, inject
from lockstep_dev.ha_drill import HA_VALUES, run_ha
from lockstep_dev.localcluster import sglang_cpu
from lockstep_dev.localcluster.controlplane import repo_root
from lockstep_dev.localcluster.engines import ENGINES, EngineName
from lockstep_dev.localcluster.kubelet import RACK_LABEL
from lockstep_dev.localcluster.maintenance import kubectl_argv, start_drain
from lockstep_dev.procmem import tree_pss_mib
from lockstep_dev.traffic import (
    CLIENT_TIMEOUT_S,
    ROUTER,
    Stream,
    Traffic,
    ready_leaders,
    request_log_arrivals,
    router_endpoint,
)

SCENARIOS = (
    "desync",
    "sequence",
    "hang",
    "rank-kill",
    "pod-delete",
    "slow",
    "stuck-step",
    "flapping",
    "operator-crash",
    "concurrent",
    "agent-down",
    "baseline",
    "node-drain",
    "unplaceable",
    "scale",
    "ha",
)
# Scenarios that need more nodes than the default cluster's, in labelled pools.
NODE_SCENARIOS = ("node-drain", "unplaceable")
# The node-drain drill's decode pool: 4 of 6 nodes, labelled and tainted so that only
# decode pods land there (the operator, the router and prefill stay off the drained node).
DRILL_POOL = "lockstep.dev/drill-pool"
# The unplaceable drill's capacity label: decode pods need it; the drill takes it away.
DRILL_CAPACITY = "lockstep.dev/drill-capacity"
# What runs on the real SGLang engine (the stand-in runs every scenario).
REAL_SGLANG_SCENARIOS = (
    "desync",
    "hang",
    "rank-kill",
    "sequence",
    "pod-delete",
    "operator-crash",
)
# The `sequence` scenario: one incident after another in decode/0, through the router.
SEQUENCE: tuple[tuple[str, FaultKind], ...] = (
    ("Desynced", "desync"),
    ("Hung", "hang"),
    ("RankDown", "kill-rank"),
)
# On the stand-in (a restart costs seconds there) a deleted pod follows.
STANDIN_SEQUENCE: tuple[tuple[str, FaultKind], ...] = (*SEQUENCE, ("RankDown", "delete-pod"))
# How long a request caught by an incident may wait past the verdict before it is served
# again through the router (the issue's bound; 3 s of it is the router's retry backoff).
PAST_VERDICT_BOUND_S = {"standin": 5.0, "sglang": 15.0}
# The long stream each incident of the sequence catches on decode/0 (tokens: long enough
# to be under way when the fault lands, on each engine's speed here).
STREAM_TOKENS = {"standin": 4000, "sglang": 1500}
# The slow drill: legitimately long steps of these lengths, one after the other, under
# the default step bounds (the issue's promise: no restart for steps up to 60 s).
SLOW_STEPS: tuple[float, ...] = (5.0, 15.0, 30.0, 60.0)
RecoveryMode = Literal["InPlace", "Recreate"]
NAMESPACE = "lockstep-drill"
NAME = "drill"
AFFECTED = "decode/0"
RESTARTING_STEPS = (
    "RestartingInPlace",
    "Deleting",
    "WaitingGone",
    "Creating",
    "WaitingProbe",
    "Readmitting",
)

Observer = Callable[["Drill", str], None]


def drill_spec(**spec_overrides: Any) -> dict[str, Any]:
    """The drill deployment (examples/local-drill.yaml), with spec keys overridden."""
    root = repo_root()
    assert root is not None
    obj: dict[str, Any] = yaml.safe_load((root / "examples/local-drill.yaml").read_text())
    obj["metadata"]["namespace"] = NAMESPACE
    for key, value in spec_overrides.items():
        if isinstance(value, dict) and isinstance(obj["spec"].get(key), dict):
            obj["spec"][key] = {**obj["spec"][key], **value}
        else:
            obj["spec"][key] = value
    return obj


def _group_key(incident: Mapping[str, Any]) -> str:
    return f"{incident['role']}/{incident['group']}"


def ts(rfc3339: str | None) -> float | None:
    """RFC 3339 (as the operator writes it) to a UNIX time."""
    if not rfc3339:
        return None
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


@dataclass
class DrillResult:
    """What a drill saw; `passed` says whether the expected outcome happened."""

    scenario: str
    passed: bool = False
    reason: str = ""
    engine: str = "standin"
    time_to_ready_s: float | None = None  # apply -> every group healthy (and routed)
    # apply -> each group Healthy in status (sampled every ~0.25 s)
    ready_s: dict[str, float] = field(default_factory=dict)
    memory_mib: dict[str, float] = field(default_factory=dict)  # PSS per pod, once ready
    verdict: str | None = None
    injected_at: float | None = None
    time_to_detect_s: float | None = None  # injection -> verdict
    probe_time_to_detect_s: float | None = None  # first failed probe -> verdict (operator)
    time_to_recover_s: float | None = None  # verdict -> re-admission (operator share)
    requests: dict[str, dict[str, int]] = field(default_factory=dict)
    affected_failed_before_drain: int = 0
    affected_failed_after_drain: int = 0
    other_groups_failed: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    # The spec's recovery.mode, and how the affected group was actually restarted.
    recovery_mode: str = "InPlace"
    restart_mode: str | None = None
    # Seconds the affected group spent in each recovery step after the injection (from
    # the records sampled every ~0.25 s while waiting; steps shorter than that may miss).
    phases: dict[str, float] = field(default_factory=dict)
    incidents: list[dict[str, Any]] = field(default_factory=list)
    # The `sequence` scenario: the figures of each incident, in order.
    steps: list[dict[str, Any]] = field(default_factory=list)
    # Warning Events on the deployment during the slow drill (must be 0).
    warning_events: int = 0
    # The slow drill, per step length: {"step_s", "observed_s", "restarts",
    # "warning_events", "incidents", "states", "failed_probes_seen", "messages"} (the
    # group states, failed probes and status messages seen while the steps ran).
    slow: list[dict[str, Any]] = field(default_factory=list)
    # Every failed request (latency: how long the client waited), seconds after the
    # first injection.
    failed_requests: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    # Through the router (router=True): requests failed, from the stand-ins' logs which
    # groups received what, and the drain window those counts refer to.
    router: bool = False
    router_failed_before_drain: int = 0
    router_failed_after_drain: int = 0
    affected_received_while_drained: int = 0
    affected_received_after_readmission: int = 0
    others_received_while_drained: int = 0
    drained_for_s: float | None = None
    router_stale_workers: list[str] = field(default_factory=list)  # URLs of no live pod
    # The maintenance drills (node-drain, unplaceable): their figures (see the scenario).
    maintenance: dict[str, Any] = field(default_factory=dict)
    # The scale drill: one entry per `kubectl scale` of a role's PDRoleScale.
    scaling: list[dict[str, Any]] = field(default_factory=list)
    # Through the router, per incident: the requests it caught and how they ended, the
    # longest wait past the verdict, the streams it caught, the serving groups' loads.
    failover: list[dict[str, Any]] = field(default_factory=list)
    # The ha drill: takeover times and writes from a woken former leader.
    ha: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


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
        slow_steps: Sequence[float] = SLOW_STEPS,
        step_bounds: Mapping[str, Any] | None = None,
        sequence: Sequence[tuple[str, FaultKind]] | None = None,
        keep_going: bool = False,
    ) -> None:
        """`cluster_options` go to :class:`DevCluster` (e.g. an operator identity and the
        audit log for the least-privilege drill); `router` puts the real sglang-router in
        front and sends the traffic through it; `recovery_mode` is the deployment's
        `recovery.mode` (the drills judge restarts by it: the same pods restarted in place,
        or new pods); `engine` is what the SGLang pods run (see the module docstring);
        `slow_steps`: the step lengths of the slow drill; `step_bounds`: the deployment's
        `health.stepBounds` (None: the drill deployment's, `{}`: the defaults);
        `sequence`: the incidents of the sequence scenario (default: the engine's);
        `keep_going`: the sequence goes on after an incident that failed its checks (a
        benchmark measures every one)."""
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
        if engine == "sglang" and scenario not in REAL_SGLANG_SCENARIOS:
            raise ValueError(
                f"scenario {scenario!r} runs on the stand-in only; on the real SGLang engine: "
                f"{', '.join(REAL_SGLANG_SCENARIOS)}"
            )
        self.engine = engine
        self.sequence = tuple(sequence) if sequence is not None else None
        self.keep_going = keep_going
        self.slow_steps = tuple(slow_steps)
        self.step_bounds = None if step_bounds is None else dict(step_bounds)
        real = engine == "sglang"
        # A real server loads the model and warms up; three of them share two cores here.
        self.ready_timeout_s = 600.0 if real else 240.0
        if real:
            router = True  # a real PD decode server needs the router's prefill bootstrap
            timeout_s = max(timeout_s, 420.0)
        self.scenario = scenario
        options = dict(cluster_options or {})
        if scenario in NODE_SCENARIOS:
            options.setdefault("nodes", 6)
            options.setdefault("racks", 2)
        if scenario == "unplaceable":
            recovery_mode = "Recreate"  # the restart must place new pods
        if scenario == "baseline":
            # SGLang without lockstep's decision consensus (plain SGLang has none in its
            # loops): an image that carries it off, since no PDDeployment may switch a
            # lockstep guard off (policy rule operator-owned-env).
            options.setdefault("image_env", {"LOCKSTEP_CONSENSUS": "0"})
        if scenario == "ha":
            # Two operator replicas electing a leader; the audit log says who wrote what.
            options.setdefault("chart_values", HA_VALUES)
            options.setdefault("audit_log", True)
        if scenario in ("node-drain", "scale"):
            router = True  # the promises are about requests through the router
        self._own_dir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"lockstep-drill-{scenario}-"))
        self.observer = observer
        self.timeout_s = timeout_s
        self.cluster = DevCluster(self.workdir, engine=engine, **options)
        self.traffic: Traffic | None = None
        self.router = router
        self.recovery_mode = recovery_mode
        self.result = DrillResult(
            scenario, router=router, recovery_mode=recovery_mode, engine=engine
        )
        self.drained_at: float | None = None
        self.readmitted_at: float | None = None
        self.samples: list[tuple[float, dict[str, str]]] = []  # (time, group -> step)
        self.first_injection: float | None = None
        # Whether decode/0 had a serving (Ready, not deleting) leader, sampled by poll()
        # in the node-drain drill.
        self.serving: list[tuple[float, bool]] = []
        # The scale drill: when each group was first seen Retiring (by poll()).
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

    def stale_router_workers(self) -> list[str]:
        """Workers the router lists that are no live serving pod's (a deleted pod's)."""
        pods = self.cluster.pods(NAMESPACE, self.selector)
        url = router_endpoint(pods).get(ROUTER)
        if url is None:
            return ["(no Ready router to ask)"]
        live = {
            w.url
            for w in serving_workers(p for p in pods if not p["metadata"].get("deletionTimestamp"))
        }
        workers = httpx.get(f"{url}/workers", timeout=5, trust_env=False).json()["workers"]
        return sorted(str(w["url"]) for w in workers if w["url"] not in live)

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

    def poll(self) -> None:
        """Called while waiting: notes the drain time, samples the recovery steps."""
        recs = self.records()
        if self.scenario == "node-drain" and self.result.injected_at is not None:
            self.serving.append((time.time(), self._serving(AFFECTED)))
        for key, rec in recs.items():
            if rec.get("step") == "Retiring":
                self.retiring_since.setdefault(key, time.time())
        self.samples.append(
            (time.time(), {k: str(v.get("step", "Healthy")) for k, v in recs.items()})
        )
        # Only after the injection: while the deployment starts, its groups pass through
        # the same steps (Creating, WaitingProbe, Readmitting).
        if self.drained_at is None and self.result.injected_at is not None:
            step = recs.get(AFFECTED, {}).get("step")
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
        mine = [i for i in self.status().get("incidents") or [] if _group_key(i) == key]
        if len(mine) <= after:
            return None
        for inc in reversed(mine[after:]):
            if not closed or inc["state"] == "Closed":
                return dict(inc)
        return None

    def incident_count(self, key: str = AFFECTED) -> int:
        return sum(1 for i in self.status().get("incidents") or [] if _group_key(i) == key)

    # ------------------------------------------------------------------- run

    def run(self) -> DrillResult:
        started = time.time()
        try:
            self.cluster.start()
            self.note(
                "local cluster up: control plane, process kubelet, operator"
                + (" (the Helm chart's)" if self.cluster.operator_mode == "chart" else "")
            )
            if self.scenario in NODE_SCENARIOS:
                self._prepare_nodes()
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
            if self.router:
                self.wait(self.router_routes_everywhere, 120, "the router routing to every group")
                self.result.time_to_ready_s = round(time.time() - applied, 1)
                self._ready_figures(applied)
                self.note("every group healthy and in the router; traffic through the router")
                # What every serving group holds while nothing runs: a request caught by an
                # incident must leave nothing behind on the groups that stay.
                self.idle_loads = self.loads()
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
            time.sleep(3)
            getattr(self, "_" + self.scenario.replace("-", "_"))()
            time.sleep(3)
        except (TimeoutError, RuntimeError, AssertionError) as err:
            self.result.passed = False
            self.result.reason = str(err)
        finally:
            if self.traffic is not None:
                self.traffic.stop()
                self._figures()
            self.result.phases = self._phases()
            try:
                self.result.incidents = list(self.status().get("incidents") or [])
                self.result.restarts = self._restarts()
            except Exception as err:  # the cluster may be gone after a failure
                self.result.notes.append(f"could not read final status: {err}")
            self.cluster.stop()
            self.result.duration_s = round(time.time() - started, 1)
            if self._own_dir and self.result.passed:
                shutil.rmtree(self.workdir, ignore_errors=True)
        return self.result

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
        overrides = self._scenario_overrides()
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
        return overrides

    def _scenario_overrides(self) -> dict[str, Any]:
        if self.scenario == "node-drain":
            pool = {"key": DRILL_POOL, "operator": "In", "values": ["decode"]}
            return {
                "decode": {
                    "tolerations": [
                        {
                            "key": DRILL_POOL,
                            "operator": "Equal",
                            "value": "decode",
                            "effect": "NoSchedule",
                        }
                    ],
                    "placement": {
                        "topologyKey": RACK_LABEL,
                        "spread": [
                            {"topologyKey": RACK_LABEL, "whenUnsatisfiable": "DoNotSchedule"}
                        ],
                        "nodeAffinity": _required_node_terms(pool),
                    },
                }
            }
        if self.scenario == "unplaceable":
            need = {"key": DRILL_CAPACITY, "operator": "In", "values": ["yes"]}
            return {
                "decode": {
                    "placement": {
                        "nodeAffinity": _required_node_terms(need),
                        "schedulingTimeoutSeconds": 10,
                    }
                },
            }
        if self.scenario == "baseline":
            # The alternative without lockstep: the runtime's decision consensus off (the
            # image's env, see __init__), SGLang's gloo timeout left long, and nobody
            # restarts the group (the operator only observes).
            return {
                "safety": {
                    "mode": "Warn",
                    "overlapSchedule": "Disabled",
                    "glooTimeoutSeconds": 3600,
                },
                "recovery": {"policy": "ObserveOnly"},
            }
        if self.scenario == "slow" and self.step_bounds is None:
            # The slow drill judges the defaults (90 s floor), not the drill's own 10 s.
            return {"health": {**self._base_health(), "stepBounds": {}}}
        if self.step_bounds is not None:
            return {"health": {**self._base_health(), "stepBounds": self.step_bounds}}
        if self.scenario == "flapping":
            return {
                "recovery": {
                    "budget": {"restarts": 2, "windowSeconds": 600},
                    "backoff": {"baseSeconds": 0, "maxSeconds": 0},
                }
            }
        if self.scenario == "sequence":
            # Every incident of the sequence is a restart of one group within minutes:
            # room for all of them in the restart budget (the flapping drill tests it).
            incidents = max(len(self.sequence or ()), len(STANDIN_SEQUENCE))
            budget = {"restarts": incidents + 1, "windowSeconds": 3600}
            return {"recovery": {"budget": budget}}
        return {}

    def _base_health(self) -> dict[str, Any]:
        return dict(drill_spec()["spec"]["health"])

    def _phases(self) -> dict[str, float]:
        """Time in each step of the affected group from the first step change after the
        injection until it was Healthy again (summed when a step recurs)."""
        if self.result.injected_at is None:
            return {}
        out: dict[str, float] = {}
        last: tuple[float, str] | None = None
        for at, steps in self.samples:
            if at < self.result.injected_at:
                continue
            step = steps.get(AFFECTED, "Healthy")
            if last is not None and step != last[1]:
                if last[1] != "Healthy":
                    out[last[1]] = round(out.get(last[1], 0.0) + at - last[0], 2)
                last = (at, step)
                if step == "Healthy":
                    break
            elif last is None:
                last = (at, step)
        return out

    def _restarts(self) -> dict[str, int]:
        out = {}
        for role in c.ROLES:
            for g in (self.status().get(role) or {}).get("groups") or []:
                out[f"{role}/{g['index']}"] = int(g.get("restarts", 0))
        return out

    def _failed_requests(self) -> list[dict[str, Any]]:
        """Every failed request with its latency (hanging ones end at the client's
        timeout), relative to the first injection; at most the last 50."""
        assert self.traffic is not None
        origin = self.first_injection or 0.0
        failed = self.traffic.failures()
        return [
            {
                "group": o.group,
                "sent_s": round(o.sent_at - origin, 2),
                "latency_s": round(o.latency_s, 2),
                "error": (o.error or "")[:160],
            }
            for o in failed[-50:]
        ]

    def _figures(self) -> None:
        assert self.traffic is not None
        self.result.failed_requests = self._failed_requests()
        if self.router:
            self._router_figures()
            return
        r = self.result
        r.requests = {
            k: {"sent": s.sent, "failed": s.failed} for k, s in sorted(self.traffic.stats().items())
        }
        r.other_groups_failed = sum(
            s.failed
            for k, s in self.traffic.stats().items()
            if k != AFFECTED and not (self.scenario == "concurrent" and k == "decode/1")
        )
        if r.injected_at is not None:
            drained = self.drained_at or time.time()
            before = self.traffic.stats(r.injected_at, drained).get(AFFECTED)
            after = self.traffic.stats(drained).get(AFFECTED)
            r.affected_failed_before_drain = before.failed if before else 0
            r.affected_failed_after_drain = after.failed if after else 0

    def _router_figures(self) -> None:
        """Failures through the router around the drain, and which groups the router sent
        requests to while the affected one was drained (from the stand-ins' logs)."""
        assert self.traffic is not None
        r = self.result
        r.requests = {
            k: {"sent": s.sent, "failed": s.failed} for k, s in sorted(self.traffic.stats().items())
        }
        if r.injected_at is None:
            return
        drained = self.drained_at or time.time()
        before = self.traffic.stats(r.injected_at, drained).get(ROUTER)
        after = self.traffic.stats(drained).get(ROUTER)
        r.router_failed_before_drain = before.failed if before else 0
        r.router_failed_after_drain = after.failed if after else 0
        # Requests through the router after the drain reached the other groups or failed.
        r.other_groups_failed = r.router_failed_after_drain
        if self.drained_at is None:
            return
        readmitted = self.readmitted_at or time.time()
        r.drained_for_s = round(readmitted - self.drained_at, 3)
        arrivals = request_log_arrivals(self.workdir / "kubelet", NAMESPACE, NAME)
        role, index = AFFECTED.split("/")

        def affected(a: Any) -> bool:
            return bool(a.role == role and a.group == int(index))

        during = [a for a in arrivals if self.drained_at <= a.at < readmitted]
        r.affected_received_while_drained = sum(1 for a in during if affected(a))
        r.others_received_while_drained = sum(
            1 for a in during if not affected(a) and a.role == "decode"
        )
        if self.readmitted_at is not None:
            r.affected_received_after_readmission = sum(
                1 for a in arrivals if affected(a) and a.at >= self.readmitted_at
            )

    def _router_checks(self) -> list[tuple[bool, str]]:
        """After the group is back: the router must send it requests again (bounded wait),
        and must have sent it none while it was drained."""
        self.readmitted_at = self.readmission_time()
        if self.readmitted_at is None:
            return [(False, "no readmission time found on decode/0's rank-0 pod")]

        def received_again() -> bool:
            self._figures_now()
            return self.result.affected_received_after_readmission > 0

        try:
            self.wait(received_again, 30, "decode/0 receiving requests through the router again")
        except TimeoutError as err:
            return [(False, str(err))]
        self.note("the router sends decode/0 requests again")
        r = self.result
        r.router_stale_workers = self.stale_router_workers()
        return [
            (
                not r.router_stale_workers,
                f"the router still lists workers of pods that are gone: {r.router_stale_workers}",
            ),
            (
                r.affected_received_while_drained == 0,
                f"the router sent {r.affected_received_while_drained} request(s) to decode/0 "
                "while it was drained",
            ),
            (r.others_received_while_drained > 0, "the other decode group served meanwhile"),
        ]

    def restart_counts(self, key: str) -> dict[str, int]:
        """Container restarts of each pod (by UID) of a group."""
        role, index = key.split("/")
        sel = f"{c.LABEL_DEPLOYMENT}={NAME},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index}"
        return {
            p["metadata"]["uid"]: sum(
                int(s.get("restartCount", 0))
                for s in (p.get("status") or {}).get("containerStatuses") or []
            )
            for p in self.cluster.pods(NAMESPACE, sel)
        }

    def _expect_restart(
        self, verdict: str, kind: FaultKind, mode: RecoveryMode | None = None
    ) -> None:
        """Inject, wait for the verdict and the re-admission, and judge the restart: in
        `mode` (default: the deployment's), the same pods each restarted once more in
        place, or every pod replaced."""
        self._conclude(self._restart_checks(verdict, kind, mode))

    def _restart_checks(
        self,
        verdict: str,
        kind: FaultKind,
        mode: RecoveryMode | None = None,
        step_seconds: float | None = None,
    ) -> list[tuple[bool, str]]:
        """One incident of `_expect_restart`: inject, wait, and the checks it must pass."""
        mode = mode or self.recovery_mode
        before = self.uids(AFFECTED)
        counts = self.restart_counts(AFFECTED)
        epoch = int(self.group(AFFECTED).get("epoch", 0))
        seen = self.incident_count(AFFECTED)
        self.drained_at = self.readmitted_at = None
        # Through the router, the incident also catches a long stream on decode/0.
        streams = self._streams_on(AFFECTED) if self.router else []
        self.result.injected_at = time.time()
        self.first_injection = self.first_injection or self.result.injected_at
        if step_seconds is None:
            self.inject(kind)
        else:
            self.inject(kind, step_seconds=step_seconds)
        self.wait(
            lambda: self.incident(AFFECTED, closed=False, after=seen),
            # A stuck step is Hung only past the step bound (minSeconds: 90 by default).
            60 if step_seconds is None else 240,
            "a verdict on decode/0",
        )
        opened = self.incident(AFFECTED, closed=False, after=seen) or {}
        self.note(f"verdict {opened.get('verdict')}: drain, evidence, whole-group restart")
        inc = self.wait(
            lambda: self.incident(AFFECTED, after=seen), self.timeout_s, "decode/0 re-admitted"
        )
        if inc.get("verdict") != opened.get("verdict"):
            self.note(
                f"verdict refined to {inc.get('verdict')} from the captured evidence: "
                f"{str(inc.get('evidence', '')).splitlines()[0][:160]}"
            )
        self.note(f"decode/0 re-admitted in epoch {self.group(AFFECTED).get('epoch')}")
        self._judge_incident(inc)
        after = self.uids(AFFECTED)
        checks = [
            (inc["verdict"] == verdict, f"verdict {inc['verdict']}, expected {verdict}"),
            (
                inc.get("restartMode") == mode,
                f"restarted {inc.get('restartMode')}, expected {mode}",
            ),
        ]
        if mode == "InPlace":
            now = self.restart_counts(AFFECTED)
            checks += [
                (int(self.group(AFFECTED)["epoch"]) == epoch + 1, "the group is in the next epoch"),
                (after == before, "the same pods (UIDs) came back"),
                (
                    # Exactly once: the ranks' own exit after a divergence holds the
                    # container (the launcher's hold) until the operator's restart.
                    all(now.get(uid, 0) == n + 1 for uid, n in counts.items()),
                    f"every container restarted exactly once (restart counts {counts} -> {now})",
                ),
            ]
        else:
            # An escalated in-place attempt took one epoch; the recreate the next.
            checks += [
                (int(self.group(AFFECTED)["epoch"]) > epoch, "the group is in a later epoch"),
                (len(after) == 2 and not after & before, "every pod of the group was recreated"),
            ]
        if self.router:
            checks += self._router_checks()
            checks += self._failover_checks(inc, streams)
        return checks

    # -------------------------------------------------- requests caught by an incident

    def _leader_urls(self) -> dict[str, str]:
        """`{"decode/0": "http://IP:30000"}` for every rank-0 pod with an address."""
        out: dict[str, str] = {}
        for pod in self.cluster.pods(NAMESPACE, f"{self.selector},{c.LABEL_RANK}=0"):
            labels = pod["metadata"].get("labels") or {}
            ip = (pod.get("status") or {}).get("podIP")
            if ip and not pod["metadata"].get("deletionTimestamp"):
                key = f"{labels.get(c.LABEL_ROLE)}/{labels.get(c.LABEL_GROUP)}"
                out[key] = f"http://{ip}:{c.PORT_HTTP}"
        return out

    def loads(self) -> dict[str, dict[str, int]]:
        """What each serving group's leader holds now (SGLang's `GET /v1/loads`)."""
        out: dict[str, dict[str, int]] = {}
        for key, url in sorted(self._leader_urls().items()):
            try:
                load = httpx.get(f"{url}/v1/loads", timeout=10, trust_env=False).json()
                first = load["loads"][0]
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                continue
            out[key] = {
                "requests": int(first.get("num_running_reqs", 0))
                + int(first.get("num_waiting_reqs", 0)),
                "used_tokens": int(first.get("num_used_tokens", 0)),
            }
        return out

    def _held_streams(self, key: str) -> int | None:
        """Streams the group's leader holds (its runtime's `GET /lockstep/requests`; None
        from a runtime without the route, as lockstep's before it had one)."""
        url = self._leader_urls().get(key)
        if url is None:
            return 0
        role, index = key.split("/")
        pods = group_pods(self.cluster.core(), NAMESPACE, NAME, role, int(index))
        token = agent_token(self.cluster.core(), pods[0]) if pods else ""
        try:
            resp = httpx.get(
                f"{url}/lockstep/requests",
                headers={"Authorization": f"Bearer {token}"},
                timeout=5,
                trust_env=False,
            )
            if resp.status_code == 404:
                return None
            held = resp.json()["requests"]
        except (httpx.HTTPError, ValueError, KeyError):
            return 0
        return sum(1 for r in held if r.get("stream"))

    def _streams_on(self, key: str, tries: int = 8) -> list[Stream]:
        """Long streams through the router until one is under way on `key` (the router
        picks the decode); every one started is judged (those elsewhere must complete)."""
        url = router_endpoint(self.cluster.pods(NAMESPACE, self.selector)).get(ROUTER)
        if url is None:
            return []
        started: list[Stream] = []
        for i in range(tries):
            s = Stream(url, f"drill stream {i} {time.time():.3f}", STREAM_TOKENS[self.engine])
            started.append(s.start())
            s.started.wait(60)
            held = self._held_streams(key)
            if held is None and i >= 1:
                self.note(f"{key} cannot list its requests: {i + 1} streams started, unsorted")
                return started
            if held:
                self.note(f"a long stream is under way on {key} ({i + 1} started)")
                return started
        self.note(f"no stream of {tries} landed on {key}")
        return started

    def _failover_checks(
        self, inc: Mapping[str, Any], streams: Sequence[Stream]
    ) -> list[tuple[bool, str]]:
        """What the users of the served model saw of the incident: every request caught
        by it ended 200, none waited long past the verdict, the stream it cut ended with
        a visible error, and the groups that stayed hold nothing of it afterwards."""
        assert self.traffic is not None
        r = self.result
        verdict_at = ts(inc.get("detectedTime")) or time.time()
        injected = r.injected_at or verdict_at
        drained = self.drained_at or verdict_at
        # Every request in flight ends (the client waits up to CLIENT_TIMEOUT_S).
        settled = self.traffic.quiesce(CLIENT_TIMEOUT_S + 10)
        for s in streams:
            s.join(CLIENT_TIMEOUT_S + 10)
        caught = [o for o in self.traffic.outcomes_between(0.0, drained) if o.ended_at > injected]
        waits = [o.ended_at - verdict_at for o in caught if o.ended_at > verdict_at]
        longest = round(max(waits, default=0.0), 2)
        caught_ok = sum(1 for o in caught if o.ok)
        # Not 200: an HTTP error the client saw, or no answer at all (a connection cut,
        # or the client's own two-minute limit).
        caught_error = sum(1 for o in caught if not o.ok and o.status is not None)
        caught_cut = sum(1 for o in caught if not o.ok and o.status is None)
        caught_failed = [
            f"{round(o.sent_at - injected, 2)}s: {o.error}" for o in caught if not o.ok
        ][:10]
        loads = self.loads()
        self.traffic.resume()
        mine = [s for s in streams if s.how is not None]
        cut = [s for s in mine if s.how != "completed"]
        figures = {
            "caught": len(caught),
            "caught_ok": caught_ok,
            "caught_error": caught_error,
            "caught_cut": caught_cut,
            "caught_failed": caught_failed,
            "longest_wait_past_verdict_s": longest,
            "streams": [
                {"how": s.how, "tokens": s.tokens, "finish": s.finish, "error": s.error}
                for s in streams
            ],
            "loads_before": self.idle_loads,
            "loads_after": loads,
        }
        r.failover.append(figures)
        bound = PAST_VERDICT_BOUND_S[self.engine]
        stayed = {k: v for k, v in loads.items() if k != AFFECTED}
        return [
            (settled, "requests still in flight two minutes after the incident"),
            (
                all(o.ok for o in caught),
                f"{len(caught) - caught_ok} of {len(caught)} request(s) caught by the "
                f"incident did not end 200: {caught_failed}",
            ),
            (
                longest <= bound,
                f"a request caught by the incident waited {longest}s past the verdict "
                f"(bound {bound}s)",
            ),
            (
                len(cut) == 1 and cut[0].how == "aborted" and len(mine) == len(streams),
                "the stream on decode/0 ended with the engine's abort event and every other "
                f"completed: {[s.how for s in streams]}",
            ),
            (
                all(stayed.get(k) == v for k, v in self.idle_loads.items() if k != AFFECTED),
                f"the groups that stayed hold what they held before: {self.idle_loads} -> {loads}",
            ),
        ]

    def _judge_incident(self, inc: dict[str, Any]) -> None:
        r = self.result
        if not inc:
            return
        r.verdict = inc["verdict"]
        r.restart_mode = inc.get("restartMode")
        detected = ts(inc.get("detectedTime"))
        if detected is not None and r.injected_at is not None:
            r.time_to_detect_s = round(detected - r.injected_at, 3)
        r.probe_time_to_detect_s = inc.get("timeToDetectSeconds")
        r.time_to_recover_s = inc.get("timeToRecoverSeconds")

    def _conclude(self, checks: list[tuple[bool, str]]) -> None:
        self._figures_now()
        if self.result.other_groups_failed:
            checks.append(
                (False, f"{self.result.other_groups_failed} requests to other groups failed")
            )
        failed = [why for ok, why in checks if not ok]
        self.result.passed = not failed
        self.result.reason = "; ".join(failed) or "expected outcome"

    def _figures_now(self) -> None:
        if self.traffic is not None:
            self._figures()

    # -------------------------------------------------------------- scenarios

    def _desync(self) -> None:
        self._expect_restart("Desynced", "desync")

    def _sequence(self) -> None:
        """A desync, then a hang, then a killed rank, in decode/0 of one cluster, each
        recovered (and judged) before the next: what the real engine's CI drill runs.

        The first is restarted in the deployment's mode; the group then fails again
        within `recovery.inPlace.escalationWindowSeconds` of an in-place restart, so (in
        InPlace mode) the next ones escalate to Recreate, as the design says."""
        checks: list[tuple[bool, str]] = []
        sequence = self.sequence or (SEQUENCE if self.engine == "sglang" else STANDIN_SEQUENCE)
        for i, (verdict, kind) in enumerate(sequence):
            self.note(f"next: {kind}")
            # A deleted pod cannot restart in place; the rest escalate (see above).
            mode: RecoveryMode = self.recovery_mode if i == 0 else "Recreate"
            step = self._restart_checks(verdict, kind, mode)
            self._figures_now()
            r = self.result
            r.steps.append(
                {
                    "fault": kind,
                    "verdict": r.verdict,
                    "restart_mode": r.restart_mode,
                    "time_to_detect_s": r.time_to_detect_s,
                    "time_to_recover_s": r.time_to_recover_s,
                    "phases": self._phases(),
                    "router_failed_before_drain": r.router_failed_before_drain,
                    "router_failed_after_drain": r.router_failed_after_drain,
                    "affected_received_while_drained": r.affected_received_while_drained,
                    "failover": r.failover[-1] if r.failover else None,
                    "passed": all(ok for ok, _ in step),
                }
            )
            failed_after = (
                r.router_failed_after_drain if self.router else r.affected_failed_after_drain
            )
            step.append((failed_after == 0, f"{failed_after} request(s) failed after the drain"))
            r.steps[-1]["passed"] = all(ok for ok, _ in step)
            checks += [(ok, f"{kind}: {why}") for ok, why in step]
            if not all(ok for ok, _ in step) and not self.keep_going:
                break
        self._conclude(checks)

    def _hang(self) -> None:
        self._expect_restart("Hung", "hang")

    def _rank_kill(self) -> None:
        self._expect_restart("RankDown", "kill-rank")

    def _pod_delete(self) -> None:
        # A pod that is gone cannot restart in place: the group is always recreated.
        self._expect_restart("RankDown", "delete-pod", mode="Recreate")

    def _ha(self) -> None:
        run_ha(self)

    def _restart_without_token(self) -> list[tuple[bool, str]]:
        """`POST /restart`, `GET /ranks` and `POST /stacks` to decode/0's agents with no
        token and a wrong one: refused (401), and nothing restarts."""
        counts = self.restart_counts(AFFECTED)
        role, index = AFFECTED.split("/")
        sel = f"{self.selector},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index}"
        answers = []
        reads = []
        for pod in self.cluster.pods(NAMESPACE, sel):
            base = agent_url(pod["status"]["podIP"])
            for headers in ({}, {"Authorization": "Bearer not-the-token"}):
                resp = httpx.post(
                    f"{base}/restart", json={"epoch": "99"}, headers=headers, timeout=5
                )
                answers.append(resp.status_code)
                # The rank states and the stacks are the operator's too.
                reads.append(httpx.get(f"{base}/ranks", headers=headers, timeout=5).status_code)
                reads.append(httpx.post(f"{base}/stacks", headers=headers, timeout=5).status_code)
        time.sleep(3)
        self.note(f"POST /restart without the token: {answers}; GET /ranks, POST /stacks: {reads}")
        return [
            (set(answers) == {401}, f"restart without the token answered {answers}, not 401"),
            (set(reads) == {401}, f"/ranks and /stacks without the token answered {reads}"),
            (self.restart_counts(AFFECTED) == counts, "nothing restarted on a refused request"),
            (self.group(AFFECTED).get("state") == "Healthy", "the group stayed Healthy"),
        ]

    def _agent_down(self) -> None:
        """A desync in a group whose rank-1 pod agent cannot answer (its pod's main
        process, which serves the agent, is stopped): the in-place restart escalates to
        recreating the group, whose new pods prefer other nodes than that pod's."""
        role, index = AFFECTED.split("/")
        refused = self._restart_without_token()
        sel = f"{self.selector},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index},{c.LABEL_RANK}=1"
        (pod,) = self.cluster.pods(NAMESPACE, sel)
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        assert self.cluster.kubelet is not None
        pid = self.cluster.kubelet.processes()[(NAMESPACE, name)]
        os.kill(pid, signal.SIGSTOP)
        self.note(f"stopped {name}'s main process (its pod agent) on {node}")
        self._expect_restart("Desynced", "desync", mode="Recreate")
        inc = self.incident(AFFECTED) or {}
        new = self.cluster.pods(NAMESPACE, sel.replace(f",{c.LABEL_RANK}=1", ""))
        avoided = [
            t["preference"]["matchFields"][0]["values"][0]
            for p in new
            for t in ((p["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
                "preferredDuringSchedulingIgnoredDuringExecution", []
            )
            if t["preference"].get("matchFields")
        ]
        more = [
            *refused,
            (
                "did not accept the restart" in str(inc.get("escalation")),
                f"escalated because the agent did not answer ({inc.get('escalation')})",
            ),
            (
                bool(new) and all(n == node for n in avoided) and len(avoided) == len(new),
                f"the new pods avoid {node} (avoided: {avoided})",
            ),
        ]
        if self.result.passed:
            self._conclude(more)
        else:
            self.result.reason += "; " + "; ".join(why for ok, why in more if not ok)

    def _slow(self) -> None:
        """Legitimately long steps on every rank of decode/0 (traffic flowing), each
        length of `slow_steps` in turn, under the default step bounds: no restart, no
        incident, no warning Event."""
        before = self.uids(AFFECTED)
        self.result.injected_at = time.time()
        checks: list[tuple[bool, str]] = []
        for step_s in self.slow_steps:
            warnings_before = self._warnings()
            restarts_before = int(self.group(AFFECTED).get("restarts", 0))
            incidents_before = self.incident_count(AFFECTED)
            started = time.time()
            self.inject("slow", step_seconds=step_s)
            # Two whole steps, and the first probes after them.
            deadline = started + max(20.0, 2 * step_s + 10)
            states: set[str] = set()
            failing: set[str] = set()  # each failed probe the status showed, by its time
            said: list[str] = []  # what the group's message said meanwhile
            while time.time() < deadline:
                self.poll()
                group = self.group(AFFECTED)
                states.add(str(group.get("state")))
                probe = group.get("lastProbe") or {}
                if probe.get("ok") is False:
                    failing.add(str(probe.get("time")))
                message = str(group.get("message") or "")[:120]
                if message and message not in said and len(said) < 4:
                    said.append(message)
                time.sleep(0.5)
            self.inject("none")
            # The step under way ends, then the group answers its probe again.
            self.wait(
                lambda: self.group(AFFECTED).get("state") == "Healthy",
                step_s + 60,
                f"decode/0 Healthy after the {step_s:g} s steps",
            )
            figures = {
                "step_s": step_s,
                "observed_s": round(time.time() - started, 1),
                "restarts": int(self.group(AFFECTED).get("restarts", 0)) - restarts_before,
                "warning_events": self._warnings() - warnings_before,
                "incidents": self.incident_count(AFFECTED) - incidents_before,
                "states": sorted(states),
                # The long steps were seen (probes failed) and judged, not missed.
                "failed_probes_seen": len(failing),
                "messages": said,
            }
            self.result.slow.append(figures)
            self.note(
                f"{step_s:g} s steps for {figures['observed_s']} s: states {figures['states']}, "
                f"{figures['restarts']} restart(s), {figures['warning_events']} warning Event(s)"
            )
            checks += [
                (figures["incidents"] == 0, f"no incident with {step_s:g} s steps"),
                (figures["restarts"] == 0, f"no group restart with {step_s:g} s steps"),
                (
                    figures["warning_events"] == 0,
                    f"{figures['warning_events']} warning Event(s) for a group that only ran "
                    f"{step_s:g} s steps",
                ),
            ]
        self.result.warning_events = sum(f["warning_events"] for f in self.result.slow)
        checks.append((self.uids(AFFECTED) == before, "no pod replaced"))
        self._conclude(checks)

    def _stuck_step(self) -> None:
        """A step that never ends on every rank of decode/0 (a wedged kernel or
        collective inside the step): Hung once no rank progressed for longer than the
        step bound (the deployment's stepBounds), then the usual restart."""
        self._conclude(self._restart_checks("Hung", "slow", step_seconds=3600.0))

    def _warnings(self) -> int:
        return sum(
            int(e.get("count") or 1)
            for e in self.cluster.events(NAMESPACE)
            if e.get("type") == "Warning" and (e.get("involvedObject") or {}).get("name") == NAME
        )

    def _flapping(self) -> None:
        self.result.injected_at = time.time()
        for attempt in range(1, 4):
            self.inject("desync")
            if attempt <= 2:

                def restarted(n: int = attempt) -> bool:
                    g = self.group(AFFECTED)
                    return int(g.get("restarts", 0)) >= n and g.get("state") == "Healthy"

                self.wait(restarted, self.timeout_s, f"restart {attempt} done")
                self.note(f"restart {attempt} of the budget (2) done; the group fails again")
        self.wait(lambda: self.group(AFFECTED).get("state") == "Quarantined", 90, "quarantine")
        self.note("decode/0 quarantined: budget spent, deployment Degraded, no restart storm")
        time.sleep(10)
        conditions = {x["type"]: x for x in self.status().get("conditions") or []}
        checks = [
            (self.group(AFFECTED).get("state") == "Quarantined", "the group stays quarantined"),
            (int(self.group(AFFECTED).get("restarts", 0)) == 2, "exactly the budget of restarts"),
            (conditions.get("Degraded", {}).get("status") == "True", "deployment Degraded"),
        ]
        checks += self._evictions_in_quarantine()
        inc = self.incident(AFFECTED) or {}
        if inc:
            self._judge_incident(inc)
        self._conclude(checks)

    def _evict(self, pod: Mapping[str, Any]) -> httpx.Response:
        """One eviction through the API (what `kubectl drain` asks for each pod)."""
        assert self.cluster.cp is not None
        meta = pod["metadata"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": NAMESPACE},
        }
        with self.cluster.cp.http_client() as http:
            return http.post(
                f"/api/v1/namespaces/{NAMESPACE}/pods/{meta['name']}/eviction", json=body
            )

    def _evictions_in_quarantine(self) -> list[tuple[bool, str]]:
        """A node drain meets a quarantined group: it has no disruption budget any more, so
        the eviction goes through (it serves nothing; a drain must not wait for a person),
        while a serving group's budget still refuses one. The group stays quarantined,
        not restarted."""
        serving = self._group_pods("decode/1")[0]
        refused = self._evict(serving)
        self.note(
            f"eviction of serving decode/1's {serving['metadata']['name']}: "
            f"HTTP {refused.status_code}"
        )
        victim = next(
            p for p in self._group_pods(AFFECTED) if p["metadata"]["labels"][c.LABEL_RANK] == "1"
        )
        victim_uid = victim["metadata"]["uid"]
        # 429 until the operator has deleted the group's budget (kubectl drain would retry
        # every 5 s).
        answers: list[httpx.Response] = []

        def evicted() -> bool:
            answers.append(self._evict(victim))
            return answers[-1].status_code in (200, 201)

        try:
            self.wait(evicted, 45, "the quarantined group's pod evicted")
        except TimeoutError:
            assert self.cluster.cp is not None
            with self.cluster.cp.http_client() as http:
                budget = http.get(
                    f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/drill-decode-0"
                ).json()
            last = answers[-1]
            return [
                (
                    False,
                    f"quarantined decode/0's pod not evicted: HTTP {last.status_code} "
                    f"{last.text[:300]}; its budget: {budget}",
                )
            ]
        self.note(
            f"eviction of quarantined decode/0's {victim['metadata']['name']}: "
            f"HTTP {answers[-1].status_code} after {len(answers)} attempt(s)"
        )
        self.wait(
            lambda: victim_uid not in {p["metadata"]["uid"] for p in self._group_pods(AFFECTED)},
            60,
            "the evicted pod gone",
        )
        time.sleep(5)  # a round or two: the operator must not restart the group
        group = self.group(AFFECTED)
        return [
            (refused.status_code == 429, f"serving group's eviction: HTTP {refused.status_code}"),
            (group.get("state") == "Quarantined", f"after the eviction: {group.get('state')}"),
            (int(group.get("restarts", 0)) == 2, "the eviction counted as a restart"),
        ]

    def _operator_crash(self) -> None:
        """SIGKILL the operator mid-recovery. Installed by the chart (the default), it is
        brought back by the kubelet (restartPolicy Always), nobody starts it; as a
        process (`operator="process"`) the drill starts it again, as a supervisor would."""
        operator = self.cluster.operator
        assert operator is not None
        self.result.injected_at = time.time()
        self.inject("desync")
        self.wait(
            lambda: self.records().get(AFFECTED, {}).get("step") in RESTARTING_STEPS,
            60,
            "the restart under way",
        )
        step = self.records()[AFFECTED]["step"]
        checks: list[tuple[bool, str]] = []
        if isinstance(operator, ChartOperator):
            pod = operator.pod()
            assert pod is not None
            uid, restarts = pod["metadata"]["uid"], restart_count(pod)
            pid = operator.kill()
            killed = time.time()
            self.note(
                f"operator container (pid {pid}) killed (SIGKILL) in step {step}; "
                "left to the kubelet and its Deployment"
            )
            back = self.wait(
                lambda: operator.ready_pod(restarts_at_least=restarts + 1),
                120,
                "the operator restarted by the kubelet",
            )
            self.note(
                f"operator back by itself in {time.time() - killed:.1f}s (container "
                f"restarts {restarts} -> {restart_count(back)}, same pod)"
            )
            checks.append(
                (
                    back["metadata"]["uid"] == uid and restart_count(back) == restarts + 1,
                    "the kubelet restarted the operator's container once, in the same pod",
                )
            )
        else:
            operator.kill()
            self.note(f"operator killed (SIGKILL) in step {step}; starting it again")
            time.sleep(2)
            operator.start()
        inc = self.wait(lambda: self.incident(AFFECTED), self.timeout_s, "recovery finished")
        self._judge_incident(inc)
        incidents = [
            i
            for i in self.status().get("incidents") or []
            if i["group"] == 0 and i["role"] == "decode"
        ]
        checks += [
            (int(self.group(AFFECTED)["restarts"]) == 1, "one restart, not two"),
            (int(self.group(AFFECTED)["epoch"]) == 1, "one new epoch"),
            (len(incidents) == 1, "one incident"),
        ]
        self._conclude(checks)

    # ------------------------------------------------------- maintenance drills

    def _nodes(self) -> dict[str, dict[str, Any]]:
        """Every node (as a dict) by name."""
        api = self.cluster.api
        items = self.cluster.core().list_node().items
        plain = [api.sanitize_for_serialization(n) for n in items]  # type: ignore[no-untyped-call]
        return {str(n["metadata"]["name"]): dict(n) for n in plain}

    def _prepare_nodes(self) -> None:
        """Label (and for node-drain, taint) the nodes before the deployment exists."""
        core = self.cluster.core()
        nodes = sorted(self._nodes())
        if self.scenario == "unplaceable":
            for n in nodes:
                core.patch_node(n, {"metadata": {"labels": {DRILL_CAPACITY: "yes"}}})
            self.note(f"every node labelled {DRILL_CAPACITY}=yes (decode pods require it)")
            return
        busy = {
            str(p.spec.node_name)
            for p in core.list_pod_for_all_namespaces().items
            if p.spec is not None and p.spec.node_name
        }
        pool = [n for n in nodes if n not in busy][:4]
        if len(pool) < 4:
            raise RuntimeError(f"need 4 idle nodes for the decode pool, have {pool}")
        for n in pool:
            core.patch_node(
                n,
                {
                    "metadata": {"labels": {DRILL_POOL: "decode"}},
                    "spec": {
                        "taints": [{"key": DRILL_POOL, "value": "decode", "effect": "NoSchedule"}]
                    },
                },
            )
        racks = {n: self.cluster.node_labels.get(n, {}).get(RACK_LABEL) for n in pool}
        self.note(f"decode pool (labelled and tainted): {racks}")

    def _serving(self, key: str) -> bool:
        """A rank-0 pod of the group is Ready (admitted) and not being deleted."""
        role, index = key.split("/")
        sel = f"{self.selector},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index},{c.LABEL_RANK}=0"
        for pod in self.cluster.pods(NAMESPACE, sel):
            if pod["metadata"].get("deletionTimestamp"):
                continue
            for cond in (pod.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    return True
        return False

    def _group_pods(self, key: str) -> list[dict[str, Any]]:
        role, index = key.split("/")
        sel = f"{self.selector},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index}"
        return [
            p
            for p in self.cluster.pods(NAMESPACE, sel)
            if not p["metadata"].get("deletionTimestamp")
        ]

    def _node_drain(self) -> None:
        """`kubectl drain` the node of one pod of decode/0, with traffic through the router:
        the eviction API refuses the serving group's pods (its disruption budget), the
        operator moves the group make-before-break, and the drain then completes."""
        pods = self._group_pods(AFFECTED)
        follower = next(p for p in pods if p["metadata"]["labels"].get(c.LABEL_RANK) == "1")
        node = str(follower["spec"]["nodeName"])
        old_nodes = sorted({str(p["spec"]["nodeName"]) for p in pods})
        epoch = int(self.group(AFFECTED).get("epoch", 0))
        restarts = int(self.group(AFFECTED).get("restarts", 0))
        assert self.cluster.cp is not None
        self.result.injected_at = self.first_injection = time.time()
        self.drained_at = None
        with start_drain(self.cluster.cp.kubeconfig, node, timeout_s=240) as drain:
            self.note(f"kubectl drain {node} (decode/0 on {old_nodes}); traffic continues")
            self.wait(lambda: not drain.running, 280, "kubectl drain to finish")
            done = drain.wait(5)
        self.note(f"kubectl drain exited {done.returncode} after {done.seconds:.1f}s")
        inc = self.wait(
            lambda: next(
                (
                    i
                    for i in self.status().get("incidents") or []
                    if _group_key(i) == AFFECTED and i["state"] == "Closed"
                ),
                None,
            ),
            120,
            "the maintenance incident closed",
        )
        self.wait(lambda: self.group(AFFECTED).get("state") == "Healthy", 60, "decode/0 Healthy")
        time.sleep(2)  # requests sent during the move finish (or fail) before counting
        moved = self._group_pods(AFFECTED)
        new_nodes = sorted({str(p["spec"]["nodeName"]) for p in moved})
        node_racks = {
            name: (n["metadata"].get("labels") or {}).get(RACK_LABEL)
            for name, n in self._nodes().items()
        }
        racks = {node_racks.get(n) for n in new_nodes}
        out = _out_of_service(self.serving)
        assert self.traffic is not None
        failed = [o for o in self.traffic.failures() if o.sent_at >= self.result.injected_at]
        hanging = [o for o in failed if o.latency_s >= self.traffic.timeout_s - 0.1]
        sent = self.traffic.stats(self.result.injected_at).get(ROUTER)
        self.result.maintenance = {
            "node": node,
            "drain_exit_code": done.returncode,
            "cordon_to_drain_complete_s": round(done.seconds, 2),
            "evicted": list(done.evicted),
            "old_nodes": old_nodes,
            "new_nodes": new_nodes,
            "new_racks": sorted(r or "" for r in racks),
            "epoch": [epoch, int(self.group(AFFECTED).get("epoch", 0))],
            "out_of_service_s": round(out, 2),
            "requests_sent": sent.sent if sent else 0,
            "requests_failed": len(failed),
            "requests_hanging": len(hanging),
            "incident_verdict": inc.get("verdict"),
            "incident_action": inc.get("action"),
            "restarts": [restarts, int(self.group(AFFECTED).get("restarts", 0))],
        }
        self.note(f"maintenance figures: {json.dumps(self.result.maintenance)}")
        self._conclude(
            [
                (done.returncode == 0, f"kubectl drain failed: {done.output[-400:]}"),
                (node not in new_nodes, f"decode/0 still on the drained node {node}"),
                (len(racks) == 1, f"decode/0's new pods span racks {racks}"),
                (inc.get("verdict") == "Maintenance", f"incident verdict {inc.get('verdict')}"),
                (
                    "make-before-break" in str(inc.get("action")),
                    f"not moved make-before-break: {inc.get('action')}",
                ),
                (out == 0.0, f"decode/0 out of service for {out:.2f}s"),
                (not failed, f"{len(failed)} request(s) failed during the move"),
                (
                    int(self.group(AFFECTED).get("restarts", 0)) == restarts,
                    "the move counted as a restart",
                ),
            ]
        )

    def _unplaceable(self) -> None:
        """The nodes lose the label decode pods require, then decode/0 is restarted
        (Recreate): its next epoch cannot be placed, is withdrawn whole after
        schedulingTimeoutSeconds and retried; once a node has the label again, it comes up."""
        core = self.cluster.core()
        nodes = sorted(self._nodes())
        for n in nodes:
            core.patch_node(n, {"metadata": {"labels": {DRILL_CAPACITY: None}}})
        self.note(f"label {DRILL_CAPACITY} removed from every node; restarting decode/0")
        self.result.injected_at = self.first_injection = time.time()
        self.cluster.custom().patch_namespaced_custom_object(
            c.GROUP,
            c.VERSION,
            NAMESPACE,
            c.PLURAL,
            NAME,
            {"metadata": {"annotations": {ANNOTATION_RESTART: "decode/0@unplaceable-1"}}},
        )
        self.wait(
            lambda: self.group(AFFECTED).get("state") == "Unschedulable",
            120,
            "decode/0 Unschedulable (its epoch withdrawn)",
        )
        withdrawn = time.time() - self.result.injected_at
        left = self._group_pods(AFFECTED)
        schedulable: dict[str, Any] = next(
            (x for x in self.status().get("conditions") or [] if x["type"] == "Schedulable"), {}
        )
        events = [
            e for e in self.cluster.events(NAMESPACE) if e.get("reason") == "GroupUnschedulable"
        ]
        self.note(f"withdrawn after {withdrawn:.1f}s: {schedulable.get('message')}")
        for n in nodes[:2]:
            core.patch_node(n, {"metadata": {"labels": {DRILL_CAPACITY: "yes"}}})
        back_at = time.time()
        self.note(f"{DRILL_CAPACITY}=yes on {nodes[:2]} again")
        self.wait(lambda: self.group(AFFECTED).get("state") == "Healthy", 120, "decode/0 Healthy")
        placed = time.time() - back_at
        self.result.maintenance = {
            "restart_to_withdrawn_s": round(withdrawn, 2),
            "capacity_to_healthy_s": round(placed, 2),
            "pods_left_when_withdrawn": len(left),
            "schedulable_condition": schedulable,
            "unschedulable_events": len(events),
            "event_message": (events[0].get("message") if events else None),
            "restarts": int(self.group(AFFECTED).get("restarts", 0)),
        }
        msg = str(schedulable.get("message"))
        self._conclude(
            [
                (not left, f"{len(left)} pod(s) of decode/0 left after the withdrawal"),
                (schedulable.get("status") == "False", f"Schedulable condition {schedulable}"),
                ("affinity" in msg or "selector" in msg, f"no scheduler reason in {msg!r}"),
                (bool(events), "no GroupUnschedulable Event"),
                (self.result.maintenance["restarts"] == 1, "the withdrawals counted as restarts"),
            ]
        )

    # ----------------------------------------------------------- scale drill

    def _kubectl_scale(self, role: str, replicas: int) -> None:
        assert self.cluster.cp is not None
        argv = kubectl_argv(
            self.cluster.cp.kubeconfig,
            "-n",
            NAMESPACE,
            "scale",
            f"pdrolescale/{NAME}-{role}",
            f"--replicas={replicas}",
        )
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl scale failed: {done.stderr.strip()}")
        self.note(f"kubectl scale pdrolescale/{NAME}-{role} --replicas={replicas}")

    def _has_healthy_groups(self, role: str, count: int) -> Callable[[], bool]:
        def check() -> bool:
            groups = self._groups(role)
            return len(groups) == count and all(
                g.get("state") == "Healthy" for g in groups.values()
            )

        return check

    def _removed(self, role: str, count: int, gone: Sequence[str]) -> Callable[[], bool]:
        def check() -> bool:
            return len(self._groups(role)) == count and not any(self._group_pods(k) for k in gone)

        return check

    def _groups(self, role: str) -> dict[int, dict[str, Any]]:
        return {int(g["index"]): g for g in (self.status().get(role) or {}).get("groups") or []}

    def _scale(self) -> None:
        """Scale decode 2 -> 3 -> 1 and prefill 1 -> 2 -> 1 through their PDRoleScales
        (`kubectl scale`, as an autoscaler would), with traffic through the router: no
        request fails; a new group gets requests only after its deep probe passed (its
        readiness gate); a removed group gets none after it left the routers."""
        assert self.traffic is not None
        checks: list[tuple[bool, str]] = []
        self.result.injected_at = self.first_injection = time.time()
        for role, up, down in (("decode", 3, 1), ("prefill", 2, 1)):
            before = len(self._groups(role))
            started = time.time()
            self._kubectl_scale(role, up)
            new = [f"{role}/{g}" for g in range(before, up)]
            self.wait(self._has_healthy_groups(role, up), 180, f"{role} up to {up}, Healthy")
            up_s = time.time() - started
            self.wait(self.router_routes_everywhere, 60, "the router routing to every group")
            time.sleep(3)  # traffic reaches the new groups
            arrivals = request_log_arrivals(self.workdir / "kubelet", NAMESPACE, NAME)
            early = 0
            for key in new:
                admitted = self.readmission_time(key)
                r, i = key.split("/")
                mine = [a for a in arrivals if a.role == r and a.group == int(i)]
                if admitted is None:
                    checks.append((False, f"{key}: no admission time"))
                    continue
                # Whole seconds (the condition's time): a request in the same second counts.
                early += sum(1 for a in mine if a.at < admitted)
                checks.append((any(a.at >= admitted for a in mine), f"{key} got no requests"))
            started = time.time()
            self._kubectl_scale(role, down)
            gone = [f"{role}/{g}" for g in range(down, up)]
            self.wait(self._removed(role, down, gone), 180, f"{role} scaled down to {down}")
            down_s = time.time() - started
            time.sleep(2)
            arrivals = request_log_arrivals(self.workdir / "kubelet", NAMESPACE, NAME)
            late = 0
            for key in gone:
                since = self.retiring_since.get(key)
                if since is None:
                    checks.append((False, f"{key} was never seen Retiring"))
                    continue
                r, i = key.split("/")
                # One second of slack: requests the router sent before the group left it.
                late += sum(
                    1 for a in arrivals if a.role == r and a.group == int(i) and a.at > since + 1
                )
            failed = [o for o in self.traffic.failures() if o.sent_at >= self.first_injection]
            entry = {
                "role": role,
                "scaled": [before, up, down],
                "scale_up_to_healthy_s": round(up_s, 2),
                "scale_down_to_gone_s": round(down_s, 2),
                "requests_to_new_groups_before_admission": early,
                "requests_to_removed_groups_after_drain": late,
                "requests_failed_so_far": len(failed),
            }
            self.result.scaling.append(entry)
            self.note(f"scaling figures: {json.dumps(entry)}")
            checks += [
                (early == 0, f"{role}: {early} request(s) reached a new group before admission"),
                (late == 0, f"{role}: {late} request(s) reached a removed group after its drain"),
                (not failed, f"{len(failed)} request(s) failed"),
            ]
        sent = self.traffic.stats(self.first_injection).get(ROUTER)
        self.result.maintenance = {"requests_sent": sent.sent if sent else 0}
        self._conclude(checks)

    def _baseline(self) -> None:
        """Without lockstep's guard and recovery a desynced group stays wedged."""
        self.result.injected_at = time.time()
        self.inject("desync")
        window = 60.0
        end = time.time() + window
        while time.time() < end:
            self.poll()
            time.sleep(0.5)
        assert self.traffic is not None
        s = self.traffic.stats(self.result.injected_at + 10).get(AFFECTED)
        self.note(f"after {window:.0f}s decode/0 still fails every request; nobody restarted it")
        checks = [
            (
                s is not None and s.sent > 0 and s.ok == 0,
                "the wedged group failed every request after the first 10 s",
            ),
            (int(self.group(AFFECTED).get("restarts", 0)) == 0, "nothing restarted it"),
        ]
        self._conclude(checks)

    def _concurrent(self) -> None:
        self.result.injected_at = time.time()
        self.inject("desync", "decode/0")
        self.inject("desync", "decode/1")
        self.wait(
            lambda: all(self.incident(k) for k in ("decode/0", "decode/1")),
            self.timeout_s * 2,
            "both decode groups recovered",
        )
        injected = self.result.injected_at or 0.0
        both = [
            s
            for at, s in self.samples
            if at >= injected
            and sum(s.get(k) in RESTARTING_STEPS for k in ("decode/0", "decode/1")) > 1
        ]
        reasons = {e.get("reason") for e in self.cluster.events(NAMESPACE)}
        if both:
            self.note(f"two groups restarting at once: {both[0]}")
        self._judge_incident(self.incident("decode/0") or {})
        checks = [
            (not both, "never two decode groups restarting at once"),
            ("RestartDeferred" in reasons, "the second restart was deferred"),
            (
                int(self.group("decode/0")["epoch"]) == 1
                and int(self.group("decode/1")["epoch"]) == 1,
                "both groups restarted once",
            ),
        ]
        self._conclude(checks)


def _required_node_terms(expression: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [dict(expression)]}]
        }
    }


def _out_of_service(samples: Sequence[tuple[float, bool]]) -> float:
    """Seconds without a serving leader, from (time, serving) samples."""
    total = 0.0
    for (at, serving), (nxt, _) in itertools.pairwise(samples):
        if not serving:
            total += nxt - at
    if samples and not samples[-1][1]:
        total += 1e-3  # ended out of service: never 0
    return total


def run_drill(scenario: str, **kw: Any) -> DrillResult:
    """Run one scenario on a fresh local cluster."""
    return Drill(scenario, **kw).run()


__all__ = ["SCENARIOS", "Drill", "DrillResult", "run_drill"]

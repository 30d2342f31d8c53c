"""lockstep's drain and re-admission in the real sglang-router's worker registry.

A real router (PD mode, the `sglang-router` wheel) in front of real stand-in pods (one
prefill, two decode); `lockstep.clients.router_workers` admits them, drains one decode pod and
admits it back. What a user would notice is checked from the pods' own request logs:
while drained, the pod receives nothing and every request still succeeds. The operator's
level-triggered sweep (`RouterManager.sweep`) runs against the same real router: a
dead pod's worker, which the router itself keeps, is removed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dist_support import wait_until
from factories import pdd_obj
from test_standin import HTTP_PORT, Launcher, StandinPod, launcher

from lockstep.api import constants as c
from lockstep.api.models import parse_pddeployment
from lockstep.clients.agent_client import AgentClient
from lockstep.clients.router_workers import RouterBook, RouterWorker, admit_workers, drain_workers
from lockstep.execute import Deps, Execution
from lockstep_standin.protocol import expected_text

__all__ = ["launcher"]  # the fixture, used by name

BOOTSTRAP_PORT = 8998


def start_pod(launcher: Launcher, mode: str, index: int) -> StandinPod:
    argv = [
        "--model-path", "/models/tiny", "--disaggregation-mode", mode, "--tp-size", "1",
        "--host", "0.0.0.0", "--port", str(HTTP_PORT),
        "--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT), "--served-model-name", "tiny",
    ]  # fmt: skip
    ip = f"{launcher.net}.{50 + index}"
    return launcher.pod(ip, argv, {"LOCKSTEP_STANDIN_REQUEST_TIMEOUT_S": "5"}, f"m-{mode}-{index}")


@pytest.fixture
def router(launcher: Launcher, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """The real router, PD mode, no static workers (extra flags: an indirect parameter);
    yields its base URL."""
    ip = f"{launcher.net}.70"
    log = tmp_path / "router.log"
    argv = [
        sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
        "--policy", "round_robin", "--host", ip, "--port", str(c.PORT_ROUTER),
        "--prometheus-host", ip, "--prometheus-port", str(c.PORT_ROUTER_METRICS),
        *getattr(request, "param", ()),
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://{ip}:{c.PORT_ROUTER}"
    try:

        def up() -> bool:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{base}/workers", timeout=1).status_code == 200
            return False

        wait_until(up, 60, "the router serving", step=0.2)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def received_since(pod: StandinPod, since: float) -> int:
    path = pod.pod_dir / "requests.jsonl"
    if not path.exists():
        return 0
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return sum(1 for e in events if e["event"] == "received" and e["at"] >= since)


def send(http: httpx.Client, base: str, n: int) -> list[int]:
    codes = []
    for i in range(n):
        prompt = f"through the router {i} {time.time()}"
        body: dict[str, Any] = {"text": prompt, "sampling_params": {"max_new_tokens": 4}}
        response = http.post(f"{base}/generate", json=body, timeout=20)
        codes.append(response.status_code)
        if response.status_code == 200:
            assert response.json()["text"] == expected_text(prompt, 4)
    return codes


def serving(pod: StandinPod) -> bool:
    assert pod.proc.poll() is None, pod.output()[-3000:]
    with contextlib.suppress(httpx.HTTPError):
        return pod.get("/health", timeout=2).status_code == 200
    return False


def worker(pod: StandinPod, kind: str) -> RouterWorker:
    return RouterWorker(
        f"http://{pod.ip}:{HTTP_PORT}", kind, BOOTSTRAP_PORT if kind == "prefill" else None
    )


def three_healthy(http: httpx.Client, router: str) -> bool:
    listed = http.get(f"{router}/workers", timeout=2).json()["workers"]
    return len(listed) == 3 and all(w["is_healthy"] for w in listed)


def admitted_pd_pods(launcher: Launcher, router: str) -> tuple[StandinPod, list[StandinPod]]:
    """One prefill and two decode stand-ins, serving, admitted to the router and listed
    healthy there."""
    prefill = start_pod(launcher, "prefill", 0)
    decode = [start_pod(launcher, "decode", 1), start_pod(launcher, "decode", 2)]
    http = launcher.http
    for pod in (prefill, *decode):
        wait_until(lambda p=pod: serving(p), 60, f"{pod.ip} serving", step=0.2)
    everyone = [worker(prefill, "prefill"), *(worker(d, "decode") for d in decode)]
    assert admit_workers(http, [router], everyone) == []
    wait_until(lambda: three_healthy(http, router), 30, "three healthy workers", step=0.2)
    return prefill, decode


@pytest.mark.timeout(180)
def test_a_drained_decode_pod_gets_no_request_until_it_is_admitted_again(
    launcher: Launcher, router: str
) -> None:
    _, decode = admitted_pd_pods(launcher, router)
    http = launcher.http
    start = time.time()
    assert send(http, router, 10) == [200] * 10
    assert received_since(decode[0], start) > 0 and received_since(decode[1], start) > 0

    assert drain_workers(http, [router], [worker(decode[1], "decode")]) == []
    drained = time.time()
    assert send(http, router, 10) == [200] * 10
    assert received_since(decode[1], drained) == 0
    assert received_since(decode[0], drained) == 10
    # Draining again (a retried round) finds nothing to do and says nothing is wrong.
    assert drain_workers(http, [router], [worker(decode[1], "decode")]) == []

    assert admit_workers(http, [router], [worker(decode[1], "decode")]) == []
    wait_until(lambda: three_healthy(http, router), 30, "the decode pod back", step=0.2)
    back = time.time()
    assert send(http, router, 10) == [200] * 10
    assert received_since(decode[1], back) > 0


def pod_object(name: str, ip: str, labels: dict[str, str], gate: bool | None) -> dict[str, Any]:
    """A pod as the operator's cache holds it (only what the sweep reads)."""
    conditions = [] if gate is None else [{"type": c.READINESS_GATE, "status": str(gate)}]
    return {
        "metadata": {"name": name, "labels": {c.LABEL_DEPLOYMENT: "m", **labels}},
        "status": {"podIP": ip, "conditions": conditions},
    }


@pytest.mark.timeout(180)
def test_the_operators_sweep_removes_a_dead_pods_worker_the_router_keeps(
    launcher: Launcher, router: str
) -> None:
    prefill, decode = admitted_pd_pods(launcher, router)
    http = launcher.http

    def listed() -> set[str]:
        return {str(w["url"]) for w in http.get(f"{router}/workers", timeout=2).json()["workers"]}

    # decode[1]'s pod dies and is gone from the cluster; the router keeps its worker
    # (it only marks it unhealthy) and keeps trying it.
    os.killpg(decode[1].proc.pid, signal.SIGKILL)
    decode[1].proc.wait(10)
    time.sleep(2)
    assert worker(decode[1], "decode").url in listed()

    router_ip = router.removeprefix("http://").split(":")[0]
    rank0 = {c.LABEL_RANK: "0"}
    pods = [
        pod_object("m-router-x", router_ip, {c.LABEL_COMPONENT: "router"}, None),
        pod_object("m-prefill-0-0", prefill.ip, {c.LABEL_ROLE: "prefill", **rank0}, True),
        # Re-admitted in this very round: the cache still shows the gate False.
        pod_object("m-decode-0-0", decode[0].ip, {c.LABEL_ROLE: "decode", **rank0}, False),
    ]
    events: list[tuple[str, str, str]] = []
    exe = Execution(
        Deps(kube=None, agents=AgentClient(http), metrics=None),  # type: ignore[arg-type]
        parse_pddeployment(pdd_obj()),
        "ns",
        lambda kind, reason, message: events.append((kind, reason, message)),
        pods,
        routers=RouterBook(gates={"m-decode-0-0": True}),
    )
    gone = worker(decode[1], "decode").url
    assert exe.routers.sweep().removed == [(router, gone)]
    assert [(k, r) for k, r, _ in events] == [("Normal", "RouterWorkerRemoved")]
    assert gone in events[0][2]
    wait_until(lambda: gone not in listed(), 10, "the dead worker gone from the router", step=0.2)
    assert listed() == {worker(prefill, "prefill").url, worker(decode[0], "decode").url}
    start = time.time()
    assert send(http, router, 10) == [200] * 10
    assert received_since(decode[0], start) == 10
    # Swept again: nothing left to remove, nothing said.
    swept = exe.routers.sweep()
    assert swept.removed == [] and swept.added == [] and len(events) == 1


def job_status(http: httpx.Client, router: str, worker_id: str) -> str | None:
    status = http.get(f"{router}/workers/{worker_id}", timeout=2).json().get("job_status")
    return None if status is None else str(status["status"])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("router", [["--worker-startup-timeout-secs", "3"]], indirect=True)
def test_the_sweep_registers_again_an_admitted_pod_whose_registration_failed(
    launcher: Launcher, router: str
) -> None:
    """`POST /workers` only queues a registration; the router contacts the worker and,
    when that fails, registers nothing. An admitted pod the router does not list gets no
    request until the operator's sweep registers it again."""
    prefill, decode = admitted_pd_pods(launcher, router)
    http = launcher.http
    lost = worker(decode[1], "decode")
    assert drain_workers(http, [router], [lost]) == []
    # Re-admitted while its server cannot answer (stopped, as a process starved of CPU
    # would be): the router's registration job fails.
    os.killpg(decode[1].proc.pid, signal.SIGSTOP)
    jobs: dict[tuple[str, str], str] = {}
    try:
        assert admit_workers(http, [router], [lost], jobs) == []
        worker_id = jobs[(router, lost.url)]
        router_ip = router.removeprefix("http://").split(":")[0]
        rank0 = {c.LABEL_RANK: "0"}
        pods = [
            pod_object("m-router-x", router_ip, {c.LABEL_COMPONENT: "router"}, None),
            pod_object("m-prefill-0-0", prefill.ip, {c.LABEL_ROLE: "prefill", **rank0}, True),
            pod_object("m-decode-0-0", decode[0].ip, {c.LABEL_ROLE: "decode", **rank0}, True),
            pod_object("m-decode-1-0", decode[1].ip, {c.LABEL_ROLE: "decode", **rank0}, True),
        ]
        events: list[tuple[str, str, str]] = []
        exe = Execution(
            Deps(kube=None, agents=AgentClient(http), metrics=None),  # type: ignore[arg-type]
            parse_pddeployment(pdd_obj()),
            "ns",
            lambda kind, reason, message: events.append((kind, reason, message)),
            pods,
            routers=RouterBook(jobs=jobs),
        )
        # While the registration is still under way, the sweep leaves it alone.
        assert job_status(http, router, worker_id) in ("pending", "processing")
        swept = exe.routers.sweep()
        assert swept.added == [] and swept.removed == [] and events == []
        wait_until(
            lambda: job_status(http, router, worker_id) == "failed",
            60,
            "the router's registration job failed",
            step=0.2,
        )
    finally:
        os.killpg(decode[1].proc.pid, signal.SIGCONT)
    listed = {str(w["url"]) for w in http.get(f"{router}/workers", timeout=2).json()["workers"]}
    assert lost.url not in listed
    start = time.time()
    assert send(http, router, 6) == [200] * 6
    assert received_since(decode[1], start) == 0  # admitted, yet it gets nothing

    swept = exe.routers.sweep()
    assert [(b, u) for b, u, _ in swept.added] == [(router, lost.url)]
    assert swept.added[0][2].startswith("its registration failed")
    assert [(k, r) for k, r, _ in events] == [("Warning", "RouterWorkerAdded")]
    assert lost.url in events[0][2]
    wait_until(lambda: three_healthy(http, router), 30, "the decode pod registered", step=0.2)
    start = time.time()
    assert send(http, router, 10) == [200] * 10
    assert received_since(decode[1], start) > 0
    # Listed now: a later sweep has nothing to add.
    assert exe.routers.sweep().added == [] and len(events) == 1


@pytest.mark.timeout(30)
def test_an_unreachable_router_is_reported_not_raised() -> None:
    with httpx.Client() as http:
        gone = ["http://127.0.0.1:9"]  # discard port: nothing listens
        drain = drain_workers(http, gone, [RouterWorker("http://10.0.0.9:30000", "decode")])
        admit = admit_workers(http, gone, [RouterWorker("http://10.0.0.9:30000", "decode")])
    assert len(drain) == 1 and "127.0.0.1:9" in drain[0]
    assert len(admit) == 1 and "10.0.0.9" in admit[0]

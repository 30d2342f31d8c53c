"""The operator (a real `lockstep operator` process) against the real local API server.

Pods are played by `FakeKubelet` + `FakePod` (probe route and pod agent on loopback
addresses), so these tests see exactly what an on-call engineer would: objects, status,
conditions, Events, incidents.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import (
    GROUP,
    PLURAL,
    REPO,
    VERSION,
    FakeKubelet,
    OperatorProcess,
    wait_for,
)
from kubernetes import client as k8s

from lockstep_dev.localcluster.controlplane import LocalControlPlane

NAME = "qwen-small"


@dataclass
class Env:
    ns: str
    api: k8s.ApiClient
    core: k8s.CoreV1Api
    custom: k8s.CustomObjectsApi
    kubelet: FakeKubelet
    operator: OperatorProcess

    def pdd(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, NAME
        )
        return obj

    def status(self) -> dict[str, Any]:
        return dict(self.pdd().get("status") or {})

    def group(self, role: str, index: int) -> dict[str, Any]:
        groups = (self.status().get(role) or {}).get("groups") or []
        return next((g for g in groups if g["index"] == index), {})

    def pods(self, selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.ns, label_selector=selector).items)

    def events(self) -> list[tuple[str, str]]:
        return [(e.reason, e.message) for e in self.core.list_namespaced_event(self.ns).items]


@pytest.fixture
def env(controlplane: LocalControlPlane, namespace: str, tmp_path: Path) -> Iterator[Env]:
    # The session control plane has the CRD from its start, so the garbage collector
    # knows the kind at once (a CRD installed later takes it up to a minute).
    cp, ns = controlplane, namespace
    api = cp.api_client()
    kubelet = FakeKubelet(api, ns).start()
    operator = OperatorProcess(cp.kubeconfig, ns, tmp_path / "operator.log").start()
    e = Env(ns, api, k8s.CoreV1Api(api), k8s.CustomObjectsApi(api), kubelet, operator)
    try:
        yield e
    finally:
        operator.stop()
        kubelet.stop()
        print(operator.log_tail())


def apply_small(e: Env, annotations: dict[str, str] | None = None, **spec: Any) -> None:
    """pd-small with a decode group spanning two pods, fast probes and no backoff."""
    obj = yaml.safe_load((REPO / "examples/pd-small.yaml").read_text())
    obj["metadata"]["namespace"] = e.ns
    if annotations:
        obj["metadata"].setdefault("annotations", {}).update(annotations)
    obj["spec"]["decode"].update({"podsPerGroup": 2, "gpusPerPod": 1})
    # FakeKubelet plays these pods: keep the scheduler from binding them to the nodes of
    # a ProcessKubelet another test module registered (their deletion would evict them).
    for role in ("prefill", "decode"):
        obj["spec"][role]["nodeSelector"] = {"lockstep.dev/test-node": "fake-kubelet"}
    obj["spec"]["health"] = {
        "periodSeconds": 1,
        "timeoutSeconds": 1,
        "failureThreshold": 2,
        "startupGraceSeconds": 60,
    }
    obj["spec"]["recovery"] = {"backoff": {"baseSeconds": 0, "maxSeconds": 0}}
    obj["spec"].update(spec)
    e.custom.create_namespaced_custom_object(GROUP, VERSION, e.ns, PLURAL, obj)


def healthy(e: Env) -> bool:
    st = e.status()
    return st.get("prefillReady") == "1/1" and st.get("decodeReady") == "1/1"


DECODE = "lockstep.dev/role=decode"


@pytest.mark.timeout(180)
def test_apply_creates_groups_router_and_reports_ready(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    pods = {p.metadata.name: p for p in env.pods("lockstep.dev/deployment=qwen-small")}
    assert {"qwen-small-prefill-0-0", "qwen-small-decode-0-0", "qwen-small-decode-0-1"} <= set(pods)
    args = pods["qwen-small-decode-0-1"].spec.containers[0].args
    assert args[args.index("--node-rank") + 1] == "1"
    assert args[args.index("--nnodes") + 1] == "2"
    assert args[args.index("--dist-init-addr") + 1].startswith(
        f"qwen-small-decode-0-0.qwen-small-decode-0.{env.ns}.svc:"
    )
    # The readiness gate admits every pod of a healthy group.
    for pod in pods.values():
        if pod.metadata.labels.get("lockstep.dev/rank") is None:
            continue
        gate = [c for c in pod.status.conditions if c.type == "lockstep.dev/group-healthy"]
        assert gate and gate[0].status == "True", pod.metadata.name
    svc = env.core.read_namespaced_service("qwen-small-decode-0", env.ns)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses is True
    apps = k8s.AppsV1Api(env.api)
    assert apps.read_namespaced_deployment("qwen-small-router", env.ns).spec.replicas == 1
    st = env.status()
    conditions = {c["type"]: c["status"] for c in st["conditions"]}
    assert conditions["Ready"] == "True" and conditions["Degraded"] == "False"
    assert "--tp-size" in st["decode"]["effectiveArgs"]
    assert st["observedGeneration"] == env.pdd()["metadata"]["generation"]


@pytest.mark.timeout(180)
def test_desync_restarts_every_container_of_the_group_in_place_in_a_new_epoch(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    before = {p.metadata.name: p.metadata.uid for p in env.pods(DECODE)}
    for fake in env.kubelet.fakes(DECODE):
        fake.set_mode("desync")
    wait_for(lambda: env.group("decode", 0).get("epoch") == 1, 60, "decode epoch 1")
    wait_for(lambda: env.group("decode", 0).get("state") == "Healthy", 60, "decode re-admitted")
    pods = env.pods(DECODE)
    assert {p.metadata.name: p.metadata.uid for p in pods} == before  # the same pods...
    assert {env.kubelet.restarts.get(uid) for uid in before.values()} == {1}  # ...restarted once
    assert all(p.status.container_statuses[0].restart_count == 1 for p in pods)
    assert all(p.metadata.labels["lockstep.dev/epoch"] == "1" for p in pods)
    assert all(fake.epoch == 1 for fake in env.kubelet.fakes(DECODE))
    (incident,) = env.status()["incidents"]
    assert incident["state"] == "Closed" and "InPlace" in incident["action"]
    reasons = [r for r, _ in env.events()]
    assert "GroupRestartingInPlace" in reasons and "GroupRestartEscalated" not in reasons
    # The group's Service follows the epoch (selector and rendezvous port).
    svc = env.core.read_namespaced_service("qwen-small-decode-0", env.ns)
    assert svc.spec.selector["lockstep.dev/epoch"] == "1"


@pytest.mark.timeout(180)
def test_an_agent_that_cannot_restart_escalates_to_new_pods(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    before = {p.metadata.uid for p in env.pods(DECODE)}
    refusing = env.core.read_namespaced_pod("qwen-small-decode-0-1", env.ns)
    for fake in env.kubelet.fakes(DECODE):
        fake.set_mode("desync")
        fake.refuse_restart = fake.ip == refusing.status.pod_ip
    wait_for(lambda: env.group("decode", 0).get("epoch") == 2, 60, "decode epoch 2")
    wait_for(lambda: env.group("decode", 0).get("state") == "Healthy", 60, "decode re-admitted")
    pods = env.pods(DECODE)
    assert len(pods) == 2 and not {p.metadata.uid for p in pods} & before  # recreated
    # (Fake pods are never bound to a node: the anti-affinity is checked end to end.)
    (incident,) = env.status()["incidents"]
    assert "escalated" in incident["action"] and "HTTP 503" in incident["action"]
    assert incident["state"] == "Closed"
    assert env.group("decode", 0)["restarts"] == 1  # one restart, escalated
    messages = [m for r, m in env.events() if r == "GroupRestartEscalated"]
    assert messages and "qwen-small-decode-0-1" in messages[0]


@pytest.mark.timeout(180)
def test_desync_in_recreate_mode_replaces_the_whole_group_in_a_new_epoch(env: Env) -> None:
    apply_small(env, recovery={"mode": "Recreate", "backoff": {"baseSeconds": 0, "maxSeconds": 0}})
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    before = {p.metadata.name: p.metadata.uid for p in env.pods(DECODE)}
    prefill_uid = env.pods("lockstep.dev/role=prefill")[0].metadata.uid
    for fake in env.kubelet.fakes(DECODE):
        fake.set_mode("desync")
    # Drained: the gate goes false on every pod of the group before any delete.
    wait_for(lambda: any(r == "GroupDrained" for r, _ in env.events()), 30, "the group drained")
    wait_for(lambda: env.group("decode", 0).get("epoch") == 1, 60, "decode epoch 1")
    wait_for(lambda: env.group("decode", 0).get("state") == "Healthy", 60, "decode re-admitted")
    after = {p.metadata.name: p.metadata.uid for p in env.pods(DECODE)}
    assert set(after) == set(before)  # same names...
    assert not set(after.values()) & set(before.values())  # ...every pod recreated
    assert all(p.metadata.labels["lockstep.dev/epoch"] == "1" for p in env.pods(DECODE))
    # The other role was never touched.
    assert env.pods("lockstep.dev/role=prefill")[0].metadata.uid == prefill_uid
    st = env.status()
    (incident,) = st["incidents"]
    assert incident["verdict"] == "Desynced" and incident["state"] == "Closed"
    assert incident["timeToDetectSeconds"] >= 0 and incident["timeToRecoverSeconds"] > 0
    assert "consensus failure" in incident["evidence"]
    assert "captured before restart" in incident["evidence"]  # rank states and stacks
    assert st["openIncidents"] == 0 and st["decode"]["groups"][0]["restarts"] == 1
    reasons = {r for r, _ in env.events()}
    assert {"GroupDesynced", "GroupDrained", "GroupRestarted", "GroupReadmitted"} <= reasons


@pytest.mark.timeout(180)
def test_hang_needs_the_failure_threshold_then_restarts(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    for fake in env.kubelet.fakes(DECODE):
        fake.set_mode("hang")
    wait_for(lambda: env.group("decode", 0).get("epoch") == 1, 60, "decode epoch 1")
    wait_for(lambda: env.group("decode", 0).get("state") == "Healthy", 60, "decode re-admitted")
    (incident,) = env.status()["incidents"]
    assert incident["verdict"] == "Hung"
    # Two consecutive failed probes (failureThreshold) at a 1 s period: at least ~1 s.
    assert incident["timeToDetectSeconds"] >= 0.5
    assert any(r == "GroupSuspect" for r, _ in env.events())


@pytest.mark.timeout(120)
def test_slow_but_progressing_group_is_never_restarted(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    uids = {p.metadata.uid for p in env.pods(DECODE)}
    for fake in env.kubelet.fakes(DECODE):
        fake.set_mode("slow")
    # Probes time out (the fake's collective takes 3 s) but every rank makes progress.
    wait_for(
        lambda: (env.group("decode", 0).get("lastProbe") or {}).get("ok") is False,
        30,
        "failed probes",
    )
    import time

    time.sleep(8)  # several probe periods and failure thresholds
    assert {p.metadata.uid for p in env.pods(DECODE)} == uids
    assert env.status().get("incidents", []) == []
    assert env.group("decode", 0)["epoch"] == 0


@pytest.mark.timeout(180)
def test_operator_killed_mid_recovery_finishes_without_doubling(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    for fake in env.kubelet.fakes(DECODE):
        fake.set_mode("desync")

    def records() -> dict[str, Any]:
        raw = (env.pdd()["metadata"].get("annotations") or {}).get("lockstep.dev/groups", "{}")
        return dict(json.loads(raw))

    wait_for(
        lambda: (
            records().get("decode/0", {}).get("step")
            in ("CapturingEvidence", "AwaitingRestart", "RestartingInPlace")
        ),
        30,
        "recovery under way",
        poll=0.05,
    )
    env.operator.kill()
    env.operator.start()
    wait_for(
        lambda: (
            env.group("decode", 0).get("state") == "Healthy"
            and env.group("decode", 0).get("epoch", 0) >= 1
        ),
        90,
        "recovery finished",
    )
    group = env.group("decode", 0)
    assert group["epoch"] == 1 and group["restarts"] == 1  # one restart, not two
    assert sorted(env.kubelet.restarts.values()) == [1, 1]  # each container once
    incidents = env.status()["incidents"]
    assert len(incidents) == 1 and incidents[0]["state"] == "Closed"


@pytest.mark.timeout(120)
def test_deleting_the_pddeployment_garbage_collects_everything(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    env.custom.delete_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, NAME)
    wait_for(
        lambda: not env.pods("lockstep.dev/deployment=qwen-small"), 60, "pods garbage collected"
    )
    wait_for(
        lambda: (
            not env.core.list_namespaced_service(
                env.ns, label_selector="lockstep.dev/deployment=qwen-small"
            ).items
        ),
        60,
        "services garbage collected",
    )


@pytest.mark.timeout(180)
def test_deleted_pod_restarts_the_whole_group(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    before = {p.metadata.uid for p in env.pods(DECODE)}
    env.core.delete_namespaced_pod("qwen-small-decode-0-1", env.ns)
    wait_for(lambda: env.group("decode", 0).get("epoch") == 1, 60, "decode epoch 1")
    wait_for(lambda: env.group("decode", 0).get("state") == "Healthy", 60, "decode re-admitted")
    after = {p.metadata.uid for p in env.pods(DECODE)}
    assert len(after) == 2 and not after & before  # rank 0 was restarted too
    (incident,) = env.status()["incidents"]
    assert incident["verdict"] == "RankDown"


@pytest.mark.timeout(180)
def test_container_restart_restarts_the_whole_group(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    pod = env.core.read_namespaced_pod("qwen-small-decode-0-0", env.ns)
    env.kubelet.report_running(pod.metadata.name, pod.status.pod_ip, restarts=1)
    wait_for(lambda: env.group("decode", 0).get("epoch") == 1, 60, "decode epoch 1")
    (incident,) = env.status()["incidents"]
    assert incident["verdict"] == "RankDown" and "restart" in incident["evidence"]


@pytest.mark.timeout(120)
def test_observe_only_records_the_incident_and_touches_nothing(env: Env) -> None:
    apply_small(env, recovery={"policy": "ObserveOnly"})
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    uids = {p.metadata.uid for p in env.pods(DECODE)}
    for fake in env.kubelet.fakes(DECODE):
        fake.set_mode("desync")
    wait_for(lambda: env.status().get("openIncidents") == 1, 30, "an open incident")
    import time

    time.sleep(4)
    assert {p.metadata.uid for p in env.pods(DECODE)} == uids
    (incident,) = env.status()["incidents"]
    assert incident["verdict"] == "Desynced" and "ObserveOnly" in incident["action"]
    conditions = {c["type"]: c["status"] for c in env.status()["conditions"]}
    assert conditions["Degraded"] == "True"


@pytest.mark.timeout(180)
def test_manual_restart_request_restarts_one_group_once(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    env.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        env.ns,
        PLURAL,
        NAME,
        {"metadata": {"annotations": {"lockstep.dev/restart": "decode/0@ticket-42"}}},
    )
    wait_for(lambda: env.group("decode", 0).get("epoch") == 1, 60, "decode epoch 1")
    wait_for(lambda: env.group("decode", 0).get("state") == "Healthy", 60, "decode re-admitted")
    import time

    time.sleep(3)  # the same request id must not restart it again
    assert env.group("decode", 0)["epoch"] == 1
    assert env.group("prefill", 0)["epoch"] == 0
    assert any(r == "GroupRestartRequested" for r, _ in env.events())


@pytest.mark.timeout(240)
def test_spec_change_rolls_groups_one_at_a_time_and_scaling_works(env: Env) -> None:
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    env.custom.patch_namespaced_custom_object(
        GROUP, VERSION, env.ns, PLURAL, NAME, {"spec": {"decode": {"replicas": 2}}}
    )
    wait_for(lambda: env.status().get("decodeReady") == "2/2", 60, "two decode groups")
    env.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        env.ns,
        PLURAL,
        NAME,
        {"spec": {"decode": {"args": ["--mem-fraction-static", "0.8"]}}},
    )
    seen_both_down = False

    def rolled() -> bool:
        nonlocal seen_both_down
        groups = (env.status().get("decode") or {}).get("groups") or []
        states = [g["state"] for g in groups]
        if len(states) == 2 and all(s != "Healthy" for s in states):
            seen_both_down = True
        return len(groups) == 2 and all(g["epoch"] == 1 and g["state"] == "Healthy" for g in groups)

    wait_for(rolled, 120, "both decode groups rolled to epoch 1", poll=0.1)
    assert not seen_both_down, "a role must never roll all its groups at once"
    for pod in env.pods(DECODE):
        args = pod.spec.containers[0].args
        assert args[args.index("--mem-fraction-static") + 1] == "0.8"
    env.custom.patch_namespaced_custom_object(
        GROUP, VERSION, env.ns, PLURAL, NAME, {"spec": {"decode": {"replicas": 1}}}
    )
    wait_for(
        lambda: not env.pods("lockstep.dev/role=decode,lockstep.dev/group=1"),
        60,
        "decode group 1 removed",
    )
    wait_for(lambda: env.status().get("decodeReady") == "1/1", 30, "one decode group")


@pytest.mark.timeout(180)
def test_the_router_objects_follow_spec_router_and_drift_is_undone(env: Env) -> None:
    apply_small(env)
    apps, rbac = k8s.AppsV1Api(env.api), k8s.RbacAuthorizationV1Api(env.api)
    name = f"{NAME}-router"

    def router_args() -> list[str]:
        try:
            dep = apps.read_namespaced_deployment(name, env.ns)
        except k8s.exceptions.ApiException as err:
            if err.status != 404:
                raise
            return []
        return list(dep.spec.template.spec.containers[0].args)

    wait_for(lambda: "round_robin" in router_args(), 60, "the router Deployment")
    # A changed spec.router is applied (it used to be created once and never patched).
    env.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        env.ns,
        PLURAL,
        NAME,
        {"spec": {"router": {"policy": "random", "replicas": 2}}},
    )
    wait_for(lambda: "random" in router_args(), 30, "the new router policy")
    assert apps.read_namespaced_deployment(name, env.ns).spec.replicas == 2
    # Someone edits the router by hand: the operator puts it back.
    apps.patch_namespaced_deployment(name, env.ns, {"spec": {"replicas": 5}})
    wait_for(
        lambda: apps.read_namespaced_deployment(name, env.ns).spec.replicas == 2,
        30,
        "the hand edit undone",
    )
    # Disabled: every router object goes; enabled again: every one comes back.
    env.custom.patch_namespaced_custom_object(
        GROUP, VERSION, env.ns, PLURAL, NAME, {"spec": {"router": {"enabled": False}}}
    )

    def router_objects() -> set[str]:
        found = set()
        for kind, read in (
            ("Deployment", apps.read_namespaced_deployment),
            ("Service", env.core.read_namespaced_service),
            ("ServiceAccount", env.core.read_namespaced_service_account),
            ("Role", rbac.read_namespaced_role),
            ("RoleBinding", rbac.read_namespaced_role_binding),
        ):
            try:
                read(name, env.ns)
                found.add(kind)
            except k8s.exceptions.ApiException as err:
                if err.status != 404:
                    raise
        return found

    wait_for(lambda: not router_objects(), 30, "every router object deleted")
    env.custom.patch_namespaced_custom_object(
        GROUP, VERSION, env.ns, PLURAL, NAME, {"spec": {"router": {"enabled": True}}}
    )
    wait_for(lambda: len(router_objects()) == 5, 30, "every router object back")


@pytest.mark.timeout(180)
def test_the_groups_disruption_budgets_are_put_back_and_kept_as_built(env: Env) -> None:
    """One PodDisruptionBudget per group (every pod must stay): deleted by hand, it comes
    back; its minAvailable edited by hand, it is patched back; once settled, the rounds
    write nothing more to it (the watch's copy equals what the operator builds)."""
    apply_small(env)
    wait_for(lambda: healthy(env), 60, "both groups healthy")
    policy = k8s.PolicyV1Api(env.api)
    name = f"{NAME}-decode-0"

    def min_available() -> int | None:
        try:
            pdb = policy.read_namespaced_pod_disruption_budget(name, env.ns)
        except k8s.exceptions.ApiException as err:
            if err.status != 404:
                raise
            return None
        value: int = pdb.spec.min_available
        return value

    wait_for(lambda: min_available() == 2, 30, "the decode group's budget (both pods)")
    uid = policy.read_namespaced_pod_disruption_budget(name, env.ns).metadata.uid
    policy.delete_namespaced_pod_disruption_budget(name, env.ns)
    wait_for(lambda: min_available() == 2, 30, "the deleted budget back")
    assert policy.read_namespaced_pod_disruption_budget(name, env.ns).metadata.uid != uid
    policy.patch_namespaced_pod_disruption_budget(name, env.ns, {"spec": {"minAvailable": 1}})
    wait_for(lambda: min_available() == 2, 30, "the edited budget patched back")
    # Settled: no write loop (a patch every round would show in the log). The operator
    # logs its patch once the API call returned, so the log may trail the read above.
    log = env.operator.log_path

    def patches() -> int:
        return log.read_text().count(f"patched PodDisruptionBudget {env.ns}/{name}")

    wait_for(lambda: patches() >= 1, 10, "the operator's patch in its log")
    patched = patches()
    assert patched <= 2
    generation = policy.read_namespaced_pod_disruption_budget(name, env.ns).metadata.generation
    time.sleep(12)  # more than one periodic round (--resync-seconds 10)
    assert policy.read_namespaced_pod_disruption_budget(name, env.ns).metadata.generation == (
        generation
    )
    assert patches() == patched


def test_a_runtime_that_refuses_to_start_says_why_in_status_and_an_event(env: Env) -> None:
    # Every container exits 2 with the launcher's termination message (the kubelet keeps
    # it in the container's last state): the on-call engineer reads it in the group's
    # status, the Degraded condition (`kubectl get pdd` shows it) and an Event.
    why = "RuntimeRefused: this image runs SGLang 0.5.23, the deployment declares 0.5.22"
    env.kubelet.refusal = why
    apply_small(env)

    def told() -> bool:
        g = env.group("decode", 0)
        degraded = next(
            (c for c in env.status().get("conditions") or [] if c["type"] == "Degraded"), {}
        )
        events = [m for r, m in env.events() if r == "RuntimeRefused"]
        return (
            g.get("message") == why
            and degraded.get("reason") == "RuntimeRefused"
            and f"decode/0: {why}" in str(degraded.get("message"))
            and any("decode group 0" in m and why in m for m in events)
        )

    wait_for(told, 20, "the refusal in status, the Degraded condition and an Event")
    # One Event per pod and container restart, however many rounds see it.
    time.sleep(3)
    events = [m for r, m in env.events() if r == "RuntimeRefused"]
    assert len(events) == 3, events  # prefill/0, decode/0's two pods


@pytest.mark.timeout(180)
def test_a_node_behind_the_outlier_of_three_incidents_is_named_and_cordoned_only_when_asked(
    env: Env,
) -> None:
    """Three incidents of the history whose outlier rank ran on one node: the
    NodesSuspect condition and a NodeSuspect Event name it; the cordon waits for
    spec.recovery.suspectNodes.cordon, then the real API server's Node is cordoned with
    the reason; a person who uncordons it is not overruled."""
    from lockstep.api.models import Incident, IncidentOutlier
    from lockstep.api.objects import rfc3339
    from lockstep.core.maintenance import CORDONED_BY_ANNOTATION
    from lockstep.core.records import ANNOTATION_INCIDENTS

    node = f"suspect-{env.ns}"
    taint = {"key": "lockstep.dev/test-only", "effect": "NoSchedule"}
    env.core.create_node({"metadata": {"name": node}, "spec": {"taints": [taint]}})
    try:
        history = [
            Incident(
                id=f"decode-0-{n}",
                role="decode",
                group=0,
                epoch=n,
                verdict="RankDown",
                state="Closed",
                detected_time=rfc3339(time.time() - 600 + n, "microseconds"),
                outliers=[IncidentOutlier(pod="qwen-small-decode-0-1", rank=1, node=node,
                                          why="its process is stopped")],
            ).model_dump(by_alias=True, exclude_none=True)
            for n in (1, 2, 3)
        ]  # fmt: skip
        recovery: dict[str, Any] = {"backoff": {"baseSeconds": 0, "maxSeconds": 0}}
        # The history as an operator persisted it (the annotation it loads its memory from).
        apply_small(env, {ANNOTATION_INCIDENTS: json.dumps(history)}, recovery=recovery)

        def suspect() -> dict[str, Any]:
            conds = env.status().get("conditions") or []
            return next((c for c in conds if c["type"] == "NodesSuspect"), {})

        wait_for(lambda: suspect().get("status") == "True", 60, "the NodesSuspect condition")
        assert suspect()["message"].startswith(f"node {node} hosted the outlier rank of 3")
        wait_for(
            lambda: any(r == "NodeSuspect" and node in m for r, m in env.events()),
            30,
            "the NodeSuspect Event",
        )
        told = next(m for r, m in env.events() if r == "NodeSuspect")
        assert "not cordoned (spec.recovery.suspectNodes.cordon is off)" in told
        assert not env.core.read_node(node).spec.unschedulable  # off by default

        recovery["suspectNodes"] = {"cordon": True}
        env.custom.patch_namespaced_custom_object(
            GROUP, VERSION, env.ns, PLURAL, NAME, {"spec": {"recovery": recovery}}
        )
        wait_for(lambda: bool(env.core.read_node(node).spec.unschedulable), 30, "the cordon")
        annotations = env.core.read_node(node).metadata.annotations
        assert annotations[CORDONED_BY_ANNOTATION] == f"{env.ns}/{NAME}"
        # The Event is written once the cordon's patch returned: it may trail it.
        wait_for(
            lambda: any(r == "NodeCordoned" and node in m for r, m in env.events()),
            10,
            "the NodeCordoned Event",
        )
        # A person uncordons it: the operator leaves it so.
        env.core.patch_node(node, {"spec": {"unschedulable": False}})
        time.sleep(5)
        assert not env.core.read_node(node).spec.unschedulable
        assert suspect().get("status") == "True"
    finally:
        env.core.delete_node(node)


@pytest.mark.timeout(240)
def test_a_capture_over_the_bound_is_kept_whole_in_a_slot_configmap_the_oldest_reused(
    env: Env,
) -> None:
    """With maxEvidenceBytes 1024 a 2-pod group's capture does not fit: status keeps the
    fitted capture and names the ConfigMap with the whole one; with one slot, the next
    incident's whole capture takes the slot and the first one no longer names it."""
    from lockstep.cli.kubectl import evidence_view
    from lockstep.core.evidence import FULL_NOTE, split_capture

    recovery = {
        "backoff": {"baseSeconds": 0, "maxSeconds": 0},
        "diagnostics": {"maxEvidenceBytes": 1024, "fullCaptures": 1},
    }
    apply_small(env, recovery=recovery)
    slot = f"{NAME}-evidence-0"

    def read(name: str) -> dict[str, Any] | None:
        try:
            cm = env.core.read_namespaced_config_map(name, env.ns)
        except k8s.ApiException as err:
            assert err.status == 404
            return None
        return {"metadata": {"name": name}, "data": dict(cm.data or {})}

    def desync_until_epoch(epoch: int) -> None:
        wait_for(lambda: healthy(env), 60, f"both groups healthy before epoch {epoch}")
        for fake in env.kubelet.fakes(DECODE):
            fake.set_mode("desync")
        wait_for(lambda: env.group("decode", 0).get("epoch") == epoch, 60, f"epoch {epoch}")

    desync_until_epoch(1)
    whole = wait_for(
        lambda: (cm := read(slot)) and cm["data"].get("incident") == "decode-0-1" and cm,
        30,
        "the whole capture of decode-0-1 in its slot",
    )
    capture = whole["data"]["capture"]
    assert len(capture) > 1024 and "trimmed" not in capture
    pods = {p.metadata.name for p in env.pods(DECODE)}
    sections = {(p.pod, p.kind) for p in split_capture(capture)}
    assert {(pod, kind) for pod in pods for kind in ("ranks", "stacks")} <= sections
    owner = env.core.read_namespaced_config_map(slot, env.ns).metadata.owner_references[0]
    assert owner.kind == "PDDeployment" and owner.name == NAME  # goes with the deployment

    def incident(incident_id: str) -> dict[str, Any]:
        return next(i for i in env.status().get("incidents") or [] if i["id"] == incident_id)

    first = wait_for(
        lambda: FULL_NOTE in (i := incident("decode-0-1")).get("evidence", "") and i,
        30,
        "status naming the whole capture",
    )
    assert len(first["evidence"]) <= 1024
    assert first["evidence"].endswith(f"{FULL_NOTE}{slot}")
    # kubectl lockstep evidence shows the whole capture's sections, not the fitted ones.
    pdd = env.custom.get_namespaced_custom_object(GROUP, VERSION, env.ns, PLURAL, NAME)
    view = evidence_view(pdd, read(f"{NAME}-evidence"), "decode-0-1", read)
    assert view["wholeCapture"] == slot
    assert {(s["pod"], s["kind"]) for s in view["sections"]} == sections

    # The second incident takes the only slot; the first keeps its fitted capture.
    wait_for(lambda: env.group("decode", 0).get("state") == "Healthy", 60, "re-admitted")
    desync_until_epoch(2)
    wait_for(
        lambda: (cm := read(slot)) and cm["data"].get("incident") == "decode-0-2",
        30,
        "decode-0-2's whole capture in the reused slot",
    )
    wait_for(
        lambda: FULL_NOTE not in incident("decode-0-1").get("evidence", ""),
        30,
        "decode-0-1 no longer naming the slot",
    )
    assert "captured before restart" in incident("decode-0-1")["evidence"]
    assert incident("decode-0-2")["evidence"].endswith(f"{FULL_NOTE}{slot}")
    assert read(f"{NAME}-evidence-1") is None  # one slot: bounded

"""Leader election against the real API server (a real coordination.k8s.io Lease, its
resourceVersion preconditions): of two replicas one leads; a leader frozen past its renew
deadline is taken over after the lease duration, and once awake it writes nothing — its
fenced client refuses the write before it is sent, and it gives the lease up without
touching it. Short timings (lease 3 s, deadline 2 s, retry 0.5 s) keep it quick; the
operator's are controller-runtime's 15/10/2 s."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from lockstep.clients.kube import FencedApiClient
from lockstep.clients.leader import ElectionConfig, LeaderElector, LeaseIO, NotLeader
from lockstep_dev.localcluster.controlplane import LocalControlPlane

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(120)]


class Replica:
    """One operator replica's election, whose thread can be frozen (as SIGSTOP does)."""

    def __init__(self, cp: LocalControlPlane, ns: str, name: str) -> None:
        self.api = cp.api_client()
        self.cfg = ElectionConfig(ns, "lockstep", name, 3.0, 2.0, 0.5)
        self.awake = threading.Event()
        self.awake.set()
        self.lost: list[str] = []
        self.elector = LeaderElector(
            LeaseIO(self.api, self.cfg), self.cfg, on_lost=self.lost.append, sleep=self._sleep
        )
        self.fenced = FencedApiClient(
            configuration=self.api.configuration, fence=self.elector.check
        )

    def _sleep(self, seconds: float) -> bool:
        time.sleep(seconds)
        self.awake.wait()  # frozen: no step until woken
        return False

    def config_map(self, ns: str, name: str) -> None:
        body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name), data={"by": self.cfg.identity})
        k8s.CoreV1Api(self.fenced).create_namespaced_config_map(ns, body)


def wait_until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def replicas(controlplane: LocalControlPlane, namespace: str) -> Iterator[tuple[Replica, Replica]]:
    a, b = Replica(controlplane, namespace, "op-a"), Replica(controlplane, namespace, "op-b")
    try:
        yield a, b
    finally:
        for r in (a, b):
            r.awake.set()
            r.elector.stop()


def test_one_leads_and_a_frozen_leader_writes_nothing_once_it_woke(
    replicas: tuple[Replica, Replica], namespace: str
) -> None:
    a, b = replicas
    a.elector.start()
    wait_until(a.elector.holds, 10, "op-a to lead")
    b.elector.start()
    time.sleep(2.0)  # several of b's tries: a renews, b stands by
    assert a.elector.holds() and not b.elector.leading.is_set()
    a.config_map(namespace, "written-while-leading")
    with pytest.raises(NotLeader):
        b.config_map(namespace, "written-by-the-standby")

    a.awake.clear()  # op-a freezes (its election thread stops renewing)
    frozen = time.monotonic()
    wait_until(b.elector.holds, 10, "op-b to take over")
    took_over = time.monotonic() - frozen
    # op-b waits out the lease duration from the last renewal it saw; it may have seen
    # op-a's last one up to a retry period before the freeze, never later than that.
    assert took_over >= 3.0 - 0.5
    # op-a's deadline passed long before op-b could take over: it refuses to write, on
    # its own clock, before its election thread even ran again.
    with pytest.raises(NotLeader):
        a.config_map(namespace, "written-after-the-takeover")
    lease = k8s.CoordinationV1Api(b.api).read_namespaced_lease("lockstep", namespace)
    version = lease.metadata.resource_version
    assert lease.spec.holder_identity == "op-b" and lease.spec.lease_transitions == 1

    a.awake.set()  # op-a wakes: it gives up without touching the lease
    wait_until(lambda: bool(a.lost), 5, "op-a to give the lease up")
    core = k8s.CoreV1Api(b.api)
    names = {cm.metadata.name for cm in core.list_namespaced_config_map(namespace).items}
    assert "written-while-leading" in names
    assert not names & {"written-by-the-standby", "written-after-the-takeover"}
    time.sleep(1.0)  # op-b renews; op-a never wrote the lease again
    lease = k8s.CoordinationV1Api(b.api).read_namespaced_lease("lockstep", namespace)
    assert lease.spec.holder_identity == "op-b" and lease.spec.lease_transitions == 1
    assert int(lease.metadata.resource_version) > int(version)
    with pytest.raises(ApiException) as refused:
        # The API server's own guard: an update under a stale resourceVersion is refused.
        stale = k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(name="lockstep", resource_version=version),
            spec=k8s.V1LeaseSpec(holder_identity="op-a"),
        )
        k8s.CoordinationV1Api(b.api).replace_namespaced_lease("lockstep", namespace, stale)
    assert refused.value.status == 409

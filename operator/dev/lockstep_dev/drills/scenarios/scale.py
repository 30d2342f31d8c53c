"""`scale`: decode and prefill scaled up and down through their PDRoleScales (as an
autoscaler would), with traffic through the router: no request fails, a new group gets
requests only once admitted, a removed one none after its drain."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from lockstep_dev.drills.deployment import NAME, NAMESPACE
from lockstep_dev.drills.restart import Checks
from lockstep_dev.drills.scenario import Scenario
from lockstep_dev.localcluster.maintenance import kubectl_argv
from lockstep_dev.traffic import ROUTER, request_log_arrivals

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill


def kubectl_scale(drill: Drill, role: str, replicas: int) -> None:
    assert drill.cluster.cp is not None
    argv = kubectl_argv(
        drill.cluster.cp.kubeconfig,
        "-n",
        NAMESPACE,
        "scale",
        f"pdrolescale/{NAME}-{role}",
        f"--replicas={replicas}",
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl scale failed: {done.stderr.strip()}")
    drill.note(f"kubectl scale pdrolescale/{NAME}-{role} --replicas={replicas}")


def has_healthy_groups(drill: Drill, role: str, count: int) -> Callable[[], bool]:
    def check() -> bool:
        groups = drill.groups(role)
        return len(groups) == count and all(g.get("state") == "Healthy" for g in groups.values())

    return check


def removed(drill: Drill, role: str, count: int, gone: Sequence[str]) -> Callable[[], bool]:
    def check() -> bool:
        return len(drill.groups(role)) == count and not any(drill.group_pods(k) for k in gone)

    return check


def act(drill: Drill) -> None:
    """Scale decode 2 -> 3 -> 1 and prefill 1 -> 2 -> 1 through their PDRoleScales
    (`kubectl scale`, as an autoscaler would), with traffic through the router: no
    request fails; a new group gets requests only after its deep probe passed (its
    readiness gate); a removed group gets none after it left the routers."""
    assert drill.traffic is not None
    checks: Checks = []
    drill.result.injected_at = drill.first_injection = time.time()
    for role, up, down in (("decode", 3, 1), ("prefill", 2, 1)):
        before = len(drill.groups(role))
        started = time.time()
        kubectl_scale(drill, role, up)
        new = [f"{role}/{g}" for g in range(before, up)]
        drill.wait(has_healthy_groups(drill, role, up), 180, f"{role} up to {up}, Healthy")
        up_s = time.time() - started
        drill.wait(drill.router_routes_everywhere, 60, "the router routing to every group")
        time.sleep(3)  # traffic reaches the new groups
        arrivals = request_log_arrivals(drill.workdir / "kubelet", NAMESPACE, NAME)
        early = 0
        for key in new:
            admitted = drill.readmission_time(key)
            r, i = key.split("/")
            mine = [a for a in arrivals if a.role == r and a.group == int(i)]
            if admitted is None:
                checks.append((False, f"{key}: no admission time"))
                continue
            # Whole seconds (the condition's time): a request in the same second counts.
            early += sum(1 for a in mine if a.at < admitted)
            checks.append((any(a.at >= admitted for a in mine), f"{key} got no requests"))
        started = time.time()
        kubectl_scale(drill, role, down)
        gone = [f"{role}/{g}" for g in range(down, up)]
        drill.wait(removed(drill, role, down, gone), 180, f"{role} scaled down to {down}")
        down_s = time.time() - started
        time.sleep(2)
        arrivals = request_log_arrivals(drill.workdir / "kubelet", NAMESPACE, NAME)
        late = 0
        for key in gone:
            since = drill.retiring_since.get(key)
            if since is None:
                checks.append((False, f"{key} was never seen Retiring"))
                continue
            r, i = key.split("/")
            # One second of slack: requests the router sent before the group left it.
            late += sum(
                1 for a in arrivals if a.role == r and a.group == int(i) and a.at > since + 1
            )
        failed = [o for o in drill.traffic.failures() if o.sent_at >= drill.first_injection]
        entry = {
            "role": role,
            "scaled": [before, up, down],
            "scale_up_to_healthy_s": round(up_s, 2),
            "scale_down_to_gone_s": round(down_s, 2),
            "requests_to_new_groups_before_admission": early,
            "requests_to_removed_groups_after_drain": late,
            "requests_failed_so_far": len(failed),
        }
        drill.result.scaling.append(entry)
        drill.note(f"scaling figures: {json.dumps(entry)}")
        checks += [
            (early == 0, f"{role}: {early} request(s) reached a new group before admission"),
            (late == 0, f"{role}: {late} request(s) reached a removed group after its drain"),
            (not failed, f"{len(failed)} request(s) failed"),
        ]
    sent = drill.traffic.stats(drill.first_injection).get(ROUTER)
    drill.result.maintenance = {"requests_sent": sent.sent if sent else 0}
    drill.conclude(checks)


# The promises are about requests through the router.
SCENARIO = Scenario("scale", act, router=True)

"""`flapping`: decode/0 fails again after each restart; once its restart budget (2) is
spent it is quarantined (no restart storm, the deployment Degraded), and a node drain
may then evict its pods."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

from lockstep.api import constants as c
from lockstep_dev.drills.deployment import AFFECTED, NAMESPACE
from lockstep_dev.drills.restart import Checks
from lockstep_dev.drills.scenario import Scenario, step_bounds_overrides

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill


def overrides(drill: Drill) -> dict[str, Any]:
    return step_bounds_overrides(drill) or {
        "recovery": {
            "budget": {"restarts": 2, "windowSeconds": 600},
            "backoff": {"baseSeconds": 0, "maxSeconds": 0},
        }
    }


def act(drill: Drill) -> None:
    drill.result.injected_at = time.time()
    for attempt in range(1, 4):
        drill.inject("desync")
        if attempt <= 2:

            def restarted(n: int = attempt) -> bool:
                g = drill.group(AFFECTED)
                return int(g.get("restarts", 0)) >= n and g.get("state") == "Healthy"

            drill.wait(restarted, drill.timeout_s, f"restart {attempt} done")
            drill.note(f"restart {attempt} of the budget (2) done; the group fails again")
    drill.wait(lambda: drill.group(AFFECTED).get("state") == "Quarantined", 90, "quarantine")
    drill.note("decode/0 quarantined: budget spent, deployment Degraded, no restart storm")
    time.sleep(10)
    conditions = {x["type"]: x for x in drill.status().get("conditions") or []}
    checks = [
        (drill.group(AFFECTED).get("state") == "Quarantined", "the group stays quarantined"),
        (int(drill.group(AFFECTED).get("restarts", 0)) == 2, "exactly the budget of restarts"),
        (conditions.get("Degraded", {}).get("status") == "True", "deployment Degraded"),
    ]
    checks += evictions_in_quarantine(drill)
    inc = drill.incident(AFFECTED) or {}
    if inc:
        drill.judge_incident(inc)
    drill.conclude(checks)


def evict(drill: Drill, pod: Mapping[str, Any]) -> httpx.Response:
    """One eviction through the API (what `kubectl drain` asks for each pod)."""
    assert drill.cluster.cp is not None
    meta = pod["metadata"]
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta["name"], "namespace": NAMESPACE},
    }
    with drill.cluster.cp.http_client() as http:
        return http.post(f"/api/v1/namespaces/{NAMESPACE}/pods/{meta['name']}/eviction", json=body)


def evictions_in_quarantine(drill: Drill) -> Checks:
    """A node drain meets a quarantined group: it has no disruption budget any more, so
    the eviction goes through (it serves nothing; a drain must not wait for a person),
    while a serving group's budget still refuses one. The group stays quarantined,
    not restarted."""
    serving = drill.group_pods("decode/1")[0]
    refused = evict(drill, serving)
    drill.note(
        f"eviction of serving decode/1's {serving['metadata']['name']}: HTTP {refused.status_code}"
    )
    victim = next(
        p for p in drill.group_pods(AFFECTED) if p["metadata"]["labels"][c.LABEL_RANK] == "1"
    )
    victim_uid = victim["metadata"]["uid"]
    # 429 until the operator has deleted the group's budget (kubectl drain would retry
    # every 5 s).
    answers: list[httpx.Response] = []

    def evicted() -> bool:
        answers.append(evict(drill, victim))
        return answers[-1].status_code in (200, 201)

    try:
        drill.wait(evicted, 45, "the quarantined group's pod evicted")
    except TimeoutError:
        assert drill.cluster.cp is not None
        with drill.cluster.cp.http_client() as http:
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
    drill.note(
        f"eviction of quarantined decode/0's {victim['metadata']['name']}: "
        f"HTTP {answers[-1].status_code} after {len(answers)} attempt(s)"
    )
    drill.wait(
        lambda: victim_uid not in {p["metadata"]["uid"] for p in drill.group_pods(AFFECTED)},
        60,
        "the evicted pod gone",
    )
    time.sleep(5)  # a round or two: the operator must not restart the group
    group = drill.group(AFFECTED)
    return [
        (refused.status_code == 429, f"serving group's eviction: HTTP {refused.status_code}"),
        (group.get("state") == "Quarantined", f"after the eviction: {group.get('state')}"),
        (int(group.get("restarts", 0)) == 2, "the eviction counted as a restart"),
    ]


SCENARIO = Scenario("flapping", act, overrides=overrides)

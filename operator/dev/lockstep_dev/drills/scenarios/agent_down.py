"""`agent-down`: a desync in decode/0 while its rank-1 pod agent cannot answer; the
in-place restart escalates to recreating the group away from that pod's node. First,
the agents refuse what comes without the operator's token."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

import httpx

from lockstep.api import constants as c
from lockstep.clients.agent_client import agent_url
from lockstep_dev.drills.deployment import AFFECTED, NAMESPACE
from lockstep_dev.drills.restart import Checks, expect_restart, restart_counts
from lockstep_dev.drills.scenario import Scenario

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill


def restart_without_token(drill: Drill) -> Checks:
    """`POST /restart`, `GET /ranks` and `POST /stacks` to decode/0's agents with no
    token and a wrong one: refused (401), and nothing restarts."""
    counts = restart_counts(drill, AFFECTED)
    role, index = AFFECTED.split("/")
    sel = f"{drill.selector},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index}"
    answers = []
    reads = []
    for pod in drill.cluster.pods(NAMESPACE, sel):
        base = agent_url(pod["status"]["podIP"])
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            resp = httpx.post(f"{base}/restart", json={"epoch": "99"}, headers=headers, timeout=5)
            answers.append(resp.status_code)
            # The rank states and the stacks are the operator's too.
            reads.append(httpx.get(f"{base}/ranks", headers=headers, timeout=5).status_code)
            reads.append(httpx.post(f"{base}/stacks", headers=headers, timeout=5).status_code)
    time.sleep(3)
    drill.note(f"POST /restart without the token: {answers}; GET /ranks, POST /stacks: {reads}")
    return [
        (set(answers) == {401}, f"restart without the token answered {answers}, not 401"),
        (set(reads) == {401}, f"/ranks and /stacks without the token answered {reads}"),
        (restart_counts(drill, AFFECTED) == counts, "nothing restarted on a refused request"),
        (drill.group(AFFECTED).get("state") == "Healthy", "the group stayed Healthy"),
    ]


def act(drill: Drill) -> None:
    """A desync in a group whose rank-1 pod agent cannot answer (its pod's main
    process, which serves the agent, is stopped): the in-place restart escalates to
    recreating the group, whose new pods prefer other nodes than that pod's."""
    role, index = AFFECTED.split("/")
    refused = restart_without_token(drill)
    sel = f"{drill.selector},{c.LABEL_ROLE}={role},{c.LABEL_GROUP}={index},{c.LABEL_RANK}=1"
    (pod,) = drill.cluster.pods(NAMESPACE, sel)
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    assert drill.cluster.kubelet is not None
    pid = drill.cluster.kubelet.processes()[(NAMESPACE, name)]
    os.kill(pid, signal.SIGSTOP)
    drill.note(f"stopped {name}'s main process (its pod agent) on {node}")
    expect_restart(drill, "Desynced", "desync", mode="Recreate")
    inc = drill.incident(AFFECTED) or {}
    new = drill.cluster.pods(NAMESPACE, sel.replace(f",{c.LABEL_RANK}=1", ""))
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
    if drill.result.passed:
        drill.conclude(more)
    else:
        drill.result.reason += "; " + "; ".join(why for ok, why in more if not ok)


SCENARIO = Scenario("agent-down", act)

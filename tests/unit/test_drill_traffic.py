"""How a drill finds the router to send through, and reads which pods got requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lockstep.api import constants as c
from lockstep_dev.traffic import request_log_arrivals, router_endpoint


def router_pod(name: str, ip: str | None, ready: bool, **meta: Any) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]
    }
    if ip:
        status["podIP"] = ip
    labels = {c.LABEL_COMPONENT: "router"}
    return {"metadata": {"name": name, "labels": labels, **meta}, "status": status}


def test_traffic_goes_to_a_ready_router_pod_only() -> None:
    assert router_endpoint([router_pod("r-a", "10.0.0.5", ready=False)]) == {}
    leader = {"metadata": {"name": "m-decode-0-0", "labels": {c.LABEL_RANK: "0"}}}
    pods = [leader, router_pod("r-b", "10.0.0.6", ready=True)]
    assert router_endpoint(pods) == {"router": f"http://10.0.0.6:{c.PORT_ROUTER}"}
    leaving = router_pod("r-c", "10.0.0.7", ready=True, deletionTimestamp="2026-01-01T00:00:00Z")
    assert router_endpoint([leaving]) == {}


def test_arrivals_come_from_every_incarnations_request_log(tmp_path: Path) -> None:
    def log(name: str, uid: str, events: list[dict[str, Any]]) -> None:
        directory = tmp_path / "pods" / f"ns_{name}_{uid}"
        directory.mkdir(parents=True)
        lines = [json.dumps(e) for e in events] + ['{"event": "rec']  # a line cut by a kill
        (directory / "requests.jsonl").write_text("\n".join(lines))

    log("m-decode-0-0", "u1", [{"event": "received", "at": 2.0, "room": 7}])
    log(
        "m-decode-0-0",
        "u2",
        [{"event": "received", "at": 9.0, "room": 8}, {"event": "answered", "at": 9.5}],
    )
    log("m-prefill-0-0", "u3", [{"event": "received", "at": 1.0, "room": None}])
    log("m-router-abc-xyz", "u4", [{"event": "received", "at": 3.0}])  # not a serving pod
    log("other-decode-0-0", "u5", [{"event": "received", "at": 4.0}])  # another deployment
    arrivals = request_log_arrivals(tmp_path, "ns", "m")
    assert [(a.role, a.group, a.uid, a.at, a.room) for a in arrivals] == [
        ("prefill", 0, "u3", 1.0, None),
        ("decode", 0, "u1", 2.0, 7),
        ("decode", 0, "u2", 9.0, 8),
    ]

"""`kubectl lockstep status`: each group's state, epoch, probe and runtime, from the
PDDeployment's status and its pods (a pure view, then its text)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType

from lockstep.api import constants as c
from lockstep.api import objects
from lockstep.api.objects import parse_time
from lockstep.cli.kubectl.common import (
    Obj,
    _group_pods,
    _groups,
    _plural,
    _render,
    _runtime,
    _table,
    human_duration,
)

# ------------------------------------------------------------------------------ status


def status_view(pdd: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: float) -> Obj:
    """What `status` shows, as a plain dict (`-o json`)."""
    meta, status = objects.meta(pdd), pdd.get("status") or {}
    groups = []
    for role in c.ROLES:
        for g in _groups(status, role):
            probe = g.get("lastProbe")
            probed = parse_time(probe.get("time")) if isinstance(probe, Mapping) else None
            groups.append(
                {
                    "role": role,
                    "group": g.get("index"),
                    "state": g.get("state"),
                    "spare": bool(g.get("spare", False)),
                    "epoch": g.get("epoch", 0),
                    "restarts": g.get("restarts", 0),
                    "readyPods": g.get("readyPods", 0),
                    "pods": g.get("pods", 0),
                    "consecutiveFailures": g.get("consecutiveFailures", 0),
                    "lastProbe": None
                    if not isinstance(probe, Mapping)
                    else {
                        "ok": probe.get("ok"),
                        "time": probe.get("time"),
                        "latencyMs": probe.get("latencyMs"),
                        "error": probe.get("error"),
                        "ageSeconds": None if probed is None else round(now - probed, 1),
                    },
                    "lastRestartTime": g.get("lastRestartTime"),
                    "runtime": _runtime(g, _group_pods(pods, role, int(g.get("index", 0)))),
                    "message": g.get("message"),
                }
            )
    conditions = []
    for cond in status.get("conditions") or []:
        since = parse_time(cond.get("lastTransitionTime"))
        conditions.append(
            {
                "type": cond.get("type"),
                "status": cond.get("status"),
                "reason": cond.get("reason", ""),
                "message": cond.get("message", ""),
                "lastTransitionTime": cond.get("lastTransitionTime"),
                "ageSeconds": None if since is None else round(now - since, 1),
            }
        )
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "generation": meta.get("generation"),
        "observedGeneration": status.get("observedGeneration"),
        "hasStatus": bool(status),
        "prefillReady": status.get("prefillReady"),
        "decodeReady": status.get("decodeReady"),
        "openIncidents": status.get("openIncidents", 0),
        "incidents": len(status.get("incidents") or []),
        "groups": groups,
        "conditions": conditions,
        "findings": [
            {k: f.get(k) for k in ("rule", "severity", "field", "action")}
            for f in status.get("findings") or []
        ],
        "pairs": [
            {
                "pair": f"prefill/{p.get('prefill')} -> decode/{p.get('decode')}",
                "ok": p.get("ok"),
                "latencyMs": p.get("latencyMs"),
                "ageSeconds": _age(p.get("time"), now),
                "error": p.get("error"),
            }
            for p in status.get("pairs") or []
        ],
    }


def _age(stamp: object, now: float) -> float | None:
    at = parse_time(stamp)
    return None if at is None else round(now - at, 1)


def format_status(view: Mapping[str, Any]) -> str:
    """`status` as text: a header line, one row per group, the conditions."""
    head = f"PDDeployment {view['name']} in {view['namespace']}"
    if not view["hasStatus"]:
        return _render(
            f"{head}: no status yet (has the operator seen it? kubectl get pods -n lockstep-system)"
        )
    head += (
        f": prefill {view['prefillReady'] or '-'} ready, decode {view['decodeReady'] or '-'} "
        f"ready, {_plural(view['openIncidents'], 'open incident')} "
        f"(generation {view['generation']}, observed {view['observedGeneration']})"
    )
    groups = _table(
        "GROUP",
        "STATE",
        "EPOCH",
        "RESTARTS",
        "READY",
        "PROBE",
        "LATENCY",
        "PROBED",
        "RUNTIME",
        "MESSAGE",
    )
    for g in view["groups"]:
        probe = g["lastProbe"] or {}
        ok = probe.get("ok")
        message = g["message"] or ""
        if ok is False and probe.get("error"):
            message = f"{message}; probe: {probe['error']}" if message else probe["error"]
        latency = probe.get("latencyMs")
        age = probe.get("ageSeconds")
        groups.add_row(
            f"{g['role']}/{g['group']}",
            f"{g['state']} (spare)" if g.get("spare") else str(g["state"]),
            str(g["epoch"]),
            str(g["restarts"]),
            f"{g['readyPods']}/{g['pods']}",
            "-" if ok is None else ("ok" if ok else "failed"),
            "-" if latency is None else f"{latency:.1f}ms",
            "-" if age is None else f"{human_duration(age)} ago",
            g["runtime"] or "-",
            message or "-",
        )
    conditions = _table("CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE")
    for cond in view["conditions"]:
        age = cond["ageSeconds"]
        conditions.add_row(
            str(cond["type"]),
            str(cond["status"]),
            cond["reason"] or "-",
            "-" if age is None else human_duration(age),
            cond["message"] or "-",
        )
    parts: list[RenderableType] = [head, "", groups, "", conditions]
    if view["pairs"]:
        # The pair probe's last try of each prefill/decode pair (the KV hand-off).
        pairs = _table("PAIR", "HAND-OFF", "LATENCY", "TRIED", "ERROR")
        for p in view["pairs"]:
            latency, age = p["latencyMs"], p["ageSeconds"]
            pairs.add_row(
                p["pair"],
                "ok" if p["ok"] else "failed",
                "-" if latency is None else f"{latency:.1f}ms",
                "-" if age is None else f"{human_duration(age)} ago",
                p["error"] or "-",
            )
        parts += ["", pairs]
    if view["findings"]:
        rules = ", ".join(f"{f['rule']} ({f['field']}, {f['action']})" for f in view["findings"])
        parts += ["", f"Flag policy: {rules}; kubectl describe pdd {view['name']} says why"]
    return _render(*parts)

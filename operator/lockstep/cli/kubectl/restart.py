"""`kubectl lockstep restart`: the one annotation a person sets to ask for a group's
restart (its request id made from the reason and the time)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from lockstep.api import objects
from lockstep.cli.kubectl.common import (
    _NOT_SLUG,
    REQUEST_SLUG_CHARS,
    PluginError,
    _groups,
    parse_group,
)
from lockstep.core.records import ANNOTATION_RESTART, load_records


def request_id(reason: str, now: float) -> str:
    """A restart request id from `--reason`: its letters, digits, `.`, `_` and `-`
    (others become `-`), at most 40 of them, then the UTC time to the second, so the same
    reason asked again is a new request (the operator acts once per request id)."""
    slug = _NOT_SLUG.sub("-", reason).strip("-._")[:REQUEST_SLUG_CHARS].rstrip("-._")
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%d-%H%M%S")
    return f"{slug or 'manual'}-{stamp}"


# ----------------------------------------------------------------------------- restart


def restart_annotation(pdd: Mapping[str, Any], target: str, reason: str, now: float) -> str:
    """The value of `lockstep.dev/restart` that asks for a restart of `target`
    (`ROLE/GROUP`), checked against the deployment. PluginError when `target` names no
    group of it, when its policy refuses restarts, or when another group's request is
    still waiting for the operator (replacing it would drop that restart)."""
    role, group = parse_group(target)
    meta, spec, status = objects.meta(pdd), pdd.get("spec") or {}, pdd.get("status") or {}
    name = meta.get("name")
    replicas = int((spec.get(role) or {}).get("replicas", 1))
    served = int((status.get(role) or {}).get("replicas", 0))
    known = set(range(max(replicas, served))) | {
        int(g.get("index", -1)) for g in _groups(status, role)
    }
    if group not in known:
        ordered = sorted(known)
        have = (
            "no groups"
            if not ordered
            else f"groups 0..{ordered[-1]}"
            if ordered == list(range(len(ordered)))
            else f"groups {', '.join(map(str, ordered))}"
        )
        raise PluginError(
            f"ROLE/GROUP {target!r}: PDDeployment {name} has {role} {have} "
            f"(spec.{role}.replicas {replicas}); name one of them, e.g. {role}/0"
        )
    if (spec.get("recovery") or {}).get("policy") == "ObserveOnly":
        raise PluginError(
            f"PDDeployment {name} has spec.recovery.policy ObserveOnly: the operator refuses "
            "restart requests (a RestartRefused Event); set it to RestartGroup first"
        )
    if not reason.strip():
        raise PluginError("--reason: say why (a ticket, an incident), e.g. --reason INC-42")
    current = (meta.get("annotations") or {}).get(ANNOTATION_RESTART)
    if isinstance(current, str) and "@" in current:
        other, req = (x.strip() for x in current.split("@", 1))
        rec = load_records(pdd).get(other)
        if (
            other != f"{role}/{group}"
            and req
            and rec is not None
            and rec.manual.handled_request != req
        ):
            raise PluginError(
                f"the restart request {current} is not taken by the operator yet, and "
                f"{ANNOTATION_RESTART} holds one request: run this again once it is (its "
                f"GroupRestartRequested Event), or overwrite it with kubectl annotate "
                f"--overwrite if that request must be dropped"
            )
    return f"{role}/{group}@{request_id(reason, now)}"

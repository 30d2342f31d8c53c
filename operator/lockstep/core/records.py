"""The records codec: what the operator persists on a PDDeployment, and how it reads it.

Pure (JSON in, models out). Two annotations hold the operator's memory, so a restarted
operator resumes every recovery where it stopped:

- `lockstep.dev/groups`: each group's `recovery.GroupRecord` (its step, epoch, counters,
  the open incident);
- `lockstep.dev/incidents`: the incident history (the last `MAX_INCIDENTS`, open and
  closed), as the recovery planner reported them, without their evidence. Evidence is
  bounded per incident, not per deployment, and annotations share a 256 KiB budget per
  object: it lives in the evidence store (`lockstep.core.evidence`).

Status is derived from these (`lockstep.core.status`), never read back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from lockstep.api import constants as c
from lockstep.api.models import Incident
from lockstep.core.recovery import Action, CloseIncident, GroupRecord, OpenIncident, UpdateIncident

log = logging.getLogger(__name__)

ANNOTATION_RECORDS = f"{c.GROUP}/groups"
ANNOTATION_INCIDENTS = f"{c.GROUP}/incidents"
# A manual restart: `kubectl annotate pdd NAME lockstep.dev/restart=decode/0@req-1`.
ANNOTATION_RESTART = f"{c.GROUP}/restart"
MAX_INCIDENTS = 20

Incidents = dict[str, Incident]  # by id, in the order they were opened


def record_key(role: str, group: int) -> str:
    """The key of a group in the records annotation."""
    return f"{role}/{group}"


def _annotation(body: Mapping[str, Any], name: str) -> str | None:
    value = ((body.get("metadata") or {}).get("annotations") or {}).get(name)
    return value if isinstance(value, str) else None


def load_records(body: Mapping[str, Any]) -> dict[str, GroupRecord]:
    """The group records persisted in the PDDeployment's annotation."""
    raw = _annotation(body, ANNOTATION_RECORDS)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
        return {k: GroupRecord.model_validate(v) for k, v in data.items()}
    except (ValueError, TypeError) as err:
        # A hand-edited annotation must not wedge the operator: start over, loudly.
        log.error("ignoring unreadable %s annotation: %s", ANNOTATION_RECORDS, err)
        return {}


# What changes with every probe and means nothing to the next operator process: which
# probe sample was counted last (sample ids come from the in-memory probe book, which a
# new process starts afresh) and when. Left out of the annotation, a healthy group's
# record does not change between probes, so it is not written between probes.
IN_MEMORY_ONLY = {"last_observed_at": None, "last_sample": None}


def dump_records(records: Mapping[str, GroupRecord]) -> str:
    """The annotation value for the records (open incidents without their evidence, and
    without the fields in `IN_MEMORY_ONLY`)."""
    out = {}
    for key, rec in sorted(records.items()):
        rec = rec.model_copy(update={"detection": rec.detection.model_copy(update=IN_MEMORY_ONLY)})
        if rec.incident is not None and rec.incident.evidence:
            rec = rec.model_copy(
                update={"incident": rec.incident.model_copy(update={"evidence": ""})}
            )
        out[key] = json.loads(rec.to_json())
    return json.dumps(out, separators=(",", ":"))


def load_incidents(body: Mapping[str, Any]) -> Incidents:
    """The incident history persisted in the PDDeployment's annotation."""
    raw = _annotation(body, ANNOTATION_INCIDENTS)
    if not raw:
        return {}
    try:
        items = [Incident.model_validate(i) for i in json.loads(raw)]
    except (ValueError, TypeError) as err:
        log.error("ignoring unreadable %s annotation: %s", ANNOTATION_INCIDENTS, err)
        return {}
    return {i.id: i for i in items}


def dump_incidents(incidents: Incidents) -> str:
    """The annotation value for the incident history (evidence left out)."""
    items = [
        i.model_copy(update={"evidence": ""}).model_dump(by_alias=True, exclude_none=True)
        for i in incidents.values()
    ]
    for item in items:
        item.pop("evidence", None)
    return json.dumps(items, separators=(",", ":"))


def apply_incident_actions(history: Incidents, actions: Iterable[Action]) -> Incidents:
    """The history after the planner's incident actions (upsert by id, oldest dropped
    past `MAX_INCIDENTS`). The planner is the incident's one owner: what it says is
    what the history holds."""
    out = dict(history)
    for action in actions:
        if isinstance(action, OpenIncident | UpdateIncident | CloseIncident):
            incident = action.incident.model_copy(update={"evidence": ""})
            out[incident.id] = incident  # an update keeps the incident's place
    while len(out) > MAX_INCIDENTS:
        out.pop(next(iter(out)))
    return out


def manual_request(body: Mapping[str, Any], role: str, group: int) -> str | None:
    """The request id of a manual restart annotation naming this group."""
    raw = _annotation(body, ANNOTATION_RESTART)
    if not raw or "@" not in raw:
        return None
    target, req = raw.split("@", 1)
    return req if target.strip() == f"{role}/{group}" and req.strip() else None

"""The incident's memory outside status: the history the planner keeps, the evidence
store, and the status derived from them (patched only when it changed)."""

from __future__ import annotations

from typing import Any

from factories import load_example

from lockstep.api.models import Incident, parse_pddeployment
from lockstep.core.evidence import EVIDENCE_MARK, EvidenceEntry, EvidenceStore, from_data, to_data
from lockstep.core.policy import evaluate
from lockstep.core.records import (
    ANNOTATION_INCIDENTS,
    MAX_INCIDENTS,
    apply_incident_actions,
    dump_incidents,
    load_incidents,
)
from lockstep.core.recovery import CloseIncident, OpenIncident, UpdateIncident, new_group_record
from lockstep.core.status import PROBE_REFRESH_SECONDS, LastProbe, derive_status, status_changed


def incident(n: int, **kw: Any) -> Incident:
    fields: dict[str, Any] = {
        "id": f"decode-0-{n}",
        "role": "decode",
        "group": 0,
        "epoch": n,
        "verdict": "RankDown",
        "evidence": "probe timeout; ranks ...",
        **kw,
    }
    return Incident(**fields)


def test_history_follows_the_planner_and_keeps_no_evidence() -> None:
    history = apply_incident_actions({}, [OpenIncident(incident(1))])
    refined = incident(1, verdict="Desynced", evidence="cause: divergence")
    history = apply_incident_actions(history, [UpdateIncident(refined)])
    history = apply_incident_actions(history, [OpenIncident(incident(2))])
    closed = incident(1, verdict="Desynced", state="Closed", time_to_recover_seconds=9.5)
    history = apply_incident_actions(history, [CloseIncident(closed)])
    # Upserts keep the order incidents were opened in; what the planner said is what stays.
    assert list(history) == ["decode-0-1", "decode-0-2"]
    assert history["decode-0-1"].verdict == "Desynced"
    assert history["decode-0-1"].state == "Closed"
    assert all(i.evidence == "" for i in history.values())
    # Through the annotation and back, evidence-free (its budget is per object).
    body = {"metadata": {"annotations": {ANNOTATION_INCIDENTS: dump_incidents(history)}}}
    assert load_incidents(body) == history
    assert "probe timeout" not in dump_incidents(history)


def test_history_is_bounded() -> None:
    history = apply_incident_actions({}, [OpenIncident(incident(n)) for n in range(30)])
    assert len(history) == MAX_INCIDENTS
    assert next(iter(history)) == f"decode-0-{30 - MAX_INCIDENTS}"


def test_an_unreadable_history_starts_over_instead_of_wedging() -> None:
    assert load_incidents({"metadata": {"annotations": {ANNOTATION_INCIDENTS: "{oops"}}}) == {}


class FakeConfigMaps:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes = 0

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(name)

    def apply_configmap(self, obj: dict[str, Any]) -> None:
        self.writes += 1
        self.objects[obj["metadata"]["name"]] = obj


def build(data: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "m-evidence"}, "data": data}


def test_evidence_survives_an_operator_restart_and_is_written_only_on_change() -> None:
    io = FakeConfigMaps()
    store = EvidenceStore(io)
    entry = EvidenceEntry("probe timeout", "[pod] ranks: {...}", "rank 1 diverged")
    store.update("ns", "m", "uid", {"decode-0-1": entry}, {"decode-0-1"}, build)
    store.update("ns", "m", "uid", {"decode-0-1": entry}, {"decode-0-1"}, build)
    assert io.writes == 1
    # A new operator process: the same entries, from the ConfigMap.
    again = EvidenceStore(io)
    assert again.entries("ns", "m", "uid") == {"decode-0-1": entry}
    # Entries of incidents that left the history go.
    again.update("ns", "m", "uid", {}, set(), build)
    assert EvidenceStore(io).entries("ns", "m", "uid") == {}


def test_evidence_renders_bounded_with_the_capture_after_the_summary() -> None:
    entry = EvidenceEntry("summary", "x" * 5000)
    text = entry.render(1024)
    assert text.startswith("summary" + EVIDENCE_MARK) and len(text) <= 1024
    assert EvidenceEntry("summary").render(1024) == "summary"
    assert from_data(to_data({"a": entry})) == {"a": entry}


def test_status_shows_the_history_with_its_evidence_and_patches_only_on_change() -> None:
    pdd = parse_pddeployment(load_example("pd-small"))
    policy = evaluate(pdd.spec)
    rec = new_group_record("decode", 0, now=100.0).model_copy(update={"step": "Healthy"})
    closed = incident(1, verdict="Desynced", state="Closed", evidence="")
    entries = {"decode-0-1": EvidenceEntry("cause: rank 1 diverged", "[pod] ranks: ...")}
    probes = {("decode", 0): LastProbe(True, 200.0, 0.004)}
    rest = ({"decode/0": rec}, {closed.id: closed}, entries, {})
    status = derive_status(pdd, policy, [], *rest, probes, 200.0)
    args = (pdd, policy, status["conditions"], *rest)  # conditions keep their transitions
    (shown,) = status["incidents"]
    assert shown["verdict"] == "Desynced" and shown["state"] == "Closed"
    assert shown["evidence"] == "cause: rank 1 diverged" + EVIDENCE_MARK + "[pod] ranks: ..."
    assert not status_changed(status, status, 200.0, 201.0)
    # Only a fresher probe: patched at most every PROBE_REFRESH_SECONDS.
    fresher = derive_status(*args, {("decode", 0): LastProbe(True, 205.0, 0.003)}, 205.0)
    assert not status_changed(fresher, status, 200.0, 205.0)
    assert status_changed(fresher, status, 200.0, 200.0 + PROBE_REFRESH_SECONDS)
    # A probe that failed is news at once.
    failed = derive_status(*args, {("decode", 0): LastProbe(False, 206.0, None, "timeout")}, 206.0)
    assert status_changed(failed, status, 200.0, 206.0)

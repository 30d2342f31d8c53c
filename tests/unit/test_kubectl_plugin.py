"""`kubectl lockstep`: what each command prints from what the operator wrote (pure views
and formatting, on `factories.incident_scene`), the restart annotation it sets, and its
command line. Against the real API server: tests/controlplane/test_kubectl_plugin.py."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from factories import REPO, incident_scene, pdd_obj, rank_state, ranks_answer, with_path

from lockstep.api.objects import rfc3339
from lockstep.cli import kubectl as kp
from lockstep.core.evidence import EvidenceEntry, to_data
from lockstep.core.records import (
    ANNOTATION_RECORDS,
    ANNOTATION_RESTART,
    dump_records,
    manual_request,
)
from lockstep.core.recovery import GroupRecord

SCENE = incident_scene()
NOW = SCENE.now


def stored(**changes: Any) -> dict[str, Any]:
    obj = SCENE.stored()
    for path, value in changes.items():
        obj = with_path(obj, path.replace("__", "."), value)
    return obj


def rows(text: str, first: str) -> list[list[str]]:
    """The rows of a table whose first column starts with `first`, split on 2+ spaces."""
    import re

    return [
        re.split(r"\s{2,}", line.strip())
        for line in text.splitlines()
        if line.strip().startswith(first)
    ]


# ------------------------------------------------------------------------------ status


def test_status_shows_every_group_with_its_probe_runtime_and_the_conditions() -> None:
    text = kp.format_status(kp.status_view(stored(), SCENE.pods, NOW))
    assert text.startswith(
        "PDDeployment qwen in ns: prefill 1/1 ready, decode 1/2 ready, 1 open incident"
    )
    runtime = "ghcr.io/lockstep-dev/operator:0.1.0"  # the pods' runtime init container
    assert rows(text, "prefill/") == [
        ["prefill/0", "Healthy", "0", "0", "1/1", "ok", "6.9ms", "3s ago", runtime, "-"]
    ]
    assert rows(text, "decode/") == [
        ["decode/0", "Healthy", "1", "1", "2/2", "ok", "6.9ms", "3s ago", runtime, "-"],
        [
            "decode/1", "Recovering", "1", "1", "0/2", "failed", "-", "3s ago", runtime,
            "pod qwen-decode-1-1 restarted (restart count 0 -> 1); probe: timeout after 3s",
        ],
    ]  # fmt: skip
    assert rows(text, "Ready") == [
        ["Ready", "False", "GroupsNotReady", "19s", "2/3 groups healthy"]
    ]
    assert rows(text, "Degraded")[0][:4] == ["Degraded", "False", "AsExpected", "9m52s"]
    assert all(line == line.rstrip() for line in text.splitlines())


def test_status_runtime_comes_from_status_when_recorded_else_from_the_pods() -> None:
    groups = SCENE.status["decode"]["groups"]
    recorded = [{**groups[0], "runtime": "ghcr.io/lockstep-dev/operator:0.2.0"}, groups[1]]
    view = kp.status_view(stored(status__decode__groups=recorded), SCENE.pods, NOW)
    by_group = {(g["role"], g["group"]): g["runtime"] for g in view["groups"]}
    assert by_group[("decode", 0)] == "ghcr.io/lockstep-dev/operator:0.2.0"
    assert by_group[("decode", 1)] == "ghcr.io/lockstep-dev/operator:0.1.0"
    # An image that carries the runtime (spec.runtime.inject false): no init container.
    built_in = [
        {**p, "spec": {k: v for k, v in p["spec"].items() if k != "initContainers"}}
        for p in SCENE.pods
    ]
    view = kp.status_view(stored(), built_in, NOW)
    assert view["groups"][0]["runtime"] == "registry.local/sglang:0.5.23-lockstep (built in)"
    # No pods (all deleted mid-restart): nothing to say.
    assert kp.status_view(stored(), [], NOW)["groups"][0]["runtime"] is None


def test_status_marks_the_warm_spares() -> None:
    groups = SCENE.status["decode"]["groups"]
    spare = [groups[0], {**groups[1], "state": "Healthy", "spare": True}]
    view = kp.status_view(stored(status__decode__groups=spare), SCENE.pods, NOW)
    assert [g["spare"] for g in view["groups"]] == [False, False, True]
    assert rows(kp.format_status(view), "decode/1")[0][1:3] == ["Healthy (spare)", "1"]


def test_status_shows_each_pairs_last_hand_off() -> None:
    pairs = [
        {"prefill": 0, "decode": 0, "ok": True, "time": rfc3339(NOW - 2), "latencyMs": 12.5},
        {
            "prefill": 0,
            "decode": 1,
            "ok": False,
            "time": rfc3339(NOW - 1),
            "error": "decode: no answer within 4s",
        },
    ]
    view = kp.status_view(stored(status__pairs=pairs), SCENE.pods, NOW)
    text = kp.format_status(view)
    assert rows(text, "prefill/0 ->") == [
        ["prefill/0 -> decode/0", "ok", "12.5ms", "2s ago", "-"],
        ["prefill/0 -> decode/1", "failed", "-", "1s ago", "decode: no answer within 4s"],
    ]
    # No pair probe yet (or off): no pair table.
    assert "HAND-OFF" not in kp.format_status(kp.status_view(stored(), SCENE.pods, NOW))


def test_status_json_is_the_view() -> None:
    view = kp.status_view(stored(), SCENE.pods, NOW)
    again = json.loads(json.dumps(view))
    assert again["name"] == "qwen" and again["openIncidents"] == 1
    g = again["groups"][2]
    assert (g["role"], g["group"], g["state"], g["epoch"]) == ("decode", 1, "Recovering", 1)
    assert g["lastProbe"] == {
        "ok": False,
        "time": SCENE.status["decode"]["groups"][1]["lastProbe"]["time"],
        "latencyMs": None,
        "error": "timeout after 3s",
        "ageSeconds": 3.0,
    }


def test_status_of_a_deployment_the_operator_has_not_seen() -> None:
    obj = SCENE.stored()
    del obj["status"]
    text = kp.format_status(kp.status_view(obj, [], NOW))
    assert "qwen in ns: no status yet" in text


# --------------------------------------------------------------------------- incidents


def test_incidents_table_names_verdicts_times_and_the_open_incidents_outlier() -> None:
    view = kp.incidents_view(stored(), SCENE.pods, SCENE.events_for(stored()), NOW)
    text = kp.format_incidents(view, NOW)
    assert rows(text, "decode-0-1  ") == [
        ["decode-0-1", "decode/0", "0", "Desynced", "Closed", "10m ago", "0.7s", "7.4s",
         "InPlace", "-"],
    ]  # fmt: skip
    # The record of the open incident names the pod its verdict implicated; the pods say
    # on which node it runs.
    node = next(
        p["spec"]["nodeName"] for p in SCENE.pods if p["metadata"]["name"] == "qwen-decode-1-1"
    )
    assert rows(text, "decode-1-1  ") == [
        ["decode-1-1", "decode/1", "0", "RankDown", "Open", "19s ago", "1.2s", "-", "Recreate",
         f"qwen-decode-1-1 (node {node})"],
    ]  # fmt: skip
    assert "now            WaitingProbe for 6s" in text
    assert "escalation     the agent of qwen-decode-1-1 did not answer" in text
    assert "kubectl lockstep evidence qwen decode-0-1 -n ns" in text


def test_an_incidents_steps_are_its_groups_events_between_first_failure_and_recovery() -> None:
    view = kp.incidents_view(stored(), SCENE.pods, SCENE.events_for(stored()), NOW)
    closed, open_ = view["incidents"]
    assert [(s["reason"], s["offsetSeconds"]) for s in closed["steps"]] == [
        ("GroupDesynced", 0.0),
        ("GroupDrained", 0.3),
        ("GroupRestartingInPlace", 1.0),
        ("GroupReadmitted", 7.4),
    ]
    assert closed["steps"][1]["message"] == "out of 1 router, readiness gate false"
    # decode/1's own, and none of prefill/0's (older) or decode/0's.
    assert [s["reason"] for s in open_["steps"]] == ["GroupRankDown", "GroupRestartEscalated"]
    text = kp.format_incidents(view, NOW)
    assert "+0.3s  GroupDrained            out of 1 router" in text


def test_a_closed_incident_outlier_is_unknown_until_status_records_it() -> None:
    view = kp.incidents_view(stored(), SCENE.pods, [], NOW)
    assert view["incidents"][0]["outlier"] == []
    incidents = [
        {**SCENE.status["incidents"][0], "culprits": ["qwen-decode-0-1"]},
        SCENE.status["incidents"][1],
    ]
    view = kp.incidents_view(stored(status__incidents=incidents), SCENE.pods, [], NOW)
    assert [o["pod"] for o in view["incidents"][0]["outlier"]] == ["qwen-decode-0-1"]


def test_incident_evidence_summary_is_bounded_and_points_at_the_evidence_command() -> None:
    long = "\n".join(f"line {i}" for i in range(30))
    incidents = [{**SCENE.status["incidents"][1], "evidence": long}]
    text = kp.format_incidents(
        kp.incidents_view(stored(status__incidents=incidents), SCENE.pods, [], NOW), NOW
    )
    assert "    line 7\n    ... 22 more lines" in text
    assert "kubectl lockstep evidence" not in text  # nothing captured for it
    assert "steps (Events): none kept" in text


def test_no_incidents() -> None:
    view = kp.incidents_view(stored(status__incidents=[]), [], [], NOW)
    assert (
        kp.format_incidents(view, NOW).strip() == "PDDeployment qwen in ns: no incidents recorded"
    )


# ---------------------------------------------------------------------------- evidence


def test_evidence_shows_each_pods_rank_states_and_stacks() -> None:
    view = kp.evidence_view(stored(), {"data": SCENE.evidence}, "decode-0-1")
    text = kp.format_evidence(view, logs=False)
    assert text.startswith("Incident decode-0-1 of qwen (decode/0, epoch 0): Desynced, Closed")
    assert "Cause: rank 1 (qwen-decode-0-1) reported a consensus failure: divergence" in text
    assert rows(text, "0     0") == [
        ["0", "0", "4100", "yes", "1200", "batch DECODE x8 #1198",
         "all_reduce tp:cpu #311 for 12.3s", "idle, last step 0.06s", "-"],
    ]  # fmt: skip
    assert rows(text, "1     1") == [
        ["1", "1", "4101", "yes", "1201", "batch DECODE x8 #1199",
         "broadcast_pyobj tp:cpu #312 for 12.1s", "idle, last step 0.06s", "FAILED"],
    ]  # fmt: skip
    assert "rank 1 consensus failure: divergence after 900 events at index 3" in text
    assert "        broadcast_pyobj (sglang/srt/utils/common.py:1187)" in text
    assert "Pod qwen-decode-0-0: log: 2 lines kept (--logs shows them)" in text
    assert "Pod qwen-decode-0-1: log: unavailable (ApiException)" in text
    assert "INFO decode batch" not in text
    with_logs = kp.format_evidence(view, logs=True)
    assert (
        "Pod qwen-decode-0-0: log\n  INFO decode batch 1198\n  INFO decode batch 1199" in with_logs
    )


def test_evidence_a_truncated_answer_is_shown_as_it_was_kept() -> None:
    answer = ranks_answer("p-0", 0, NOW, [rank_state(0, now=NOW, seq=5)])[:60]
    data = to_data({"x-0-1": EvidenceEntry("Hung", f"[p-0] ranks: {answer}")})
    text = kp.format_evidence(kp.evidence_view(stored(), {"data": data}, "x-0-1"), logs=False)
    assert text.startswith("Incident x-0-1 of qwen: not in status (only its evidence is kept)")
    assert f"(not readable as rank states) {answer.rstrip()}\n" in text


def test_evidence_of_an_unknown_incident_lists_the_ones_there_are() -> None:
    with pytest.raises(kp.PluginError) as err:
        kp.evidence_view(stored(), {"data": SCENE.evidence}, "decode-0-9")
    assert str(err.value) == (
        "no incident 'decode-0-9' in PDDeployment qwen (namespace ns); its incidents: "
        "decode-0-1, decode-1-1"
    )


def test_evidence_without_a_configmap_entry_is_read_from_status() -> None:
    view = kp.evidence_view(stored(), None, "decode-0-1")
    assert view["source"] == "status" and view["captured"]
    assert [s["pod"] for s in view["sections"] if s["kind"] == "ranks"] == [
        "qwen-decode-0-0",
        "qwen-decode-0-1",
    ]
    assert "from status" in kp.format_evidence(view, logs=False)


def test_evidence_nothing_captured_yet() -> None:
    view = kp.evidence_view(stored(), {"data": SCENE.evidence}, "decode-1-1")
    text = kp.format_evidence(view, logs=False)
    assert "pod qwen-decode-1-1 restarted" in text and "Nothing captured" in text


# ----------------------------------------------------------------------------- restart


def test_restart_sets_what_the_operator_reads_as_one_new_request() -> None:
    value = kp.restart_annotation(stored(), "decode/1", "INC-42: wedged after a driver update", NOW)
    assert value == "decode/1@INC-42-wedged-after-a-driver-update-20260528-202640"
    body = {"metadata": {"annotations": {ANNOTATION_RESTART: value}}}
    assert manual_request(body, "decode", 1) == value.split("@", 1)[1]
    assert manual_request(body, "decode", 0) is None
    # The same reason a second later is another request (the operator acts once per id).
    assert kp.restart_annotation(stored(), "decode/1", "INC-42: wedged after a driver update", NOW + 1) != value  # fmt: skip


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("ticket-42", "ticket-42-20260528-202640"),
        ("  spaces and @ signs / slashes ", "spaces-and-signs-slashes-20260528-202640"),
        ("!!!", "manual-20260528-202640"),
        ("x" * 100, "x" * 40 + "-20260528-202640"),
    ],
)
def test_request_id_keeps_what_the_annotation_parser_accepts(reason: str, expected: str) -> None:
    assert kp.request_id(reason, NOW) == expected
    body = {"metadata": {"annotations": {ANNOTATION_RESTART: f"prefill/0@{expected}"}}}
    assert manual_request(body, "prefill", 0) == expected


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "decode-0",
            "ROLE/GROUP 'decode-0': expected a role (prefill or decode) and a group number, e.g. decode/0",
        ),
        ("router/0", "ROLE/GROUP 'router/0': expected a role"),
        (
            "decode/2",
            "ROLE/GROUP 'decode/2': PDDeployment qwen has decode groups 0..1 (spec.decode.replicas 2); name one of them, e.g. decode/0",
        ),
        ("prefill/1", "ROLE/GROUP 'prefill/1': PDDeployment qwen has prefill groups 0..0"),
    ],
)
def test_restart_of_a_group_the_deployment_does_not_have_is_refused(
    target: str, message: str
) -> None:
    with pytest.raises(kp.PluginError) as err:
        kp.restart_annotation(stored(), target, "why", NOW)
    assert str(err.value).startswith(message)


def test_restart_names_the_groups_there_are_when_they_are_not_0_to_n() -> None:
    # decode/3 still retiring after a scale-down to 2: it can be restarted, and is listed.
    groups = [*SCENE.status["decode"]["groups"], {"index": 3, "state": "Retiring"}]
    obj = stored(status__decode__groups=groups)
    assert kp.restart_annotation(obj, "decode/3", "why", NOW).startswith("decode/3@")
    with pytest.raises(kp.PluginError, match="has decode groups 0, 1, 3 "):
        kp.restart_annotation(obj, "decode/2", "why", NOW)


def test_restart_is_refused_under_observe_only_and_without_a_reason() -> None:
    with pytest.raises(kp.PluginError, match=r"spec\.recovery\.policy ObserveOnly"):
        kp.restart_annotation(
            stored(spec__recovery={"policy": "ObserveOnly"}), "decode/0", "why", NOW
        )
    with pytest.raises(kp.PluginError, match="--reason: say why"):
        kp.restart_annotation(stored(), "decode/0", "  ", NOW)


def test_restart_does_not_drop_another_groups_request_the_operator_has_not_taken() -> None:
    records = {
        "decode/0": GroupRecord(role="decode", index=0, handled_request="old"),
        "decode/1": GroupRecord(role="decode", index=1),
    }
    pending = stored(
        metadata__annotations={
            ANNOTATION_RECORDS: dump_records(records),
            ANNOTATION_RESTART: "decode/1@new",
        }
    )
    with pytest.raises(kp.PluginError, match="decode/1@new is not taken by the operator yet"):
        kp.restart_annotation(pending, "decode/0", "why", NOW)
    # The same group again: a newer request for the same restart.
    assert kp.restart_annotation(pending, "decode/1", "why", NOW).startswith("decode/1@why-")
    taken = with_path(pending, f"metadata.annotations.{ANNOTATION_RESTART}", "decode/0@old")
    assert kp.restart_annotation(taken, "decode/1", "why", NOW).startswith("decode/1@why-")


# ------------------------------------------------------------------------ command line


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (119, "119s"), (130, "2m10s"), (600, "10m"), (3 * 3600 + 60, "3h1m"),
     (10 * 3600, "10h"), (49 * 3600, "2d1h"), (9 * 86400, "9d"), (-5, "0s")],
)  # fmt: skip
def test_ages_read_as_kubectls(seconds: float, text: str) -> None:
    assert kp.human_duration(seconds) == text


def test_connection_flags_go_before_or_after_the_command() -> None:
    parser = kp.build_parser()
    after = parser.parse_args(["status", "qwen", "-n", "prod", "--context", "c1"])
    before = parser.parse_args(["-n", "prod", "--context", "c1", "status", "qwen"])
    for args in (after, before):
        assert (args.namespace, args.context, args.kubeconfig) == ("prod", "c1", None)
    args = parser.parse_args(["restart", "qwen", "decode/0", "--reason", "t-1"])
    assert (args.group, args.reason) == ("decode/0", "t-1")


def test_usage_errors_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        kp.main(["restart", "qwen", "decode/0"])
    assert done.value.code == 1
    assert "the following arguments are required: --reason" in capsys.readouterr().err


def test_an_unreadable_kubeconfig_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = kp.main(["status", "qwen", "--kubeconfig", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: kubeconfig: ") and "--kubeconfig" in err


def test_the_package_installs_the_plugin_executable() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["kubectl-lockstep"] == "lockstep.cli.kubectl:main"


def test_a_spec_without_replicas_has_one_group_per_role() -> None:
    obj = {**pdd_obj(), "status": {}}
    with pytest.raises(kp.PluginError, match=r"has decode groups 0\.\.0"):
        kp.restart_annotation(obj, "decode/1", "why", NOW)

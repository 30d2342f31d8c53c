"""Why a runtime refused to start, where on-call looks: the container's termination
message the runtime writes (`lockstep_sglang.termination`), read back from a pod's status
(`verdicts.pod_view_from_k8s`) into the group's status and the Degraded condition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from factories import pdd_obj
from harness import report_refused_status

from lockstep.api.models import parse_pddeployment
from lockstep.core.policy import evaluate
from lockstep.core.recovery import Step, new_group_record
from lockstep.core.status import derive_status
from lockstep.core.verdicts import pod_view_from_k8s
from lockstep_sglang import termination

WHY = "RuntimeRefused: this image runs SGLang 0.5.23, the deployment declares 0.5.22"


def test_the_runtime_writes_one_bounded_line_without_its_banner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "termination-log"
    monkeypatch.setenv(termination.PATH_ENV, str(out))
    termination.refused("lockstep-sglang refuses to start: SGLang 0.5.23 is\nnot 0.5.22")
    assert out.read_text() == "RuntimeRefused: SGLang 0.5.23 is not 0.5.22\n"
    termination.refused("x" * 10_000)
    assert len(out.read_bytes()) <= termination.MAX_BYTES + 1
    monkeypatch.setenv(termination.PATH_ENV, str(tmp_path / "no" / "dir"))
    termination.refused("still exits")  # never raises


def pod(status: dict[str, Any], name: str = "m-decode-0-0") -> dict[str, Any]:
    labels = {"lockstep.dev/epoch": "0", "lockstep.dev/rank": "0"}
    return {"metadata": {"name": name, "uid": f"u-{name}", "labels": labels}, "status": status}


def test_a_refusal_is_read_from_the_last_state_or_an_init_container() -> None:
    view = pod_view_from_k8s(pod(report_refused_status(WHY, restarts=3)))
    assert (view.refusal, view.refusal_restart) == (WHY, 3)
    install = {
        "initContainerStatuses": [
            {"name": "lockstep-runtime", "restartCount": 1,
             "state": {"terminated": {"exitCode": 1, "message": "RuntimeInstallFailed: x"}}}
        ]
    }  # fmt: skip
    assert pod_view_from_k8s(pod(install)).refusal == "RuntimeInstallFailed: x"
    # A crash's own words are no refusal; nor is a pod that says nothing.
    crash = report_refused_status("Traceback (most recent call last): ...")
    assert pod_view_from_k8s(pod(crash)).refusal is None
    assert pod_view_from_k8s(pod({})).refusal is None


def test_status_shows_the_refusal_on_the_group_and_in_the_degraded_condition() -> None:
    pdd = parse_pddeployment(pdd_obj())
    records = {
        f"{r}/0": new_group_record(r, 0, now=100.0).model_copy(update={"step": Step.STARTING})
        for r in ("prefill", "decode")
    }
    pods = {("decode", 0): [pod(report_refused_status(WHY))]}
    status = derive_status(pdd, evaluate(pdd.spec), [], records, {}, {}, pods, {}, 200.0)
    (group,) = status["decode"]["groups"]
    assert group["message"] == WHY
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "RuntimeRefused"
    assert degraded["message"] == f"decode/0: {WHY}"

"""The SGLang release a spec is judged for, and what changes with it: the flag table,
the rules that apply, the flags the operator renders, the version the launcher is told
to insist on; and the launcher's refusal of an image that runs another release."""

from __future__ import annotations

from typing import Any

import pytest
from factories import pdd_obj

from lockstep.api.models import parse_pddeployment
from lockstep.core.builders import build_group_pods
from lockstep.core.policy import evaluate, image_sglang_version
from lockstep_sglang import pins

pytestmark = pytest.mark.unit


def judged(image: str, declared: str | None = None, **decode: Any) -> Any:
    obj = pdd_obj(decode=decode or None) if decode else pdd_obj()
    obj["spec"]["image"] = image
    if declared is not None:
        obj["spec"]["sglangVersion"] = declared
    return parse_pddeployment(obj)


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("lmsysorg/sglang:v0.5.23-cu130", "0.5.23"),
        ("lmsysorg/sglang:v0.5.21", "0.5.21"),
        ("registry.local:5000/sglang:0.5.22-lockstep0.1.0", "0.5.22"),
        ("lmsysorg/sglang:v0.5.22-cu130@sha256:" + "0" * 64, "0.5.22"),
        ("lmsysorg/sglang:latest", None),
        ("lmsysorg/sglang", None),
        ("registry.local:5000/sglang", None),
    ],
)
def test_the_image_tag_names_the_release(image: str, version: str | None) -> None:
    assert image_sglang_version(image) == version


@pytest.mark.parametrize("version", ["0.5.21", "0.5.22", "0.5.23"])
def test_each_supported_release_is_judged_by_its_own_table(version: str) -> None:
    result = evaluate(judged(f"lmsysorg/sglang:v{version}-cu130").spec)
    assert result.accepted and result.sglang_version == version
    assert not [f for f in result.findings if f.rule == "sglang-version"]
    assert result.roles["decode"].env["LOCKSTEP_SGLANG_VERSION"] == version


def test_a_flag_of_a_newer_release_is_unknown_to_an_older_one() -> None:
    obj = pdd_obj()
    obj["spec"]["decode"]["args"] = ["--enable-hicache"]  # new in 0.5.23
    obj["spec"]["image"] = "lmsysorg/sglang:v0.5.22-cu130"
    (finding,) = [
        f for f in evaluate(parse_pddeployment(obj).spec).findings if f.rule == "unknown-flag"
    ]
    assert "not a flag of SGLang 0.5.22" in finding.message
    obj["spec"]["image"] = "lmsysorg/sglang:v0.5.23-cu130"
    assert evaluate(parse_pddeployment(obj).spec).accepted


def test_an_unsupported_release_is_refused_with_the_supported_list() -> None:
    for pdd, field in (
        (judged("lmsysorg/sglang:v0.5.24-cu130"), "spec.image"),
        (judged("lmsysorg/sglang:latest", declared="0.5.20"), "spec.sglangVersion"),
    ):
        result = evaluate(pdd.spec)
        (f,) = [f for f in result.findings if f.rule == "sglang-version"]
        assert f.action == "rejected" and f.field == field and not result.accepted
        assert "supported: 0.5.21, 0.5.22, 0.5.23" in f.message
        assert ".ci/sglang-release" in f.fix


def test_a_declared_release_that_the_image_tag_contradicts_is_refused() -> None:
    result = evaluate(judged("lmsysorg/sglang:v0.5.23-cu130", declared="0.5.22").spec)
    (f,) = [f for f in result.findings if f.rule == "sglang-version"]
    assert f.action == "rejected" and "tagged 0.5.23" in f.message


def test_an_image_that_names_no_release_is_judged_as_the_newest_and_said_so() -> None:
    result = evaluate(judged("mycorp/inference:prod").spec)
    (f,) = [f for f in result.findings if f.rule == "sglang-version"]
    assert result.accepted and f.action == "reported" and f.severity == "warning"
    assert result.sglang_version == "0.5.23" and "set spec.sglangVersion" in f.fix
    declared = evaluate(judged("mycorp/inference:prod", declared="0.5.21").spec)
    assert declared.sglang_version == "0.5.21" and declared.accepted


def test_rules_and_rendered_flags_follow_the_release() -> None:
    tp2 = {"tp": 2, "gpusPerPod": 2}
    rules = {
        v: {f.rule for f in evaluate(judged(f"x/sglang:v{v}", **tp2).spec).findings}
        for v in ("0.5.21", "0.5.22", "0.5.23")
    }
    # A failed KV transfer is held per rank before 0.5.23.
    assert "decode-transfer-hold" in rules["0.5.21"] and "decode-transfer-hold" in rules["0.5.22"]
    assert "decode-transfer-hold" not in rules["0.5.23"]
    assert all("decode-queue-collectives" in r for r in rules.values())
    # DP attention: 0.5.21 has only the switch, later releases size it.
    dpa = {"tp": 4, "gpusPerPod": 4, "dp": 2, "dpAttention": True}
    for version, flags in (
        ("0.5.21", ["--enable-dp-attention"]),
        ("0.5.23", ["--attn-dp-size", "2"]),
    ):
        pdd = judged(f"x/sglang:v{version}", **dpa)
        argv = evaluate(pdd.spec).roles["decode"].argv
        assert [a for a in argv if "dp-attention" in a or "attn-dp" in a] == flags[:1]
        if len(flags) > 1:
            assert argv[argv.index(flags[0]) + 1] == flags[1]
        pod = build_group_pods(pdd, "decode", 0, 0, evaluate(pdd.spec).roles["decode"])[0]
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["LOCKSTEP_SGLANG_VERSION"] == version


def test_the_launcher_refuses_an_image_of_another_release_than_declared() -> None:
    report = pins.check(expected_version="0.5.22", installed_version="0.5.23")
    assert not report.ok
    message = report.message()
    assert "declares SGLang 0.5.22" in message and "image runs 0.5.23" in message
    assert "supported: 0.5.21, 0.5.22, 0.5.23" in message
    unknown = pins.check(installed_version="0.5.24")
    assert not unknown.ok and "0.5.24 is not a supported release" in unknown.message()
    assert ".ci/sglang-release" in unknown.message()

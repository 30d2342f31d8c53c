"""The safety-flag policy: each rule, in each mode, names its rule id and field."""

from __future__ import annotations

from typing import Any

import pytest
from factories import pdd_obj, with_path

from lockstep.api.models import parse_pddeployment
from lockstep.core.policy import RULES, Finding, PolicyResult, evaluate
from lockstep.core.policy.flags import load_flag_table


def run(obj: dict[str, Any], mode: str | None = None) -> PolicyResult:
    if mode:
        obj = with_path(obj, "spec.safety.mode", mode)
    return evaluate(parse_pddeployment(obj).spec)


def finding(result: PolicyResult, rule: str, role: str | None = None) -> Finding:
    for f in result.findings:
        if f.rule == rule and (role is None or f.field.startswith(f"spec.{role}")):
            return f
    raise AssertionError(f"no {rule} finding in {[str(f) for f in result.findings]}")


def args_obj(decode_args: list[str], **decode: Any) -> dict[str, Any]:
    return pdd_obj(decode={"tp": 1, "gpusPerPod": 1, "args": decode_args, **decode})


TP2 = {"tp": 2, "gpusPerPod": 2}


# -------------------------------------------------------- invalid in every mode

INVALID: list[tuple[str, list[str], str, str]] = [
    ("tp flag", ["--tp-size", "4"], "operator-owned-flag", "spec.decode.args[0]"),
    ("tp alias", ["--tensor-parallel-size", "4"], "operator-owned-flag", "spec.decode.args[0]"),
    ("nnodes", ["--nnodes", "2"], "operator-owned-flag", "spec.decode.args[0]"),
    ("node rank", ["--node-rank", "1"], "operator-owned-flag", "spec.decode.args[0]"),
    ("dist init", ["--dist-init-addr", "a:1"], "operator-owned-flag", "spec.decode.args[0]"),
    ("host", ["--host", "1.2.3.4"], "operator-owned-flag", "spec.decode.args[0]"),
    ("port", ["--port=31000"], "operator-owned-flag", "spec.decode.args[0]"),
    ("pd mode", ["--disaggregation-mode", "decode"], "operator-owned-flag", "spec.decode.args[0]"),
    (
        "bootstrap port",
        ["--disaggregation-bootstrap-port", "9"],
        "operator-owned-flag",
        "spec.decode.args[0]",
    ),
    (
        "transfer backend",
        ["--disaggregation-transfer-backend", "nixl"],
        "operator-owned-flag",
        "spec.decode.args[0]",
    ),
    ("dp attention", ["--enable-dp-attention"], "operator-owned-flag", "spec.decode.args[0]"),
    ("model path", ["--model-path", "/x"], "operator-owned-flag", "spec.decode.args[0]"),
    ("misspelt flag", ["--mem-fraction-statc", "0.8"], "unknown-flag", "spec.decode.args[0]"),
    ("made-up flag", ["--trust-me"], "unknown-flag", "spec.decode.args[0]"),
    ("float type", ["--mem-fraction-static", "abc"], "flag-value", "spec.decode.args[0]"),
    ("int type", ["--chunked-prefill-size", "8k"], "flag-value", "spec.decode.args[0]"),
    ("bad choice", ["--grammar-backend", "regex"], "flag-value", "spec.decode.args[0]"),
    ("switch with value", ["--trust-remote-code", "yes"], "flag-value", "spec.decode.args[0]"),
    ("missing value", ["--mem-fraction-static"], "flag-value", "spec.decode.args[0]"),
    (
        "json type",
        ["--default-chat-template-kwargs", "{not json"],
        "flag-value",
        "spec.decode.args[0]",
    ),
    ("human int type", ["--context-length", "32KB"], "flag-value", "spec.decode.args[0]"),
    ("stray token", ["0.8"], "flag-value", "spec.decode.args[0]"),
    (
        "duplicate",
        ["--mem-fraction-static", "0.8", "--mem-fraction-static", "0.7"],
        "duplicate-flag",
        "spec.decode.args[2]",
    ),
    (
        "second flag index",
        ["--trust-remote-code", "--max-running-requests", "x"],
        "flag-value",
        "spec.decode.args[1]",
    ),
]


@pytest.mark.parametrize("mode", ["Enforce", "Reject", "Warn"])
@pytest.mark.parametrize(("case", "args", "rule", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_args_are_refused_in_every_mode(
    mode: str, case: str, args: list[str], rule: str, field: str
) -> None:
    result = run(args_obj(args), mode)
    f = finding(result, rule, "decode")
    assert (f.field, f.action, f.severity) == (field, "rejected", "error"), case
    assert not result.accepted


def test_owned_flag_names_the_field_to_use() -> None:
    f = finding(run(args_obj(["--tp-size", "4"])), "operator-owned-flag")
    assert "spec.decode.tp" in f.fix


def test_unknown_flag_suggests_closest() -> None:
    f = finding(run(args_obj(["--mem-fraction-statc", "0.8"])), "unknown-flag")
    assert "--mem-fraction-static" in f.fix


def test_unsupported_sglang_version_is_refused() -> None:
    obj = with_path(args_obj([]), "spec.sglangVersion", "0.5.24")
    f = finding(run(obj), "sglang-version")
    assert f.field == "spec.sglangVersion" and f.action == "rejected"


def test_operator_owned_env_is_refused() -> None:
    obj = args_obj([], env=[{"name": "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER", "value": "0"}])
    f = finding(run(obj), "operator-owned-env")
    assert f.field == "spec.decode.env[0].name"


def test_the_restart_token_cannot_be_set_by_hand() -> None:
    # A fixed token in the spec would let anyone who reads the PDDeployment restart pods.
    obj = args_obj([], env=[{"name": "LOCKSTEP_AGENT_TOKEN", "value": "hunter2"}])
    f = finding(run(obj), "operator-owned-env")
    assert f.field == "spec.decode.env[0].name" and f.action == "rejected"


@pytest.mark.parametrize("mode", ["Enforce", "Reject", "Warn"])
def test_the_runtimes_test_fault_switch_is_never_rendered(mode: str) -> None:
    # It injects desyncs and hangs into the real scheduler loop on purpose.
    obj = args_obj([], env=[{"name": "LOCKSTEP_TEST_FAULT_FILE", "value": "/tmp/fault.json"}])
    obj = with_path(obj, "spec.safety.mode", mode)
    result = run(obj)
    f = finding(result, "operator-owned-env")
    assert f.field == "spec.decode.env[0].name" and f.action == "rejected"
    assert "test-only fault switch" in f.message
    assert not result.accepted


def test_valid_args_pass_through_in_order() -> None:
    result = run(
        args_obj(["--mem-fraction-static", "0.8", "--trust-remote-code", "--page-size=64"])
    )
    argv = list(result.roles["decode"].argv)
    i = argv.index("--mem-fraction-static")
    assert argv[i : i + 4] == [
        "--mem-fraction-static",
        "0.8",
        "--trust-remote-code",
        "--page-size=64",
    ]
    assert result.accepted


def test_negative_number_is_a_value_not_a_flag() -> None:
    result = run(args_obj(["--random-seed", "-1"]))
    assert result.accepted


def test_deprecated_flag_is_reported_not_refused() -> None:
    f = finding(run(args_obj(["--disable-cuda-graph"])), "deprecated-flag")
    assert f.action == "reported" and "--cuda-graph-backend" in f.fix


# ------------------------------------------------------------ unsafe: by mode


def test_overlap_schedule_enforce_adds_the_flag() -> None:
    result = run(pdd_obj(decode=TP2), "Enforce")
    f = finding(result, "overlap-schedule", "decode")
    assert (f.action, f.field) == ("adjusted", "spec.decode.args")
    assert "sglang#26454" in f.issues
    assert "--disable-overlap-schedule" in result.roles["decode"].argv
    assert result.accepted and result.adjusted


def test_overlap_schedule_reject_refuses() -> None:
    result = run(pdd_obj(decode=TP2), "Reject")
    f = finding(result, "overlap-schedule", "decode")
    assert f.action == "rejected" and not result.accepted
    assert "--disable-overlap-schedule" in f.fix


def test_overlap_schedule_warn_reports_only() -> None:
    result = run(pdd_obj(decode=TP2), "Warn")
    f = finding(result, "overlap-schedule", "decode")
    assert f.action == "reported" and result.accepted
    assert "--disable-overlap-schedule" not in result.roles["decode"].argv


def test_overlap_schedule_guarded_keeps_overlap_and_turns_on_consensus() -> None:
    obj = with_path(pdd_obj(decode=TP2), "spec.safety.overlapSchedule", "Guarded")
    result = run(obj, "Reject")
    assert result.accepted
    role = result.roles["decode"]
    assert "--disable-overlap-schedule" not in role.argv
    assert role.env["SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"] == "1"


def test_overlap_rule_not_applied_with_user_flag_or_tp1_or_dp_attention() -> None:
    for decode in (
        {**TP2, "args": ["--disable-overlap-schedule"]},
        {"tp": 1, "gpusPerPod": 1},
        {"tp": 4, "gpusPerPod": 4, "dp": 4, "dpAttention": True},
    ):
        result = run(pdd_obj(decode=decode), "Reject")
        assert all(f.rule != "overlap-schedule" for f in result.findings), decode


@pytest.mark.parametrize(
    ("value", "mode", "action"),
    [
        ("1000000", "Enforce", "adjusted"),
        ("1000000", "Reject", "rejected"),
        ("1000000", "Warn", "reported"),
        ("0", "Enforce", "adjusted"),
        ("0", "Reject", "rejected"),
    ],
)
def test_watchdog_unbounded_or_zero(value: str, mode: str, action: str) -> None:
    result = run(args_obj(["--watchdog-timeout", value]), mode)
    f = finding(result, "watchdog-timeout", "decode")
    assert (f.action, f.field) == (action, "spec.decode.args[0]")
    argv = list(result.roles["decode"].argv)
    expected = "300" if action == "adjusted" else value
    assert argv[argv.index("--watchdog-timeout") + 1] == expected


def test_watchdog_within_bound_is_kept() -> None:
    result = run(args_obj(["--watchdog-timeout", "120"]), "Reject")
    assert result.accepted
    assert all(f.rule != "watchdog-timeout" for f in result.roles["decode"].findings)


def test_missing_timeouts_are_filled_except_in_warn() -> None:
    filled = run(args_obj([]), "Enforce").roles["decode"].argv
    assert "--watchdog-timeout" in filled and "--dist-timeout" in filled
    warned = run(args_obj([]), "Warn")
    assert "--dist-timeout" not in warned.roles["decode"].argv
    assert finding(warned, "dist-timeout", "decode").action == "reported"


def test_spec_grammar_dp_attention_overlap() -> None:
    decode = {
        "tp": 4,
        "gpusPerPod": 4,
        "dp": 4,
        "dpAttention": True,
        "args": ["--speculative-algorithm", "EAGLE"],
    }
    enforce = run(pdd_obj(decode=decode), "Enforce")
    f = finding(enforce, "spec-grammar-dp-attention-overlap", "decode")
    assert f.field == "spec.decode.args[0]" and "sglang#29144" in f.issues
    assert "--disable-overlap-schedule" in enforce.roles["decode"].argv
    assert (
        finding(run(pdd_obj(decode=decode), "Reject"), "spec-grammar-dp-attention-overlap").action
        == "rejected"
    )
    no_grammar = {**decode, "args": [*decode["args"], "--grammar-backend", "none"]}
    assert all(
        f.rule != "spec-grammar-dp-attention-overlap"
        for f in run(pdd_obj(decode=no_grammar)).findings
    )


def test_hicache_prefetch_with_tp() -> None:
    prefill = {
        **TP2,
        "args": [
            "--disable-overlap-schedule",
            "--enable-hierarchical-cache",
            "--hicache-storage-backend",
            "file",
        ],
    }
    enforce = run(pdd_obj(prefill=prefill), "Enforce")
    f = finding(enforce, "hicache-prefetch-tp", "prefill")
    assert f.field == "spec.prefill.args[2]" and "sglang#30760" in f.issues
    assert enforce.roles["prefill"].env["SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"] == "1"
    assert (
        finding(run(pdd_obj(prefill=prefill), "Reject"), "hicache-prefetch-tp").action == "rejected"
    )


def test_decode_queue_collectives_guarded_in_enforce() -> None:
    decode = {**TP2, "args": ["--disable-overlap-schedule"]}
    enforce = run(pdd_obj(decode=decode), "Enforce")
    f = finding(enforce, "decode-queue-collectives")
    assert f.field == "spec.decode.tp" and f.issues == ("sglang#36928",)
    assert enforce.roles["decode"].env["SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"] == "1"
    warn = run(pdd_obj(decode=decode), "Warn")
    assert "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER" not in warn.roles["decode"].env
    assert (
        finding(run(pdd_obj(decode=decode), "Reject"), "decode-queue-collectives").action
        == "rejected"
    )


def test_every_finding_rule_is_documented() -> None:
    result = run(args_obj(["--tp-size", "2", "--watchdog-timeout", "0", "--nope"]), "Enforce")
    for f in result.findings:
        assert f.rule in RULES


def test_runtime_env_is_set_for_every_role() -> None:
    result = run(pdd_obj())
    for role in result.roles.values():
        assert role.env["LOCKSTEP_GLOO_TIMEOUT_SECONDS"] == "120"
        assert role.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


def test_operator_argv_reflects_the_spec() -> None:
    obj = pdd_obj(
        decode={"tp": 16, "gpusPerPod": 8, "podsPerGroup": 2, "dp": 2, "ep": 16},
        transfer={"backend": "nixl", "devices": ["mlx5_0", "mlx5_1"]},
    )
    argv = list(run(obj).roles["decode"].argv)

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert value("--tp-size") == "16"
    assert value("--nnodes") == "2"
    assert value("--disaggregation-mode") == "decode"
    assert value("--disaggregation-transfer-backend") == "nixl"
    assert value("--disaggregation-ib-device") == "mlx5_0,mlx5_1"
    assert value("--dp-size") == "2" and value("--ep-size") == "16"


def test_flag_table_is_for_the_pinned_sglang() -> None:
    table = load_flag_table()
    assert table.sglang_version == "0.5.23"
    assert table.lookup("--disable-overlap-schedule") is not None
    assert table.lookup("--tensor-parallel-size") is table.lookup("--tp-size")

"""Every bound in every form: for each bounded setting, each way it can reach the SGLang
pod (the CR field, `--flag value`, `--flag=value`, an abbreviated flag, a `--config`
file, an environment variable as a value or through valueFrom), what the policy does
under each mode, what `lockstep check`, the webhook and the rendered pod then hold."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from factories import REPO, pdd_obj

from lockstep.api.models import parse_pddeployment
from lockstep.core.builders import build_group_pods
from lockstep.core.policy import evaluate
from lockstep.core.webhook import review

pytestmark = pytest.mark.unit

MODES = ("Enforce", "Reject", "Warn")


def spec(
    mode: str, args: Sequence[str] = (), env: Sequence[dict[str, Any]] = (), **safety: Any
) -> Any:
    obj = pdd_obj(safety={"mode": mode, **safety})
    obj["spec"]["decode"].update({"args": list(args), "env": list(env)})
    return parse_pddeployment(obj)


def decode(result: Any) -> Any:
    return result.roles["decode"]


def findings(result: Any, rule: str) -> list[Any]:
    """`rule`'s findings about the decode role's settings or the CR's safety fields (the
    prefill role, untouched here, gets the operator's defaults)."""
    return [f for f in result.findings if f.rule == rule and not f.field.startswith("spec.prefill")]


# ------------------------------------------------------------------ flag forms

BAD_FLAG_FORMS = {
    # setting: (rule, [each form of an out-of-bounds value], the value the operator sets)
    "watchdog": (
        "watchdog-timeout",
        [["--watchdog-timeout", "0"], ["--watchdog-timeout=0"],
         ["--watchdog-timeout", "1000000"], ["--watchdog-timeout=-1"]],
        "300",
    ),
    "dist": (
        "dist-timeout",
        [["--dist-timeout", "0"], ["--dist-timeout=0"], ["--dist-timeout", "99999"],
         ["--dist-timeout=-5"]],
        "600",
    ),
}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("setting", "form"),
    [(name, form) for name, (_, forms, _) in BAD_FLAG_FORMS.items() for form in forms],
)
def test_a_bounded_flag_is_bounded_in_every_spelling(
    mode: str, setting: str, form: list[str]
) -> None:
    rule, _, want = BAD_FLAG_FORMS[setting]
    result = evaluate(spec(mode, form).spec)
    (finding,) = findings(result, rule)
    assert finding.field == "spec.decode.args[0]"
    if mode == "Enforce":
        assert finding.action == "adjusted" and result.accepted
        flag = form[0].split("=")[0]
        argv = list(decode(result).argv)
        # The bound, in the pod's argv, in the spelling the user chose.
        given = [argv[i + 1] for i, a in enumerate(argv) if a == flag]
        given += [a.split("=", 1)[1] for a in argv if a.startswith(f"{flag}=")]
        assert given == [want]
    elif mode == "Reject":
        assert finding.action == "rejected" and not result.accepted
    else:
        assert finding.action == "reported" and result.accepted


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("form", "full"),
    [
        (["--watchdog", "0"], "--watchdog-timeout"),
        (["--watchdog=0"], "--watchdog-timeout"),
        (["--dist-time", "0"], "--dist-timeout"),
        (["--disable-overlap"], "--disable-overlap-schedule"),
    ],
)
def test_an_abbreviated_flag_is_refused_in_every_mode_naming_the_flag(
    mode: str, form: list[str], full: str
) -> None:
    # argparse would expand it, so SGLang would apply a value the policy never judged.
    result = evaluate(spec(mode, form).spec)
    (finding,) = findings(result, "unknown-flag")
    assert finding.action == "rejected" and not result.accepted
    assert full in finding.message and finding.fix == f"write {full} in full"


def test_an_ambiguous_prefix_is_an_unknown_flag() -> None:
    (finding,) = findings(evaluate(spec("Warn", ["--enable", "x"]).spec), "unknown-flag")
    assert "not a flag" in finding.message


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("form", [["--config", "/etc/sglang.yaml"], ["--config=/x.yaml"]])
def test_a_config_file_is_refused_in_every_mode(mode: str, form: list[str]) -> None:
    result = evaluate(spec(mode, form).spec)
    (finding,) = findings(result, "config-file")
    assert finding.action == "rejected" and "write those options in args" in finding.fix


# ------------------------------------------------------------------ the CR's fields


def test_the_watchdog_field_may_not_exceed_its_own_bound_field() -> None:
    from lockstep.api.models import InvalidPDDeployment

    with pytest.raises(InvalidPDDeployment) as err:
        spec("Enforce", watchdogTimeoutSeconds=1200, maxWatchdogTimeoutSeconds=600)
    (problem,) = err.value.problems
    assert problem.field == "spec.safety.watchdogTimeoutSeconds"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("watchdogTimeoutSeconds", 0),
        ("watchdogTimeoutSeconds", 100000),
        ("distTimeoutSeconds", 0),
        ("distTimeoutSeconds", 99999),
        ("glooTimeoutSeconds", 0),
        ("glooTimeoutSeconds", 7200),
    ],
)
def test_each_safety_field_is_bounded_by_the_schema(field: str, value: int) -> None:
    from lockstep.api.models import InvalidPDDeployment

    with pytest.raises(InvalidPDDeployment) as err:
        spec("Enforce", **{field: value})
    assert any(p.field == f"spec.safety.{field}" for p in err.value.problems)


# ------------------------------------------------------------------ environment forms

OWNED = ["SGLANG_ENABLE_RANK_CONSENSUS_CHECKER", "LOCKSTEP_GLOO_TIMEOUT_SECONDS",
         "LOCKSTEP_AGENT_TOKEN", "LOCKSTEP_TEST_FAULT_FILE",
         # lockstep's own runtime guard: the operator's in every mode, Warn included.
         "LOCKSTEP_AGENT", "LOCKSTEP_CONSENSUS", "LOCKSTEP_PROBE_MAX_TIMEOUT_S",
         "LOCKSTEP_EXIT_HOLD_S", "LOCKSTEP_STATE_DIR", "LOCKSTEP_NOT_YET_INVENTED"]  # fmt: skip
SECRET_REF = {"secretKeyRef": {"name": "s", "key": "k"}}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", OWNED)
@pytest.mark.parametrize("source", ["value", "valueFrom"])
def test_env_the_operator_sets_is_refused_as_a_value_or_a_reference(
    mode: str, name: str, source: str
) -> None:
    var = (
        {"name": name, "value": "0"}
        if source == "value"
        else {"name": name, "valueFrom": SECRET_REF}
    )
    result = evaluate(spec(mode, env=[var]).spec)
    (finding,) = findings(result, "operator-owned-env")
    assert finding.action == "rejected" and finding.field == "spec.decode.env[0].name"


# torch's guards (lockstep's own, LOCKSTEP_*, are operator-owned: above).
GUARD_ENV = [
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"),
    ("TORCH_NCCL_ENABLE_MONITORING", "0"),
    ("TORCH_NCCL_DUMP_ON_TIMEOUT", "0"),
    ("TORCH_NCCL_TRACE_BUFFER_SIZE", "0"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "value"), GUARD_ENV)
@pytest.mark.parametrize("source", ["value", "valueFrom"])
def test_env_that_loosens_a_guard_never_reaches_the_pod_unless_only_reported(
    mode: str, name: str, value: str, source: str
) -> None:
    var = (
        {"name": name, "value": value}
        if source == "value"
        else {"name": name, "valueFrom": SECRET_REF}
    )
    keep = {"name": "HF_HOME", "value": "/cache"}
    pdd = spec(mode, env=[keep, var])
    result = evaluate(pdd.spec)
    (finding,) = findings(result, "guard-env")
    assert finding.field == "spec.decode.env[1]" and name in finding.message
    pod = build_group_pods(pdd, "decode", 0, 0, decode(result))[0]
    rendered = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert "HF_HOME" in rendered
    decision = review(pdd_dict(mode, [keep, var]))
    if mode == "Enforce":
        assert finding.action == "adjusted" and result.accepted
        assert (name in rendered) == (name in result.roles["decode"].env)  # only ours
        assert name not in {v.name for v in decode(result).user_env}
        # The webhook writes the env without it back into the spec.
        assert decision.allowed and decision.adjusted_env["decode"] == [keep]
    elif mode == "Reject":
        assert finding.action == "rejected" and not decision.allowed
        assert name in decision.message
    else:
        assert finding.action == "reported" and decision.allowed and name in rendered


@pytest.mark.parametrize("value", ["1", "3"])
def test_nccl_settings_that_keep_the_guard_are_left_alone(value: str) -> None:
    var = {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": value}
    result = evaluate(spec("Reject", env=[var]).spec)
    assert not findings(result, "guard-env") and result.accepted


def pdd_dict(mode: str, env: list[dict[str, Any]]) -> dict[str, Any]:
    obj = pdd_obj(safety={"mode": mode})
    obj["spec"]["decode"]["env"] = env
    return obj


@pytest.mark.parametrize("source", ["value", "valueFrom"])
def test_switching_the_pod_agent_off_is_refused_under_warn_too(source: str) -> None:
    # Warn reports what it leaves unsafe; it does not let a spec switch a lockstep guard off.
    var = (
        {"name": "LOCKSTEP_AGENT", "value": "0"}
        if source == "value"
        else {"name": "LOCKSTEP_AGENT", "valueFrom": SECRET_REF}
    )
    result = evaluate(spec("Warn", env=[var]).spec)
    (finding,) = findings(result, "operator-owned-env")
    assert finding.action == "rejected" and not result.accepted
    assert "pod agent" in finding.message and "every mode" in finding.message
    assert finding.fix.startswith("remove LOCKSTEP_AGENT from env")
    decision = review(pdd_dict("Warn", [var]))
    assert not decision.allowed
    assert "spec.decode.env[0].name" in decision.message and "LOCKSTEP_AGENT" in decision.message


def test_every_setting_of_the_runtime_is_the_operators() -> None:
    # Each LOCKSTEP_ variable lockstep's runtime reads is either set by the operator or
    # described as a guard setting (the message says what it switches), and refused.
    import re

    from lockstep.api import constants as c
    from lockstep.core.policy.engine import OWNED_ENV, RUNTIME_GUARD_ENV

    runtime = REPO / "images" / "sglang" / "lockstep_sglang"
    read = {
        name
        for path in runtime.glob("*.py")
        for name in re.findall(r'"(LOCKSTEP_[A-Z_]+)"', path.read_text())
    }
    assert read, "no LOCKSTEP_ variable found in the runtime"
    known = set(OWNED_ENV) | set(RUNTIME_GUARD_ENV) | {c.ENV_TEST_FAULT_FILE}
    assert sorted(read - known) == []
    for name in sorted(read):
        result = evaluate(spec("Warn", env=[{"name": name, "value": "1"}]).spec)
        assert not result.accepted, name


# ------------------------------------------------------------------ step bounds vs watchdog


def step_spec(
    mode: str,
    args: Sequence[str] = (),
    steps: dict[str, Any] | None = None,
    prefill_args: Sequence[str] = (),
    **safety: Any,
) -> Any:
    obj = pdd_obj(safety={"mode": mode, **safety}, health={"stepBounds": steps or {}})
    obj["spec"]["decode"]["args"] = list(args)
    obj["spec"]["prefill"]["args"] = list(prefill_args)
    return obj


# (case, stepBounds, safety fields, the args of both roles, the bound refused, what the
# message names as the watchdog)
STEP_CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str], str, str]] = [
    # The watchdog as the CR field (both roles take it: one finding about the spec).
    ("field", {}, {"watchdogTimeoutSeconds": 60}, [], "minSeconds",
     "spec.safety.watchdogTimeoutSeconds"),
    ("field vs maxSeconds", {"maxSeconds": 600}, {}, [], "maxSeconds",
     "spec.safety.watchdogTimeoutSeconds"),
    # The watchdog as a flag, in each spelling (one finding per role that sets it).
    ("flag", {}, {}, ["--watchdog-timeout", "60"], "minSeconds", "--watchdog-timeout in spec."),
    ("flag=", {}, {}, ["--watchdog-timeout=60"], "minSeconds", "--watchdog-timeout in spec."),
    ("flag vs maxSeconds", {"maxSeconds": 900}, {}, ["--watchdog-timeout", "600"], "maxSeconds",
     "--watchdog-timeout in spec."),
]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("case", "steps", "safety", "args", "bound", "source"),
    STEP_CASES,
    ids=[case[0] for case in STEP_CASES],
)
def test_step_bounds_above_the_watchdog_are_refused_in_every_form_and_mode(
    mode: str,
    case: str,
    steps: dict[str, Any],
    safety: dict[str, Any],
    args: list[str],
    bound: str,
    source: str,
) -> None:
    obj = step_spec(mode, args, steps, prefill_args=args, **safety)
    result = evaluate(parse_pddeployment(obj).spec)
    found = [f for f in result.findings if f.rule == "step-bounds"]
    assert len(found) == (2 if args else 1), case
    for finding in found:
        assert finding.field == f"spec.health.stepBounds.{bound}"
        assert finding.action == "rejected", "refused in every mode, never clamped"
        assert source in finding.message and "watchdog" in finding.message
        assert f"make {bound} <= " in finding.fix
    assert not result.accepted
    decision = review(obj)
    assert not decision.allowed and f"spec.health.stepBounds.{bound}" in decision.message


def test_step_bounds_under_a_watchdog_raised_by_flag_pass() -> None:
    # 90 s minSeconds (the default) with the CR's watchdog at 60 s but both roles raising
    # their own to 600 s: no role's watchdog ends a step before 90 s.
    raised = ["--watchdog-timeout", "600"]
    obj = step_spec("Reject", raised, {}, prefill_args=raised, watchdogTimeoutSeconds=60)
    result = evaluate(parse_pddeployment(obj).spec)
    assert result.accepted, [str(f) for f in result.findings]
    # One role left on the CR's 60 s is refused, naming that field.
    one = step_spec("Reject", raised, {}, watchdogTimeoutSeconds=60)
    (finding,) = [
        f for f in evaluate(parse_pddeployment(one).spec).findings if f.rule == "step-bounds"
    ]
    assert "spec.safety.watchdogTimeoutSeconds" in finding.message


def test_step_bounds_against_an_enforced_watchdog_name_the_value_that_runs() -> None:
    # Enforce replaces an unbounded watchdog with the operator's 300 s: the step bound is
    # judged against what SGLang will run with.
    obj = step_spec("Enforce", ["--watchdog-timeout", "1000000"], {"maxSeconds": 600})
    result = evaluate(parse_pddeployment(obj).spec)
    (finding,) = [
        f for f in result.findings if f.rule == "step-bounds" and "spec.decode.args" in f.message
    ]
    assert "300s (--watchdog-timeout in spec.decode.args[0])" in finding.message
    assert not result.accepted


@pytest.mark.parametrize("form", [["--watchdog", "600"], ["--config", "/x.yaml"]])
def test_a_watchdog_the_policy_cannot_see_is_refused_before_any_step_bound(
    form: list[str],
) -> None:
    obj = step_spec("Warn", form, {"maxSeconds": 500})
    result = evaluate(parse_pddeployment(obj).spec)
    assert not result.accepted
    assert any(f.field == "spec.decode.args[0]" and f.action == "rejected" for f in result.findings)


def test_the_operator_judges_steps_by_each_roles_watchdog() -> None:
    from lockstep.control import step_bounds
    from lockstep.core.policy import watchdog_seconds

    obj = step_spec("Enforce", ["--watchdog-timeout=1200"], {"minSeconds": 30})
    pdd = parse_pddeployment(obj)
    result = evaluate(pdd.spec)
    decode_cap = step_bounds(pdd, watchdog_seconds(result.roles["decode"].argv)).max_seconds
    prefill_cap = step_bounds(pdd, watchdog_seconds(result.roles["prefill"].argv)).max_seconds
    # A decode step may run to 1200 s (its SGLang allows it); prefill keeps the CR's 300 s.
    assert (decode_cap, prefill_cap) == (1200, 300)
    capped = step_spec(
        "Enforce", ["--watchdog-timeout=1200"], {"minSeconds": 30, "maxSeconds": 900}
    )
    assert step_bounds(parse_pddeployment(capped), 1200).max_seconds == 900


# ------------------------------------------------------------------ a bound that is no number


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("form", "wants"),
    [
        (["--watchdog-timeout", "abc"], "a number of seconds"),
        (["--watchdog-timeout=5m"], "a number of seconds"),
        (["--dist-timeout", "ten"], "a whole number of seconds"),
        (["--dist-timeout=1.5"], "a whole number of seconds"),
    ],
)
def test_a_bound_that_is_no_number_says_the_flag_wants_one(
    mode: str, form: list[str], wants: str
) -> None:
    result = evaluate(spec(mode, form).spec)
    (finding,) = findings(result, "flag-value")
    flag = form[0].split("=")[0]
    rule_of = {"--watchdog-timeout": "watchdog-timeout", "--dist-timeout": "dist-timeout"}
    assert finding.field == "spec.decode.args[0]" and finding.action == "rejected"
    assert f"{flag} wants {wants}" in finding.message
    assert finding.fix.startswith(f"give {flag} {wants}, e.g. {flag} ")
    # Nothing claims the flag was not set.
    assert not any(f"{flag} is not set" in f.message for f in findings(result, rule_of[flag]))


@pytest.mark.parametrize("mode", MODES)
def test_a_nan_watchdog_is_no_number_of_seconds(mode: str) -> None:
    result = evaluate(spec(mode, ["--watchdog-timeout", "nan"]).spec)
    (finding,) = findings(result, "watchdog-timeout")
    assert "is not a number of seconds" in finding.message
    assert {"Enforce": "adjusted", "Reject": "rejected", "Warn": "reported"}[mode] == finding.action

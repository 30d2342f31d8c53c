"""`lockstep check | render | crd`: exit codes, output shapes, messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from factories import EXAMPLES, REPO

from lockstep.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("mode", ["Enforce", "Reject", "Warn"])
@pytest.mark.parametrize("name", ["pd-small", "dp-attention"])
def test_good_examples_accepted_in_every_mode(
    capsys: pytest.CaptureFixture[str], name: str, mode: str
) -> None:
    code, out, _ = run(
        capsys, "check", "-f", str(EXAMPLES / f"{name}.yaml"), "--mode", mode, "-o", "json"
    )
    report = json.loads(out)
    assert code == 0 and report["accepted"] is True
    assert set(report["effective"]) == {"prefill", "decode"}
    assert all(f["action"] != "rejected" for f in report["findings"])


# example, mode -> (exit code, rules that must appear, with action)
CASES = [
    (
        "deepseek-v3",
        "Enforce",
        0,
        {("overlap-schedule", "adjusted"), ("decode-queue-collectives", "adjusted")},
    ),
    (
        "deepseek-v3",
        "Reject",
        1,
        {("overlap-schedule", "rejected"), ("decode-queue-collectives", "rejected")},
    ),
    ("deepseek-v3", "Warn", 0, {("overlap-schedule", "reported")}),
    ("unsafe/overlap-schedule", "Enforce", 0, {("overlap-schedule", "adjusted")}),
    ("unsafe/overlap-schedule", "Reject", 1, {("overlap-schedule", "rejected")}),
    ("unsafe/overlap-schedule", "Warn", 0, {("overlap-schedule", "reported")}),
    ("unsafe/watchdog-unbounded", "Enforce", 0, {("watchdog-timeout", "adjusted")}),
    ("unsafe/watchdog-unbounded", "Reject", 1, {("watchdog-timeout", "rejected")}),
    ("unsafe/watchdog-unbounded", "Warn", 0, {("watchdog-timeout", "reported")}),
    ("unsafe/operator-owned-flag", "Enforce", 1, {("operator-owned-flag", "rejected")}),
    ("unsafe/operator-owned-flag", "Warn", 1, {("operator-owned-flag", "rejected")}),
    (
        "unsafe/misspelt-flag",
        "Enforce",
        1,
        {("unknown-flag", "rejected"), ("flag-value", "rejected")},
    ),
    ("unsafe/misspelt-flag", "Warn", 1, {("unknown-flag", "rejected")}),
]


@pytest.mark.parametrize(("name", "mode", "code", "rules"), CASES)
def test_examples_by_mode(
    capsys: pytest.CaptureFixture[str], name: str, mode: str, code: int, rules: set[tuple[str, str]]
) -> None:
    got, out, _ = run(
        capsys, "check", "-f", str(EXAMPLES / f"{name}.yaml"), "--mode", mode, "-o", "json"
    )
    report = json.loads(out)
    assert got == code and report["accepted"] is (code == 0)
    assert rules <= {(f["rule"], f["action"]) for f in report["findings"]}


def test_enforce_adjusts_the_effective_argv(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(
        capsys, "check", "-f", str(EXAMPLES / "unsafe/watchdog-unbounded.yaml"), "-o", "json"
    )
    argv = json.loads(out)["effective"]["decode"]
    assert "--watchdog-timeout=300" in argv or argv[argv.index("--watchdog-timeout") + 1] == "300"


def test_human_output_lists_rule_field_and_fix(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "-f", str(EXAMPLES / "unsafe/misspelt-flag.yaml"))
    assert code == 1
    assert "REJECTED" in out
    assert "unknown-flag: spec.decode.args[0]" in out
    assert "did you mean --mem-fraction-static?" in out


def test_schema_errors_are_rejections_with_field_paths(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    obj = yaml.safe_load((EXAMPLES / "pd-small.yaml").read_text())
    obj["spec"]["decode"]["tp"] = 3
    bad.write_text(yaml.safe_dump(obj))
    code, out, _ = run(capsys, "check", "-f", str(bad), "-o", "json")
    report = json.loads(out)
    assert code == 1
    assert report["findings"][0]["field"] == "spec.decode.tp"
    assert report["findings"][0]["rule"] == "schema"


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        # What the API server refuses by the CRD's types, not read as something else.
        (("spec", "router", "enabled"), "yes", "spec.router.enabled"),
        (("spec", "decode", "tp"), "2", "spec.decode.tp"),
        # And by its metadata rules.
        (("metadata", "labels"), {"team": "x" * 64}, "metadata.labels['team']"),
        (("metadata", "annotations"), {"bad key": "v"}, "metadata.annotations['bad key']"),
    ],
)
def test_check_refuses_what_the_api_server_would(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    where: tuple[str, ...],
    value: object,
    field: str,
) -> None:
    obj = yaml.safe_load((EXAMPLES / "pd-small.yaml").read_text())
    node = obj
    for key in where[:-1]:
        node = node.setdefault(key, {})
    node[where[-1]] = value
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(obj))
    code, out, _ = run(capsys, "check", "-f", str(bad), "-o", "json")
    assert code == 1
    assert [f["field"] for f in json.loads(out)["findings"]] == [field]
    # A label and an annotation Kubernetes takes pass.
    obj = yaml.safe_load((EXAMPLES / "pd-small.yaml").read_text())
    obj["metadata"]["labels"] = {"app.kubernetes.io/team": "serving-a"}
    obj["metadata"]["annotations"] = {"example.org/ticket": "INC 42, see the runbook"}
    bad.write_text(yaml.safe_dump(obj))
    assert run(capsys, "check", "-f", str(bad))[0] == 0


@pytest.mark.parametrize(
    ("content", "needle"),
    [(None, "cannot read"), ("a: [", "not valid YAML"), ("- 1\n- 2\n", "exactly one YAML mapping")],
)
def test_unreadable_input_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, needle: str
) -> None:
    path = tmp_path / "in.yaml"
    if content is not None:
        path.write_text(content)
    code, _, err = run(capsys, "check", "-f", str(path))
    assert code == 2 and needle in err


def test_render_emits_applyable_documents(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "render", "-f", str(EXAMPLES / "deepseek-v3.yaml"))
    docs = list(yaml.safe_load_all(out))
    assert code == 0
    assert [d["kind"] for d in docs].count("Pod") == 4
    assert all("apiVersion" in d and "metadata" in d for d in docs)


def test_render_renders_the_groups_the_operator_runs_spares_included_none_while_paused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`lockstep render` shows what the operator runs: the serving groups and the warm
    spares beyond them (decode: 1 + 1 here), and no group of a paused deployment."""
    spec = yaml.safe_load((EXAMPLES / "pd-small.yaml").read_text())
    spec["spec"]["decode"]["spares"] = 1
    path = tmp_path / "spares.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, _ = run(capsys, "render", "-f", str(path))
    assert code == 0
    pods = [d for d in yaml.safe_load_all(out) if d["kind"] == "Pod"]
    groups = sorted(
        {
            (
                p["metadata"]["labels"]["lockstep.dev/role"],
                p["metadata"]["labels"]["lockstep.dev/group"],
            )
            for p in pods
        }
    )
    assert groups == [("decode", "0"), ("decode", "1"), ("prefill", "0")]
    spec["spec"]["paused"] = True
    path.write_text(yaml.safe_dump(spec))
    code, out, _ = run(capsys, "render", "-f", str(path))
    assert code == 0 and not [d for d in yaml.safe_load_all(out) if d["kind"] == "Pod"]


def test_render_refuses_a_rejected_spec(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "render", "-f", str(EXAMPLES / "unsafe/operator-owned-flag.yaml"))
    assert code == 1 and out == "" and "operator-owned-flag" in err


def test_crd_command_prints_the_committed_crd(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "crd")
    assert code == 0
    assert out == (REPO / "crds/pddeployments.lockstep.dev.yaml").read_text()


def test_the_docs_document_every_policy_rule() -> None:
    from lockstep.core.policy import RULES

    page = (REPO / "docs/validation.md").read_text()
    for rule in RULES:
        assert f"`{rule}`" in page, f"docs/validation.md lacks rule {rule}"


def test_dev_engine_choices_are_the_local_clusters_engines() -> None:
    from lockstep_dev import cli as dev_cli
    from lockstep_dev.localcluster.engines import ENGINES

    assert tuple(dev_cli.ENGINE_CHOICES) == ENGINES


def test_a_scenario_the_real_engine_cannot_run_is_refused_with_the_ones_it_can() -> None:
    from lockstep_dev.drills import Drill

    with pytest.raises(ValueError, match="runs on the stand-in only") as err:
        Drill("baseline", engine="sglang")
    assert "desync, hang, rank-kill, sequence" in str(err.value)

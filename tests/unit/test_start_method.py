"""How SGLang's subprocesses start (`lockstep_sglang.start_method`): forked from the engine
process where that is safe, spawned where a device context or the pod says otherwise, and
the choice left in the pod's start-up timeline."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockstep_sglang import start_method, timeline
from lockstep_sglang.config import RuntimeConfig

pytestmark = pytest.mark.unit

LINUX = ("fork", "spawn", "forkserver")


@pytest.fixture
def restore_start_method() -> Iterator[None]:
    before = multiprocessing.get_start_method(allow_none=True)
    yield
    multiprocessing.set_start_method(before, force=True)


def test_a_fresh_engine_process_forks_its_subprocesses() -> None:
    choice = start_method.decide("fork", cuda_initialized=False, available=LINUX)
    assert choice.method == "fork"
    assert "no device context" in choice.why


def test_a_cuda_context_in_the_engine_process_keeps_spawn_and_says_why() -> None:
    choice = start_method.decide("fork", cuda_initialized=True, available=LINUX)
    assert choice.method == "spawn"
    assert "torch.cuda.is_initialized()" in choice.why


def test_the_pod_may_ask_for_spawn_and_a_platform_without_fork_spawns() -> None:
    asked = start_method.decide("spawn", cuda_initialized=False, available=LINUX)
    assert asked == start_method.Choice(
        "spawn", "SGLang's own spawn, as the pod asks (LOCKSTEP_SUBPROCESS_START=spawn)"
    )
    no_fork = start_method.decide("fork", cuda_initialized=False, available=("spawn",))
    assert no_fork.method == "spawn" and "cannot fork" in no_fork.why


def test_a_bad_setting_is_refused_naming_the_variable_and_its_values() -> None:
    assert RuntimeConfig.from_env({}).subprocess_start == "fork"  # where it is safe
    assert RuntimeConfig.from_env({"LOCKSTEP_SUBPROCESS_START": " Spawn "}).subprocess_start == (
        "spawn"
    )
    with pytest.raises(ValueError, match="LOCKSTEP_SUBPROCESS_START must be one of fork, spawn"):
        RuntimeConfig.from_env({"LOCKSTEP_SUBPROCESS_START": "forkserver"})


def test_apply_sets_the_method_children_start_with_and_marks_the_timeline(
    tmp_path: Path, restore_start_method: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    forked = start_method.apply(tmp_path, "fork", cuda_initialized=lambda: False)
    assert multiprocessing.get_start_method() == "fork"
    # A child started now runs in this interpreter's state: a module attribute set here
    # after import is seen there, which a spawned child (a fresh import) would not see.
    monkeypatch.setattr(start_method, "MARKER", "set after import", raising=False)
    reader, writer = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.Process(target=_report_marker, args=(writer,))
    child.start()
    child.join(timeout=30)
    assert reader.recv() == "set after import"
    kept = start_method.apply(tmp_path, "fork", cuda_initialized=lambda: True)
    assert kept.method == "spawn" and multiprocessing.get_start_method() == "spawn"
    marks = [e for e in timeline.read(tmp_path) if e["event"] == "subprocess_start"]
    assert [(m["method"], m["why"]) for m in marks] == [
        (forked.method, forked.why),
        (kept.method, kept.why),
    ]
    assert "MainThread" in marks[0]["threads"]


def _report_marker(writer: object) -> None:
    writer.send(getattr(start_method, "MARKER", None))  # type: ignore[attr-defined]

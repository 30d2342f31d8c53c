"""The start-up timeline a pod's runtime keeps (`lockstep_sglang.timeline`): where a
restart's time went, readable after the container that wrote it is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstep_sglang import timeline


def test_milestones_are_kept_in_order_and_survive_a_line_cut_short(tmp_path: Path) -> None:
    timeline.mark(tmp_path, "container_start")
    timeline.mark(tmp_path, "scheduler_loop", rank=1)
    with (tmp_path / timeline.FILE).open("a") as out:
        out.write('{"event": "probe_o')  # the process was killed mid-line
    got = timeline.read(tmp_path)
    assert [e["event"] for e in got] == ["container_start", "scheduler_loop"]
    assert got[1]["rank"] == 1 and got[0]["at"] <= got[1]["at"]


def test_an_unknown_event_is_refused_and_an_unwritable_dir_never_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown timeline event 'ready'"):
        timeline.mark(tmp_path, "ready")
    timeline.mark(tmp_path / "missing" / "dir", "container_start")  # logged, not raised
    assert timeline.read(tmp_path / "missing" / "dir") == []


def test_the_file_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "MAX_LINES", 10)
    for _ in range(40):
        timeline.mark(tmp_path, "probe_ok")
    assert 0 < len(timeline.read(tmp_path)) <= 20

"""The drill's summary (`lockstep dev drill`, what `make demo` prints): through the router
it says what the users of the served model saw of each incident."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from lockstep_dev.drills.figures import DrillResult
from lockstep_dev.view import render_result


def _printed(result: DrillResult) -> str:
    console = Console(record=True, width=200)
    render_result(console, result)
    return console.export_text()


def _incident(caught: int, ok: int, **extra: Any) -> dict[str, Any]:
    return {
        "caught": caught, "caught_ok": ok, "caught_error": caught - ok, "caught_cut": 0,
        "caught_failed": [], "longest_wait_past_verdict_s": 1.25,
        "streams": [
            {"how": "aborted", "held": True, "tokens": 12, "error": None,
             "finish": {"type": "abort", "message": "the TP group went down"}},
            {"how": "completed", "held": False, "tokens": 400, "error": None,
             "finish": {"type": "length", "length": 400}},
        ],
        **extra,
    }  # fmt: skip


def test_the_summary_says_what_the_incident_caught_and_that_none_was_lost() -> None:
    result = DrillResult("desync", passed=True, router=True, failover=[_incident(6, 6)])
    out = _printed(result)
    assert "what the users saw (through the router)" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("│ 1"))
    assert [cell.strip() for cell in row.strip("│ ").split("│")][:6] == [
        "1", "6", "6", "0", "0", "1.25 s"
    ]  # fmt: skip
    assert "aborted (abort), completed (length)" in row
    assert "no request caught by an incident was lost" in out


def test_a_lost_request_is_said_and_no_table_without_the_router() -> None:
    lost = _printed(DrillResult("desync", router=True, failover=[_incident(5, 3)]))
    assert "2 request(s) caught by an incident did not end 200" in lost
    direct = _printed(DrillResult("desync", passed=True))
    assert "what the users saw" not in direct

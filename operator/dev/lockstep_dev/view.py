"""The live view of a drill (rich): groups, traffic and what lockstep did, as it happens."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from lockstep.api import constants as c
from lockstep_dev.drills import Drill, DrillResult
from lockstep_dev.traffic import ROUTER

STATE_STYLE = {
    "Healthy": "green",
    "Starting": "cyan",
    "Recovering": "yellow",
    "Suspect": "yellow",
    "Desynced": "red",
    "Hung": "red",
    "RankDown": "red",
    "Quarantined": "magenta",
}


def snapshot(drill: Drill) -> Group:
    """The current picture: one row per group, then the drill's log."""
    table = Table(title=f"lockstep drill: {drill.scenario}", expand=True)
    for col in (
        "group",
        "state",
        "epoch",
        "restarts",
        "pods ready",
        "last probe",
        "requests ok",
        "failed",
    ):
        table.add_column(col)
    try:
        status = drill.status()
    except Exception:
        status = {}
    stats = drill.traffic.stats() if drill.traffic is not None else {}
    for role in c.ROLES:
        for g in (status.get(role) or {}).get("groups") or []:
            key = f"{role}/{g['index']}"
            probe = g.get("lastProbe") or {}
            probe_text = (
                f"ok {probe.get('latencyMs', 0):.0f} ms"
                if probe.get("ok")
                else str(probe.get("error") or "-")[:30]
            )
            s = stats.get(key)
            style = STATE_STYLE.get(g["state"], "white")
            table.add_row(
                key,
                f"[{style}]{g['state']}[/]",
                str(g["epoch"]),
                str(g["restarts"]),
                f"{g['readyPods']}/{g['pods']}",
                probe_text,
                str(s.ok if s else 0),
                str(s.failed if s else 0),
            )
    through_router = stats.get(ROUTER)
    if through_router is not None:  # router drills: requests are the router's, not a group's
        table.add_row(
            "via router", "", "", "", "", "", str(through_router.ok), str(through_router.failed)
        )
    log = "\n".join(drill.result.notes[-10:]) or "starting the local cluster..."
    return Group(table, Panel(log, title="what happened"))


def render_result(console: Console, result: DrillResult) -> None:
    verdict = "[green]PASSED[/]" if result.passed else "[red]FAILED[/]"
    console.print(f"\n{verdict} {result.scenario}: {result.reason}")
    figures = Table(title="figures")
    figures.add_column("figure")
    figures.add_column("value")
    rows: tuple[tuple[str, object], ...] = (
        ("verdict", result.verdict),
        ("time to detect (from injection)", result.time_to_detect_s),
        ("time to detect (first failed probe to verdict)", result.probe_time_to_detect_s),
        ("time to recover (verdict to re-admission)", result.time_to_recover_s),
        ("requests failed on decode/0 before its drain", result.affected_failed_before_drain),
        ("requests failed on decode/0 after its drain", result.affected_failed_after_drain),
        ("requests failed on the other groups", result.other_groups_failed),
        ("restarts per group", result.restarts),
    )
    router_rows = (
        ("requests failed through the router before the drain", result.router_failed_before_drain),
        ("requests failed through the router after the drain", result.router_failed_after_drain),
        ("requests the router sent decode/0 while drained", result.affected_received_while_drained),
        ("requests the router sent decode/1 meanwhile", result.others_received_while_drained),
        ("requests to decode/0 after re-admission", result.affected_received_after_readmission),
        ("router workers of pods that are gone", result.router_stale_workers),
    )
    for name, value in (*rows, *(router_rows if result.router else ())):
        figures.add_row(name, str(value))
    console.print(figures)
    if result.failover:
        console.print(users_table(result))
    for inc in result.incidents:
        console.print(
            Panel(
                f"verdict {inc['verdict']}, action: {inc.get('action')}\n"
                f"detected {inc.get('detectedTime')}, recovered {inc.get('recoveredTime')}\n"
                f"time to detect {inc.get('timeToDetectSeconds')} s, "
                f"time to recover {inc.get('timeToRecoverSeconds')} s\n\n"
                + str(inc.get("evidence", ""))[:1500],
                title=f"incident {inc['id']} ({inc['state']})",
            )
        )


def _ending(stream: Mapping[str, Any]) -> str:
    """How a stream ended, in a word: SGLang's finish reason type, else the error."""
    finish = stream.get("finish")
    if isinstance(finish, Mapping):
        return str(finish.get("type") or "finished")
    if finish:
        return str(finish)
    return "error" if stream.get("error") else "no end"


def users_table(result: DrillResult) -> Table:
    """What the users of the served model saw of each incident, through the router: the
    requests it caught (sent before the group left the router, still waiting when it
    broke) and how each ended, the longest wait past the verdict, the streams it cut."""
    table = Table(title="what the users saw (through the router)")
    for column in ("incident", "caught", "ended 200", "HTTP error", "no answer",
                   "longest wait past the verdict", "streams caught"):  # fmt: skip
        table.add_column(column)
    for n, f in enumerate(result.failover, start=1):
        streams = ", ".join(f"{s['how']} ({_ending(s)})" for s in f["streams"])
        table.add_row(
            str(n),
            str(f["caught"]),
            str(f["caught_ok"]),
            str(f["caught_error"]),
            str(f["caught_cut"]),
            f"{f['longest_wait_past_verdict_s']} s",
            streams or "-",
        )
    lost = sum(f["caught"] - f["caught_ok"] for f in result.failover)
    table.caption = (
        "no request caught by an incident was lost"
        if lost == 0
        else f"{lost} request(s) caught by an incident did not end 200"
    )
    return table


def run_with_live_view(drill: Drill) -> int:
    console = Console()
    box: dict[str, DrillResult] = {}
    worker = threading.Thread(target=lambda: box.setdefault("r", drill.run()), daemon=True)
    worker.start()
    with Live(snapshot(drill), console=console, refresh_per_second=2) as live:
        while worker.is_alive():
            time.sleep(0.5)
            live.update(snapshot(drill))
    result = box["r"]
    render_result(console, result)
    return 0 if result.passed else 1

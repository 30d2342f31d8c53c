"""`slow`: legitimately long steps on every rank of decode/0 under the default step
bounds (the issue's promise: no restart for steps up to 60 s)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lockstep_dev.drills.deployment import AFFECTED, NAME, NAMESPACE, base_health
from lockstep_dev.drills.restart import Checks
from lockstep_dev.drills.scenario import Scenario, step_bounds_overrides

if TYPE_CHECKING:
    from lockstep_dev.drills.harness import Drill

# The step lengths, one after the other (a Drill's `slow_steps` replaces them).
SLOW_STEPS: tuple[float, ...] = (5.0, 15.0, 30.0, 60.0)


def overrides(drill: Drill) -> dict[str, Any]:
    # The slow drill judges the defaults (90 s floor), not the drill's own 10 s.
    return step_bounds_overrides(drill) or {"health": {**base_health(), "stepBounds": {}}}


def warnings(drill: Drill) -> int:
    """Warning Events on the deployment so far."""
    return sum(
        int(e.get("count") or 1)
        for e in drill.cluster.events(NAMESPACE)
        if e.get("type") == "Warning" and (e.get("involvedObject") or {}).get("name") == NAME
    )


def act(drill: Drill) -> None:
    """Legitimately long steps on every rank of decode/0 (traffic flowing), each
    length of `slow_steps` in turn, under the default step bounds: no restart, no
    incident, no warning Event."""
    before = drill.uids(AFFECTED)
    drill.result.injected_at = time.time()
    checks: Checks = []
    for step_s in drill.slow_steps if drill.slow_steps is not None else SLOW_STEPS:
        warnings_before = warnings(drill)
        restarts_before = int(drill.group(AFFECTED).get("restarts", 0))
        incidents_before = drill.incident_count(AFFECTED)
        started = time.time()
        drill.inject("slow", step_seconds=step_s)
        # Two whole steps, and the first probes after them.
        deadline = started + max(20.0, 2 * step_s + 10)
        states: set[str] = set()
        failing: set[str] = set()  # each failed probe the status showed, by its time
        said: list[str] = []  # what the group's message said meanwhile
        while time.time() < deadline:
            drill.poll()
            group = drill.group(AFFECTED)
            states.add(str(group.get("state")))
            probe = group.get("lastProbe") or {}
            if probe.get("ok") is False:
                failing.add(str(probe.get("time")))
            message = str(group.get("message") or "")[:120]
            if message and message not in said and len(said) < 4:
                said.append(message)
            time.sleep(0.5)
        drill.inject("none")
        # The step under way ends, then the group answers its probe again.
        drill.wait(
            lambda: drill.group(AFFECTED).get("state") == "Healthy",
            step_s + 60,
            f"decode/0 Healthy after the {step_s:g} s steps",
        )
        figures = {
            "step_s": step_s,
            "observed_s": round(time.time() - started, 1),
            "restarts": int(drill.group(AFFECTED).get("restarts", 0)) - restarts_before,
            "warning_events": warnings(drill) - warnings_before,
            "incidents": drill.incident_count(AFFECTED) - incidents_before,
            "states": sorted(states),
            # The long steps were seen (probes failed) and judged, not missed.
            "failed_probes_seen": len(failing),
            "messages": said,
        }
        drill.result.slow.append(figures)
        drill.note(
            f"{step_s:g} s steps for {figures['observed_s']} s: states {figures['states']}, "
            f"{figures['restarts']} restart(s), {figures['warning_events']} warning Event(s)"
        )
        checks += [
            (figures["incidents"] == 0, f"no incident with {step_s:g} s steps"),
            (figures["restarts"] == 0, f"no group restart with {step_s:g} s steps"),
            (
                figures["warning_events"] == 0,
                f"{figures['warning_events']} warning Event(s) for a group that only ran "
                f"{step_s:g} s steps",
            ),
        ]
    drill.result.warning_events = sum(f["warning_events"] for f in drill.result.slow)
    checks.append((drill.uids(AFFECTED) == before, "no pod replaced"))
    drill.conclude(checks)


SCENARIO = Scenario("slow", act, overrides=overrides)

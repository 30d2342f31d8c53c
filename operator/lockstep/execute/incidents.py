"""Manager: what an incident tells (`OpenIncident`, `UpdateIncident`, `CloseIncident`,
`EmitEvent`): the Events of each step on the PDDeployment and the incident's figures as
metrics (time to detect, verdicts, time to recover). The incident history itself is the
round's memory, written by its record step (`lockstep.core.records`)."""

from __future__ import annotations

from dataclasses import dataclass

from lockstep.core.recovery import CloseIncident, EmitEvent, OpenIncident, UpdateIncident
from lockstep.execute.scene import Scene


@dataclass
class IncidentManager:
    scene: Scene

    def opened(self, role: str, action: OpenIncident) -> None:
        """A verdict's incident: its time to detect and its verdict, counted."""
        metrics, inc = self.scene.deps.metrics, action.incident
        if inc.time_to_detect_seconds is not None:
            metrics.time_to_detect.labels(role).observe(inc.time_to_detect_seconds)
            metrics.verdicts.labels(role, inc.verdict).inc()

    def updated(self, role: str, action: UpdateIncident) -> None:
        """An incident refined: nothing to count (the history takes the new text)."""

    def closed(self, role: str, action: CloseIncident) -> None:
        """A recovered incident: its time to recover, observed."""
        inc = action.incident
        if inc.time_to_recover_seconds is not None:
            self.scene.deps.metrics.time_to_recover.labels(role).observe(
                inc.time_to_recover_seconds
            )

    def emit(self, action: EmitEvent) -> None:
        """An Event on the PDDeployment."""
        self.scene.events(
            "Warning" if action.warning else "Normal", str(action.reason), action.message
        )

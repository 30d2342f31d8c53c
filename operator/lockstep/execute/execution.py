"""One round's execution for one PDDeployment: the managers, and the table from each of
recovery's actions to the one manager that carries it out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lockstep.api.models import PDDeployment
from lockstep.clients.router_workers import RouterBook
from lockstep.core.evidence import CaptureBook, EvidenceEntry
from lockstep.core.recovery import (
    Action,
    CaptureEvidence,
    CloseIncident,
    CreateEpoch,
    DeletePods,
    EmitEvent,
    EndRequests,
    OpenIncident,
    RestartInPlace,
    SetGate,
    UpdateIncident,
)
from lockstep.execute.capture import CaptureManager
from lockstep.execute.incidents import IncidentManager
from lockstep.execute.nodes import NodeManager
from lockstep.execute.pods import PodManager
from lockstep.execute.requests import RequestManager
from lockstep.execute.restarts import RestartManager
from lockstep.execute.routers import RouterManager
from lockstep.execute.scale import ScaleManager
from lockstep.execute.scene import Deps, EventSink, GroupId, Scene


class Execution:
    """The managers of one round, over one `Scene`. `routers` and `captures` are the
    deployment's memory across rounds (control keeps them); `entries`,
    `incidents_oldest_first` and `incident_epochs` what the capture needs to know of the
    evidence store and the open incidents (see `CaptureManager`)."""

    def __init__(
        self,
        deps: Deps,
        pdd: PDDeployment,
        namespace: str,
        events: EventSink,
        pods: Sequence[Mapping[str, Any]],
        *,
        routers: RouterBook | None = None,
        captures: CaptureBook | None = None,
        entries: Mapping[str, EvidenceEntry] | None = None,
        incidents_oldest_first: Sequence[str] = (),
        incident_epochs: Mapping[str, int] | None = None,
    ) -> None:
        self.scene = scene = Scene(deps, pdd, namespace, events, pods)
        self.pods = PodManager(scene)
        self.routers = RouterManager(scene, routers if routers is not None else RouterBook())
        self.requests = RequestManager(scene)
        self.capture = CaptureManager(
            scene,
            captures if captures is not None else CaptureBook(),
            entries or {},
            incidents_oldest_first,
            incident_epochs or {},
        )
        self.restarts = RestartManager(scene)
        self.scale = ScaleManager(scene)
        self.incidents = IncidentManager(scene)
        self.nodes = NodeManager(scene)

    @property
    def events(self) -> EventSink:
        """The round's Event sink (Events on the PDDeployment)."""
        return self.scene.events

    def execute(self, role: str, group: int, actions: Sequence[Action]) -> None:
        """Carry out one group's actions, in order, each by its manager."""
        for action in actions:
            ACTION_TABLE[type(action)](self, (role, group), action)


Handler = Callable[[Execution, GroupId, Any], None]

# Every action of `lockstep.core.recovery.actions` and the one manager that carries it out
# (tests/unit/test_execute_layout.py holds the table to every action, once).
ACTION_TABLE: Mapping[type[Action], Handler] = {
    SetGate: lambda x, g, a: x.routers.set_gate(a),
    EndRequests: lambda x, g, a: x.requests.end(g, a),
    CaptureEvidence: lambda x, g, a: x.capture.capture(a),
    DeletePods: lambda x, g, a: x.pods.delete(g[0], a),
    RestartInPlace: lambda x, g, a: x.restarts.restart_in_place(g, a),
    CreateEpoch: lambda x, g, a: x.pods.create_epoch(g, a),
    OpenIncident: lambda x, g, a: x.incidents.opened(g[0], a),
    UpdateIncident: lambda x, g, a: x.incidents.updated(g[0], a),
    CloseIncident: lambda x, g, a: x.incidents.closed(g[0], a),
    EmitEvent: lambda x, g, a: x.incidents.emit(a),
}

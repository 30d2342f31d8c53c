"""`kubectl lockstep`: what on-call reads and does during an incident, as a kubectl plugin.

    kubectl lockstep status NAME [-o json]      every group: state, epoch, restarts, ready
                                                pods, last deep probe, runtime; conditions
    kubectl lockstep incidents NAME [-o json]   every incident status keeps: verdict, times,
                                                steps (Events), evidence summary, outlier
    kubectl lockstep evidence NAME INCIDENT [--logs] [-o json]
                                                the rank states and stacks captured for one
    kubectl lockstep restart NAME ROLE/GROUP --reason TEXT
                                                the manual restart annotation

kubectl runs any executable named `kubectl-lockstep` on PATH as `kubectl lockstep`; the
package installs one (`[project.scripts]`). Connection flags as kubectl's: `--kubeconfig`
(else `KUBECONFIG`, else ~/.kube/config), `--context`, `-n/--namespace` (else the
context's namespace, else `default`).

Only `restart` writes: the annotation `lockstep.dev/restart=ROLE/GROUP@REQUEST`
(`lockstep.core.records`), exactly what `kubectl annotate` would set, with a request id made
from `--reason` and the time (the operator acts once per request id). What the other
commands show comes from the PDDeployment's status, its records annotation (the open
incident's step and the pods its verdict implicated), its pods (runtime image, nodes), its
Events (an incident's steps, for as long as the API server keeps Events: an hour by
default) and the evidence ConfigMap `<name>-evidence` (`lockstep.core.evidence`).

Layers as in the operator: the `*_view` functions turn API objects into plain dicts (what
`-o json` prints) and `format_*` render them, both pure with `now` passed in; `Cluster` is
the only I/O. argparse for the command line, the official `kubernetes` client (its own
kubeconfig loading, as kopf's), rich for the tables (already a dependency; kubectl-like:
no borders, upper-case headers).

Exit codes: 0 done; 1 failed (a bad argument, the deployment or incident not found, the
API server unreachable or refusing), with a message on stderr saying what and the fix.
"""

from __future__ import annotations

from lockstep.cli.kubectl.cluster import Cluster
from lockstep.cli.kubectl.command import build_parser, main, run
from lockstep.cli.kubectl.common import (
    EXIT_FAILED,
    EXIT_OK,
    REQUEST_SLUG_CHARS,
    REQUEST_TIMEOUT,
    SUMMARY_LINES,
    Obj,
    PluginError,
    human_duration,
    parse_group,
)
from lockstep.cli.kubectl.evidence import evidence_view, format_evidence, split_captured
from lockstep.cli.kubectl.incidents import (
    event_time,
    format_incidents,
    incident_steps,
    incidents_view,
)
from lockstep.cli.kubectl.restart import request_id, restart_annotation
from lockstep.cli.kubectl.status import format_status, status_view

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "REQUEST_SLUG_CHARS",
    "REQUEST_TIMEOUT",
    "SUMMARY_LINES",
    "Cluster",
    "Obj",
    "PluginError",
    "build_parser",
    "event_time",
    "evidence_view",
    "format_evidence",
    "format_incidents",
    "format_status",
    "human_duration",
    "incident_steps",
    "incidents_view",
    "main",
    "parse_group",
    "request_id",
    "restart_annotation",
    "run",
    "split_captured",
    "status_view",
]

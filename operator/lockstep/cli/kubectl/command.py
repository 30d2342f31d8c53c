"""The command line: the parser (kubectl's connection flags), one run per subcommand,
`main`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NoReturn, TextIO

from lockstep.api import constants as c
from lockstep.api import objects
from lockstep.cli.kubectl.cluster import Cluster
from lockstep.cli.kubectl.common import EXIT_FAILED, EXIT_OK, PluginError
from lockstep.cli.kubectl.evidence import evidence_view, format_evidence
from lockstep.cli.kubectl.incidents import format_incidents, incidents_view
from lockstep.cli.kubectl.restart import restart_annotation
from lockstep.cli.kubectl.status import format_status, status_view
from lockstep.core.records import ANNOTATION_RESTART

# ------------------------------------------------------------------------ command line


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1, as kubectl's do (argparse's own code is 2)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_FAILED, f"error: {message}\n")


def _connection_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # On the top parser and on each command, so they go before or after the command
    # (kubectl passes the user's flags to a plugin as written).
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--kubeconfig", default=default, help="kubeconfig file (else KUBECONFIG)")
    parser.add_argument("--context", default=default, help="kubeconfig context")
    parser.add_argument(
        "-n", "--namespace", default=default, help="namespace (else the context's, or default)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The `kubectl lockstep` command line."""
    parser = _Parser(
        prog="kubectl lockstep",
        description="Status, incidents, evidence and manual restarts of lockstep PDDeployments.",
    )
    _connection_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        _connection_flags(p, top=False)
        p.add_argument("name", metavar="NAME", help="the PDDeployment")
        return p

    p = command("status", "groups: state, epoch, restarts, ready pods, last probe, runtime")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p = command("incidents", "every incident: verdict, times, steps, evidence summary, outlier")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p = command("evidence", "the rank states and stacks captured for one incident")
    p.add_argument("incident", metavar="INCIDENT", help="an incident id (see incidents)")
    p.add_argument("--logs", action="store_true", help="also the pods' log tails")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p = command("restart", "restart one whole group (the lockstep.dev/restart annotation)")
    p.add_argument("group", metavar="ROLE/GROUP", help="e.g. decode/0")
    p.add_argument("--reason", required=True, help="why (a ticket, an incident): in the request id")
    return parser


def run(args: argparse.Namespace, cluster: Cluster, now: float, out: TextIO) -> int:
    """One command against `cluster`; PluginError for anything the user must fix."""
    pdd = cluster.pdd(args.name)
    if args.command == "status":
        view = status_view(pdd, cluster.pods(args.name), now)
        text = format_status(view)
    elif args.command == "incidents":
        uid = str(objects.meta(pdd).get("uid"))
        view = incidents_view(pdd, cluster.pods(args.name), cluster.events(uid), now)
        text = format_incidents(view, now)
    elif args.command == "evidence":
        view = evidence_view(
            pdd, cluster.evidence_configmap(args.name), args.incident, cluster.configmap
        )
        text = format_evidence(view, logs=args.logs)
    elif args.command == "restart":
        for _ in range(3):  # the operator writes annotations too: read, check, write again
            value = restart_annotation(pdd, args.group, args.reason, now)
            version = str(objects.meta(pdd).get("resourceVersion"))
            if cluster.annotate(args.name, ANNOTATION_RESTART, value, version):
                break
            pdd = cluster.pdd(args.name)
        else:
            raise PluginError(f"PDDeployment {args.name} kept changing; try again")
        role_group = value.split("@", 1)[0]
        out.write(
            f"pddeployment.{c.GROUP}/{args.name} annotated: {ANNOTATION_RESTART}={value}\n"
            f"the operator drains {role_group}, restarts it whole into a new epoch and "
            f"re-admits it (kubectl lockstep status {args.name} -n {cluster.namespace})\n"
        )
        return EXIT_OK
    out.write(json.dumps(view, indent=2) + "\n" if args.output == "json" else text)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """`kubectl-lockstep`: see the module docstring."""
    args = build_parser().parse_args(argv)
    try:
        cluster = Cluster.connect(args.kubeconfig, args.context, args.namespace)
        return run(args, cluster, datetime.now(UTC).timestamp(), sys.stdout)
    except PluginError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_FAILED

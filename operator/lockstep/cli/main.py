"""The `lockstep` command line.

    lockstep check -f FILE [-o json] [--mode MODE]   validate a PDDeployment, run the policy
    lockstep render -f FILE [--mode MODE]            the manifests, for `kubectl apply -f -`
    lockstep crd [--kind PDDeployment|PDRoleScale]   a CRD's YAML (default PDDeployment)

Exit codes: 0 accepted, 1 rejected (invalid spec or refused by the flag policy),
2 unreadable input (no such file, not YAML, not one mapping).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from lockstep.api import constants as c
from lockstep.api.k8s_rules import FIX_IMAGE, image_reference
from lockstep.api.models import InvalidPDDeployment, PDDeployment, parse_pddeployment
from lockstep.core.builders import build_all
from lockstep.core.crd import CRD_YAML_BY_KIND
from lockstep.core.policy import PolicyResult, evaluate

EXIT_OK, EXIT_REJECTED, EXIT_UNREADABLE = 0, 1, 2


class UnreadableInput(Exception):
    """The input file could not be read as one YAML mapping."""


def load_document(path: str) -> dict[str, Any]:
    """Read one YAML mapping from a file (`-` for stdin)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as err:
        raise UnreadableInput(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise UnreadableInput(f"{path}: not valid YAML: {err}") from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise UnreadableInput(f"{path}: expected exactly one YAML mapping (a PDDeployment)")
    return docs[0]


def _with_mode(obj: dict[str, Any], mode: str | None) -> dict[str, Any]:
    if mode is None:
        return obj
    spec = dict(obj.get("spec") or {})
    spec["safety"] = {**(spec.get("safety") or {}), "mode": mode}
    return {**obj, "spec": spec}


def _spec_findings(err: InvalidPDDeployment) -> list[dict[str, Any]]:
    return [
        {
            "rule": p.rule,
            "severity": "error",
            "field": p.field,
            "message": p.message,
            "fix": p.fix,
            "action": "rejected",
            "issues": [],
        }
        for p in err.problems
    ]


def _evaluate(path: str, mode: str | None) -> tuple[PDDeployment | None, dict[str, Any]]:
    """Parse and judge a file: (the object when valid, the check report)."""
    obj = _with_mode(load_document(path), mode)
    try:
        # Strict: the file's JSON types as the API server checks them (a string where a
        # boolean belongs is refused here as it is there).
        pdd = parse_pddeployment(obj, strict=True)
    except InvalidPDDeployment as err:
        return None, {"accepted": False, "findings": _spec_findings(err), "effective": {}}
    result: PolicyResult = evaluate(pdd.spec)
    return pdd, result.to_dict()


def _print_human(path: str, report: dict[str, Any], mode: str, out: TextIO) -> None:
    verdict = "accepted" if report["accepted"] else "REJECTED"
    out.write(f"{path}: {verdict} (safety mode {mode})\n")
    for f in report["findings"]:
        cite = f" [{', '.join(f['issues'])}]" if f["issues"] else ""
        out.write(f"  {f['action']:<8} {f['severity']:<7} {f['rule']}: {f['field']}{cite}\n")
        out.write(f"           {f['message']}\n")
        out.write(f"           fix: {f['fix']}\n")
    for role, argv in report["effective"].items():
        out.write(f"  {role}: {' '.join(argv)}\n")


def cmd_check(args: argparse.Namespace) -> int:
    pdd, report = _evaluate(args.file, args.mode)
    if args.output == "json":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        mode = args.mode or (pdd.spec.safety.mode if pdd else "?")
        _print_human(args.file, report, mode, sys.stdout)
    return EXIT_OK if report["accepted"] else EXIT_REJECTED


def cmd_render(args: argparse.Namespace) -> int:
    pdd, report = _evaluate(args.file, args.mode)
    if pdd is None or not report["accepted"]:
        _print_human(args.file, report, args.mode or "?", sys.stderr)
        return EXIT_REJECTED
    objects = build_all(pdd)
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=100))
    return EXIT_OK


def cmd_crd(args: argparse.Namespace) -> int:
    sys.stdout.write(CRD_YAML_BY_KIND[args.kind]())
    return EXIT_OK


def cmd_dev_missing(args: argparse.Namespace) -> int:
    print(
        "lockstep dev: the local cluster (the dev wing, lockstep_dev) is not installed: it is "
        "not part of the lockstep package. Run it from a source checkout: `make venv`, then "
        ".venv/bin/lockstep dev ... (or `make demo`).",
        file=sys.stderr,
    )
    return EXIT_UNREADABLE


def cmd_operator(args: argparse.Namespace) -> int:
    """Run the operator (kopf) until interrupted."""
    if args.runtime_image is not None:
        why = image_reference(args.runtime_image)
        if why is not None:
            # Every injected pod would end in InvalidImageName: refuse to start instead.
            print(
                f"lockstep operator: --runtime-image {args.runtime_image!r} {why} (fix: "
                f"{FIX_IMAGE})",
                file=sys.stderr,
            )
            return EXIT_UNREADABLE
    import logging

    import kopf

    from lockstep.clients.leader import ElectionConfig
    from lockstep.handlers.settings import MEMO_KEY, OperatorConfig, WebhookConfig

    webhook = None
    if args.webhook_port:
        if bool(args.webhook_cert_dir) == bool(args.webhook_self_signed):
            print(
                "lockstep operator: --webhook-port needs exactly one of --webhook-cert-dir "
                "(cert-manager's tls.crt/tls.key) or --webhook-self-signed",
                file=sys.stderr,
            )
            return EXIT_UNREADABLE
        webhook = WebhookConfig(
            port=args.webhook_port,
            addr=args.webhook_addr or args.bind_address,
            cert_dir=args.webhook_cert_dir or None,
            service=args.webhook_service,
            namespace=args.webhook_namespace,
            config_name=args.webhook_config_name or None,
            cert_secret=args.webhook_cert_secret or None,
        )
    election = None
    if args.leader_elect:
        identity = (
            args.leader_election_identity or os.environ.get("POD_NAME") or socket.gethostname()
        )
        try:
            # Its own checks refuse timings out of order and an empty identity.
            election = ElectionConfig(
                namespace=args.leader_election_namespace,
                name=args.leader_election_id,
                identity=identity,
                lease_duration_s=args.leader_election_lease_duration,
                renew_deadline_s=args.leader_election_renew_deadline,
                retry_period_s=args.leader_election_retry_period,
            )
        except ValueError as err:
            print(f"lockstep operator: --leader-elect: {err}", file=sys.stderr)
            return EXIT_UNREADABLE
    config = OperatorConfig(
        metrics_port=args.metrics_port,
        bind_address=args.bind_address,
        resync_seconds=args.resync_seconds,
        runtime_image=args.runtime_image,
        # Exact namespace names: nothing for kopf to discover, so it must not list and
        # watch namespaces cluster-wide (namespaced RBAC does not grant that).
        exact_namespaces=bool(args.namespace)
        and not any(set(ns) & set("*?!,") for ns in args.namespace),
        webhook=webhook,
        election=election,
    )
    import lockstep.handlers.operator

    if webhook is not None:
        import lockstep.handlers.admission  # noqa: F401  (registers the webhook handlers)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    host = f"[{args.bind_address}]" if ":" in args.bind_address else args.bind_address
    liveness = f"http://{host}:{args.liveness_port}/healthz" if args.liveness_port else None
    run_kwargs: dict[str, Any] = {
        "clusterwide": not args.namespace,
        "namespaces": args.namespace or (),
        "standalone": True,
        "liveness_endpoint": liveness,
    }
    if election is None:
        kopf.run(memo=kopf.Memo({MEMO_KEY: config}), **run_kwargs)
        return EXIT_OK
    from lockstep.clients.kube import api_client
    from lockstep.clients.metrics import Metrics
    from lockstep.handlers import ha

    # One metrics server for both phases (a standby reports lockstep_leader 0 too).
    metrics = Metrics()
    if config.metrics_port:
        metrics.serve(config.metrics_port, config.bind_address)
    return ha.run(
        election, {MEMO_KEY: config}, api_client(), metrics, run_kwargs, webhook=webhook is not None
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lockstep", description="lockstep: SGLang PD TP groups kept in lockstep."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    modes = ["Enforce", "Reject", "Warn"]

    check = sub.add_parser("check", help="validate a PDDeployment and run the flag policy")
    check.add_argument("-f", "--file", required=True, help="PDDeployment YAML ('-': stdin)")
    check.add_argument("-o", "--output", choices=["text", "json"], default="text")
    check.add_argument("--mode", choices=modes, help="override spec.safety.mode")
    check.set_defaults(func=cmd_check)

    render = sub.add_parser("render", help="print the manifests as multi-document YAML")
    render.add_argument("-f", "--file", required=True, help="PDDeployment YAML ('-': stdin)")
    render.add_argument("--mode", choices=modes, help="override spec.safety.mode")
    render.set_defaults(func=cmd_render)

    crd = sub.add_parser("crd", help="print a CRD (the PDDeployment's unless --kind)")
    crd.add_argument("--kind", choices=sorted(CRD_YAML_BY_KIND), default=c.KIND)
    crd.set_defaults(func=cmd_crd)

    try:
        from lockstep_dev.cli import add_parser as add_dev_parser
    except ImportError:
        # The dev wing is not in the wheel or the images (pyproject.toml's package list):
        # `lockstep dev` runs from a source checkout's venv only. Say so.
        dev = sub.add_parser("dev", help="the local cluster (from a source checkout only)")
        dev.set_defaults(func=cmd_dev_missing)
    else:
        add_dev_parser(sub)

    op = sub.add_parser("operator", help="run the operator (kopf) against the current cluster")
    op.add_argument(
        "--namespace", action="append", help="watch this namespace (repeatable; default: all)"
    )
    op.add_argument(
        "--leader-elect",
        action="store_true",
        help="several replicas: elect one leader through a coordination.k8s.io Lease (the "
        "others serve the webhook and stand by)",
    )
    op.add_argument(
        "--leader-election-namespace",
        default="default",
        help="namespace of the Lease (the chart: the release's)",
    )
    op.add_argument("--leader-election-id", default="lockstep", help="name of the Lease")
    op.add_argument(
        "--leader-election-identity", help="this replica's name in the Lease (default: $POD_NAME)"
    )
    op.add_argument("--leader-election-lease-duration", type=float, default=15.0)
    op.add_argument("--leader-election-renew-deadline", type=float, default=10.0)
    op.add_argument("--leader-election-retry-period", type=float, default=2.0)
    op.add_argument(
        "--bind-address",
        default="0.0.0.0",
        help="address the liveness, metrics and webhook servers listen on (default: all)",
    )
    op.add_argument("--liveness-port", type=int, default=8080, help="0 disables /healthz")
    op.add_argument("--metrics-port", type=int, default=9090, help="0 disables /metrics")
    op.add_argument(
        "--resync-seconds",
        type=float,
        default=10.0,
        help="a control round this often even when nothing happened (the safety net; rounds "
        "run at once on a failed probe, a pod change, a spec change)",
    )
    op.add_argument(
        "--runtime-image",
        help="the image SGLang pods copy lockstep's runtime from when a PDDeployment leaves "
        f"spec.runtime.image unset (default {c.DEFAULT_RUNTIME_IMAGE}; the chart passes the "
        "operator's own image)",
    )
    op.add_argument("--webhook-port", type=int, help="serve the admission webhooks (HTTPS)")
    op.add_argument("--webhook-addr", help="webhook listen address (default: --bind-address)")
    op.add_argument("--webhook-cert-dir", help="directory with tls.crt and tls.key")
    op.add_argument(
        "--webhook-self-signed",
        action="store_true",
        help="generate a CA and certificate at start and inject the CA into the configs",
    )
    op.add_argument("--webhook-service", default="lockstep-webhook", help="for the cert SANs")
    op.add_argument("--webhook-namespace", default="default", help="for the cert SANs")
    op.add_argument("--webhook-config-name", help="webhook configurations to inject the CA into")
    op.add_argument(
        "--webhook-cert-secret",
        help="Secret (in --webhook-namespace) the self-signed certificate is kept in, shared "
        "by every replica (default: <--webhook-service>-cert)",
    )
    op.add_argument("-v", "--verbose", action="store_true")
    op.set_defaults(func=cmd_operator)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except UnreadableInput as err:
        print(f"lockstep: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    return code


if __name__ == "__main__":
    sys.exit(main())

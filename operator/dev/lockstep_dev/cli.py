"""`lockstep dev up | status | inject | down | drill` (rich for the live view).

`up` starts a supervisor process that holds the local cluster (control plane, process
kubelet, the operator installed with the Helm chart) until `down`; its working directory
(default `~/.cache/lockstep/dev`) holds `state.json` (kubeconfig, pids), `operator.log`
(a link to the operator pod's log) and every pod's directory. `drill` runs one scenario on its own fresh cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

# `lockstep dev inject --fault`: a rank's, a pod's or (the last three) a PD path's.
FAULTS = (
    "desync", "hang", "slow", "kill-rank", "stall-rank", "delete-pod", "none",
    "stuck-in-kernel", "transfer-stall", "bootstrap-down", "kv-leak",
)  # fmt: skip

# lockstep_dev.localcluster.engines.ENGINES (not imported here: `lockstep --help` stays fast).
ENGINE_CHOICES = ("standin", "sglang")
ENGINE_HELP = (
    "what SGLang pods run: the fast CPU stand-in (default), or the real SGLang 0.5.23 "
    "server on CPU with a tiny generated model (sglang; the router is then always on)"
)
DEFAULT_DIR = Path(os.environ.get("LOCKSTEP_CACHE", Path.home() / ".cache" / "lockstep")) / "dev"


def add_parser(sub: Any) -> None:
    dev = sub.add_parser("dev", help="the local cluster: up, status, inject, down, drill")
    dsub = dev.add_subparsers(dest="dev_command", required=True)
    up = dsub.add_parser("up", help="start the local cluster in the background")
    up.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    up.add_argument("-f", "--file", help="a PDDeployment to apply once it is up")
    up.add_argument("--engine", choices=ENGINE_CHOICES, default="standin", help=ENGINE_HELP)
    up.set_defaults(func=cmd_up)
    status = dsub.add_parser("status", help="groups, pods and incidents of the local cluster")
    status.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    status.set_defaults(func=cmd_status)
    inj = dsub.add_parser("inject", help="inject a fault into one group")
    inj.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    inj.add_argument("--namespace", default="lockstep-drill")
    inj.add_argument("--deployment", default="drill")
    inj.add_argument("--group", default="decode/0", help="ROLE/INDEX")
    inj.add_argument(
        "--fault",
        required=True,
        choices=FAULTS,
        help="transfer-stall and bootstrap-down: a prefill group's PD path (its leader); "
        "kv-leak: a decode group's (its leader keeps the KV of ended PD requests)",
    )
    inj.set_defaults(func=cmd_inject)
    down = dsub.add_parser("down", help="stop the local cluster")
    down.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    down.set_defaults(func=cmd_down)
    drill = dsub.add_parser("drill", help="run one incident drill on a fresh local cluster")
    drill.add_argument("--scenario", default="desync")
    drill.add_argument("--json", action="store_true", help="print the figures as JSON")
    drill.add_argument(
        "--mode",
        choices=("InPlace", "Recreate"),
        default="InPlace",
        help="the drill deployment's recovery.mode (default InPlace)",
    )
    drill.add_argument(
        "--router", action="store_true", help="run the real sglang-router; traffic through it"
    )
    drill.add_argument("--engine", choices=ENGINE_CHOICES, default="standin", help=ENGINE_HELP)
    drill.add_argument("--keep", type=Path, help="keep the cluster's files in this directory")
    drill.add_argument(
        "--prometheus",
        metavar="ALERT",
        nargs="*",
        help="a real Prometheus watches the drill as the chart's monitoring would (the "
        "ServiceMonitor's scrape, the chart's alerts with every `for` a 120th); the "
        "ALERTs named must fire after the fault and resolve after the recovery, and every "
        "dashboard query must return data",
    )
    drill.set_defaults(func=cmd_drill)


def _state(directory: Path) -> dict[str, Any]:
    path = directory / "state.json"
    if not path.exists():
        raise SystemExit(f"lockstep dev: no local cluster in {directory} (run `lockstep dev up`)")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def cmd_up(args: argparse.Namespace) -> int:
    directory: Path = args.dir
    state = directory / "state.json"
    if state.exists() and _alive(int(json.loads(state.read_text())["pid"])):
        print(f"lockstep dev: already up in {directory}")
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    state.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "lockstep_dev.supervisor", "--dir", str(directory)]
    if args.file:
        cmd += ["--file", str(Path(args.file).resolve())]
    cmd += ["--engine", args.engine]
    with (directory / "supervisor.log").open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900  # a first run builds the control plane
    while not state.exists():
        if proc.poll() is not None:
            print(
                f"lockstep dev: the cluster failed to start; see {directory}/supervisor.log",
                file=sys.stderr,
            )
            return 1
        if time.monotonic() > deadline:
            print("lockstep dev: timed out starting the cluster", file=sys.stderr)
            return 1
        time.sleep(0.5)
    info = json.loads(state.read_text())
    print(f"lockstep dev: up (supervisor pid {info['pid']})")
    print(f"  export KUBECONFIG={info['kubeconfig']}")
    print(f"  operator log: {info['operator_log']}")
    if info.get("operator_logs_command"):
        print(f"  (the chart's operator pod: {info['operator_logs_command']})")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    info = _state(args.dir)
    pid = int(info["pid"])
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    (args.dir / "state.json").unlink(missing_ok=True)
    print("lockstep dev: down")
    return 0


def _api(info: dict[str, Any]) -> Any:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=info["kubeconfig"])  # type: ignore[no-untyped-call]
    return api, k8s


def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from lockstep.api import constants as c

    info = _state(args.dir)
    api, k8s = _api(info)
    custom = k8s.CustomObjectsApi(api)
    items = custom.list_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL)["items"]
    console = Console()
    for pdd in items:
        meta, st = pdd["metadata"], pdd.get("status") or {}
        table = Table(
            title=f"{meta['namespace']}/{meta['name']}  prefill {st.get('prefillReady')}"
            f"  decode {st.get('decodeReady')}  open incidents {st.get('openIncidents', 0)}"
        )
        for col in ("group", "state", "epoch", "restarts", "pods", "last probe"):
            table.add_column(col)
        for role in c.ROLES:
            for g in (st.get(role) or {}).get("groups") or []:
                probe = g.get("lastProbe") or {}
                table.add_row(
                    f"{role}/{g['index']}",
                    g["state"],
                    str(g["epoch"]),
                    str(g["restarts"]),
                    f"{g['readyPods']}/{g['pods']}",
                    "ok" if probe.get("ok") else str(probe.get("error", "-")),
                )
        console.print(table)
    return 0


def cmd_inject(args: argparse.Namespace) -> int:
    from lockstep_dev.faults import inject

    info = _state(args.dir)
    api, k8s = _api(info)
    role, index = args.group.split("/")
    try:
        text = inject(
            k8s.CoreV1Api(api),
            Path(info["kubelet_root"]),
            args.namespace,
            args.deployment,
            role,
            int(index),
            args.fault,
        )
    except ValueError as e:  # a PD-path fault asked of a decode group
        print(f"lockstep dev: --fault {args.fault} --group {args.group}: {e}", file=sys.stderr)
        return 2
    print(f"lockstep dev: {text}")
    return 0


def cmd_drill(args: argparse.Namespace) -> int:
    from lockstep_dev.drills import SCENARIOS, Drill

    if args.scenario not in SCENARIOS:
        print(
            f"lockstep dev drill: unknown scenario {args.scenario!r}; one of "
            f"{', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    try:
        drill = Drill(
            args.scenario,
            workdir=args.keep,
            recovery_mode=args.mode,
            router=args.router,
            engine=args.engine,
            prometheus=args.prometheus,
        )
    except ValueError as exc:
        print(f"lockstep dev drill: {exc}", file=sys.stderr)
        return 2

    def stop(signum: int, _frame: object) -> None:
        # As Ctrl-C: the drill's cleanup stops every process of its local cluster
        # (SIGTERM's default would leave the servers, the router and the operator running).
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    if args.json:
        result = drill.run()
        print(result.to_json())
        return 0 if result.passed else 1
    from lockstep_dev.view import run_with_live_view

    return run_with_live_view(drill)


def load_yaml(path: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(Path(path).read_text())
    return data


__all__ = ["add_parser", "load_yaml"]

"""The process behind `lockstep dev up`: holds a `DevCluster` until SIGTERM."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

import yaml

from lockstep_dev.cluster import DevCluster
from lockstep_dev.localcluster.engines import ENGINES


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--file")
    parser.add_argument("--engine", choices=ENGINES, default="standin")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with DevCluster(args.dir, engine=args.engine) as cluster:
        if args.file:
            cluster.apply(yaml.safe_load(Path(args.file).read_text()))
        stop.wait()


if __name__ == "__main__":
    main()

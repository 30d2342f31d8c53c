"""Inject lockstep's runtime into a stock SGLang image: ``lockstep-runtime-install DEST``.

The operator renders every SGLang pod (unless ``spec.runtime.inject`` is false) with an
init container from the operator's own image, which carries this package, running this
command into an ``emptyDir`` volume; the SGLang container then starts
``<python of the SGLang image> DEST/launch.py`` with SGLang's argv. What lands in DEST:

- ``lockstep_sglang/``: this package, pure Python (it imports only the standard library
  until it runs inside SGLang's processes, where torch and SGLang are the image's), without
  the CPU stand-in and without bytecode;
- ``bin/py-spy``: the pod agent's stack dumper, when this image has one (the agent finds
  it there; without it ``POST /stacks`` answers each rank with "py-spy not found");
- ``launch.py``: puts DEST first on ``sys.path`` and on ``PYTHONPATH`` (so the engine,
  the pod agent and SGLang's scheduler processes import the same copy) and runs
  :func:`lockstep_sglang.launcher.main`, which checks the SGLang it finds against the
  versions and sources the hooks were written for before it starts anything;
- ``VERSION``: the runtime's version.

No pip, no network, no compiler at start: a copy of files, then the image's own Python.
Exit status 0, or 1 with a message naming what could not be written.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from lockstep_sglang import __version__, termination

PACKAGE = Path(__file__).resolve().parent
EXCLUDED = ("__pycache__",)
LAUNCH = '''\
"""lockstep's SGLang launcher, injected by lockstep-runtime-install (lockstep_sglang.install)."""
import os
import sys

root = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, root)
# Every process of the server (the engine, the pod agent, SGLang's schedulers) imports
# this copy, not another lockstep_sglang the image may hold.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
)
from lockstep_sglang.launcher import main  # noqa: E402

sys.exit(main())
'''


def find_py_spy() -> str | None:
    """``py-spy`` next to this interpreter (a venv) or on ``PATH``."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def install(dest: Path, py_spy: str | None) -> list[str]:
    """Write the runtime into `dest` (replacing an earlier copy); what was written."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / "lockstep_sglang"
    staging = dest / ".lockstep_sglang.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(PACKAGE, staging, ignore=shutil.ignore_patterns(*EXCLUDED, "*.pyc"))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    written = [f"{target}/ ({sum(1 for _ in target.rglob('*.py'))} modules)"]
    if py_spy is not None:
        (dest / "bin").mkdir(exist_ok=True)
        shutil.copy2(py_spy, dest / "bin" / "py-spy")
        written.append(f"{dest / 'bin' / 'py-spy'}")
    (dest / "launch.py").write_text(LAUNCH)
    (dest / "VERSION").write_text(f"{__version__}\n")
    written += [str(dest / "launch.py"), str(dest / "VERSION")]
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lockstep-runtime-install",
        description="Copy lockstep's SGLang runtime into DEST (an init container's job).",
    )
    parser.add_argument("dest", type=Path, help="the shared volume's mount path")
    args = parser.parse_args(argv)
    py_spy = find_py_spy()
    try:
        written = install(args.dest, py_spy)
    except OSError as err:
        why = f"lockstep-runtime-install: cannot write {args.dest}: {err}"
        print(why, file=sys.stderr)
        termination.write("RuntimeInstallFailed", why)
        return 1
    for line in written:
        print(f"lockstep-runtime-install: {line}")
    if py_spy is None:
        print(
            "lockstep-runtime-install: no py-spy in this image; the pod agent's stack dumps "
            "will report it missing",
            file=sys.stderr,
        )
    print(f"lockstep-runtime-install: lockstep runtime {__version__} in {args.dest}")
    return 0


__all__ = ["install", "main"]

if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Install the lockstep operator into a new virtual environment at DIR, the way the
# operator image does (images/operator/Dockerfile runs this very script), then check the
# result: the `lockstep` entry point runs, the operator's libraries import, the
# dependency set is consistent, and neither torch nor sglang came along (those belong to
# the SGLang runtime image, never to the operator).
#
#   images/operator/install-venv.sh DIR        PYTHON=python3.11 to choose the interpreter
#
# The package is built from a staged copy of exactly the files the Dockerfile copies, so
# this check sees what the image sees and leaves no build output in the repository.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
dir=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}

# The files the operator's distribution is built from (the Dockerfile COPYs the same).
sources=(pyproject.toml README.md operator/lockstep images/sglang/lockstep_sglang)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for src in "${sources[@]}"; do
  mkdir -p "$stage/$(dirname "$src")"
  cp -R "$repo/$src" "$stage/$src"
done
find "$stage" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
# The dev wing and the CPU stand-in (operator/dev) are not among the sources, nor in the
# distribution's package list (pyproject.toml): the checks below prove they stay out.

"$python" -m venv "$dir"
pip=("$dir/bin/python" -m pip --disable-pip-version-check)
# The operator only: no `sglang` extra, no dev tools.
"${pip[@]}" install --quiet "$stage"
# SGLang pods of stock images get lockstep's runtime from this image (an init container
# running lockstep-runtime-install), with py-spy for the pod agent's stack dumps.
"${pip[@]}" install --quiet --no-deps "py-spy==0.4.3"

"${pip[@]}" check
"$dir/bin/lockstep" --help >/dev/null
"$dir/bin/lockstep-runtime-install" --help >/dev/null
"$dir/bin/py-spy" --version >/dev/null
"$dir/bin/python" - <<'PY'
import importlib.util
import sys

for module in ("kopf", "kubernetes", "httpx", "pydantic", "prometheus_client", "lockstep"):
    if importlib.util.find_spec(module) is None:
        sys.exit(f"install-venv: the operator needs {module!r}, which is not installed")
wing = [
    m
    for m in ("lockstep_dev", "lockstep_standin")
    if importlib.util.find_spec(m) is not None
]
if wing:
    sys.exit(f"install-venv: {wing} shipped in the operator image; they are local-cluster only")
present = [m for m in ("torch", "sglang") if importlib.util.find_spec(m) is not None]
if present:
    sys.exit(f"install-venv: {present} installed in the operator environment; they belong "
             "to the SGLang runtime image (the pyproject `sglang` extra) only")
PY
echo "install-venv: lockstep operator installed in $dir"

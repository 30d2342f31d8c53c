#!/usr/bin/env bash
# Install lockstep's SGLang runtime into the Python environment of PYTHON, the way the
# SGLang image does (images/sglang/Dockerfile runs this very script), then check it.
#
#   images/sglang/install.sh PYTHON SOURCE
#
# PYTHON's environment must already hold SGLang 0.5.23 and its dependency set (the
# lmsysorg/sglang base image does; install-venv.sh builds a stand-in for CI). SOURCE is
# a directory with pyproject.toml, README.md, operator/ and images/sglang/lockstep_sglang/.
#
# --no-deps: the runtime's imports (torch, SGLang, fastapi, msgspec, zmq) are the base
# image's, already pinned to what SGLang 0.5.23 needs; resolving the project's extras
# here could replace the image's CUDA torch. --ignore-installed: never touch a copy of
# lockstep or py-spy that the base environment may already hold.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 PYTHON SOURCE" >&2
  exit 2
fi
python=$1
source_dir=$2
pip=("$python" -m pip --disable-pip-version-check)

"${pip[@]}" install --quiet --no-deps --ignore-installed "$source_dir"
# The pod agent's stack dumps (POST /stacks).
"${pip[@]}" install --quiet --no-deps --ignore-installed "py-spy==0.4.3"

bin=$("$python" -c 'import sys, os; print(os.path.dirname(sys.executable))')
# The runtime must match the SGLang it hooks: version and every pinned source.
PYTHONWARNINGS=ignore "$bin/lockstep-sglang" --lockstep-check
"$bin/py-spy" --version >/dev/null
"$python" -m lockstep_sglang.agent --help >/dev/null

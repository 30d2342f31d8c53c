#!/usr/bin/env bash
# Perform the SGLang image's install steps (install.sh, exactly as the Dockerfile runs
# it) in a new virtual environment at DIR, so CI checks them without Docker.
#
#   images/sglang/install-venv.sh DIR
#
# The image's base layer (lmsysorg/sglang: SGLang 0.5.23, torch and the rest) is stood
# in for by an existing environment that has them: BASE_SITE (default: the repository's
# .venv site-packages, which `make venv` fills with the same pins). DIR sees it through a
# .pth file, as a layer below its own site-packages; nothing is installed into it.
# The package is built from a staged copy of exactly what the Dockerfile copies.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
dir=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
base_site=${BASE_SITE:-$("$repo/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}

# The files the Dockerfile copies (and Dockerfile.dockerignore lets through).
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
site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$base_site" > "$site/_lockstep_base_image.pth"

bash "$repo/images/sglang/install.sh" "$dir/bin/python" "$stage"

# What the image runs is what was installed here, not the repository checkout.
"$dir/bin/python" - "$dir" <<'PY'
import sys
from pathlib import Path

import lockstep_sglang

where = Path(lockstep_sglang.__file__).resolve()
if not where.is_relative_to(Path(sys.argv[1]).resolve()):
    sys.exit(f"install-venv: lockstep_sglang imported from {where}, not from the new environment")
shipped = [p.name for p in (where.parent.parent / "lockstep_dev",
           where.parent.parent / "lockstep_standin") if p.exists()]
if shipped:
    sys.exit(f"install-venv: {shipped} shipped in the runtime image; they are local-cluster only")
PY
echo "install-venv: lockstep SGLang runtime installed in $dir"

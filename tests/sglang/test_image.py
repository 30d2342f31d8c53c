"""The SGLang runtime image's install steps, checked without Docker."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from lockstep_sglang import pins

REPO = Path(__file__).resolve().parents[2]
IMAGE = REPO / "images/sglang"


def _venv_sources() -> list[str]:
    text = (IMAGE / "install-venv.sh").read_text()
    match = re.search(r"^sources=\(([^)]*)\)", text, re.MULTILINE)
    assert match, "install-venv.sh lists the files it stages in sources=(...)"
    return match.group(1).split()


def test_dockerfile_runs_the_checked_install_on_the_pinned_base() -> None:
    text = (IMAGE / "Dockerfile").read_text()
    base = re.search(r"^ARG SGLANG_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base is not None
    assert base.group(1).startswith(f"lmsysorg/sglang:v{pins.SGLANG_VERSION}-")
    assert "RUN bash /opt/lockstep/install.sh python3 /opt/lockstep/src" in text
    assert 'ENTRYPOINT ["lockstep-sglang"]' in text
    copied = re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.MULTILINE)
    copied_paths = {p.rstrip("/") for line in copied for p in line.split()}
    # The image is built from what install-venv.sh stages (and the ignore file lets in).
    assert set(_venv_sources()) <= copied_paths | {"operator"}
    allowed = {
        line[1:].rstrip("/")
        for line in (IMAGE / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert copied_paths <= allowed


def test_install_steps_produce_a_runtime_that_passes_its_own_check(tmp_path: Path) -> None:
    target = tmp_path / "image-env"
    done = subprocess.run(
        ["bash", str(IMAGE / "install-venv.sh"), str(target)],
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"matches {len(pins.PINNED_SOURCES)} pinned sources" in done.stdout
    for tool in ("lockstep-sglang", "py-spy"):
        assert (target / "bin" / tool).exists(), f"{tool} missing from the image environment"

"""Each supported SGLang release's interpreter and pins, for the releases tier.

0.5.23 runs from the test venv (``.ci/setup-venv`` installs its pins); 0.5.21 and 0.5.22
from ``.venv-releases/<version>`` (``.ci/setup-release-venv``, run here when missing).
"""

from __future__ import annotations

import subprocess
import sys

from factories import REPO, sglang_source

from lockstep_sglang import pins


def release_pin(version: str, package: str) -> str:
    """The version ``version``'s wheel pins ``package`` to (``==``), from its metadata."""
    from email.parser import Parser

    from packaging.requirements import Requirement

    src = sglang_source(version)
    metadata = Parser().parsestr((src / f"sglang-{version}.dist-info" / "METADATA").read_text())
    for line in metadata.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.name == package and (req.marker is None or req.marker.evaluate({"extra": ""})):
            (spec,) = req.specifier
            assert spec.operator == "==", f"SGLang {version} does not pin {package}: {req}"
            return spec.version
    raise AssertionError(f"SGLang {version} does not list {package}")


def release_python(version: str) -> str:
    """The interpreter of ``version``'s own venv (set up on first use)."""
    if version == pins.SGLANG_VERSION:
        return sys.executable
    made = subprocess.run(
        ["bash", str(REPO / ".ci/setup-release-venv"), version],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, f"setup-release-venv {version}:\n{made.stderr[-3000:]}"
    return str(REPO / made.stdout.strip().splitlines()[-1])

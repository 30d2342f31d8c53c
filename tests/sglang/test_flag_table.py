"""The policy's flag table is what the real SGLang 0.5.23 `ServerArgs` defines."""

from __future__ import annotations

import subprocess
import sys

from factories import REPO


def test_flag_table_regenerates_identically_from_real_serverargs() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / ".ci/gen-sglang-flags"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]

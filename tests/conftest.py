"""Test tiers: every test gets the marker of the folder it lives in.

`make test` runs every tier; `pytest -m <tier>` runs one alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = (
    "unit",
    "controlplane",
    "distributed",
    "sglang",
    "realsglang",
    "releases",
    "e2e",
    "chart",
)
TESTS_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(str(item.path)).relative_to(TESTS_DIR)
        tier = rel.parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))

"""Incidents in the real SGLang 0.5.23 server (TP2 over gloo, on CPU): a refused layout.
Each test starts its own server. A forced divergence and an in-place restart are the
releases tier's, for every supported release (tests/releases/test_release_servers.py).

Each test drives the real server through ``lockstep-sglang`` as a pod would and asserts
what an operator (or a user) sees: the deep probe, the rank state and evidence from the
pod agent, the process exit codes, the requests served.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from server import RealServer

pytestmark = pytest.mark.timeout(420)


def test_pipeline_parallelism_is_refused_at_start_as_the_operator_refuses_it(
    real_server: Callable[..., RealServer],
) -> None:
    server = real_server(tp=1, args=["--pp-size", "2"])
    assert server.wait_exit(timeout=180) == 2
    log = server.log.read_text()
    assert "--pp-size above 1 is not supported" in log
    assert "rank-engine-exit.json" not in os.listdir(server.state_dir)  # no hold, no crash

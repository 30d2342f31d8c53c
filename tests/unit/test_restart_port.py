"""The runtime's half of an in-place restart, as pure functions: the effective epoch and
the rendezvous port it moves to, which must be the port the operator renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstep.api import constants as c
from lockstep.core import builders
from lockstep_sglang import config
from lockstep_sglang.config import (
    dist_port,
    effective_epoch,
    move_dist_init_addr,
    read_epoch_file,
    resolve_epoch,
    write_epoch_file,
)


@pytest.mark.parametrize("epoch", [0, 1, 3, 7, 42, 999, 1000, 1003, 123456])
def test_the_runtime_moves_to_the_port_the_operator_renders(epoch: int) -> None:
    assert dist_port(epoch) == builders.dist_port(epoch)
    assert (config.DIST_PORT_BASE, config.DIST_PORT_SPAN) == (
        c.DIST_PORT_BASE,
        c.DIST_PORT_SPAN,
    )


def test_only_the_dist_init_addr_port_moves_in_either_argv_form() -> None:
    argv = ["--tp", "2", "--dist-init-addr", "m-decode-0-0.m-decode-0.ns.svc:20003",
            "--port", "30000"]  # fmt: skip
    assert move_dist_init_addr(argv, 5) == [
        "--tp", "2", "--dist-init-addr", "m-decode-0-0.m-decode-0.ns.svc:20005",
        "--port", "30000",
    ]  # fmt: skip
    assert move_dist_init_addr(["--nccl-init-addr=[fd00::1]:20003"], 1004) == [
        "--nccl-init-addr=[fd00::1]:20004"
    ]
    assert move_dist_init_addr(["--port", "30000"], 5) == ["--port", "30000"]
    with pytest.raises(ValueError, match="HOST:PORT"):
        move_dist_init_addr(["--dist-init-addr", "no-port"], 5)


def test_effective_epoch_prefers_the_state_dir_unless_it_is_stale(tmp_path: Path) -> None:
    env = {"LOCKSTEP_GROUP_EPOCH": "3"}
    assert effective_epoch(tmp_path, env) == "3"
    assert effective_epoch(tmp_path, {}) is None
    write_epoch_file(tmp_path, 5)
    assert (tmp_path / "epoch").read_text() == "5\n"
    assert read_epoch_file(tmp_path) == 5
    assert effective_epoch(tmp_path, env) == "5"
    assert effective_epoch(tmp_path, {}) == "5"
    # A newer pod in an old state dir: the env's epoch wins over the stale file.
    assert effective_epoch(tmp_path, {"LOCKSTEP_GROUP_EPOCH": "6"}) == "6"
    (tmp_path / "epoch").write_text("five")
    assert effective_epoch(tmp_path, env) == "3"
    assert not list(tmp_path.glob("*.tmp"))


def test_resolve_epoch_rewrites_the_argv_only_after_an_in_place_restart(tmp_path: Path) -> None:
    env = {"LOCKSTEP_GROUP_EPOCH": "3"}
    argv = ["--dist-init-addr", "10.0.0.1:20003", "--node-rank", "1"]
    assert resolve_epoch(tmp_path, argv, env) == ("3", argv)
    write_epoch_file(tmp_path, 3)
    assert resolve_epoch(tmp_path, argv, env) == ("3", argv)
    write_epoch_file(tmp_path, 4)
    assert resolve_epoch(tmp_path, argv, env) == (
        "4",
        ["--dist-init-addr", "10.0.0.1:20004", "--node-rank", "1"],
    )


@pytest.mark.parametrize(
    ("raw", "ok"),
    [("7", 7), (" 12 ", 12), (0, 0), (9, 9), ("-1", None), ("1.5", None), ("", None),
     (None, None), (True, None), (-2, None), ("٣", None)],
)  # fmt: skip
def test_parse_epoch_accepts_decimal_strings_only(raw: object, ok: int | None) -> None:
    if ok is None:
        with pytest.raises(ValueError, match="decimal"):
            config.parse_epoch(raw)
    else:
        assert config.parse_epoch(raw) == ok

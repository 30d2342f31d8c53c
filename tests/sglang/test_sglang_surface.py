"""What lockstep reads of SGLang's objects exists on the real SGLang 0.5.23 classes.

A fake that shares lockstep's assumptions proves nothing about the boundary it fakes:
the runtime once read ``scheduler.tp_rank``, which the loop harness's fake scheduler set
and the real ``Scheduler`` does not have. These tests check every name the runtime
reads (``hooks.SGLANG_READS``, ``engine.SERVER_ARGS_READ``) and every attribute the
harness's stand-in scheduler sets against the real classes, without a model: instance
attributes are what the class and its bases assign to ``self`` in their source, plus
declared fields, properties and methods.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from types import ModuleType
from typing import Any

import pytest


def _owner(target: str) -> Any:
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _assigned_to_self(cls: type) -> set[str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return set()
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    names.add(sub.attr)
    return names


def instance_attributes(cls: type) -> set[str]:
    """Every name an instance of ``cls`` can have, from the real source."""
    names = set(dir(cls))
    fields = getattr(cls, "__struct_fields__", ())  # msgspec Structs
    names |= set(fields) if isinstance(fields, tuple) else set()
    for base in inspect.getmro(cls):
        names |= _assigned_to_self(base)
        names |= set(vars(base).get("__annotations__", {}))
        names |= set(vars(base).get("__dataclass_fields__", {}))
    return names


@pytest.fixture(scope="module")
def hooks(sglang_hooks: ModuleType) -> ModuleType:
    return sglang_hooks


def test_every_name_the_hooks_read_exists_on_the_real_classes(hooks: ModuleType) -> None:
    from sglang.srt.runtime_context import _parallel_fields

    missing = []
    for target, names in hooks.SGLANG_READS.items():
        owner = _owner(target)
        known = (
            set(_parallel_fields())
            if target.endswith(":ParallelContext")
            else instance_attributes(owner)
        )
        missing += [f"{target}.{name}" for name in names if name not in known]
    assert missing == [], f"the hooks read names SGLang 0.5.23 does not have: {missing}"


def test_every_name_the_failover_reads_exists_on_the_real_classes(hooks: ModuleType) -> None:
    # The requests a server holds are SGLang's own request states, and ending one calls
    # SGLang's own abort paths: a renamed field or method must fail here, not in an
    # incident (tests/realsglang runs them on a real server).
    from lockstep_sglang import server_hooks

    missing = []
    for target, names in server_hooks.SGLANG_FAILOVER_READS.items():
        known = instance_attributes(_owner(target))
        missing += [f"{target}.{name}" for name in names if name not in known]
    assert missing == [], f"the failover reads names SGLang 0.5.23 does not have: {missing}"


def test_the_check_itself_catches_what_broke_the_last_release(hooks: ModuleType) -> None:
    from sglang.srt.managers.scheduler import Scheduler

    attributes = instance_attributes(Scheduler)
    # The attribute the first runtime read and the real Scheduler never had.
    assert "tp_rank" not in attributes
    assert "pp_size" not in attributes
    # What it does have, assigned in its own source or its mixins'.
    assert {"tp_group", "running_batch", "_request_dispatcher", "tp_size"} <= attributes
    assert "disagg_prefill_inflight_queue" in attributes  # set in the prefill mixin


def test_every_server_args_field_the_engine_reads_is_a_real_field(hooks: ModuleType) -> None:
    from sglang.srt.server_args import ServerArgs

    from lockstep_sglang.engine import SERVER_ARGS_READ

    fields = set(ServerArgs.__struct_fields__)
    assert [f for f in SERVER_ARGS_READ if f not in fields] == []


def test_the_loop_harness_sets_only_what_the_real_scheduler_has(
    hooks: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/sglang/sgl_loop_harness.py fakes the scheduler around the real loop body:
    apart from its own ``harness_*`` bookkeeping it may only set real attributes."""
    from sgl_loop_harness import StandInScheduler
    from sglang.srt.managers.scheduler import Scheduler

    names = _assigned_to_self(StandInScheduler) | {
        n for n, v in vars(StandInScheduler).items() if isinstance(v, property)
    }
    fake_only = sorted(
        n for n in names if not n.startswith("harness_") and n not in instance_attributes(Scheduler)
    )
    assert fake_only == [], f"the harness sets attributes the real Scheduler lacks: {fake_only}"

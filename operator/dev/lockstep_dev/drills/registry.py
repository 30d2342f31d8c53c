"""Every scenario by name, and the name lists derived from them (what `lockstep dev drill`
accepts, what runs on the real SGLang engine, what needs a cluster of more nodes)."""

from __future__ import annotations

from types import MappingProxyType

from lockstep_dev.drills.scenario import Scenario
from lockstep_dev.drills.scenarios import (
    agent_down,
    baseline,
    capacity,
    concurrent,
    desync,
    flapping,
    ha,
    hang,
    node_drain,
    operator_crash,
    pd_path,
    pod_delete,
    rank_kill,
    scale,
    sequence,
    slow,
    spares,
    stuck_step,
    unplaceable,
    upgrade,
)

# In the order they are listed: first the scenarios both engines run (in the order the
# real engine gained them), then the stand-in's own.
REGISTRY = MappingProxyType(
    {
        s.name: s
        for s in (
            desync.SCENARIO,
            hang.SCENARIO,
            rank_kill.SCENARIO,
            sequence.SCENARIO,
            pod_delete.SCENARIO,
            operator_crash.SCENARIO,
            slow.SCENARIO,
            stuck_step.SCENARIO,
            flapping.SCENARIO,
            concurrent.SCENARIO,
            agent_down.SCENARIO,
            baseline.SCENARIO,
            node_drain.SCENARIO,
            unplaceable.SCENARIO,
            scale.SCENARIO,
            spares.SCENARIO,
            capacity.SCENARIO,
            upgrade.SCENARIO,
            ha.SCENARIO,
            pd_path.SCENARIO,
        )
    }
)

SCENARIOS = tuple(REGISTRY)
# What runs on the real SGLang engine (the stand-in runs every scenario).
REAL_SGLANG_SCENARIOS = tuple(n for n, s in REGISTRY.items() if "sglang" in s.engines)
# Scenarios that need more nodes than the default cluster's, in labelled pools.
NODE_SCENARIOS = tuple(n for n, s in REGISTRY.items() if s.needs_nodes)


def lookup(name: str) -> Scenario:
    """The scenario of that name (ValueError naming every one otherwise)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}") from None

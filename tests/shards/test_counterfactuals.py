"""Would run if: a counterfactual is verified by applying it.

Hypothesis generates small clusters (zones, pools, tainted, cordoned and GPU nodes,
quotas)
and pods that may wait for many reasons (room, priority, quota max and borrowing, node
selectors, taints, anti-affinity, gangs). Each runs at 1 and 2 shards; for every unit
left pending that has a counterfactual, the change it names (its inputs, at its time)
is added to the scenario and the scenario simulated again: the unit must then run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.counterfactual import Counterfactual
from engine.model.pools import POOL_LABEL, Sharding
from events.memory import MemoryLog
from events.types import (
    SECOND,
    GroupSpec,
    PodBound,
    PodGroupSubmitted,
    PodSubmitted,
    QuotaDefined,
    QuotaSpec,
)
from shards import wouldrun
from shards.inputs.scenario import Scenario, TimedEvent
from shards.simulate import SimulationResult, simulate
from tests.builders import make_node, make_pod

GPU = "nvidia.com/gpu"
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
SHARDS = (1, 2)
MAX_EXAMPLES = 10


@dataclass(frozen=True)
class Shape:
    """What the pods of one unit ask for, and the one rule they carry."""

    app: str
    priority: int
    cpu: str
    cards: int
    runtime: int | None
    rule: str


def _pod(name: str, ns: str, shape: Shape, group: str = "") -> PodSubmitted:
    b = make_pod(name, ns).cpu(shape.cpu).priority(shape.priority).labels(app=shape.app)
    if shape.cards:
        b = b.gpu(shape.cards)
    if shape.runtime is not None:
        b = b.runtime(shape.runtime)
    if shape.rule == "zone":
        b = b.selector(**{ZONE: "b"})
    elif shape.rule == "tolerate":
        b = b.tolerate("dedicated", "infra")
    elif shape.rule == "anti":
        b = b.anti(HOST, app=shape.app)
    elif shape.rule == "spread":
        b = b.spread(ZONE, 1, app=shape.app)
    if group:
        b = b.group(group)
    return b.submitted()


@st.composite
def scenarios(draw: Any) -> Scenario:
    items: list[tuple[int, Any]] = []
    for i in range(draw(st.integers(1, 3))):
        zone = draw(st.sampled_from(["a", "b"]))
        node = (
            make_node(f"n{i}")
            .cpu(draw(st.sampled_from(["2", "4"])))
            .memory("16Gi")
            .label(ZONE, zone)
            .label(HOST, f"n{i}")
            .label(POOL_LABEL, f"p{i % 2}")
        )
        if draw(st.booleans()):
            node = node.gpu(draw(st.sampled_from([2, 4])))
        if draw(st.integers(0, 4)) == 0:
            node = node.taint("dedicated", "infra")
        if draw(st.integers(0, 5)) == 0:
            node = node.cordoned()
        items.append((0, node.added()))
    for ns in ("a", "b")[: draw(st.integers(0, 2))]:
        minimum = draw(st.integers(0, 4))
        maximum = minimum + draw(st.integers(0, 4))
        quota = QuotaSpec(
            namespace=ns, name="q", min={GPU: minimum, "cpu": 4000}, max={GPU: maximum, "cpu": 8000}
        )
        items.append((0, QuotaDefined(quota=quota)))
    for u in range(draw(st.integers(2, 10))):
        ns = draw(st.sampled_from(["a", "b", "c"]))
        at = draw(st.integers(0, 20))
        shape = Shape(
            app=f"u{u % 2}",
            priority=draw(st.integers(0, 2)),
            cpu=draw(st.sampled_from(["500m", "1", "3"])),
            cards=draw(st.sampled_from([0, 0, 1, 2, 4])),
            runtime=draw(st.one_of(st.none(), st.none(), st.integers(1, 10))),
            rule=draw(st.sampled_from(["", "", "zone", "tolerate", "anti", "spread"])),
        )
        if draw(st.integers(0, 3)) == 0:
            size = draw(st.integers(2, 3))
            group = GroupSpec(namespace=ns, name=f"g{u}", min_member=size, priority=shape.priority)
            items.append((at, PodGroupSubmitted(group=group)))
            items += [(at, _pod(f"g{u}-{m}", ns, shape, group.key)) for m in range(size)]
        else:
            items.append((at, _pod(f"p{u}", ns, shape)))
    events = [TimedEvent(t * SECOND, i, e) for i, (t, e) in enumerate(items)]
    events.sort(key=lambda e: (e.time, e.order))
    return Scenario(events=events)


async def _run(scenario: Scenario, shards: int) -> tuple[SimulationResult, MemoryLog]:
    log = MemoryLog(shards + 1 if shards > 1 else 1)
    sharding = Sharding(shards=shards) if shards > 1 else None
    return await simulate(scenario, log, sharding=sharding), log


def _with(scenario: Scenario, cf: Counterfactual) -> Scenario:
    extra = [
        TimedEvent(cf.at, len(scenario.events) + i, event)
        for i, event in enumerate(cf.change.events)
    ]
    return Scenario(events=[*scenario.events, *extra])


async def _runs_after(scenario: Scenario, cf: Counterfactual, shards: int) -> bool:
    """Whether, with the change, the unit runs: the pod is bound after the change, or
    the gang leaves Pending."""
    result, log = await _run(_with(scenario, cf), shards)
    group = result.report.groups.get(cf.unit)
    if group is not None:
        return group.phase != "Pending"
    records = [env for p in range(log.partitions) for env in await log.read(p, 0)]
    return any(
        isinstance(env.event, PodBound) and env.event.pod == cf.unit and env.time >= cf.at
        for env in records
    )


async def _check(scenario: Scenario, shards: int) -> int:
    result, _ = await _run(scenario, shards)
    engine = wouldrun.whole_engine(
        result.engines, result.control.engine if result.control is not None else None
    )
    found = wouldrun.find(engine, wouldrun.pending(result.report))
    units = {cf.unit: cf for cf in found.values()}
    if not units and wouldrun.pending(result.report):
        event("pending, no counterfactual")
    for unit, cf in sorted(units.items()):
        ok = await _runs_after(scenario, cf, shards)
        assert ok, f"{unit}: {cf.text()} (at {cf.at / SECOND:g}s, {shards} shard(s))"
        event(f"would run if: {cf.change.kind}")
    return len(units)


@pytest.mark.parametrize("shards", SHARDS)
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(scenarios())
def test_the_change_a_counterfactual_names_lets_the_unit_run(
    shards: int, scenario: Scenario
) -> None:
    asyncio.run(_check(scenario, shards))

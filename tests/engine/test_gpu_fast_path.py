"""FGD's and ShoalGpu's compiled scoring places every pod exactly as the numpy path
does (its reference: the same node and the same cards), through the whole engine at 1,
2 and 4 shards, with pods that leave again (so the change journal lists a node several
times between two pods of one shape), and the single-shard log replays."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.model.devices import GPU, MODEL_LABEL, SHOAL_MILLI
from engine.model.pools import Sharding
from engine.plugins import kernels
from events.memory import MemoryLog
from events.types import (
    NodeAdded,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    NodeSpec,
    PodBound,
    PodSpec,
    PodSubmitted,
)
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay
from shards.simulate import simulate
from tests.engine.test_gpu_compiled import shape_st

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba is not installed")

GIB = 1 << 30
SECOND = 1_000_000_000
MODELS = ("A100", "T4", "V100")

node_st = st.tuples(
    st.integers(1, 16).map(lambda x: x * 2000),  # cpu
    st.integers(1, 16).map(lambda x: x * 4 * GIB),  # memory
    st.sampled_from([1, 2, 4, 8]),  # cards
    st.sampled_from(MODELS),
)
pod_st = st.tuples(
    st.integers(0, 8).map(lambda x: x * 500),  # cpu
    st.integers(0, 8).map(lambda x: x * GIB),  # memory
    st.sampled_from([0, 1, 1, 2, 4]),  # cards
    st.sampled_from([100, 250, 500, 700, 1000]),  # per-card milli (one card)
    st.lists(st.sampled_from(MODELS), max_size=2, unique=True),
    st.one_of(st.none(), st.integers(1, 20)),  # runtime (s): it leaves again
)


def node_spec(i: int, cpu: int, memory: int, cards: int, model: str) -> NodeSpec:
    allocatable = {"cpu": cpu, "memory": memory, "pods": 100, GPU: cards}
    return NodeSpec(name=f"n{i}", allocatable=allocatable, labels={MODEL_LABEL: model})


def pod_spec(
    i: int, cpu: int, memory: int, cards: int, milli: int, models: list[str], runtime: int | None
) -> PodSpec:
    requests = {"cpu": cpu, "memory": memory}
    if cards == 1 and milli < 1000:
        requests[SHOAL_MILLI] = milli
    elif cards:
        requests[GPU] = cards
    affinity = None
    if models and cards:
        req = NodeSelectorRequirement(key=MODEL_LABEL, operator="In", values=tuple(models))
        affinity = (NodeSelectorTerm(match_expressions=(req,)),)
    return PodSpec(
        namespace="default",
        name=f"p{i}",
        requests=requests,
        required_affinity=affinity,
        runtime=None if runtime is None else runtime * SECOND,
    )


@contextmanager
def compiled(on: bool) -> Iterator[None]:
    kernels.configure(jit=on)
    try:
        yield
    finally:
        kernels.configure(jit=True)


async def placements(
    scenario: Scenario, config: dict[str, Any], shards: int, jit: bool
) -> list[tuple[str, str, tuple[int, ...]]]:
    parsed = parse_config(config)
    routed = shards > 1
    log = MemoryLog(shards + 1 if routed else 1)
    with compiled(jit):
        await simulate(scenario, log, parsed, sharding=Sharding(shards=shards) if routed else None)
    records = [r for p in range(log.partitions) for r in await log.read(p, 0)]
    if not routed:
        assert replay(records, parsed, verify=True).mismatch is None
    return sorted(
        (e.event.pod, e.event.node, e.event.devices)
        for e in records
        if isinstance(e.event, PodBound)
    )


@settings(max_examples=8, deadline=None)
@given(
    workload=st.lists(shape_st, min_size=1, max_size=5),
    nodes=st.lists(node_st, min_size=1, max_size=5),
    pods=st.lists(pod_st, min_size=1, max_size=14),
    policy=st.sampled_from(["ShoalGpu", "GpuFragmentation"]),
    resolution=st.sampled_from(["simulator", "exact"]),
    shards=st.sampled_from([1, 2, 4]),
)
async def test_the_compiled_path_places_every_pod_as_the_numpy_path(
    workload: list[dict[str, Any]],
    nodes: list[tuple[int, int, int, str]],
    pods: list[tuple[int, int, int, int, list[str], int | None]],
    policy: str,
    resolution: str,
    shards: int,
) -> None:
    events = [TimedEvent(0, i, NodeAdded(node=node_spec(i, *n))) for i, n in enumerate(nodes)]
    for i, raw in enumerate(pods):
        events.append(TimedEvent(i * SECOND, len(nodes) + i, PodSubmitted(pod=pod_spec(i, *raw))))
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "plugins": {"score": {"disabled": [{"name": "*"}], "enabled": [{"name": policy}]}},
                "pluginConfig": [
                    {"name": policy, "args": {"targetWorkload": workload, "resolution": resolution}}
                ],
            }
        ],
    }
    scenario = Scenario(events=events)
    fast = await placements(scenario, config, shards, jit=True)
    reference = await placements(scenario, config, shards, jit=False)
    assert fast == reference

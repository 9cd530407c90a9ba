"""Pods with a zone spread constraint among plain pods of several kinds: the spread
pods are decided on the coordinator (each ends a batch of hand-overs), the plain pods
around them handed over in batches whose per-kind counts and sums are kept from one
batch to the next (:class:`shards.coordinator.handover.Counted`, ``Sums``). At 1, 2
and 4 shards every pod is placed, every zone constraint holds, and every log replays
with ``--verify``."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.pools import Sharding
from events.memory import MemoryLog
from events.types import SECOND
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay, replay_routed
from shards.simulate import simulate
from tests.builders import make_node, make_pod

ZONE = "topology.kubernetes.io/zone"
ZONES = ("z0", "z1", "z2")
KINDS = (("1", "1Gi"), ("2", "2Gi"), ("3", "1Gi"))
"""The plain pods' cpu and memory, on nodes of 4 cpus: a node holding anything is no
longer feasible for the last kind, so the counts per shard change from batch to batch."""


@st.composite
def scenarios(draw: Any) -> tuple[Scenario, int]:
    nodes = draw(st.integers(6, 12))
    items: list[tuple[int, Any]] = []
    for i in range(nodes):
        node = make_node(f"n{i}").cpu("4").memory("16Gi").label(ZONE, ZONES[i % 3])
        items.append((0, node.added()))
    big = 0
    cpus = 0
    for i in range(draw(st.integers(4, 24))):
        at = draw(st.integers(0, 3))
        if draw(st.integers(0, 3)) == 0:
            pod = make_pod(f"s{i}").cpu("500m").labels(app="web").spread(ZONE, app="web")
            items.append((at, pod.submitted()))
            continue
        kind = draw(st.integers(0, len(KINDS) - 1))
        if kind == 2 and big >= nodes // 3:
            kind = 0
        big += kind == 2
        cpu, memory = KINDS[kind]
        cpus += int(cpu)
        if cpus > nodes * 2:  # (room to spare: every pod fits, whichever nodes are chosen)
            break
        items.append((at, make_pod(f"p{i}").cpu(cpu).memory(memory).submitted()))
    events = [TimedEvent(t * SECOND, i, e) for i, (t, e) in enumerate(items)]
    events.sort(key=lambda e: (e.time, e.order))
    return Scenario(events=events), nodes


async def _run(scenario: Scenario, shards: int) -> dict[str, str]:
    log = MemoryLog(shards + 1 if shards > 1 else 1)
    sharding = Sharding(shards=shards) if shards > 1 else None
    result = await simulate(scenario, log, sharding=sharding)
    result.cluster.check_invariants()
    parts = [await log.read(p, 0) for p in range(log.partitions)]
    verified = replay_routed(parts, verify=True) if shards > 1 else replay(parts[0], verify=True)
    assert verified.mismatch is None, str(verified.mismatch)
    pods = result.report.pods
    assert all(view.phase in ("Bound", "Running", "Succeeded") for view in pods.values()), pods
    return {key: view.node or "" for key, view in pods.items()}


@settings(max_examples=6, deadline=None)
@given(scenarios())
def test_spread_pods_among_batches_hold_at_one_two_and_four_shards(
    drawn: tuple[Scenario, int],
) -> None:
    scenario, _ = drawn
    for shards in (1, 2, 4):
        nodes = asyncio.run(_run(scenario, shards))
        zones = Counter(
            ZONES[int(node[1:]) % 3] for key, node in nodes.items() if key.split("/")[1][0] == "s"
        )
        spread = [zones.get(zone, 0) for zone in ZONES]
        assert max(spread) - min(spread) <= 1, (shards, spread)

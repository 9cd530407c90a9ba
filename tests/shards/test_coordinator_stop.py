"""A coordinator stopped (SIGTERM: a rolling update) right after appending its own clock
tick decides what the tick asks for before it exits, so that it leaves no tail of
outputs for its successor (``replay --verify`` reports such a tail as unforwarded)."""

from __future__ import annotations

import asyncio

from engine.engine import Engine
from engine.model.pools import Sharding
from events.memory import MemoryLog
from events.types import (
    ClockTicked,
    Envelope,
    Event,
    GroupSpec,
    NodeAdded,
    PodGroupSubmitted,
    SchedulerConfigured,
    ShardingConfigured,
)
from shards.control import ControlWorker
from shards.coordinator.coordinator import Coordinator
from shards.processes import run_coordinator
from shards.replay import replay_routed
from shards.worker import ShardWorker
from tests.builders import make_node, make_pod

SECOND = 1_000_000_000


async def test_a_coordinator_stopped_after_its_tick_leaves_no_tail() -> None:
    log = MemoryLog(3)
    sharding = Sharding(shards=2)
    start: list[Event] = [ShardingConfigured(config=sharding.to_json()), SchedulerConfigured()]
    start += [NodeAdded(node=make_node(f"n{i}").cpu("2").spec()) for i in range(2)]
    # a gang that cannot fit, with a time-out: the coordinator wakes to fail it
    start += [
        PodGroupSubmitted(
            group=GroupSpec(namespace="default", name="g", min_member=3, timeout=10 * SECOND)
        )
    ]
    start += [make_pod(f"m{i}").cpu("2").group("default/g").submitted() for i in range(3)]
    await log.append([Envelope(event=e, producer="ingest") for e in start], 2)
    router = ControlWorker(Coordinator(sharding), log)
    shards = [ShardWorker(Engine(shard=i), log, partition=i) for i in range(2)]
    for _ in range(50):  # until quiet
        moved = await router.poll()
        for shard in shards:
            moved += await shard.poll()
        if not moved:
            break
    wake = router.control.next_wakeup()
    assert wake is not None  # the gang's time-out
    stop = asyncio.Event()
    await run_coordinator(
        log, stop=stop, clock=lambda: wake + 60 * SECOND, on_poll=lambda _: stop.set()
    )
    parts = [await log.read(p, 0) for p in range(3)]
    assert not isinstance(parts[2][-1].event, ClockTicked)  # the tick was decided
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, str(verified.mismatch)
    assert verified.unforwarded == 0

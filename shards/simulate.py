"""``shoal simulate``: the whole system on a simulated cluster and a simulated clock.

A discrete-event loop drives the components in a fixed order, so a run is a function of
its scenario and configuration:

1. at time ``now``, ingest appends every scenario event due, and the cluster appends the
   pods whose runtime ended (or, if nothing else is due and the engine asked to wake up
   now, a ``ClockTicked``);
2. the shard and the binder poll in turn until neither appends anything;
3. ``now`` jumps to the earliest of: the next scenario event, the next pod completion,
   the engine's next back-off expiry. No such time: the run is over.

With ``shards`` > 1 the same loop drives the whole routed system in one process, with
the code paths of the service: ingest and the cluster append to the control partition,
the control worker (router and coordinator) relays and forwards, each shard polls its
own partition, and the binder follows them all. A component that wants to act at
``now`` without new input (a back-off, a reservation or prepare time-out) gets a
``ClockTicked`` in its partition.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.config import SchedulerConfig
from engine.engine import Engine
from engine.model.pools import Sharding
from events.errors import StuckError
from events.log import EventLog
from events.types import ClockTicked, Envelope, Event, SchedulerConfigured, ShardingConfigured
from shards import plugins
from shards.binder import Binder
from shards.cluster import SimulatedCluster
from shards.control import ControlWorker
from shards.coordinator.coordinator import Coordinator
from shards.inputs.scenario import Scenario, TimedEvent
from shards.processes import tick_if_due
from shards.report import RunReport, merge
from shards.worker import ShardWorker

MAX_ROUNDS = 100_000
"""Rounds of every component's poll at one simulated instant before the run is declared
stuck: each round is a step of some protocol (a unit handed over and answered, a part
prepared and granted), so even thousands of gangs at one instant need far fewer."""

Progress = Callable[[int, int, int], None]
"""Called with (simulated ns, events ingested, events in scenario)."""


@dataclass
class SimulationResult:
    report: RunReport
    engine: Engine
    cluster: SimulatedCluster
    wall_seconds: float
    records: int
    stats: dict[str, float] = field(default_factory=dict)
    engines: list[Engine] = field(default_factory=list)
    control: Coordinator | None = None


async def read_all(log: EventLog) -> list[Envelope]:
    """Every record of every partition, merged into one history (see :func:`merge`)."""
    return merge([await log.read(p, 0) for p in range(log.partitions)])


async def simulate(
    scenario: Scenario,
    log: EventLog,
    config: SchedulerConfig | None = None,
    *,
    progress: Progress | None = None,
    sharding: Sharding | None = None,
    snapshot_every: int = 0,
) -> SimulationResult:
    """Run ``scenario`` to the end, recording everything in ``log`` (with a snapshot of
    each shard every ``snapshot_every`` records, if set)."""
    started = time.perf_counter()
    routed = sharding is not None and sharding.shards > 1
    n = sharding.shards if sharding is not None and routed else 1
    inputs = n if routed else 0  # cluster inputs: the control partition with several shards
    if routed and log.partitions != n + 1:
        raise ValueError(f"{n} shards need a log of {n + 1} partitions, not {log.partitions}")
    config = config or scenario.config
    source = config.source if config is not None else None
    recorded = json.dumps(source, sort_keys=True) if source is not None else ""
    loaded = plugins.for_config(config)
    head = [
        Envelope(event=SchedulerConfigured(config=recorded, plugins=loaded.used), producer="ingest")
    ]
    if sharding is not None:
        head.insert(
            0, Envelope(event=ShardingConfigured(config=sharding.to_json()), producer="ingest")
        )
    await log.append(head, inputs)
    engines = [Engine(config, shard=i, registry=loaded.registry) for i in range(n)]
    workers = [
        ShardWorker(engine, log, partition=i, snapshot_every=snapshot_every)
        for i, engine in enumerate(engines)
    ]
    router = (
        ControlWorker(
            Coordinator(sharding, config, loaded.registry),
            log,
            snapshot_every=snapshot_every,
            config=config,
        )
        if sharding is not None and routed
        else None
    )
    cluster = SimulatedCluster()
    binder = Binder(cluster, log, shards=n)
    await drive(scenario.events, log, workers, router, binder, progress=progress)
    report = RunReport(control=n if routed else None)
    records = await read_all(log)
    for env in records:
        report.apply(env)
    wall = time.perf_counter() - started
    stats: dict[str, float] = {
        "passes": sum(w.passes for w in workers),
        "pass_seconds": sum(w.pass_seconds for w in workers),
        "snapshots": sum(w.snapshots for w in workers),
        "snapshot_seconds": sum(w.snapshot_seconds for w in workers),
        **(router.control.stats() if router is not None else {}),
    }
    askers = [w.asker for w in workers] + ([router.asker] if router is not None else [])
    for asker in askers:
        for key, value in asker.stats.as_dict().items() if asker.stats.calls else ():
            stats[key] = stats.get(key, 0) + value
    for engine in engines:
        for key, value in engine.stats().items():
            stats[key] = stats.get(key, 0) + value
    return SimulationResult(
        report=report,
        engine=engines[0],
        cluster=cluster,
        wall_seconds=wall,
        records=len(records),
        stats=stats,
        engines=engines,
        control=router.control if router is not None else None,
    )


async def drive(
    feed: Sequence[TimedEvent],
    log: EventLog,
    workers: Sequence[ShardWorker],
    router: ControlWorker | None,
    binder: Binder,
    *,
    start: int = 0,
    progress: Progress | None = None,
) -> int:
    """The discrete-event loop (steps 1 to 3 above) from simulated time ``start`` until
    nothing is due: ``feed`` (sorted by time) appended by ingest as it comes due, the
    completions of ``binder``'s cluster, ticks; returns the time of the last instant.
    The components may hold state already (a dry run's copy of a running service)."""
    routed = router is not None
    inputs = len(workers) if routed else 0
    engines = [worker.engine for worker in workers]
    cluster = binder.cluster
    # who acts on time at the inputs' partition: the coordinator, or the only shard
    input_wakeup = router.control.next_wakeup if router is not None else engines[0].next_wakeup
    i = 0
    now = start
    while True:
        batch: list[Envelope] = []
        while i < len(feed) and feed[i].time <= now:
            batch.append(Envelope(event=feed[i].event, time=now, producer="ingest"))
            i += 1
        completions: list[Event] = cluster.due(now)
        batch.extend(Envelope(event=e, time=now, producer="cluster") for e in completions)
        wake = input_wakeup()
        if not batch and wake is not None and wake <= now:
            batch.append(Envelope(event=ClockTicked(), time=now, producer="clock"))
        if batch:
            await log.append(batch, inputs)
        if routed:
            for shard, engine in enumerate(engines):
                await tick_if_due(log, shard, engine.next_wakeup(), now, "clock")
        rounds = 0
        while True:
            moved = await router.poll() if router is not None else 0
            for worker in workers:
                moved += await worker.poll()
            moved += await binder.poll(now)
            if not moved:
                break
            rounds += 1
            if rounds > MAX_ROUNDS:
                raise StuckError(
                    f"no quiet point at {now / 1e9:g}s after {MAX_ROUNDS} rounds of the "
                    "components (a protocol loop that does not end)"
                )
        if progress is not None:
            progress(now, i, len(feed))
        candidates = [cluster.next_time(), *(engine.next_wakeup() for engine in engines)]
        if router is not None:
            candidates.append(router.control.next_wakeup())
        times = [t for t in candidates if t is not None]
        if i < len(feed):
            times.append(feed[i].time)
        if not times:
            return now
        now = max(now, min(times))

"""``shoal simulate``: the whole system on a simulated cluster and a simulated clock.

A discrete-event loop drives the components in a fixed order, so a run is a function of
its scenario and configuration:

1. at time ``now``, ingest appends every scenario event due, and the cluster appends the
   pods whose runtime ended (or, if nothing else is due and the engine asked to wake up
   now, a ``ClockTicked``);
2. the shard and the binder poll in turn until neither appends anything;
3. ``now`` jumps to the earliest of: the next scenario event, the next pod completion,
   the engine's next back-off expiry. No such time: the run is over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import SchedulerConfig
from engine.scheduler import Engine
from events.log import EventLog
from events.types import ClockTicked, Envelope, Event, SchedulerConfigured
from shards.binder import Binder
from shards.cluster import SimulatedCluster
from shards.report import RunReport
from shards.scenario import Scenario
from shards.worker import ShardWorker

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


async def simulate(
    scenario: Scenario,
    log: EventLog,
    config: SchedulerConfig | None = None,
    *,
    progress: Progress | None = None,
) -> SimulationResult:
    """Run ``scenario`` to the end, recording everything in ``log``."""
    started = time.perf_counter()
    config = config or scenario.config
    engine = Engine(config)
    source = config.source if config is not None else None
    recorded = json.dumps(source, sort_keys=True) if source is not None else ""
    await log.append([Envelope(event=SchedulerConfigured(config=recorded), producer="ingest")])
    worker = ShardWorker(engine, log)
    cluster = SimulatedCluster()
    binder = Binder(cluster, log)
    feed = scenario.events
    i = 0
    now = 0
    while True:
        batch: list[Envelope] = []
        while i < len(feed) and feed[i].time <= now:
            batch.append(Envelope(event=feed[i].event, time=now, producer="ingest"))
            i += 1
        completions: list[Event] = cluster.due(now)
        batch.extend(Envelope(event=e, time=now, producer="cluster") for e in completions)
        wake = engine.next_wakeup()
        if not batch and wake is not None and wake <= now:
            batch.append(Envelope(event=ClockTicked(), time=now, producer="clock"))
        if batch:
            await log.append(batch)
        while (await worker.poll()) + (await binder.poll(now)):
            pass
        if progress is not None:
            progress(now, i, len(feed))
        candidates = [t for t in (cluster.next_time(), engine.next_wakeup()) if t is not None]
        if i < len(feed):
            candidates.append(feed[i].time)
        if not candidates:
            break
        now = max(now, min(candidates))
    report = RunReport()
    records = await log.read(0, 0)
    for env in records:
        report.apply(env)
    wall = time.perf_counter() - started
    return SimulationResult(
        report=report,
        engine=engine,
        cluster=cluster,
        wall_seconds=wall,
        records=len(records),
        stats={"passes": worker.passes, "pass_seconds": worker.pass_seconds, **engine.stats()},
    )

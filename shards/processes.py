"""Shards and the coordinator as OS processes, talking only through the log.

``shoal worker shard --bus URL --shard-id I`` and ``shoal worker coordinator --bus URL``
run one component each with its own (uvloop) event loop; ``loadtest --shards N`` starts
them as subprocesses over a :class:`~events.remote.LogServer`, and the fault-injection
tests kill them with SIGKILL and start them again. A component that starts (or starts
again) rebuilds its state from the log first: a shard by replaying its partition, the
coordinator by folding the control partition and scanning what it already forwarded.

Time in these processes is the wall clock: a component whose engine wants to act at a
time that has come (a back-off, a reservation or prepare time-out) appends a
``ClockTicked`` to its own partition, and the tick is folded like any input, so replay
sees the same time.

``SHOAL_PROFILE_SHARD=PATH`` makes each shard process write a cProfile of its run to
``PATH.<shard>`` when it stops, and ``SHOAL_PROFILE_COORDINATOR=PATH`` the coordinator
process to ``PATH`` (profile before optimising).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator

from engine.config import SchedulerConfig
from engine.model.pools import Sharding
from engine.plugins import kernels
from events.errors import InputError, LogCorruptedError, LogError, cause
from events.log import EventLog, long_poll_or_sleep, read_past_unreadable
from events.types import BindFailed, ClockTicked, Envelope, ShardingConfigured
from shards.binder import Binder
from shards.cluster import SimulatedCluster
from shards.control import ControlWorker
from shards.coordinator.coordinator import Coordinator
from shards.worker import ShardWorker

log = logging.getLogger(__name__)

Clock = Callable[[], int]


LONG_WAIT = 0.2
"""Seconds an idle coordinator waits on a log that long-polls several partitions at once
(Kafka, the log server) before it looks again (its own wake-ups and ``stop`` come
sooner)."""


def wall_clock() -> int:
    return time.time_ns()


async def _wait_for_growth(bus: EventLog, partition: int, offset: int, seconds: float) -> None:
    """Wait until ``partition`` has a record at ``offset`` (long poll when the log can:
    a fetch of no record, so nothing is sent back nor decoded twice)."""
    fetch = getattr(bus, "fetch", None)
    if fetch is not None:  # (the log server: it holds the fetch)
        with contextlib.suppress(LogCorruptedError):  # it is there: its reader skips it
            await fetch(partition, offset, 0, wait=seconds)
    else:  # (Kafka: the broker holds the fetch)
        await long_poll_or_sleep(bus, {partition: offset}, seconds, min(seconds, 0.01))


async def recorded_sharding(bus: EventLog) -> ShardingConfigured | None:
    """The sharding recorded at the head of the control partition (the last one; ingest
    writes it before anything else), if it is there yet."""
    # 64: past the leaders' TermBegan records, which may come first
    head, _, _ = await read_past_unreadable(bus, bus.partitions - 1, 0, 64)
    for env in head:
        if isinstance(env.event, ShardingConfigured):
            return env.event
    return None


async def tick_if_due(
    bus: EventLog, partition: int, wake: int | None, now: int, producer: str
) -> bool:
    """Append a ``ClockTicked`` to ``partition`` if the component's next wake-up has come
    (replay then sees time pass exactly as the component did); whether it did."""
    if wake is None or wake > now:
        return False
    await bus.append([Envelope(event=ClockTicked(), time=now, producer=producer)], partition)
    return True


async def sharding_from_log(bus: EventLog, *, timeout: float = 30.0) -> Sharding:
    """The sharding configuration recorded first in the control partition (waits for
    it: a coordinator may start before ingest has written it)."""
    control = bus.partitions - 1
    deadline = time.monotonic() + timeout
    while True:
        recorded = await recorded_sharding(bus)
        if recorded is not None:
            return Sharding.from_json(recorded.config)
        if time.monotonic() > deadline:
            raise LogError("no sharding configuration in the control partition")
        await _wait_for_growth(bus, control, 0, 0.2)


async def run_shard(
    bus: EventLog,
    shard: int,
    *,
    config: SchedulerConfig | None = None,
    stop: asyncio.Event,
    clock: Clock = wall_clock,
    idle_wait: float = 0.2,
    snapshot_every: int = 0,
    snapshot_per_pod: int = 0,
) -> ShardWorker:
    """Rebuild shard ``shard`` from its partition (its newest snapshot and what follows),
    then schedule until ``stop``, writing a snapshot every ``snapshot_every`` records
    (and at least ``snapshot_per_pod`` records per pod held)."""
    profile_to = os.environ.get("SHOAL_PROFILE_SHARD")
    with _profiled(f"{profile_to}.{shard}" if profile_to else None):
        return await _run_shard(
            bus, shard, config, stop, clock, idle_wait, snapshot_every, snapshot_per_pod
        )


@contextlib.contextmanager
def _profiled(path: str | None) -> Iterator[None]:
    """A cProfile of the block, written to ``path`` (nothing without one)."""
    if not path:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(path)


async def _run_shard(
    bus: EventLog,
    shard: int,
    config: SchedulerConfig | None,
    stop: asyncio.Event,
    clock: Clock,
    idle_wait: float,
    snapshot_every: int,
    snapshot_per_pod: int,
) -> ShardWorker:
    worker = await ShardWorker.recover(
        bus,
        config,
        shard=shard,
        partition=shard,
        snapshot_every=snapshot_every,
        snapshot_per_pod=snapshot_per_pod,
    )
    worker.asker.background = True  # a slow extender delays only the pods it judges
    log.info(
        "shard %d recovered at offset %d (from the snapshot at %d)",
        shard,
        worker.position,
        worker.restored_from,
    )
    producer = f"clock-{shard}"
    while not stop.is_set():
        decided = await worker.poll()
        wake = worker.engine.next_wakeup()
        now = clock()
        if await tick_if_due(bus, shard, wake, now, producer):
            continue
        if decided == 0 and warm_up_when_idle():
            continue
        if decided == 0:
            wait = idle_wait if wake is None else min(idle_wait, max(wake - now, 0) / 1e9)
            await _wait_for_growth(bus, shard, worker.reading_from(), wait)
    return worker


async def run_coordinator(
    bus: EventLog,
    *,
    stop: asyncio.Event,
    clock: Clock = wall_clock,
    idle_wait: float = 0.005,
    on_poll: Callable[[ControlWorker], None] | None = None,
    snapshot_every: int = 0,
    snapshot_per_pod: int = 0,
) -> ControlWorker:
    """The router and coordinator: fold the control partition, relay shards' reports,
    forward, until ``stop``. Restarted, it appends only what its predecessor had not."""
    with _profiled(os.environ.get("SHOAL_PROFILE_COORDINATOR")):
        return await _run_coordinator(
            bus, stop, clock, idle_wait, on_poll, snapshot_every, snapshot_per_pod
        )


async def _run_coordinator(
    bus: EventLog,
    stop: asyncio.Event,
    clock: Clock,
    idle_wait: float,
    on_poll: Callable[[ControlWorker], None] | None,
    snapshot_every: int,
    snapshot_per_pod: int,
) -> ControlWorker:
    sharding = await sharding_from_log(bus)
    worker = ControlWorker(
        Coordinator(sharding),
        bus,
        snapshot_every=snapshot_every,
        snapshot_per_pod=snapshot_per_pod,
    )
    worker.asker.background = True
    control = sharding.shards
    ticked = False
    while not stop.is_set():
        moved = await worker.poll()
        if on_poll is not None:
            on_poll(worker)
        ticked = await tick_if_due(bus, control, worker.control.next_wakeup(), clock(), "clock")
        if ticked:
            continue
        if not moved and not warm_up_when_idle():
            # Kafka: the broker holds a fetch on every partition until one grows (a
            # read of each every few milliseconds was most of an idle coordinator's
            # time, and each one waited at the broker anyway); the log server holds a
            # ``wait`` request likewise
            wake, now = worker.control.next_wakeup(), clock()
            seconds = LONG_WAIT if wake is None else min(LONG_WAIT, max(wake - now, 0) / 1e9)
            await long_poll_or_sleep(bus, worker.reading_from(), seconds, idle_wait)
    if ticked:
        # stopped (SIGTERM: a rolling update) right after its own clock tick: decide
        # what the tick asks for, so that no tail of outputs is left to its successor
        await worker.poll()
    return worker


def warm_up_when_idle() -> bool:
    """Load the compiled refresh (:func:`engine.plugins.kernels.warm_up`, about 0.7 s) the
    first time a long-running component is idle, if nothing has loaded it yet; whether
    it did. Not before the first decisions: a component that starts again decides what
    waits first, and the refresh loads anyway when a pass first needs it (the same
    results either way, bit for bit)."""
    if kernels.loaded() or not kernels.available():
        return False
    started = time.monotonic()
    kernels.warm_up()
    log.info("compiled refresh loaded in %.2f s", time.monotonic() - started)
    return True


async def run_binder(
    bus: EventLog,
    *,
    stop: asyncio.Event,
    clock: Clock = wall_clock,
    idle_wait: float = 0.005,
) -> Binder:
    """The binder with the simulated cluster, in wall time. Started again, it rebuilds
    the cluster by applying the log from the start (decisions refused before stay
    refused; what was accepted is accepted again, in the same order) and appends only
    the refusals and completions that were never recorded."""
    shards = bus.partitions - 1
    failed: set[str] = set()
    for partition in range(shards):
        offset = 0
        while True:  # a batch at a time: the partition may be long
            batch, skipped, offset = await read_past_unreadable(bus, partition, offset, 50_000)
            if not batch and not skipped:
                break
            failed.update(e.event.decision_id for e in batch if isinstance(e.event, BindFailed))
    cluster = SimulatedCluster()
    binder = Binder(cluster, bus, shards=shards, failed=failed)
    while not stop.is_set():
        now = clock()
        moved = await binder.poll(now)
        done = cluster.due(now)
        if done:
            await bus.append(
                [Envelope(event=e, time=now, producer="cluster") for e in done], shards
            )
        if not moved and not done:
            await asyncio.sleep(idle_wait)
    return binder


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


BACKOFF_FIRST = 0.05
BACKOFF_MAX = 5.0
"""A failed bus operation is retried after ``BACKOFF_FIRST`` seconds, doubling to at
most ``BACKOFF_MAX`` (``shoal serve`` backs off the same way)."""
GIVE_UP_AFTER = 30
"""Failures in a row (none of them after a stretch of work, see :func:`run_backing_off`)
after which a worker exits with the last error, so that whatever supervises it (a
StatefulSet, a test) sees it fail rather than retry for ever."""
STEADY = 30.0
"""Seconds of work after which a failure counts as the first of a new series."""


async def run_backing_off(
    role: str,
    open_: Callable[[], Awaitable[EventLog]],
    run: Callable[[EventLog], Awaitable[object]],
    stop: asyncio.Event,
    *,
    give_up_after: int = GIVE_UP_AFTER,
    first: float = BACKOFF_FIRST,
) -> None:
    """Open the bus and run a component on it until ``stop``; when the bus fails (a
    broken connection, a slow read, a server not yet up), close it, wait, and start the
    component again from the log, as a restarted process would. The wait doubles from
    ``first`` to :data:`BACKOFF_MAX`; after ``give_up_after`` failures in a row the last
    error is raised."""
    backoff, failures = first, 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            bus = await open_()
            try:
                await run(bus)
            finally:
                await bus.close()
            return
        except (LogError, OSError) as exc:
            if time.monotonic() - started > STEADY:
                backoff, failures = first, 0
            failures += 1
            if failures >= give_up_after:
                raise LogError(
                    f"{role}: the bus failed {failures} times in a row: {cause(exc)}"
                ) from exc
            log.warning(
                "bus failed; starting again role=%s in=%.2fs failures=%d error=%s",
                role,
                backoff,
                failures,
                cause(exc),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)


async def run_worker(
    role: str,
    open_: Callable[[], Awaitable[EventLog]],
    *,
    shard_id: int | None,
    config: SchedulerConfig | None,
    snapshot_every: int,
    snapshot_per_pod: int,
) -> None:
    """``shoal worker ROLE``: one component (``shard``, ``coordinator`` or ``binder``) on
    the bus ``open_`` opens, until SIGTERM or SIGINT. A bus that fails (a slow read, a
    broken connection) is opened again after a back-off, and the component rebuilds
    from the log (:func:`run_backing_off`), as ``serve`` does."""
    log.info("worker %s starting", role)
    stop = asyncio.Event()
    install_stop_signals(stop)

    async def run(bus: EventLog) -> None:
        if role == "shard":
            if shard_id is None or shard_id >= bus.partitions - 1:
                raise InputError(
                    f"a shard needs --shard-id below {bus.partitions - 1} "
                    f"(the bus has {bus.partitions - 1} shard partitions)",
                    location="--shard-id",
                )
            await run_shard(
                bus,
                shard_id,
                config=config,
                stop=stop,
                snapshot_every=snapshot_every,
                snapshot_per_pod=snapshot_per_pod,
            )
        elif role == "binder":
            await run_binder(bus, stop=stop)
        else:
            await run_coordinator(
                bus, stop=stop, snapshot_every=snapshot_every, snapshot_per_pod=snapshot_per_pod
            )

    await run_backing_off(role, open_, run, stop)

"""A long churn run: pods arriving and finishing without end, on one shard.

``shoal loadtest --churn --pods 1000000 --live 3000 --nodes 1000`` submits pods at a
steady rate (``live`` divided by the mean run time, in simulated seconds) and lets each
run for a drawn time after it is bound, so that about ``live`` pods are held at any
moment while ``pods`` of them finish over the run. With ``--gang-size N`` the pods come
in gangs of N (``minMember`` N, a schedule time-out each), so that groups and their
time-outs churn too.

What it shows: whether a shard's cost stays flat as finished pods pile up. At every
checkpoint (every ``every`` finished pods) it measures, outside the timed part, the
memory reachable from the engine (every object, counted once), the resident size of the
process, the snapshot the shard would write (raw and compressed), and, over the
interval since the last checkpoint, the CPU and the engine's time (fold and pass) per
finished pod.

The shard is a real :class:`~shards.worker.ShardWorker` over a log. On the memory bus
the log keeps only what the worker has not read yet (:class:`TailLog`: a run of a
million pods would otherwise hold every record); on a file bus it keeps everything, so
the run can be replayed and verified (``shoal replay PATH --verify``).
"""

from __future__ import annotations

import gc
import heapq
import random
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

import msgspec
import numpy as np

from engine.engine import Engine
from engine.plugins import kernels
from engine.snapshot import encode_state
from events.log import EventLog, check_partition
from events.types import (
    SECOND,
    ClockTicked,
    Envelope,
    Event,
    GroupSpec,
    NodeAdded,
    PodBound,
    PodGroupSubmitted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    SchedulerConfigured,
)
from loadtest.synthetic import POD_MEMORY, POD_MILLICPU, basic_nodes
from shards.worker import ShardWorker

RUNTIME_SECONDS: Final = (60, 240)
"""A pod runs between these many simulated seconds once bound (uniform)."""
STEP_SECONDS: Final = 5
"""Simulated seconds between two ingest batches (each followed by one pass)."""
GANG_TIMEOUT_SECONDS: Final = 120
"""``scheduleTimeoutSeconds`` of each gang (``--gang-size``)."""

Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class ChurnShape:
    nodes: int = 1000
    pods: int = 1_000_000
    """Pods that finish over the run."""
    live: int = 3000
    """Pods held at a time (on average)."""
    every: int = 100_000
    """Finished pods between two checkpoints."""
    gang_size: int = 0
    seed: int = 0


class TailLog:
    """A one-partition ``EventLog`` that keeps only records from ``trim``'s offset on,
    as a log with a retention limit does: offsets stay as they were, and records before
    the kept tail read as absent. (A churn run of a million pods appends millions of
    records that nobody reads twice.)"""

    def __init__(self) -> None:
        self._base = 0
        self._records: list[Envelope] = []

    def __repr__(self) -> str:
        return f"TailLog(base={self._base}, records={len(self._records)})"

    @property
    def partitions(self) -> int:
        return 1

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        check_partition(partition, 1)
        start = self._base + len(self._records)
        replace = msgspec.structs.replace
        self._records.extend(
            replace(env, offset=start + i, partition=0) for i, env in enumerate(envelopes)
        )
        return list(range(start, start + len(envelopes)))

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        check_partition(partition, 1)
        begin = max(offset - self._base, 0)
        stop = len(self._records) if limit is None else min(len(self._records), begin + limit)
        return self._records[begin:stop]

    async def end_offset(self, partition: int) -> int:
        check_partition(partition, 1)
        return self._base + len(self._records)

    async def close(self) -> None:
        return None

    def trim(self, offset: int) -> None:
        """Forget the records before ``offset``."""
        drop = min(max(offset - self._base, 0), len(self._records))
        del self._records[:drop]
        self._base += drop


def reachable_bytes(root: object) -> int:
    """Bytes of every object reachable from ``root``, each counted once (classes,
    modules and functions left out: they are code, not state)."""
    skip = (type, type(sys), type(reachable_bytes), type(len))
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def resident_bytes() -> int:
    """The process's resident set size (0 where ``/proc`` is not there)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096
    except (OSError, IndexError, ValueError):
        return 0


class _Workload:
    """The arrivals of a churn run, seeded: pods (or gangs) with their run times."""

    def __init__(self, shape: ChurnShape) -> None:
        self.shape = shape
        self.rng = random.Random(shape.seed)
        mean = sum(RUNTIME_SECONDS) / 2
        self.rate = shape.live / mean
        """Pods submitted per simulated second."""
        self.owed = 0.0
        self.units = 0
        self.runtime: dict[str, int] = {}
        """Pod → its run time (until it is bound)."""

    def arrivals(self, seconds: int) -> list[Event]:
        self.owed += self.rate * seconds
        size = max(self.shape.gang_size, 1)
        out: list[Event] = []
        while self.owed >= size:
            self.owed -= size
            out.extend(self._unit(size))
        return out

    def _unit(self, size: int) -> list[Event]:
        rng = self.rng
        n = self.units
        self.units += 1
        requests = {"cpu": rng.choice(POD_MILLICPU), "memory": rng.choice(POD_MEMORY)}
        runtime = rng.randint(*RUNTIME_SECONDS) * SECOND
        out: list[Event] = []
        group = ""
        if self.shape.gang_size:
            spec = GroupSpec(
                namespace="churn",
                name=f"gang-{n:07d}",
                min_member=size,
                timeout=GANG_TIMEOUT_SECONDS * SECOND,
                uid=f"g{n}",
            )
            group = spec.key
            out.append(PodGroupSubmitted(group=spec))
        for i in range(size):
            name = f"gang-{n:07d}-{i}" if group else f"pod-{n:07d}"
            pod = PodSpec(
                namespace="churn",
                name=name,
                requests=dict(requests),
                group=group,
                uid=f"u{n}-{i}",
            )
            self.runtime[pod.key] = runtime
            out.append(PodSubmitted(pod=pod))
        return out


async def run_churn(
    shape: ChurnShape,
    log: EventLog,
    *,
    progress: Progress | None = None,
    bus: str = "memory",
    snapshot_every: int = 0,
) -> dict[str, Any]:
    """Run ``shape`` on one shard over ``log`` (a :class:`TailLog` is trimmed as the
    worker reads it; the worker writes a snapshot every ``snapshot_every`` records, 0
    never); return the checkpoints and the totals."""
    kernels.warm_up()
    nodes = basic_nodes(shape.nodes, random.Random(shape.seed + 1))
    engine = Engine()
    worker = ShardWorker(engine, log, snapshot_every=snapshot_every)
    await log.append([Envelope(event=SchedulerConfigured(), producer="ingest")])
    await log.append([Envelope(event=NodeAdded(node=n), producer="ingest") for n in nodes])
    await worker.poll()
    workload = _Workload(shape)
    ending: list[tuple[int, str]] = []  # (finishes at, pod): bound pods, soonest first
    now = 0
    finished = submitted = 0
    checkpoints: list[dict[str, Any]] = []
    cpu_total = engine_total = 0.0
    interval = _Interval()
    polled = 0.0
    steps_taken: list[tuple[int, float]] = []  # (pods submitted, seconds to decide them)
    started = time.perf_counter()
    # every step finishes about rate * STEP_SECONDS pods once the run is warm: the bound
    # is that with a wide margin (a run that stopped finishing pods stops here)
    steps = int(shape.pods / max(workload.rate * STEP_SECONDS, 1e-9) * 4) + 1000
    for _ in range(steps):
        if finished >= shape.pods:
            break
        now += STEP_SECONDS * SECOND
        batch = workload.arrivals(STEP_SECONDS)
        submitted += sum(1 for e in batch if isinstance(e, PodSubmitted))
        while ending and ending[0][0] <= now:
            _, key = heapq.heappop(ending)
            batch.append(PodSucceeded(pod=key))
            finished += 1
        envelopes = [Envelope(event=e, time=now, producer="ingest") for e in batch]
        start = await log.end_offset(0)
        await log.append(envelopes or [Envelope(event=ClockTicked(), time=now, producer="ingest")])
        before = time.perf_counter()
        await worker.poll()
        took = time.perf_counter() - before
        polled += took
        steps_taken.append((len(batch), took))
        for env in await log.read(0, start):
            if isinstance(env.event, PodBound):
                runtime = workload.runtime.pop(env.event.pod, None)
                if runtime is not None:
                    heapq.heappush(ending, (now + runtime, env.event.pod))
        if isinstance(log, TailLog):
            log.trim(worker.position)
        if finished // shape.every > len(checkpoints):
            cpu, engine_seconds, pods = interval.close(finished, polled)
            cpu_total += cpu
            engine_total += engine_seconds
            point = _checkpoint(engine, finished, submitted, cpu, engine_seconds, pods)
            checkpoints.append(point)
            if progress is not None:
                progress(point)
            interval = _Interval(finished, polled)
    wall = time.perf_counter() - started
    counts = np.array([n for n, _ in steps_taken], dtype=np.int64)
    ms = np.repeat(np.array([t for _, t in steps_taken]) * 1000, counts)
    if not ms.size:
        ms = np.zeros(1)
    return {
        "shape": {**asdict(shape), "bus": bus, "workload": "churn"},
        "finished": finished,
        "submitted": submitted,
        "live": len(engine.pods),
        "pods_per_second": finished / wall if wall > 0 else 0.0,
        "latency_ms": {
            "p50": float(np.percentile(ms, 50)),
            "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99)),
            "max": float(ms.max()),
        },
        "wall_seconds": round(wall, 3),
        "simulated_seconds": now / SECOND,
        "checkpoints": checkpoints,
        "cpu_microseconds_per_pod": round(cpu_total * 1e6 / max(finished, 1), 1),
        "engine_microseconds_per_pod": round(engine_total * 1e6 / max(finished, 1), 1),
    }


class _Interval:
    """CPU, and time in the worker's polls (fold and pass), since the last checkpoint."""

    def __init__(self, finished: int = 0, polled: float = 0.0) -> None:
        self.finished = finished
        self.polled = polled
        self.cpu = time.process_time()

    def close(self, finished: int, polled: float) -> tuple[float, float, int]:
        """(CPU seconds, seconds polling, pods finished) over the interval."""
        return (time.process_time() - self.cpu, polled - self.polled, finished - self.finished)


def _checkpoint(
    engine: Engine, finished: int, submitted: int, cpu: float, engine_seconds: float, pods: int
) -> dict[str, Any]:
    raw = encode_state(engine)
    return {
        "finished": finished,
        "submitted": submitted,
        "live": len(engine.pods),
        "groups": len(engine.groups),
        "finished_kept": len(engine.outcomes),
        "engine_bytes": reachable_bytes(engine),
        "resident_bytes": resident_bytes(),
        "snapshot_bytes": len(raw),
        "snapshot_compressed_bytes": len(zlib.compress(raw, 1)),
        "cpu_microseconds_per_pod": round(cpu * 1e6 / max(pods, 1), 1),
        "engine_microseconds_per_pod": round(engine_seconds * 1e6 / max(pods, 1), 1),
    }

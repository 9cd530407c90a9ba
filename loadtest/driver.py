"""Drive a shard with a synthetic workload through a real event log and measure it.

Pods are appended to the log in batches of ``batch``; after each batch the shard polls
(folds the batch, runs a pass, appends its decisions). Throughput is pods decided per
wall second from the first pod appended to the last decision appended, so it includes
the log on both sides. Latency is per pod, from the append of its submission to the
append of its decision (batch-granular: a pass decides a whole batch).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from engine.scheduler import Engine
from events.log import EventLog
from events.types import Envelope, NodeAdded, PodBound, PodSubmitted, SchedulerConfigured
from loadtest.synthetic import basic_nodes, basic_pods
from shards.worker import ShardWorker

Progress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class LoadShape:
    nodes: int = 5000
    pods: int = 20000
    seed: int = 0
    batch: int = 1000
    shards: int = 1
    workload: str = "basic"


async def run_loadtest(
    shape: LoadShape, log: EventLog, *, progress: Progress | None = None, bus: str = "memory"
) -> dict[str, Any]:
    rng = random.Random(shape.seed)
    nodes = basic_nodes(shape.nodes, rng)
    pods = basic_pods(shape.pods, rng)
    engine = Engine()
    worker = ShardWorker(engine, log)
    await log.append([Envelope(event=SchedulerConfigured(), producer="ingest")])
    await log.append([Envelope(event=NodeAdded(node=n), producer="ingest") for n in nodes])
    await worker.poll()
    latencies = np.zeros(shape.pods)
    started = time.perf_counter()
    for start in range(0, shape.pods, shape.batch):
        chunk = pods[start : start + shape.batch]
        submitted = time.perf_counter()
        await log.append([Envelope(event=PodSubmitted(pod=p), producer="ingest") for p in chunk])
        await worker.poll()
        latencies[start : start + len(chunk)] = time.perf_counter() - submitted
        if progress is not None:
            progress(start + len(chunk), shape.pods, time.perf_counter() - started)
    wall = time.perf_counter() - started
    records = await log.read(0, 0)
    bound = sum(1 for env in records if isinstance(env.event, PodBound))
    stats = engine.stats()
    ms = latencies * 1000
    return {
        "shape": {**asdict(shape), "bus": bus},
        "pods_per_second": shape.pods / wall if wall > 0 else 0.0,
        "latency_ms": {
            "p50": float(np.percentile(ms, 50)),
            "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99)),
            "max": float(ms.max()),
        },
        "bound": bound,
        "unschedulable": stats["unschedulable"],
        "attempts": stats["attempts"],
        "wall_seconds": wall,
        "engine_seconds": worker.pass_seconds,
        "events": len(records),
    }

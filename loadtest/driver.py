"""Drive a shard with a synthetic workload through a real event log and measure it.

Pods are appended to the log in batches of ``batch``; after each batch (or every
``window`` batches) the shard polls (folds them, runs a pass, appends its decisions).
Throughput is pods decided per wall second from the first pod appended to the last
decision appended, so it includes the log on both sides. Latency is per pod, from the
append of its submission to the append of its decision (batch-granular: a pass decides
a whole batch).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from engine.config import SchedulerConfig, parse_config
from engine.engine import Engine
from engine.plugins import kernels
from events.log import EventLog
from events.types import (
    Envelope,
    Event,
    NodeAdded,
    PodBound,
    PodGroupSubmitted,
    PodSpec,
    PodSubmitted,
    SchedulerConfigured,
)
from loadtest.perfshapes import perf_nodes, perf_pods
from loadtest.synthetic import basic_nodes, basic_pods, gang_workload
from shards.worker import ShardWorker

Progress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class LoadShape:
    nodes: int = 5000
    pods: int = 20000
    seed: int = 0
    batch: int = 1000
    shards: int = 1
    gang_size: int = 0
    """0: independent pods; N: pods in gangs of N (``minMember`` N)."""
    window: int = 1
    """At most this many batches submitted and not yet decided (0: no limit, every
    batch as fast as the log takes it). 1, a closed loop, measures latency as a
    batch's time through the system; more keeps every stage busy."""
    workload: str = ""
    """A scheduler_perf workload (:mod:`loadtest.perfshapes`): its nodes, its init pods
    placed before the clock starts, then ``pods`` measured pods; empty: the synthetic
    mix."""
    extender: str = ""
    """An extender's URL prefix: every pod is asked about (filter and prioritize)."""
    node_names: bool = False
    """The extender is ``nodeCacheCapable`` (sent node names, not whole nodes)."""


def extender_config(shape: LoadShape) -> SchedulerConfig | None:
    """The configuration of a run with ``shape.extender`` (None without one)."""
    if not shape.extender:
        return None
    entry = {
        "urlPrefix": shape.extender,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": 1,
        "nodeCacheCapable": shape.node_names,
    }
    return parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "extenders": [entry],
        }
    )


async def run_loadtest(
    shape: LoadShape, log: EventLog, *, progress: Progress | None = None, bus: str = "memory"
) -> dict[str, Any]:
    rng = random.Random(shape.seed)
    init: list[PodSpec] = []
    if shape.workload:
        nodes = perf_nodes(shape.nodes)
        init, measured = perf_pods(shape.workload, shape.pods, shape.nodes)
        batches: list[list[Event]] = [
            [PodSubmitted(pod=p) for p in measured[start : start + shape.batch]]
            for start in range(0, len(measured), shape.batch)
        ]
    else:
        nodes = basic_nodes(shape.nodes, rng)
        batches = _batches(shape, rng)
    kernels.warm_up()  # its one-time load is not what the run measures
    config = extender_config(shape)
    engine = Engine(config)
    worker = ShardWorker(engine, log)
    recorded = json.dumps(config.source, sort_keys=True) if config and config.source else ""
    await log.append([Envelope(event=SchedulerConfigured(config=recorded), producer="ingest")])
    await log.append([Envelope(event=NodeAdded(node=n), producer="ingest") for n in nodes])
    await worker.poll()
    for start in range(0, len(init), shape.batch):
        first = init[start : start + shape.batch]
        await log.append([Envelope(event=PodSubmitted(pod=p), producer="ingest") for p in first])
        await worker.poll()
    already = len(await log.read(0, 0))
    total = sum(sum(1 for e in b if isinstance(e, PodSubmitted)) for b in batches)
    latencies = np.zeros(total)
    done = 0
    cpu_before = time.process_time()
    started = time.perf_counter()
    waiting: list[tuple[int, float]] = []  # (pods, when appended) of undecided batches
    for index, chunk in enumerate(batches):
        waiting.append((sum(1 for e in chunk if isinstance(e, PodSubmitted)), time.perf_counter()))
        await log.append([Envelope(event=e, producer="ingest") for e in chunk])
        last = index == len(batches) - 1
        if not last and (not shape.window or len(waiting) < shape.window):
            continue
        await worker.poll()  # one pass decides every batch appended so far
        while engine.extenders.waiting:
            await worker.poll()  # (with an extender: the pass after its answers decides)
        decided = time.perf_counter()
        for pods_in_chunk, submitted in waiting:
            latencies[done : done + pods_in_chunk] = decided - submitted
            done += pods_in_chunk
        waiting.clear()
        if progress is not None:
            progress(done, total, time.perf_counter() - started)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_before
    records = await log.read(0, 0)
    bound = sum(1 for env in records[already:] if isinstance(env.event, PodBound))
    stats = engine.stats()
    ms = latencies * 1000
    return {
        "shape": {**asdict(shape), "bus": bus, "pods": total},
        "pods_per_second": total / wall if wall > 0 else 0.0,
        "latency_ms": {
            "p50": float(np.percentile(ms, 50)),
            "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99)),
            "max": float(ms.max()),
        },
        "bound": bound,
        "unschedulable": stats["unschedulable"],
        "gangs_scheduled": sum(1 for g in engine.groups.values() if g.phase == "Scheduled"),
        "attempts": stats["attempts"],
        "wall_seconds": wall,
        "engine_seconds": worker.pass_seconds,
        "cpu_seconds": {"process": round(cpu, 3)},
        "cpu_microseconds_per_pod": round(cpu * 1e6 / max(total, 1), 1),
        "events": len(records),
        **({"extender": worker.stats()} if shape.extender else {}),
    }


def _batches(shape: LoadShape, rng: random.Random) -> list[list[Event]]:
    """Ingest batches of about ``shape.batch`` pods; a gang is never split."""
    if shape.gang_size <= 0:
        pods = basic_pods(shape.pods, rng)
        return [
            [PodSubmitted(pod=p) for p in pods[start : start + shape.batch]]
            for start in range(0, len(pods), shape.batch)
        ]
    batches: list[list[Event]] = [[]]
    count = 0
    for group, members in gang_workload(shape.pods, shape.gang_size, rng):
        if count and count + len(members) > shape.batch:
            batches.append([])
            count = 0
        batches[-1].append(PodGroupSubmitted(group=group))
        batches[-1].extend(PodSubmitted(pod=m) for m in members)
        count += len(members)
    return [b for b in batches if b]

"""The scale harness (``shoal loadtest scale``): one configuration, measured per process.

A configuration is a cluster size, a number of templates and either ``shards`` shard
processes behind a coordinator process (``shoal worker coordinator`` and ``shoal
worker shard``, over a log server this process runs), or, with ``shards`` 0, one shard
in this process (the engine on the in-memory log, as ``shoal loadtest`` with one shard).
Each process's CPU (user + system, from ``/proc``) is read before and after a phase,
so the report splits the cost per pod between the coordinator, each shard, the binder
(when asked for) and this process, which serves the log and drives the load ("log").
Peak memory is each process's high-water mark of resident memory (``VmHWM``; this
process's is reset when a configuration starts, where the kernel allows it).

Phases, each timed on its own: the fillers of the preemption wave are placed first (not
timed); then the workload (:mod:`loadtest.mixed`), submitted in batches, at most
``window`` undecided (see :mod:`loadtest.sharded`, whose collector this reuses): pods/s,
latency from submission to decision; then the wave: every high-priority pod submitted at
once, timed until each is bound, with the evictions counted.

The projection for a machine with N + 1 free cores (N shards, the coordinator on its
own core) is min(1 / coordinator's CPU per pod, 1 / busiest shard's CPU per pod), each
per pod of the whole run (:func:`projection`): what the slowest stage allows once
nothing shares a core. It leaves out the log and the
binder, which a deployment runs elsewhere (Kafka, the API server).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from engine.engine import Engine
from engine.model.pools import Sharding
from engine.plugins import kernels
from events.errors import InputError
from events.fence import FencedLog
from events.log import EventLog, count_kinds, read_kinds
from events.memory import MemoryLog
from events.remote import LogServer
from events.types import (
    Envelope,
    Event,
    NodeAdded,
    PodBound,
    PodPreempted,
    PodSpec,
    PodSubmitted,
    SchedulerConfigured,
    ShardingConfigured,
    ShardSummary,
)
from events.wire import load_token, new_token_file
from loadtest.mixed import mixed_batches, mixed_nodes, templates, wave_pods
from loadtest.sharded import _Collector, _envelope, _percentiles, cpu_seconds
from shards.bus import open_bus
from shards.worker import ShardWorker

Progress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class ScaleShape:
    nodes: int
    pods: int
    shards: int
    """Shard processes behind a coordinator process; 0: one shard in this process."""
    templates: int = 1
    gang_fraction: float = 0.0
    gang_size: int = 4
    wave: int = 0
    """Pods in the preemption wave (and wave nodes, and fillers)."""
    seed: int = 0
    batch: int = 1000
    window: int = 1
    binder: bool = False
    """Run ``shoal worker binder`` too (processes only)."""

    @property
    def label(self) -> str:
        return "in-process" if self.shards == 0 else f"{self.shards} shard(s)"


@dataclass
class Workload:
    nodes: list[Any]
    batches: list[list[Event]]
    fillers: list[PodSpec]
    wave: list[PodSpec]

    @property
    def pods(self) -> int:
        return sum(1 for b in self.batches for e in b if isinstance(e, PodSubmitted))


def workload(shape: ScaleShape) -> Workload:
    """The cluster and pods of ``shape``: a pure function of it."""
    if shape.wave * 2 > shape.nodes:
        raise InputError(
            f"a wave of {shape.wave} needs that many nodes set apart: at most half of "
            f"{shape.nodes}",
            location="--preemption-wave",
        )
    rng = random.Random(shape.seed)
    nodes = mixed_nodes(shape.nodes, rng, shape.wave)
    shapes = templates(shape.templates, rng)
    batches = mixed_batches(
        shape.pods,
        shapes,
        rng,
        batch=shape.batch,
        gang_fraction=shape.gang_fraction,
        gang_size=shape.gang_size,
    )
    fillers, wave = wave_pods(nodes)
    return Workload(nodes, batches, fillers, wave)


def projection(shards: int, coordinator_us: float, busiest_us: float) -> dict[str, Any]:
    """pods/s ≈ min(1 / coordinator's CPU per pod, 1 / busiest shard's), on N + 1 cores
    (``shards`` N); with no coordinator (one shard in this process), 1 / its CPU per
    pod. Every figure is per pod of the whole run (what the report gives), so a shard
    that places a share of them on a core of its own allows 1 / its figure (N / its CPU
    per pod of its own share, where the shards are balanced). Until 2026-11-29 the
    shards' bound was N / their figure, N times too high where a shard was the slowest
    stage."""
    bounds = [1e6 / busiest_us] if busiest_us > 0 else []
    if coordinator_us > 0:
        bounds.append(1e6 / coordinator_us)
    return {
        "cores": shards + (1 if coordinator_us > 0 else 0),
        "formula": "min(1 / coordinator, 1 / busiest shard)" if coordinator_us > 0 else "1 / shard",
        "coordinator_us_per_pod": round(coordinator_us, 1),
        "busiest_shard_us_per_pod": round(busiest_us, 1),
        "pods_per_second": round(min(bounds), 1) if bounds else 0.0,
    }


def peak_rss_mb(pid: int | None) -> float | None:
    """The high-water mark of ``pid``'s resident memory (this process's if None), MB."""
    try:
        with open(f"/proc/{pid or 'self'}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss() -> bool:
    """Start this process's ``VmHWM`` again from its current size (Linux); whether it could."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


class _Processes:
    """CPU seconds of named processes (None: this one), read in one go."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = pids

    def cpu(self) -> dict[str, float]:
        out = {}
        for name, pid in self.pids.items():
            seconds = cpu_seconds(pid)
            if seconds is not None:
                out[name] = seconds
        return out

    def report(
        self, before: dict[str, float], after: dict[str, float], pods: int
    ) -> list[dict[str, Any]]:
        rows = []
        for name, pid in self.pids.items():
            if name not in before or name not in after:
                continue
            spent = after[name] - before[name]
            rows.append(
                {
                    "process": name,
                    "cpu_seconds": round(spent, 3),
                    "cpu_us_per_pod": round(spent * 1e6 / max(pods, 1), 1),
                    "peak_rss_mb": peak_rss_mb(pid),
                }
            )
        return rows


def _split(rows: list[dict[str, Any]], shards: int) -> dict[str, Any]:
    per = {r["process"]: r["cpu_us_per_pod"] for r in rows}
    shard_us = [v for k, v in per.items() if k.startswith("shard")]
    return projection(shards, per.get("coordinator", 0.0), max(shard_us, default=0.0))


async def run_configuration(shape: ScaleShape, progress: Progress | None = None) -> dict[str, Any]:
    """Measure one configuration (see the module's docstring)."""
    load = workload(shape)
    reset = reset_peak_rss()
    if shape.shards == 0:
        result = await _in_process(shape, load, progress)
    else:
        with tempfile.TemporaryDirectory(prefix="shoal-scale-") as folder:
            token_file = new_token_file(folder)
            token = load_token(token_file)
            async with LogServer(shape.shards + 1, token=token) as server:
                result = await _processes(shape, load, server.url, token_file, progress)
    result["shape"] = {**asdict(shape), "configuration": shape.label, "pods": load.pods}
    result["peak_rss_reset"] = reset
    return result


# ------------------------------------------------------------------ processes


def _spawn(role: str, url: str, token_file: str, shard: int | None = None) -> Any:
    extra = ["--shard-id", str(shard)] if shard is not None else []
    return asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shards.cli",
        "worker",
        role,
        "--bus",
        url,
        "--token-file",
        token_file,
        *extra,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def _processes(
    shape: ScaleShape, load: Workload, url: str, token_file: str, progress: Progress | None
) -> dict[str, Any]:
    n = shape.shards
    bus = await open_bus(url, partitions=n + 1, token_file=token_file)
    log = FencedLog(bus, fence="shoal-ingest", epoch=1)
    await log.begin([n], holder="loadtest", now=time.time_ns())
    await log.append(
        [
            _envelope(ShardingConfigured(config=Sharding(shards=n).to_json())),
            _envelope(SchedulerConfigured()),
            *(_envelope(NodeAdded(node=node)) for node in load.nodes),
        ],
        n,
    )  # stored in as many frames as the log server's limit needs (events.remote)
    children = {"coordinator": await _spawn("coordinator", url, token_file)}
    for i in range(n):
        children[f"shard {i}"] = await _spawn("shard", url, token_file, i)
    if shape.binder:
        children["binder"] = await _spawn("binder", url, token_file)
    pids: dict[str, int | None] = {k: c.pid for k, c in children.items()}
    meter = _Processes({**pids, "log": None})
    try:
        await _wait_ready(log, n, len(load.nodes), children)
        positions = [0] * n
        if load.fillers:
            await log.append([_envelope(PodSubmitted(pod=p)) for p in load.fillers], n)
            await _Collector(log, positions, {}, len(load.fillers), None).finish()
        result = await _measure(log, shape, load.batches, positions, meter, progress)
        if load.wave:
            result["wave"] = await _wave_processes(log, n, load.wave, positions, meter, progress)
        return result
    finally:
        for child in children.values():
            with contextlib.suppress(ProcessLookupError):
                child.terminate()
        for child in children.values():
            await child.wait()
        await bus.close()


async def _wait_ready(log: EventLog, shards: int, nodes: int, children: dict[str, Any]) -> None:
    """Until every shard has summarised all its nodes to the coordinator."""
    held = [0] * shards
    offset = 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        for name, child in children.items():
            if child.returncode is not None:
                raise RuntimeError(f"{name} exited with {child.returncode} before the run")
        offset, records = await read_kinds(log, shards, offset, ("summary",))
        for env in records:
            if isinstance(env.event, ShardSummary):
                held[env.event.shard] = env.event.nodes
        if sum(held) == nodes:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("shards did not fold their nodes within 600 s")


async def _measure(
    log: EventLog,
    shape: ScaleShape,
    batches: list[list[Event]],
    positions: list[int],
    meter: _Processes,
    progress: Progress | None,
) -> dict[str, Any]:
    n = shape.shards
    submitted_at: dict[str, float] = {}
    decided_at: dict[str, float] = {}
    total = sum(1 for b in batches for e in b if isinstance(e, PodSubmitted))
    before = meter.cpu()
    after: dict[str, float] = {}

    def when_counted() -> None:
        after.update(meter.cpu())

    collector = _Collector(log, positions, decided_at, total, progress, when_counted)
    started = collector.started = time.perf_counter()
    appended: list[int] = []
    for chunk in batches:
        if shape.window and len(appended) >= shape.window:
            await collector.until(appended[-shape.window])
        now = time.perf_counter()
        for event in chunk:
            if isinstance(event, PodSubmitted):
                submitted_at[event.pod.key] = now
        await log.append([_envelope(e) for e in chunk], n)
        pods = sum(1 for e in chunk if isinstance(e, PodSubmitted))
        appended.append((appended[-1] if appended else 0) + pods)
    bound = await collector.finish()
    if not after:
        when_counted()
    wall = max(decided_at.values()) - started
    ms = np.array([(decided_at[k] - submitted_at[k]) * 1000 for k in decided_at])
    rows = meter.report(before, after, total)
    return {
        "pods_per_second": total / wall if wall > 0 else 0.0,
        "latency_ms": _percentiles(ms),
        "bound": bound,
        "unschedulable": total - bound,
        "wall_seconds": wall,
        "processes": rows,
        "projection": _split(rows, n),
    }


async def _wave_processes(
    log: EventLog,
    shards: int,
    wave: list[PodSpec],
    positions: list[int],
    meter: _Processes,
    progress: Progress | None,
) -> dict[str, Any]:
    before = meter.cpu()
    started = time.perf_counter()
    await log.append([_envelope(PodSubmitted(pod=p)) for p in wave], shards)
    waiting = {p.key for p in wave}
    offsets = list(positions)
    deadline = time.monotonic() + 600
    while waiting and time.monotonic() < deadline:
        for shard in range(shards):
            offsets[shard], records = await read_kinds(log, shard, offsets[shard], ("bind",))
            waiting.difference_update(
                env.event.pod for env in records if isinstance(env.event, PodBound)
            )
        if progress is not None:
            progress(len(wave) - len(waiting), len(wave), time.perf_counter() - started)
        if waiting:
            await asyncio.sleep(0.01)
    seconds = time.perf_counter() - started
    after = meter.cpu()
    evicted = 0
    for shard in range(shards):
        evicted += (await count_kinds(log, shard, positions[shard], ("preempt",)))[1]
    return _wave_result(
        len(wave), len(waiting), evicted, seconds, meter.report(before, after, len(wave))
    )


# ------------------------------------------------------------------ in process


async def _in_process(
    shape: ScaleShape, load: Workload, progress: Progress | None
) -> dict[str, Any]:
    kernels.warm_up()  # its one-time load is not what the run measures
    log = MemoryLog()
    engine = Engine(None)
    worker = ShardWorker(engine, log)
    meter = _Processes({"shard (in process, with the log and driver)": None})
    try:
        await log.append([Envelope(event=SchedulerConfigured(), producer="ingest")])
        await log.append([Envelope(event=NodeAdded(node=n), producer="ingest") for n in load.nodes])
        await worker.poll()
        if load.fillers:
            await log.append([_envelope(PodSubmitted(pod=p)) for p in load.fillers])
            await worker.poll()
        position = len(await log.read(0, 0))
        total = load.pods
        latencies = np.zeros(total)
        done = 0
        before = meter.cpu()
        started = time.perf_counter()
        waiting: list[tuple[int, float]] = []
        for index, chunk in enumerate(load.batches):
            pods = sum(1 for e in chunk if isinstance(e, PodSubmitted))
            waiting.append((pods, time.perf_counter()))
            await log.append([_envelope(e) for e in chunk])
            last = index == len(load.batches) - 1
            if not last and (not shape.window or len(waiting) < shape.window):
                continue
            await worker.poll()
            decided = time.perf_counter()
            for count, submitted in waiting:
                latencies[done : done + count] = decided - submitted
                done += count
            waiting.clear()
            if progress is not None:
                progress(done, total, decided - started)
        wall = time.perf_counter() - started
        after = meter.cpu()
        records = await log.read(0, position)
        bound = len({r.event.pod for r in records if isinstance(r.event, PodBound)})
        rows = meter.report(before, after, total)
        result: dict[str, Any] = {
            "pods_per_second": total / wall if wall > 0 else 0.0,
            "latency_ms": _percentiles(latencies * 1000),
            "bound": bound,
            "unschedulable": total - bound,
            "wall_seconds": wall,
            "processes": rows,
            "projection": projection(1, 0.0, rows[0]["cpu_us_per_pod"] if rows else 0.0),
        }
        if load.wave:
            result["wave"] = await _wave_in_process(log, worker, load.wave, meter, progress)
        return result
    finally:
        await log.close()


async def _wave_in_process(
    log: MemoryLog,
    worker: ShardWorker,
    wave: list[PodSpec],
    meter: _Processes,
    progress: Progress | None,
) -> dict[str, Any]:
    position = len(await log.read(0, 0))
    before = meter.cpu()
    started = time.perf_counter()
    await log.append([_envelope(PodSubmitted(pod=p)) for p in wave])
    waiting = {p.key for p in wave}
    evicted = 0
    read = position
    deadline = time.monotonic() + 600
    while waiting and time.monotonic() < deadline:
        await worker.poll()
        records = await log.read(0, read)
        read += len(records)
        for env in records:
            if isinstance(env.event, PodBound):
                waiting.discard(env.event.pod)
            elif isinstance(env.event, PodPreempted):
                evicted += 1
        if progress is not None:
            progress(len(wave) - len(waiting), len(wave), time.perf_counter() - started)
        if waiting and not records:
            await asyncio.sleep(0.001)
    seconds = time.perf_counter() - started
    rows = meter.report(before, meter.cpu(), len(wave))
    return _wave_result(len(wave), len(waiting), evicted, seconds, rows)


def _wave_result(
    pods: int, waiting: int, evicted: int, seconds: float, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """A preemption wave's figures, as both ways of running it report them. Its
    engine CPU: the coordinator's and the shards' (in process, the one process's,
    the log and driver included), what deciding every eviction cost."""
    engine = sum(
        r["cpu_seconds"]
        for r in rows
        if r["process"] == "coordinator" or r["process"].startswith("shard")
    )
    return {
        "pods": pods,
        "bound": pods - waiting,
        "evicted": evicted,
        "seconds": seconds,
        "pods_per_second": pods / seconds if seconds > 0 else 0.0,
        "engine_cpu_seconds": round(engine, 3),
        "processes": rows,
    }

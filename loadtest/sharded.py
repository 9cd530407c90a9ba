"""The load test with several shards: one OS process per shard, through a shared log.

The parent process serves the in-memory log (:class:`~events.remote.LogServer`), runs
ingest and the coordinator, and starts ``shoal worker shard`` once per shard.
Nodes are spread over the shards by the default pool rule (a stable hash of the name).
Once every shard has folded its nodes, pods are appended to the control partition in
batches of ``batch``, at most ``window`` batches undecided (0: as fast as the log takes
them); the clock stops when every pod has
a decision in some shard's partition. Latency is per pod, from the append of its
submission to the moment the parent reads its decision (so it includes the coordinator's
hop and the parent's polling).

With ``direct`` the pods skip the coordinator's choice: once the shards are ready they are appended
straight to the shards' partitions, dealt out in turn (as ``PodRouted`` records the
shards keep even if they cannot place them). Nothing else changes, the coordinator
included, so the difference between the two runs is what choosing costs, and the direct
run is the most the shards and the log give on this machine, whatever the coordinator
does:
a measuring aid, not a way to run shoal.

With ``spanning_gangs`` the workload also holds that many gangs too large for any one
shard (their members ask for GPUs and the nodes of each shard hold fewer than a gang
needs): the coordinator places them across shards, and the report gives the wall time
from prepare to commit of each.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from engine.model.pools import Sharding
from engine.plugins import kernels
from events.errors import InputError
from events.fence import FencedLog
from events.log import EventLog, count_kinds, long_poll_or_sleep, read_kinds
from events.remote import LogServer
from events.types import (
    Envelope,
    GroupSpec,
    NodeAdded,
    NodeSpec,
    PodBound,
    PodDeleted,
    PodGroupSubmitted,
    PodRouted,
    PodSpec,
    PodSubmitted,
    PodUnschedulable,
    SchedulerConfigured,
    ShardingConfigured,
    Taint,
    Toleration,
)
from events.wire import load_token, new_token_file
from loadtest.driver import LoadShape, Progress, _batches
from loadtest.synthetic import basic_nodes
from shards.bus import open_bus
from shards.control import ControlWorker
from shards.processes import run_coordinator

DECIDED = ("bind", "unsched")


def _envelope(event: Any, producer: str = "ingest") -> Envelope:
    return Envelope(event=event, time=time.time_ns(), producer=producer)


def _spanning(shape: LoadShape, count: int, shards: int) -> tuple[list[NodeSpec], list[list[Any]]]:
    """GPU nodes, 4 cards each, spread over the shards; gangs of one-card members, each
    needing more cards than a shard has."""
    per_shard = 4
    nodes = [
        NodeSpec(
            name=f"gpu-{i:04d}",
            allocatable={"cpu": 64000, "memory": 256 << 30, "pods": 110, "nvidia.com/gpu": 4},
            labels={"shoal.io/pool": f"gpu-{i % shards}", "gpu": "yes"},
            taints=(Taint(key="nvidia.com/gpu", effect="NoSchedule"),),
        )
        for i in range(per_shard * shards)
    ]
    size = per_shard * 4 + 2  # more cards than one shard's 16
    gangs: list[list[Any]] = []
    for g in range(count):
        group = GroupSpec(namespace="train", name=f"wide-{g:03d}", min_member=size)
        events: list[Any] = [PodGroupSubmitted(group=group)]
        gangs.append(events)
        for m in range(size):
            pod = PodSpec(
                namespace="train",
                name=f"wide-{g:03d}-{m:02d}",
                requests={"cpu": 1000, "nvidia.com/gpu": 1},
                group=group.key,
                node_selector={"gpu": "yes"},
                tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),),
            )
            events.append(PodSubmitted(pod=pod))
    return nodes, gangs


async def run_sharded_loadtest(
    shape: LoadShape,
    *,
    spanning_gangs: int = 0,
    progress: Progress | None = None,
    bus: str = "memory",
    direct: bool = False,
) -> dict[str, Any]:
    """Run the load with ``shape.shards`` shard processes over ``bus``: ``memory`` (a log
    server this process starts) or ``kafka://...`` (a fresh topic with shards + 1
    partitions, from ``shoal kafka init``); ``direct``: the pods skip the coordinator."""
    if direct and (shape.gang_size or spanning_gangs):
        raise InputError(
            "pods given to the shards directly are plain pods: no gangs", location="--direct"
        )
    if bus == "memory":
        with tempfile.TemporaryDirectory(prefix="shoal-log-") as folder:
            token_file = new_token_file(folder)  # only this run's processes can use the server
            async with LogServer(shape.shards + 1, token=load_token(token_file)) as server:
                label = "tcp (in-memory log server)"
                return await _run(
                    shape, server.url, label, spanning_gangs, progress, direct, token_file
                )
    if not bus.startswith("kafka://"):
        raise InputError("the sharded load test runs on memory or kafka://", location="--bus")
    if "partitions=" not in bus:
        bus += ("&" if "?" in bus else "?") + f"partitions={shape.shards + 1}"
    return await _run(shape, bus, bus, spanning_gangs, progress, direct)


async def _run(
    shape: LoadShape,
    url: str,
    label: str,
    spanning_gangs: int,
    progress: Progress | None,
    direct: bool = False,
    token_file: str | None = None,
) -> dict[str, Any]:
    n = shape.shards
    rng = random.Random(shape.seed)
    nodes = basic_nodes(shape.nodes, rng)
    batches = _dealt(_batches(shape, rng), n) if direct else [(n, b) for b in _batches(shape, rng)]
    gpu_nodes, wide = _spanning(shape, spanning_gangs, n) if spanning_gangs else ([], [])
    sharding = Sharding(shards=n, pools=tuple((f"gpu-{i}", i) for i in range(n)))
    bus = await open_bus(url, partitions=n + 1, token_file=token_file)
    if bus.partitions != n + 1 or any([await bus.end_offset(p) for p in range(n + 1)]):
        await bus.close()
        raise InputError(
            f"{n} shards need an empty log of {n + 1} partitions (a fresh topic)",
            location="--bus",
        )
    # ingest and the coordinator write as `shoal serve`'s leaders do: through a term
    log = FencedLog(bus, fence="shoal-ingest", epoch=1)
    await log.begin([n], holder="loadtest", now=time.time_ns())
    await log.append(
        [
            _envelope(ShardingConfigured(config=sharding.to_json())),
            _envelope(SchedulerConfigured()),
            *(_envelope(NodeAdded(node=node)) for node in [*nodes, *gpu_nodes]),
        ],
        n,
    )
    stop = asyncio.Event()
    control_bus = await open_bus(url, partitions=n + 1, token_file=token_file)
    control_log = FencedLog(control_bus, fence="shoal-coordinator", epoch=1)
    await control_log.begin(range(n + 1), holder="loadtest", now=time.time_ns())
    holder: list[ControlWorker] = []

    def keep(worker: ControlWorker) -> None:
        if not holder:
            holder.append(worker)

    coordinator = asyncio.create_task(run_coordinator(control_log, stop=stop, on_poll=keep))
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shards.cli",
            "worker",
            "shard",
            "--bus",
            url,
            "--shard-id",
            str(i),
            *(["--token-file", token_file] if token_file else []),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        for i in range(n)
    ]
    try:
        await _wait_ready(holder, n, len(nodes) + len(gpu_nodes), coordinator)
        pids = [child.pid for child in children]
        await _settled(pids)
        result = await _measure(log, shape, batches, wide, holder[0], progress, n, pids)
        result["shape"]["bus"] = label
        if direct:
            result["shape"]["direct"] = True
            result["processes"]["router_and_coordinator"] = "parent (no pods routed)"
        return result
    finally:
        stop.set()
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.terminate()
        for child in children:
            await child.wait()
        await coordinator
        await control_bus.close()
        await bus.close()


def _dealt(batches: list[list[Any]], shards: int) -> list[tuple[int, list[Any]]]:
    """Each ingest batch of plain pods as one batch per shard, pods dealt out in turn,
    as records the shard keeps (``final``: never handed back to a coordinator that did
    not hand them out)."""
    dealt: list[tuple[int, list[Any]]] = []
    dealt_so_far = 0
    for batch in batches:
        per: list[list[Any]] = [[] for _ in range(shards)]
        for event in batch:
            if not isinstance(event, PodSubmitted):
                raise InputError("only plain pods can skip the coordinator", location="--direct")
            per[dealt_so_far % shards].append(PodRouted(pod=event.pod, final=True))
            dealt_so_far += 1
        dealt.extend((shard, part) for shard, part in enumerate(per) if part)
    return dealt


async def _wait_ready(
    holder: list[ControlWorker], shards: int, nodes: int, coordinator: asyncio.Task[Any]
) -> None:
    """Until every shard has summarised all its nodes."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if coordinator.done():
            coordinator.result()
        if holder:
            control = holder[0].control
            owned = [0] * shards
            for shard in control.routing.node_shard.values():
                owned[shard] += 1
            if sum(owned) == nodes and control.shard_nodes == owned:
                return
        await asyncio.sleep(0.05)
    raise TimeoutError("shards did not fold their nodes within 300 s")


async def _settled(pids: list[int], quiet: float = 0.02, limit: float = 60.0) -> None:
    """Until every process has loaded what it loads once: the compiled refresh
    (:func:`engine.plugins.kernels.warm_up`, about 0.7 s of CPU, several seconds on a busy
    machine), which a component loads the first time it is idle, so in the shards
    after they have folded their nodes, when the clock was about to start. Counted,
    it added about 0.5 s per shard process, 25-50 µs per pod at 20,000 pods, to the
    shards' CPU; the one-process run (:mod:`loadtest.driver`) loads it before its clock
    starts, and so do these runs now. This process's coordinator loads it here; a
    shard has loaded it when its CPU stops growing (less than ``quiet`` seconds over
    0.3 s), or after ``limit`` seconds whatever it does."""
    kernels.warm_up()
    deadline = time.monotonic() + limit
    before = [cpu_seconds(pid) for pid in pids]
    while time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        after = [cpu_seconds(pid) for pid in pids]
        if all(
            a is None or b is None or a - b <= quiet for a, b in zip(after, before, strict=True)
        ):
            return
        before = after


async def _measure(
    log: EventLog,
    shape: LoadShape,
    batches: list[tuple[int, list[Any]]],
    wide: list[list[Any]],
    control_worker: ControlWorker,
    progress: Progress | None,
    shards: int,
    pids: list[int],
) -> dict[str, Any]:
    submitted_at: dict[str, float] = {}
    decided_at: dict[str, float] = {}
    total = sum(1 for _, b in batches for e in b if isinstance(e, PodSubmitted | PodRouted))
    positions = [0] * shards
    bound = 0
    cpu_before: list[float | None] = [cpu_seconds(None), *(cpu_seconds(pid) for pid in pids)]
    cpu_after: list[float | None] = []

    def when_counted() -> None:  # all may be decided: the CPU before reading them back
        cpu_after[:] = [cpu_seconds(None), *(cpu_seconds(pid) for pid in pids)]

    collector = _Collector(log, positions, decided_at, total, progress, when_counted)
    started = collector.started = time.perf_counter()
    appended: list[int] = []  # pods appended, after each batch
    for partition, chunk in batches:
        if shape.window and len(appended) >= shape.window:
            # at most ``window`` batches undecided: wait for the oldest (a closed loop,
            # so latency is a batch's time through the system, not a queue's length)
            await collector.until(appended[-shape.window])
        now = time.perf_counter()
        for event in chunk:
            if isinstance(event, PodSubmitted | PodRouted):
                submitted_at[event.pod.key] = now
        producer = "ingest" if partition == shards else "loadtest"  # else skips the coordinator
        await log.append([_envelope(e, producer) for e in chunk], partition)
        pods = sum(1 for e in chunk if isinstance(e, PodSubmitted | PodRouted))
        appended.append((appended[-1] if appended else 0) + pods)
    bound = await collector.finish()
    wall = max(decided_at.values()) - started
    ms = np.array([(decided_at[k] - submitted_at[k]) * 1000 for k in decided_at])
    result: dict[str, Any] = {
        "shape": {**asdict(shape), "bus": "tcp (in-memory log server)", "pods": total},
        "pods_per_second": total / wall if wall > 0 else 0.0,
        "latency_ms": _percentiles(ms),
        "bound": bound,
        "wall_seconds": wall,
        "processes": {"shards": shards, "router_and_coordinator": "parent"},
        "handbacks": control_worker.control.counters["handbacks"],
        "routed_by_router": control_worker.control.counters["handed"],
    }
    if not cpu_after:
        when_counted()
    spent = [
        round(b - a, 3)
        for a, b in zip(cpu_before, cpu_after, strict=True)
        if a is not None and b is not None
    ]
    if len(spent) == len(cpu_before):
        # what each process burnt until every pod had its decision (the parent's
        # includes the harness: submitting pods and counting decisions, not reading
        # them back afterwards)
        result["cpu_seconds"] = {"parent": spent[0], "shards": spent[1:]}
        result["cpu_microseconds_per_pod"] = round(sum(spent) * 1e6 / max(total, 1), 1)
    if wide:
        await _one_gang_at_a_time(log, wide, positions, shards)
        commit = np.array(control_worker.commit_seconds) * 1000
        result["cross_shard_gangs"] = {
            "gangs": len(wide),
            "size": sum(1 for e in wide[0] if isinstance(e, PodSubmitted)),
            "committed": control_worker.control.counters["committed"],
            "aborted": control_worker.control.counters["aborted"],
            "commit_latency_ms": _percentiles(commit) if commit.size else None,
        }
    return result


LONG_POLL = 0.05
"""The longest the harness waits on a log that long-polls before it looks again."""


class _Decisions:
    """The decisions in one shard's partition as the harness sees them.

    While pods are being decided the harness only counts them (the log server counts on
    its side, so nothing is decoded in the parent, whose CPU the shards share) and notes
    when each count was seen; the records are read once the counts say every pod may
    have one, and each gets the time its count was first seen, as if it had been read
    then. A log that cannot count (Kafka, files) is read as it goes instead."""

    def __init__(self, log: EventLog, shard: int, offset: int) -> None:
        self.log = log
        self.shard = shard
        self.can_count = getattr(log, "count_kinds", None) is not None
        self.counted_to = offset
        self.read_to = offset
        self.count = 0
        self.read = 0
        self.seen: list[tuple[int, float]] = []
        """(decisions counted so far, when that count was first seen)."""
        self.kept: list[tuple[float, Envelope]] = []
        """Read as they were counted, not handed out yet (a log that cannot count)."""

    async def poll(self, now: float) -> int:
        """Count what is new; return how many."""
        if self.can_count:
            stop, count = await count_kinds(self.log, self.shard, self.counted_to, DECIDED)
        else:
            stop, records = await read_kinds(self.log, self.shard, self.counted_to, DECIDED)
            self.kept.extend((now, env) for env in records)
            count = len(records)
        self.counted_to = max(stop, self.counted_to)
        if count:
            self.count += count
            self.seen.append((self.count, now))
        return count

    async def new(self) -> list[tuple[float, Envelope]]:
        """The decisions counted and not handed out yet, each with when it was counted."""
        out, self.kept = self.kept, []
        self.read += len(out)
        if out:
            self.read_to = out[-1][1].offset + 1
        while self.read < self.count:
            _, records = await read_kinds(self.log, self.shard, self.read_to, DECIDED)
            records = records[: self.count - self.read]
            if not records:
                raise TimeoutError(f"shard {self.shard}'s counted decisions are not there")
            for env in records:
                # the first count that includes this record
                at = bisect.bisect_right(self.seen, self.read, key=lambda seen: seen[0])
                out.append((self.seen[at][1], env))
                self.read += 1
            self.read_to = records[-1].offset + 1
        return out


class _Collector:
    """Waits for decisions in every shard's partition and notes when each pod got its
    first (see :class:`_Decisions`)."""

    def __init__(
        self,
        log: EventLog,
        positions: list[int],
        decided_at: dict[str, float],
        total: int,
        progress: Progress | None,
        when_counted: Callable[[], None] | None = None,
    ) -> None:
        self.log = log
        self.shards = [_Decisions(log, shard, offset) for shard, offset in enumerate(positions)]
        self.positions = positions
        self.decided_at = decided_at
        self.total = total
        self.progress = progress
        self.when_counted = when_counted
        self.counted = 0
        self.checked = -1
        self.bound = 0
        self.started = time.perf_counter()
        self.last_progress = self.started

    async def _poll(self) -> int:
        now = time.perf_counter()
        moved = 0
        for shard in self.shards:
            moved += await shard.poll(now)
        self.counted += moved
        if self.progress is not None:
            done = len(self.decided_at) if self.checked >= 0 else min(self.counted, self.total)
            self.progress(done, self.total, time.perf_counter() - self.started)
        if moved:
            self.last_progress = time.perf_counter()
        elif time.perf_counter() - self.last_progress > 60:
            raise TimeoutError(f"{self.total - self.counted} pods got no decision for 60 s")
        return moved

    async def until(self, count: int) -> None:
        """Until ``count`` decisions were counted (a pod tried again may count twice:
        enough to pace submissions, not to time them)."""
        while self.counted < count:
            if not await self._poll():
                await self._idle(0.001)

    async def _idle(self, seconds: float) -> None:
        """Wait before looking again: ``seconds``, or, where the log long-polls
        (Kafka, the log server), until a shard's partition grows (at most ``LONG_POLL``
        seconds): there each look is a request the broker or server answers, whose cost
        falls on the parent (which serves the log), and so on the CPU the shards share,
        several hundred times a second."""
        offsets = {s.shard: s.counted_to for s in self.shards}
        await long_poll_or_sleep(self.log, offsets, LONG_POLL, seconds)

    async def finish(self) -> int:
        """Until every pod has a decision; return how many were bound. Calls
        ``when_counted`` once, when the counts first say every pod may have one."""
        decided_at = self.decided_at
        while len(decided_at) < self.total:
            moved = await self._poll()
            if self.counted >= self.total and self.counted != self.checked:
                if self.checked < 0 and self.when_counted is not None:
                    self.when_counted()
                self.checked = self.counted  # every pod may have its decision: look
                for shard in self.shards:
                    for at, env in await shard.new():
                        event = env.event
                        if isinstance(event, PodBound):
                            if event.pod not in decided_at:
                                self.bound += 1
                            decided_at.setdefault(event.pod, at)
                        elif isinstance(event, PodUnschedulable) and event.attempt > 0:
                            decided_at.setdefault(event.pod, at)
            if not moved and len(decided_at) < self.total:
                await self._idle(0.01)  # the harness must not take the shards' CPU
        for index, shard in enumerate(self.shards):
            self.positions[index] = shard.read_to
        return self.bound


async def _collect(
    log: EventLog,
    positions: list[int],
    decided_at: dict[str, float],
    total: int,
    started: float,
    progress: Progress | None,
) -> int:
    """Wait until ``total`` pods have a decision; return how many were bound."""
    collector = _Collector(log, positions, decided_at, total, progress)
    collector.started = started
    return await collector.finish()


async def _one_gang_at_a_time(
    log: EventLog, gangs: list[list[Any]], positions: list[int], shards: int
) -> None:
    """Each wide gang alone: submit it, wait until it is bound, delete it (so the next
    finds the room), so that commit latency is the protocol's, not a queue's."""
    for events in gangs:
        members = [e.pod.key for e in events if isinstance(e, PodSubmitted)]
        await log.append([_envelope(e) for e in events], shards)
        decided: dict[str, float] = {}
        await _collect(log, positions, decided, len(members), time.perf_counter(), None)
        await log.append([_envelope(PodDeleted(pod=key)) for key in members], shards)


def cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds (user and system) process ``pid`` has used so far (this process's
    if None); None where ``/proc`` cannot tell."""
    if pid is None:
        return time.process_time()
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _percentiles(ms: Any) -> dict[str, float]:
    return {
        "p50": float(np.percentile(ms, 50)),
        "p90": float(np.percentile(ms, 90)),
        "p99": float(np.percentile(ms, 99)),
        "max": float(ms.max()),
    }

"""Real component processes over a log server, for the tests that kill, cut or poison
them: the cluster (GPU nodes in one pool per shard), the workload (gangs and plain
pods), the processes (``shoal worker`` by role), and waiting on conditions."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from engine.model.pools import Sharding
from events.log import EventLog, read_past_unreadable
from events.types import (
    SECOND,
    Envelope,
    Event,
    GroupSpec,
    NodeAdded,
    NodeSpec,
    PodBound,
    PodGroupSubmitted,
    PodSpec,
    PodSubmitted,
    SchedulerConfigured,
    ShardingConfigured,
)

SHARDS = 2
NODES_PER_SHARD = 6
GPUS = 4


def nodes() -> list[NodeSpec]:
    return [
        NodeSpec(
            name=f"gpu-{i:02d}",
            allocatable={"cpu": 64000, "memory": 256 << 30, "pods": 110, "nvidia.com/gpu": GPUS},
            labels={"shoal.io/pool": f"pool-{i % SHARDS}"},
        )
        for i in range(NODES_PER_SHARD * SHARDS)
    ]


def gang(name: str, size: int) -> list[Event]:
    group = GroupSpec(namespace="train", name=name, min_member=size, timeout=120 * SECOND)
    members: list[Event] = [
        PodSubmitted(
            pod=PodSpec(
                namespace="train",
                name=f"{name}-{m:02d}",
                requests={"cpu": 1000, "nvidia.com/gpu": 1},
                group=group.key,
            )
        )
        for m in range(size)
    ]
    return [PodGroupSubmitted(group=group), *members]


def pods(prefix: str, count: int) -> list[Event]:
    return [
        PodSubmitted(
            pod=PodSpec(namespace="web", name=f"{prefix}-{i}", requests={"nvidia.com/gpu": 1})
        )
        for i in range(count)
    ]


class Fleet:
    """The component processes, started and killed by role."""

    def __init__(self, url: str, logs: Path | None = None) -> None:
        self.url = url
        self.logs = logs
        """Where each role's standard error goes (``ROLE.log``, appended), if given."""
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.kills: Counter[str] = Counter()

    def said(self, role: str) -> str:
        """What ``role`` has written to its standard error so far (with ``logs``)."""
        assert self.logs is not None
        path = self.logs / f"{role}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    async def start(self, role: str) -> None:
        args = ["worker", role.split("-", maxsplit=1)[0], "--bus", self.url]
        if role.startswith("shard-"):
            args += ["--shard-id", role.split("-")[1]]
        if role != "binder":
            # snapshots often, so that restarts restore them (and replay checks them)
            args += ["--snapshot-every", "40"]
        if self.logs is None:
            self.procs[role] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "shards.cli", *args, env={**os.environ}
            )
            return
        with open(self.logs / f"{role}.log", "ab") as err:
            self.procs[role] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "shards.cli", *args, env={**os.environ}, stderr=err
            )

    async def kill(self, role: str) -> None:
        proc = self.procs[role]
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()
        self.kills[role] += 1

    async def stop(self, *, keep: str = "") -> None:
        """Stop every role's process (``keep``: but that role's)."""
        procs = [proc for role, proc in self.procs.items() if role != keep]
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            await proc.wait()


Ingest = Callable[[list[Event]], Awaitable[None]]


async def set_up(log: EventLog, shards: int = SHARDS) -> Ingest:
    """Record the sharding (a reservation time-out of 3 s), the default configuration
    and the cluster in the control partition, as ingest does; return a function that
    appends more events there."""

    async def ingest(events: list[Event]) -> None:
        now = time.time_ns()
        await log.append([Envelope(event=e, time=now, producer="ingest") for e in events], shards)

    sharding = Sharding(shards=shards, reservation_timeout=3 * SECOND)
    await ingest(
        [
            ShardingConfigured(config=sharding.to_json()),
            SchedulerConfigured(),
            *(NodeAdded(node=n) for n in nodes()),
        ]
    )
    return ingest


async def bound(log: EventLog, shards: int = SHARDS) -> int:
    """How many pods the shards have bound (reading past records that do not decode)."""
    keys: set[str] = set()
    for shard in range(shards):
        records, _, _ = await read_past_unreadable(log, shard, 0)
        keys |= {e.event.pod for e in records if isinstance(e.event, PodBound)}
    return len(keys)


async def until(check: Callable[[], Awaitable[bool]], what: str, limit: float = 240.0) -> None:
    """Wait until ``check`` holds (polled), failing with ``what`` after ``limit`` s."""
    deadline = time.monotonic() + limit
    while not await check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.2)


async def bound_at_least(log: EventLog, n: int) -> None:
    """Wait until the shards have bound ``n`` pods."""

    async def enough() -> bool:
        return await bound(log) >= n

    await until(enough, f"{n} pods bound")

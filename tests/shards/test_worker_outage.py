"""A worker rides out a bus outage: it backs off and starts again from the log.

Real processes (``shoal worker`` for two shards, the coordinator and the binder) reach
the log server through a TCP relay that the test cuts: every connection is closed and
new ones are refused for a while, then let through again. Every worker must still be
running afterwards, say in its log that it started again, and decide the work that
arrives after the outage, gangs across both shards included; the log must replay
exactly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Self

import pytest

from engine.model.pools import Sharding
from events.errors import LogError
from events.log import EventLog
from events.remote import LogServer, RemoteLog
from events.types import (
    SECOND,
    Envelope,
    Event,
    GroupSpec,
    NodeAdded,
    PodBound,
    PodSpec,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
    SchedulerConfigured,
    ShardingConfigured,
)
from shards.processes import run_backing_off
from shards.replay import replay_routed
from tests.shards.test_kill import SHARDS, Fleet, _gang, _nodes, _pods

_STARTED_AGAIN = "bus failed; starting again"


class Relay:
    """A TCP relay on 127.0.0.1 to ``target`` that can be cut and restored."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.open = True
        self.cuts = 0
        self._pipes: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"tcp://{host}:{port}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def cut(self) -> None:
        """Close every connection and refuse new ones until :meth:`restore`."""
        self.open = False
        self.cuts += 1
        for writer in list(self._pipes):
            writer.close()
        self._pipes.clear()

    def restore(self) -> None:
        self.open = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._pipes.update((writer, up_writer))
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(1 << 16):
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sink.close()
            self._pipes.discard(sink)


async def _until(check: Callable[[], Awaitable[bool]], what: str, limit: float = 240.0) -> None:
    deadline = time.monotonic() + limit
    while not await check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.2)


async def test_workers_back_off_and_start_again_after_the_bus_fails(tmp_path: Path) -> None:
    sharding = Sharding(shards=SHARDS, reservation_timeout=3 * SECOND)
    async with LogServer(SHARDS + 1) as server:
        log = await RemoteLog.connect(server.url)

        async def ingest(events: list[Event]) -> None:
            now = time.time_ns()
            await log.append(
                [Envelope(event=e, time=now, producer="ingest") for e in events], SHARDS
            )

        async def bound() -> int:
            pods: set[str] = set()
            for shard in range(SHARDS):
                for env in await log.read(shard, 0):
                    if isinstance(env.event, PodBound):
                        pods.add(env.event.pod)
            return len(pods)

        await ingest(
            [
                ShardingConfigured(config=sharding.to_json()),
                SchedulerConfigured(),
                *(NodeAdded(node=n) for n in _nodes()),
            ]
        )
        async with Relay(server.host, server.port) as relay:
            fleet = Fleet(relay.url, tmp_path)
            roles = ["coordinator", "binder", *(f"shard-{i}" for i in range(SHARDS))]
            try:
                for role in roles:
                    await fleet.start(role)
                await ingest(_pods("before", 4))
                await _until(lambda: _at_least(bound, 4), "the pods before the outage bound")
                relay.cut()

                async def all_failed() -> bool:
                    return all(_STARTED_AGAIN in fleet.said(role) for role in roles)

                # down until every worker has seen the bus fail, then up again
                await _until(all_failed, "every worker saw the bus fail")
                relay.restore()
                # work that arrives after the outage: a gang no one shard can hold
                await ingest(_gang("wide", 30) + _pods("after", 4))
                await _until(lambda: _at_least(bound, 38), "the work after the outage bound")
                assert all(p.returncode is None for p in fleet.procs.values()), {
                    r: p.returncode for r, p in fleet.procs.items()
                }
            finally:
                await fleet.stop()
        parts = [await log.read(p, 0) for p in range(SHARDS + 1)]
        await log.close()
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, str(verified.mismatch)


async def _at_least(count: Callable[[], Awaitable[int]], n: int) -> bool:
    return await count() >= n


async def test_a_worker_gives_up_after_failures_in_a_row() -> None:
    """The retries are bounded: a bus that never opens ends in the last error."""
    tries = 0

    async def unreachable() -> EventLog:
        nonlocal tries
        tries += 1
        raise LogError(f"cannot reach the log server (try {tries})")

    async def never_run(_: EventLog) -> None:
        raise AssertionError("the component ran without a bus")

    with pytest.raises(LogError, match=r"failed 4 times in a row: .*\(try 4\)"):
        await run_backing_off("shard", unreachable, never_run, asyncio.Event(), give_up_after=4)
    assert tries == 4


async def test_a_stop_during_the_back_off_ends_the_worker_at_once() -> None:
    stop = asyncio.Event()

    async def unreachable() -> EventLog:
        stop.set()
        raise LogError("cannot reach the log server")

    async def never_run(_: EventLog) -> None:
        raise AssertionError("the component ran without a bus")

    await run_backing_off("binder", unreachable, never_run, stop, first=3600.0)


async def test_a_held_reservation_expires_while_its_shard_restarts(tmp_path: Path) -> None:
    """A shard holds a part of a cross-shard gang and no commit comes (the coordinator
    is gone). The shard is killed and started again while it holds it: the part still
    expires, not before its time-out, and the shard releases it and its pods."""
    async with LogServer(2) as server:
        log = await RemoteLog.connect(server.url)
        nodes = _nodes()[:2]
        group = GroupSpec(namespace="train", name="wide", min_member=2, timeout=120 * SECOND)
        pods = tuple(
            PodSpec(
                namespace="train",
                name=f"wide-{i}",
                requests={"cpu": 1000, "nvidia.com/gpu": 1},
                group=group.key,
            )
            for i in range(2)
        )
        now = time.time_ns()
        expires_at = now + 4 * SECOND
        await log.append(
            [
                Envelope(event=SchedulerConfigured(), time=now, producer="router"),
                *(Envelope(event=NodeAdded(node=n), time=now, producer="router") for n in nodes),
                Envelope(
                    event=ReservationRequested(
                        rid="wide/1", group=group, pods=pods, expires_at=expires_at
                    ),
                    time=now,
                    producer="router",
                ),
            ],
            0,
        )

        async def records(kind: type) -> list[Envelope]:
            return [e for e in await log.read(0, 0) if isinstance(e.event, kind)]

        async def granted() -> bool:
            return bool(await records(ReservationGranted))

        async def released() -> bool:
            return bool(await records(ReservationReleased))

        fleet = Fleet(server.url, tmp_path)
        try:
            await fleet.start("shard-0")
            await _until(granted, "the shard held the part")
            for _ in range(3):  # killed and started again while it holds it
                await fleet.kill("shard-0")
                await fleet.start("shard-0")
            await _until(released, "the held part expired")
        finally:
            await fleet.stop()
        (release,) = await records(ReservationReleased)
        await log.close()
    assert release.event.rid == "wide/1" and "expired" in release.event.reason
    assert release.time >= expires_at

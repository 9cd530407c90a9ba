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
from pathlib import Path
from typing import Self

import pytest

from events.errors import LogError, RecordTooLargeError
from events.log import EventLog
from events.remote import LogServer, RemoteLog, ServerLimits
from events.types import (
    SECOND,
    Envelope,
    GroupSpec,
    NodeAdded,
    NodeSpec,
    PodSpec,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
    SchedulerConfigured,
)
from shards.processes import run_backing_off
from shards.replay import replay_routed
from tests.shards.fleet import SHARDS, Fleet, bound_at_least, gang, nodes, pods, set_up, until

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


async def test_workers_back_off_and_start_again_after_the_bus_fails(tmp_path: Path) -> None:
    async with LogServer(SHARDS + 1) as server:
        log = await RemoteLog.connect(server.url)
        ingest = await set_up(log)
        async with Relay(server.host, server.port) as relay:
            fleet = Fleet(relay.url, tmp_path)
            roles = ["coordinator", "binder", *(f"shard-{i}" for i in range(SHARDS))]
            try:
                for role in roles:
                    await fleet.start(role)
                await ingest(pods("before", 4))
                await bound_at_least(log, 4)  # before the outage
                relay.cut()

                async def all_failed() -> bool:
                    return all(_STARTED_AGAIN in fleet.said(role) for role in roles)

                # down until every worker has seen the bus fail, then up again
                await until(all_failed, "every worker saw the bus fail")
                relay.restore()
                # work that arrives after the outage: a gang no one shard can hold
                await ingest(gang("wide", 30) + pods("after", 4))
                await bound_at_least(log, 38)  # after it
                assert all(p.returncode is None for p in fleet.procs.values()), {
                    r: p.returncode for r, p in fleet.procs.items()
                }
            finally:
                await fleet.stop()
        parts = [await log.read(p, 0) for p in range(SHARDS + 1)]
        await log.close()
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, str(verified.mismatch)


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


async def test_a_record_the_bus_can_never_take_stops_the_worker_at_once() -> None:
    """A record over the log server's frame limit would be refused at every try: the
    worker stops at the first, naming the limit and the flag that raises it, instead of
    starting again from the log and sending it again for ever."""
    limits = ServerLimits(max_frame=64 << 10, max_buffered=1 << 20)
    runs = 0
    async with LogServer(1, limits=limits) as server:

        async def open_() -> EventLog:
            return await RemoteLog.connect(server.url)

        async def run(bus: EventLog) -> None:
            nonlocal runs
            runs += 1
            huge = NodeAdded(node=NodeSpec(name="n", allocatable={}, labels={"big": "x" * 70_000}))
            await bus.append([Envelope(event=huge)])

        with pytest.raises(RecordTooLargeError, match="log-server --max-frame-mib"):
            await run_backing_off("coordinator", open_, run, asyncio.Event(), first=0.01)
    assert runs == 1


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
        cluster = nodes()[:2]
        group = GroupSpec(namespace="train", name="wide", min_member=2, timeout=120 * SECOND)
        members = tuple(
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
                *(Envelope(event=NodeAdded(node=n), time=now, producer="router") for n in cluster),
                Envelope(
                    event=ReservationRequested(
                        rid="wide/1", group=group, pods=members, expires_at=expires_at
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
            await until(granted, "the shard held the part")
            for _ in range(3):  # killed and started again while it holds it
                await fleet.kill("shard-0")
                await fleet.start("shard-0")
            await until(released, "the held part expired")
        finally:
            await fleet.stop()
        (release,) = await records(ReservationReleased)
        await log.close()
    assert release.event.rid == "wide/1" and "expired" in release.event.reason
    assert release.time >= expires_at

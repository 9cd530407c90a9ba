"""The EventLog contract, run against every backend."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from events.filelog import FileLog
from events.kafka import KafkaLog, KafkaSettings, create_topic
from events.log import EventLog, count_kinds, long_poll_or_sleep, read_kinds
from events.memory import MemoryLog
from events.remote import LogServer, RemoteLog
from events.types import ClockTicked, Envelope, NodeRemoved, PodDeleted

Factory = Callable[[int], Awaitable[EventLog]]


@pytest.fixture(params=["memory", "file", "kafka", "remote"])
async def make_log(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[int], Awaitable[EventLog]]]:
    opened: list[EventLog] = []
    servers: list[LogServer] = []

    async def factory(partitions: int = 1) -> EventLog:
        if request.param == "memory":
            log: EventLog = MemoryLog(partitions)
        elif request.param == "remote":
            server = await LogServer(partitions).start()
            servers.append(server)
            log = await RemoteLog.connect(server.url)
        elif request.param == "file":
            log = FileLog(tmp_path / f"log-{len(opened)}.events", partitions=partitions)
        else:
            bootstrap = request.getfixturevalue("kafka_bootstrap")
            settings = KafkaSettings(
                bootstrap=bootstrap,
                topic=f"contract-{uuid.uuid4().hex[:12]}",
                partitions=partitions,
            )
            await create_topic(settings)
            kafka = KafkaLog(settings)
            await kafka.start()
            log = kafka
        opened.append(log)
        return log

    yield factory
    for log in opened:
        await log.close()
    for server in servers:
        await server.close()


def records(n: int, start: int = 0) -> list[Envelope]:
    return [
        Envelope(event=PodDeleted(pod=f"ns/p{i}"), time=i, producer="test", event_id=f"e{i}")
        for i in range(start, start + n)
    ]


async def test_empty_log_reads_nothing(make_log: Factory) -> None:
    log = await make_log(1)
    assert await log.end_offset(0) == 0
    assert await log.read(0, 0) == []


async def test_offsets_start_at_zero_and_have_no_gaps(make_log: Factory) -> None:
    log = await make_log(1)
    assert await log.append(records(3)) == [0, 1, 2]
    assert await log.append(records(2, 3)) == [3, 4]
    got = await log.read(0, 0)
    assert [e.offset for e in got] == [0, 1, 2, 3, 4]
    assert await log.end_offset(0) == 5


async def test_records_read_back_equal_with_offset_and_partition_set(make_log: Factory) -> None:
    log = await make_log(2)
    sent = records(4)
    await log.append(sent, partition=1)
    got = await log.read(1, 0)
    for i, (a, b) in enumerate(zip(sent, got, strict=True)):
        assert b.event == a.event and b.time == a.time and b.event_id == a.event_id
        assert b.offset == i and b.partition == 1


async def test_read_from_offset_with_limit(make_log: Factory) -> None:
    log = await make_log(1)
    await log.append(records(10))
    got = await log.read(0, 4, limit=3)
    assert [e.offset for e in got] == [4, 5, 6]
    assert await log.read(0, 8, limit=100) == (await log.read(0, 0))[8:]
    assert await log.read(0, 10) == []
    assert await log.read(0, 99) == []


async def test_partitions_are_independent(make_log: Factory) -> None:
    log = await make_log(3)
    assert log.partitions == 3
    await log.append(records(2), partition=0)
    await log.append(records(5), partition=2)
    assert await log.end_offset(0) == 2
    assert await log.end_offset(1) == 0
    assert await log.end_offset(2) == 5
    assert [e.event for e in await log.read(2, 0)] == [e.event for e in records(5)]


async def test_bad_partition_is_a_value_error(make_log: Factory) -> None:
    log = await make_log(2)
    with pytest.raises(ValueError, match="out of range"):
        await log.append(records(1), partition=2)
    with pytest.raises(ValueError):
        await log.read(-1, 0)
    with pytest.raises(ValueError):
        await log.end_offset(5)


async def test_caller_offsets_are_replaced(make_log: Factory) -> None:
    log = await make_log(1)
    await log.append([Envelope(event=NodeRemoved(name="n"), offset=77, partition=9)])
    (got,) = await log.read(0, 0)
    assert (got.offset, got.partition) == (0, 0)


async def test_every_event_kind_round_trips(make_log: Factory) -> None:
    from tests.events.test_codec import one_of_each

    log = await make_log(1)
    sent = [Envelope(event=e, time=7, causation=3, producer="p") for e in one_of_each()]
    await log.append(sent)
    got = await log.read(0, 0)
    assert [g.event for g in got] == [s.event for s in sent]


async def test_empty_append_appends_nothing(make_log: Factory) -> None:
    log = await make_log(1)
    assert await log.append([]) == []
    assert await log.end_offset(0) == 0
    await log.append([Envelope(event=ClockTicked())])
    assert await log.end_offset(0) == 1


async def test_close_twice_is_safe(make_log: Factory) -> None:
    log = await make_log(1)
    await log.close()
    await log.close()


async def _of_three_kinds(make_log: Factory) -> EventLog:
    """A log whose partition holds pod-, node-, pod- and a clock tick, in that order."""
    log = await make_log(1)
    await log.append(
        [
            Envelope(event=PodDeleted(pod="ns/a")),
            Envelope(event=NodeRemoved(name="n")),
            Envelope(event=PodDeleted(pod="ns/b")),
            Envelope(event=ClockTicked()),
        ]
    )
    return log


async def test_read_kinds_keeps_the_kinds_asked_for_and_says_where_it_stopped(
    make_log: Factory,
) -> None:
    log = await _of_three_kinds(make_log)
    stop, kept = await read_kinds(log, 0, 1, ["pod-"])
    assert stop == 4 and [(e.offset, e.event) for e in kept] == [(2, PodDeleted(pod="ns/b"))]
    assert await read_kinds(log, 0, 4, ["pod-"]) == (4, [])


async def test_count_kinds_counts_what_read_kinds_would_keep(make_log: Factory) -> None:
    log = await _of_three_kinds(make_log)
    assert await count_kinds(log, 0, 0, ["pod-"]) == (4, 2)
    assert await count_kinds(log, 0, 1, ["pod-", "node-"]) == (4, 2)
    assert await count_kinds(log, 0, 3, ["pod-"]) == (4, 0)
    assert await count_kinds(log, 0, 4, ["pod-"]) == (4, 0)
    assert await count_kinds(log, 0, 0, []) == (4, 0)


async def test_a_long_poll_returns_once_one_of_its_partitions_grows(make_log: Factory) -> None:
    """Where the log long-polls (Kafka) the wait ends when a record comes; elsewhere it
    is a short sleep. Either way it is back long before its ``seconds``."""
    log = await make_log(2)
    await log.append(records(1), 1)
    waiting = asyncio.ensure_future(long_poll_or_sleep(log, {0: 0, 1: 1}, 600.0, 0.01))
    await log.append(records(1), 0)
    await asyncio.wait_for(waiting, 60)
    await long_poll_or_sleep(log, {0: 1, 1: 1}, 0.01, 0.01)  # nothing comes: back in time

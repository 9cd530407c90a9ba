"""Fencing a deposed leader: every backend refuses a record of an older term (memory,
file, log server; Kafka by a transactional producer per term), and readers drop one a
log holds all the same (Kafka with transactions off, or a log written before); replay
sees the same."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from events.codec import decode
from events.fence import FencedError, FencedLog, ReadFence, highest_epoch
from events.filelog import FileLog
from events.kafka import KafkaLog, KafkaSettings, create_topic
from events.log import EventLog, read_kinds
from events.memory import MemoryLog
from events.remote import LogServer, RemoteLog
from events.types import ClockTicked, Envelope, PodDeleted, RecordFenced, TermBegan

Factory = Callable[[int], Awaitable[EventLog]]


@pytest.fixture(params=["memory", "file", "remote"])
async def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Factory]:
    opened: list[EventLog] = []
    servers: list[LogServer] = []

    async def factory(partitions: int = 1) -> EventLog:
        if request.param == "memory":
            log: EventLog = MemoryLog(partitions)
        elif request.param == "remote":
            server = await LogServer(partitions).start()
            servers.append(server)
            log = await RemoteLog.connect(server.url)
        else:
            log = FileLog(tmp_path / f"{uuid.uuid4().hex}.events", partitions=partitions)
        opened.append(log)
        return log

    yield factory
    for log in opened:
        await log.close()
    for server in servers:
        await server.close()


def rec(i: int, fence: str = "", epoch: int = 0) -> Envelope:
    return Envelope(event=PodDeleted(pod=f"ns/p{i}"), time=i, fence=fence, epoch=epoch)


async def test_an_append_of_an_older_term_is_refused_whole_where_a_newer_one_began(
    make_log: Factory,
) -> None:
    log = await make_log(2)
    old = FencedLog(log, fence="shoal-coordinator", epoch=3)
    new = FencedLog(log, fence="shoal-coordinator", epoch=4)
    await old.append([rec(0)], 0)
    await new.begin([0, 1], holder="b", now=1)
    with pytest.raises(FencedError) as refused:
        await old.append([rec(1), rec(2)], 0)
    assert (refused.value.epoch, refused.value.highest) == (3, 4)
    with pytest.raises(FencedError):
        await old.append([rec(1)], 1)
    assert [await log.end_offset(p) for p in (0, 1)] == [2, 1]
    await new.append([rec(3)], 0)
    await log.append([rec(4)], 0)  # writers that lead nothing are never fenced
    await FencedLog(log, fence="shoal-binder", epoch=1).append([rec(5)], 0)  # another fence
    records = await log.read(0, 0)
    assert [(e.fence, e.epoch) for e in records] == [
        ("shoal-coordinator", 3),
        ("shoal-coordinator", 4),
        ("shoal-coordinator", 4),
        ("", 0),
        ("shoal-binder", 1),
    ]
    (marker,) = await log.read(1, 0)
    assert marker.event == TermBegan(fence="shoal-coordinator", epoch=4, holder="b")
    assert await highest_epoch(log, "shoal-coordinator") == 4
    assert await highest_epoch(log, "shoal-ingest") == 0


async def test_a_reopened_file_log_remembers_the_terms_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "log.events"
    log = FileLog(path, partitions=2)
    await FencedLog(log, fence="f", epoch=5).append([rec(0)], 1)
    await log.close()
    again = FileLog(path)
    try:
        assert await highest_epoch(again, "f") == 5
        with pytest.raises(FencedError):
            await FencedLog(again, fence="f", epoch=4).append([rec(1)], 1)
        await FencedLog(again, fence="f", epoch=4).append([rec(1)], 0)  # not fenced there
    finally:
        await again.close()


async def test_a_term_past_its_deadline_appends_nothing() -> None:
    log = MemoryLog()
    valid = [True]
    term = FencedLog(log, fence="f", epoch=1, valid=lambda: valid[0])
    await term.append([rec(0)])
    valid[0] = False  # the elector's renew deadline passed (a frozen process resumed)
    with pytest.raises(FencedError, match="renew deadline"):
        await term.append([rec(1)])
    assert await log.end_offset(0) == 1


# appends of (partition, epoch) by writers of one fence, in any order
APPENDS = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4)), max_size=12)


@settings(max_examples=25, deadline=None)
@given(appends=APPENDS)
async def test_a_log_stores_exactly_what_its_readers_would_keep(
    appends: list[tuple[int, int]],
) -> None:
    """The append-side rule is the read-side rule applied early: the log stores an
    append iff a reader of its partition would keep it, so a reader drops nothing of
    what it stored (and a log that stores everything, Kafka, reads the same)."""
    log, everything = MemoryLog(2), [ReadFence(), ReadFence()]
    for i, (partition, epoch) in enumerate(appends):
        env = rec(i, "f", epoch)
        kept = everything[partition].admit(env) is env
        try:
            await log.append([env], partition)
            assert kept
        except FencedError:
            assert not kept
    for partition in range(2):
        reader = ReadFence()
        for env in await log.read(partition, 0):
            assert reader.admit(env) is env


def test_the_read_side_drops_a_record_of_an_older_term_in_its_place() -> None:
    reader = ReadFence()
    seen = [
        reader.admit(e)
        for e in (rec(0, "f", 2), rec(1), rec(2, "f", 3), rec(3, "f", 2), rec(4, "g", 1))
    ]
    assert [type(e.event).__name__ for e in seen] == [
        "PodDeleted",
        "PodDeleted",
        "PodDeleted",
        "RecordFenced",
        "PodDeleted",
    ]
    assert seen[3].event == RecordFenced(kind="PodDeleted", highest=3)
    assert (seen[3].offset, seen[3].time) == (rec(3).offset, 0)


def _kafka(bootstrap: str, **options: bool) -> KafkaSettings:
    return KafkaSettings(
        bootstrap=bootstrap, topic=f"fence-{uuid.uuid4().hex[:12]}", partitions=1, **options
    )


@contextlib.asynccontextmanager
async def _kafka_logs(settings_: KafkaSettings, count: int) -> AsyncIterator[list[KafkaLog]]:
    """``count`` logs on one topic, as so many processes would open it."""
    logs = [KafkaLog(settings_) for _ in range(count)]
    try:
        for log in logs:
            await log.start()
        yield logs
    finally:
        for log in logs:
            await log.close()


async def _everything_stored(settings_: KafkaSettings) -> list[Envelope]:
    """Every record partition 0 holds, committed or not (``read_uncommitted``)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings_.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(settings_.topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[Envelope] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            out += [decode(r.value) for r in batch.get(tp, []) if r.value is not None]
        return out
    finally:
        await consumer.stop()


async def test_kafka_refuses_a_deposed_writers_append_and_stores_nothing_of_it(
    kafka_bootstrap: str,
) -> None:
    """Two processes lead one role in turn: once the second's term began, the broker
    refuses the first's appends (its producer is fenced), nothing of them is stored, not
    even uncommitted, and the second's records all land. A producer the deposed process
    starts again (after a broker outage) is refused too, and the leader, whose producer
    that start fenced, goes on."""
    settings_ = _kafka(kafka_bootstrap)
    await create_topic(settings_)
    async with _kafka_logs(settings_, 3) as (first, second, reader):
        old = FencedLog(first, fence="c", epoch=1)
        await old.append([rec(0)])
        new = FencedLog(second, fence="c", epoch=2)
        await new.begin([0], holder="b", now=1)
        with pytest.raises(FencedError) as refused:
            await old.append([rec(1), rec(2)])
        assert (refused.value.epoch, refused.value.highest) == (1, 2)
        await new.append([rec(3)])
        await first.append([rec(4)])  # writers that lead nothing are never fenced
        await first.close()  # as after a broker outage: its clients start again
        await first.start()
        with pytest.raises(FencedError):
            await old.append([rec(5)])
        await new.append([rec(6), rec(7)])
        want = [
            ("PodDeleted", 1),
            ("TermBegan", 2),
            ("PodDeleted", 2),
            ("PodDeleted", 0),
            ("PodDeleted", 2),
            ("PodDeleted", 2),
        ]
        records = await reader.read(0, 0)
        assert [(type(e.event).__name__, e.epoch) for e in records] == want
        assert [(type(e.event).__name__, e.epoch) for e in await replayed(settings_)] == want
        stored = await _everything_stored(settings_)
        assert [e.time for e in stored] == [0, 1, 3, 4, 6, 7]  # nothing of 1, 2 or 5
        assert await highest_epoch(reader, "c") == 2


async def replayed(settings_: KafkaSettings) -> list[Envelope]:
    """What a reader that starts afresh (``shoal replay``) reads."""
    async with _kafka_logs(settings_, 1) as (fresh,):
        return await fresh.read(0, 0)


async def test_kafka_readers_drop_a_deposed_writers_late_records(kafka_bootstrap: str) -> None:
    """With transactions off (a broker without them), or in a log written before shoal
    fenced Kafka producers, the broker stores a deposed leader's late record: every
    reader drops it in the same place."""
    settings_ = _kafka(kafka_bootstrap, transactions=False)
    await create_topic(settings_)
    writer, reader = KafkaLog(settings_), KafkaLog(settings_)
    await writer.start()
    await reader.start()
    try:
        old = FencedLog(writer, fence="c", epoch=1)
        await old.append([rec(0)])
        await FencedLog(writer, fence="c", epoch=2).begin([0], holder="b", now=1)
        await old.append([rec(1)])  # the broker takes it: readers must drop it
        await writer.append([Envelope(event=ClockTicked(), time=2)])
        # a reader that starts past it judges it the same as one that reads it all
        tail = await reader.read(0, 2)
        assert isinstance(tail[0].event, RecordFenced) and tail[0].offset == 2
        whole = await reader.read(0, 0)
        assert [type(e.event).__name__ for e in whole] == [
            "PodDeleted",
            "TermBegan",
            "RecordFenced",
            "ClockTicked",
        ]
        fresh = KafkaLog(settings_)
        await fresh.start()
        try:
            assert await fresh.read(0, 0) == whole
            _, kept = await read_kinds(fresh, 0, 0, ["pod-"])
            assert [e.offset for e in kept] == [0]
            assert await highest_epoch(fresh, "c") == 2
        finally:
            await fresh.close()
    finally:
        await writer.close()
        await reader.close()


async def test_a_log_server_call_cancelled_mid_exchange_leaves_the_next_call_its_own_answer() -> (
    None
):
    """A deposed leader's work is cancelled at once, maybe mid-request: the shared
    client must not hand that request's answer to the next caller."""
    async with LogServer(1) as server:
        client = await RemoteLog.connect(server.url)
        try:
            waiting = asyncio.create_task(client.fetch(0, 0, wait=30))  # a long poll
            for _ in range(50):  # until it is sent and waits for its answer
                await asyncio.sleep(0)
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            assert await client.append([rec(0)]) == [0]
            assert await client.end_offset(0) == 1
        finally:
            await client.close()

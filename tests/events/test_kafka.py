"""Kafka backend specifics (the shared contract runs in test_log_contract.py)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from events.codec import encode
from events.errors import InputError, LogCorruptedError, LogError, RecordTooLargeError
from events.fence import FencedError, FencedLog
from events.kafka import KafkaLog, KafkaSettings, create_topic
from events.types import Envelope, PodDeleted, PodSucceeded


def _settings(bootstrap: str, name: str, **options: Any) -> KafkaSettings:
    """Settings for a topic of the test's own (``name`` and a random suffix)."""
    return KafkaSettings(bootstrap=bootstrap, topic=f"{name}-{uuid.uuid4().hex[:8]}", **options)


@contextlib.asynccontextmanager
async def _logs(settings: KafkaSettings, count: int = 1) -> AsyncIterator[tuple[KafkaLog, ...]]:
    """``settings``' topic created and ``count`` logs on it started, for a block that
    gets them as a tuple; closed after it, the last first."""
    await create_topic(settings)
    async with contextlib.AsyncExitStack() as stack:
        logs: list[KafkaLog] = []
        for _ in range(count):
            log = KafkaLog(settings)
            await log.start()
            stack.push_async_callback(log.close)
            logs.append(log)
        yield tuple(logs)


def test_settings_from_url_and_environment() -> None:
    s = KafkaSettings.from_url(
        "kafka://a:9092,b:9092?topic=t&partitions=3&idempotence=true&fetch_max_wait_ms=5",
        env={"SHOAL_KAFKA_CLIENT_ID": "x", "SHOAL_KAFKA_TOPIC": "overridden"},
    )
    assert (s.bootstrap, s.topic, s.partitions, s.idempotence, s.client_id) == (
        "a:9092,b:9092",
        "t",
        3,
        True,
        "x",
    )
    assert s.fetch_max_wait_ms == 5
    assert s.client_options()["bootstrap_servers"] == ["a:9092", "b:9092"]


def test_producers_are_idempotent_unless_told_otherwise() -> None:
    assert KafkaSettings.from_url("kafka://h:1", env={}).idempotence
    s = KafkaSettings.from_url("kafka://h:1?acks=1&idempotence=false", env={})
    assert (s.acks, s.idempotence) == ("1", False)


def test_leader_terms_are_transactional_where_producers_are_idempotent() -> None:
    def transactional(query: str) -> bool:
        return KafkaSettings.from_url(f"kafka://h:1?{query}", env={}).transactional

    assert transactional("")
    assert not transactional("transactions=false")
    assert not transactional("idempotence=false")  # a broker that cannot: none
    from_env = KafkaSettings.from_url("kafka://h:1", env={"SHOAL_KAFKA_TRANSACTIONS": "false"})
    assert from_env.transactions is False


def test_sasl_settings_pass_through(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("secret\n")
    s = KafkaSettings.from_url(
        "kafka://h:9093?security_protocol=SASL_PLAINTEXT&sasl_mechanism=SCRAM-SHA-512&sasl_username=u",
        env={"SHOAL_KAFKA_SASL_PASSWORD_FILE": str(password)},
    )
    options = s.client_options()
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "u" and options["sasl_plain_password"] == "secret"
    assert "secret" not in repr(s)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("kafka://", "expected kafka://HOST:PORT"),
        ("http://h:1", "expected kafka://HOST:PORT"),
        ("kafka://h:1?colour=blue", "unknown Kafka setting 'colour'"),
        ("kafka://h:1?partitions=many", "bad value 'many' for partitions"),
        ("kafka://h:1?partitions=0", "at least 1"),
        ("kafka://h:1?idempotence=perhaps", "bad value"),
        ("kafka://h:1?security_protocol=CARRIER", "security_protocol must be"),
        ("kafka://h:1?security_protocol=SASL_SSL&sasl_mechanism=GSSAPI", "sasl_mechanism must be"),
        ("kafka://h:1?security_protocol=SASL_SSL&sasl_mechanism=PLAIN", "needs sasl_username"),
        ("kafka://h:1?sasl_password=x", "read only from a file"),
        ("kafka://h:1?acks=2", "acks must be"),
        ("kafka://h:1?acks=1", "acks=1 needs idempotence=false"),
        ("kafka://h:1?idempotence=false&transactions=true", "transactions=true needs idemp"),
        ("kafka://h:1?transactions=maybe", "bad value 'maybe' for transactions"),
    ],
)
def test_bad_settings(url: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        KafkaSettings.from_url(url, env={})


def test_tls_needs_readable_files() -> None:
    s = KafkaSettings.from_url(
        "kafka://h:1?security_protocol=SSL&ssl_cafile=/nonexistent/ca.pem", env={}
    )
    with pytest.raises(InputError, match=r"ssl_cafile /nonexistent/ca\.pem"):
        s.client_options()


async def test_unstarted_log_is_an_error() -> None:
    with pytest.raises(LogError, match="not started"):
        await KafkaLog(KafkaSettings(bootstrap="127.0.0.1:1")).append(
            [Envelope(event=PodDeleted(pod="a/b"))]
        )


async def test_unreachable_broker_is_a_log_error() -> None:
    log = KafkaLog(KafkaSettings(bootstrap="127.0.0.1:1", request_timeout_ms=1000))
    with pytest.raises(LogError, match=r"127\.0\.0\.1:1"):
        await log.start()


async def test_missing_topic_is_named(kafka_bootstrap: str) -> None:
    log = KafkaLog(_settings(kafka_bootstrap, "absent"))
    with pytest.raises(LogError, match="shoal kafka init"):
        await log.start()


async def test_garbage_record_is_corruption_naming_its_offset(kafka_bootstrap: str) -> None:
    settings = _settings(kafka_bootstrap, "garbage")
    assert await create_topic(settings)
    assert not await create_topic(settings), "a second init finds the topic"
    log = KafkaLog(settings)
    await log.start()
    try:
        await log.append([Envelope(event=PodDeleted(pod="a/b"))])
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        await producer.send_and_wait(settings.topic, b"\xc1 not msgpack", partition=0)
        await producer.stop()
        with pytest.raises(LogCorruptedError, match="offset 1") as info:
            await log.read(0, 0)
        assert info.value.offset == 1
        assert len(await log.read(0, 0, limit=1)) == 1, "records before it still read"
    finally:
        await log.close()


async def test_large_appends_split_into_batches(kafka_bootstrap: str) -> None:
    settings = _settings(kafka_bootstrap, "big", max_batch_bytes=20_000)
    async with _logs(settings) as (log,):
        sent = [Envelope(event=PodDeleted(pod=f"ns/{'x' * 200}-{i}")) for i in range(500)]
        assert await log.append(sent) == list(range(500))
        got = await log.read(0, 0)
        assert [g.event for g in got] == [s.event for s in sent]
        assert await log.end_offset(0) == 500


async def test_a_record_over_the_batch_limit_is_refused_before_anything_is_sent(
    kafka_bootstrap: str,
) -> None:
    """A record no batch can hold would be refused by the broker for ever: the call is
    refused whole, before any batch is sent, naming the setting that raises the limit
    (never a ``LogError``, which roles retry)."""
    settings = _settings(kafka_bootstrap, "huge", max_batch_bytes=20_000)
    async with _logs(settings) as (log,):
        small = [Envelope(event=PodDeleted(pod=f"ns/{'x' * 200}-{i}")) for i in range(200)]
        huge = Envelope(event=PodDeleted(pod="ns/" + "x" * 30_000))
        with pytest.raises(RecordTooLargeError, match="max_batch_bytes") as info:
            await log.append([*small, huge])
        assert not isinstance(info.value, LogError)
        assert await log.end_offset(0) == 0


async def test_read_kinds_skips_other_kinds_by_key(kafka_bootstrap: str) -> None:
    """Records are keyed by their kind: ``read_kinds`` keeps the kinds asked for, skips
    the rest undecoded (a garbage value under another kind's key is never looked at),
    still decodes records keyed the older way (by partition number) to filter them, and
    says where its scan stopped."""
    settings = _settings(kafka_bootstrap, "kinds")
    async with _logs(settings) as (log,):
        await log.append(
            [
                Envelope(event=PodDeleted(pod="a/1")),
                Envelope(event=PodSucceeded(pod="a/2")),
            ]
        )
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(settings.topic, b"\xc1 junk", key=b"pod.ok", partition=0)
            older = encode(Envelope(event=PodDeleted(pod="a/3")))
            await producer.send_and_wait(settings.topic, older, key=b"0", partition=0)
            older = encode(Envelope(event=PodSucceeded(pod="a/4")))
            await producer.send_and_wait(settings.topic, older, key=b"0", partition=0)
        finally:
            await producer.stop()
        stop, kept = await log.read_kinds(0, 0, ["pod-"])
        assert stop == 5
        assert [(e.offset, e.event) for e in kept] == [
            (0, PodDeleted(pod="a/1")),
            (3, PodDeleted(pod="a/3")),
        ]
        assert await log.read_kinds(0, 5, ["pod-"]) == (5, [])
        with pytest.raises(LogCorruptedError, match="offset 2"):
            await log.read_kinds(0, 0, ["pod.ok"])


async def test_reads_pass_over_commit_markers_and_aborted_transactions(
    kafka_bootstrap: str,
) -> None:
    """A leader term's appends are transactions: each commit marker takes an offset,
    and a transaction its writer left open (frozen mid-append) is aborted when the next
    term's producer starts. Reads from anywhere, with or without a limit, pass over
    both, never show an aborted record, and end."""
    settings = _settings(kafka_bootstrap, "gaps")
    async with _logs(settings, 2) as (log, other):
        term = FencedLog(log, fence="c", epoch=1)
        at = [*await term.append([Envelope(event=PodDeleted(pod="a/0"), time=0)])]
        at += await term.append([Envelope(event=PodDeleted(pod=f"a/{i}"), time=i) for i in (1, 2)])
        at += await log.append([Envelope(event=PodDeleted(pod="a/3"), time=3)])
        assert at[1] == at[0] + 2  # the first transaction's commit marker between
        frozen = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=log.terms.transactional_id("c")
        )
        await frozen.start()  # (fences the term's producer: the log still holds epoch 1)
        await frozen.begin_transaction()
        stale = encode(Envelope(event=PodDeleted(pod="a/x"), time=9, fence="c", epoch=1))
        await frozen.send_and_wait(settings.topic, stale, key=b"pod-", partition=0)
        # the next term's producer starting aborts the open transaction
        await FencedLog(other, fence="c", epoch=2).begin([0], holder="b", now=4)
        await frozen.stop()
        whole = await log.read(0, 0)
        assert [e.time for e in whole] == [0, 1, 2, 3, 4]  # a/0..a/3, the TermBegan: no a/x
        offsets = [e.offset for e in whole]
        end = await log.end_offset(0)
        assert end > offsets[-1] + 1  # past the aborted record and the markers
        for start in range(end + 1):  # from every offset, markers included
            rest = [o for o in offsets if o >= start]
            assert [e.offset for e in await other.read(0, start)] == rest
            assert [e.offset for e in await other.read(0, start, 1)] == rest[:1]
        stop, kept = await log.read_kinds(0, 0, ["pod-"])
        assert (stop, [e.time for e in kept]) == (end, [0, 1, 2, 3])
        with pytest.raises(FencedError):
            await term.append([Envelope(event=PodDeleted(pod="a/5"), time=5)])


async def test_a_read_while_others_append_ends_and_keeps_what_it_fetched(
    kafka_bootstrap: str,
) -> None:
    """A read with no limit used to chase the tail while a writer kept appending, until
    its time-out, and then fail ("stalled") throwing its progress away. It ends at the
    high-water mark it learnt, with every record appended before it began."""
    settings = _settings(kafka_bootstrap, "tail", request_timeout_ms=3000, fetch_max_wait_ms=10)
    async with _logs(settings, 2) as (writer, reader):
        stop = asyncio.Event()

        async def append_on() -> None:
            i = 0
            while not stop.is_set():
                await writer.append([Envelope(event=PodDeleted(pod=f"ns/p-{i}"))])
                i += 1

        await writer.append([Envelope(event=PodDeleted(pod=f"ns/before-{i}")) for i in range(50)])
        appending = asyncio.create_task(append_on())
        try:
            for _ in range(5):  # each read ends, however long the writer goes on
                got = await reader.read(0, 0)
                assert [e.offset for e in got] == list(range(len(got)))
                assert len(got) >= 50
        finally:
            stop.set()
            await appending


async def test_a_log_of_many_small_batches_is_read_whole_from_anywhere(
    kafka_bootstrap: str,
) -> None:
    """The test broker lists every stored batch of a partition at each fetch and stops
    at the fetch's wait: with thousands of one-record batches a fetch that may wait a
    few milliseconds brought one record, or none from late offsets, and shards stalled
    (the stall of a real cluster's pod creation over Kafka). Learning the end without a
    fetch and gathering with a long wait reads everything, from any offset."""
    settings = _settings(
        kafka_bootstrap,
        "small",
        request_timeout_ms=20000,
        fetch_max_wait_ms=1,  # far too short to list a few thousand batches
    )
    async with _logs(settings, 2) as (writer, reader):
        total = 3000
        for i in range(total):
            await writer.append([Envelope(event=PodDeleted(pod=f"ns/p-{i}"))])
        for start in (0, total // 2, total - 7):
            got = await reader.read(0, start)
            assert [e.offset for e in got] == list(range(start, total))
        assert await reader.read(0, total) == []
        assert await reader.end_offset(0) == total
        offset, kept = await reader.read_kinds(0, total - 3, ["pod-"])
        assert (offset, len(kept)) == (total, 3)


async def test_a_wait_returns_when_one_of_its_partitions_grows_past_a_commit_marker(
    kafka_bootstrap: str,
) -> None:
    """An idle reader long-polls: the broker holds its fetch until a record comes to
    any partition it waits on (a commit marker, which no reader sees, does not count),
    instead of the reader asking every few milliseconds."""
    settings = _settings(kafka_bootstrap, "wait", partitions=2)
    async with _logs(settings, 2) as (log, writer):
        term = FencedLog(writer, fence="c", epoch=1)
        first = await term.append([Envelope(event=PodDeleted(pod="a/0"), time=0)], 1)
        after = first[-1] + 1  # the transaction's commit marker is there
        waiting = asyncio.ensure_future(log.wait_any({0: 0, 1: after}, 60.0))
        await asyncio.sleep(0.3)  # (it waits at the broker meanwhile)
        assert not waiting.done()
        await writer.append([Envelope(event=PodDeleted(pod="a/1"), time=1)], 1)
        await asyncio.wait_for(waiting, 30.0)  # well before its 60 s
        again = asyncio.ensure_future(log.wait_for(0, 0, 60.0))
        await writer.append([Envelope(event=PodDeleted(pod="a/2"), time=2)], 0)
        await asyncio.wait_for(again, 30.0)
        await log.wait_for(0, 5, 0.05)  # nothing there: back after its time


def _count_scans(log: KafkaLog) -> list[int]:
    """The offsets ``log`` scans headers from (to judge terms before a read), from now on."""
    scans: list[int] = []
    read = log._read

    async def counted(partition: int, offset: int, limit: int | None, kinds: object = None) -> Any:
        if kinds == frozenset():
            scans.append(offset)  # a scan of headers only: judging before a read
        return await read(partition, offset, limit, kinds)  # type: ignore[arg-type]

    log._read = counted  # type: ignore[method-assign]
    return scans


async def test_a_read_past_its_own_plain_records_does_not_scan_them_and_still_judges_terms(
    kafka_bootstrap: str,
) -> None:
    """A shard reads around what it appended (``shards.worker``): its log knows those
    records carry no term and judges from after them without fetching them, while a
    deposed leader's record after them is still dropped."""
    settings = _settings(kafka_bootstrap, "plain")
    async with _logs(settings, 2) as (log, other):
        scans = _count_scans(log)
        await FencedLog(other, fence="c", epoch=2).begin([0], holder="b", now=0)
        begun = await log.read(0, 0)
        own = await log.append([Envelope(event=PodDeleted(pod=f"a/{i}"), time=i) for i in range(3)])
        stale = Envelope(event=PodDeleted(pod="a/x"), time=9, fence="c", epoch=1)
        await other.append([stale])  # (no transaction: the read side must drop it)
        after = await log.read(0, own[-1] + 1)
        assert scans == []
        assert [type(e.event).__name__ for e in after] == ["RecordFenced"]
        assert len(begun) == 1


async def test_a_read_that_stopped_inside_its_own_plain_records_does_not_scan_them(
    kafka_bootstrap: str,
) -> None:
    """A shard reads up to its own records with a limit counted in offsets; a commit
    marker before them takes one of those offsets, so the read stops one record into
    them. The next read, from after them, still judges from there without fetching
    them again (the records are the log's own, with no term)."""
    settings = _settings(kafka_bootstrap, "inside")
    async with _logs(settings, 2) as (log, other):
        scans = _count_scans(log)
        term = FencedLog(other, fence="c", epoch=1)
        routed = await term.append(
            [Envelope(event=PodDeleted(pod=f"r/{i}"), time=i) for i in range(2)]
        )
        for _ in range(500):  # the broker writes the commit marker once the commit is sent
            if await log.end_offset(0) > routed[-1] + 1:
                break
            await asyncio.sleep(0.01)
        own = await log.append([Envelope(event=PodDeleted(pod=f"a/{i}"), time=i) for i in range(3)])
        assert own[0] > routed[-1] + 1, "the transaction's commit marker is between"
        first = await log.read(0, 0, own[0])
        assert [e.offset for e in first] == [*routed, own[0]]
        stale = Envelope(event=PodDeleted(pod="a/x"), time=9, fence="c", epoch=0)
        await other.append([Envelope(event=PodDeleted(pod="b/0"), time=9), stale])
        after = await log.read(0, own[-1] + 1)
        assert scans == []
        assert [e.event.pod for e in after] == ["b/0", "a/x"]  # type: ignore[union-attr]


def _count_handed(log: KafkaLog) -> list[int]:
    """How many records each fetch of ``log``'s clients hands over, from now on."""
    handed: list[int] = []
    for client in (log._probe_consumer, log._consumer):
        getmany = client.getmany

        async def counted(*args: Any, _getmany: Any = getmany, **kwargs: Any) -> Any:
            batch = await _getmany(*args, **kwargs)
            handed.append(sum(len(records) for records in batch.values()))
            return batch

        client.getmany = counted
    return handed


async def test_a_read_with_a_limit_takes_no_more_records_from_the_client(
    kafka_bootstrap: str,
) -> None:
    """Each record the client hands over costs a Python object; a read that wants few
    of a long partition takes only those (the rest of the fetch is left unpacked)."""
    settings = _settings(kafka_bootstrap, "few")
    async with _logs(settings) as (log,):
        handed = _count_handed(log)
        await log.append([Envelope(event=PodDeleted(pod=f"a/{i}"), time=i) for i in range(200)])
        got = await log.read(0, 10, limit=3)
        assert [e.offset for e in got] == [10, 11, 12]
        assert sum(handed) == 3


async def test_read_kinds_passes_over_its_own_records_of_other_kinds_unfetched(
    kafka_bootstrap: str,
) -> None:
    """The coordinator routes pods to a shard's partition and reads back only the
    shard's reports: its log passes over the pods it appended itself without taking
    them from the client, and still judges their term (a deposed leader's record after
    them is dropped). A run of its own of a term older than the partition holds is read
    (its records are dropped, as any reader drops them)."""
    settings = _settings(kafka_bootstrap, "own", transactions=False)
    async with _logs(settings, 2) as (log, shard):
        handed = _count_handed(log)
        router = FencedLog(log, fence="c", epoch=2)
        await router.append([Envelope(event=PodDeleted(pod=f"r/{i}"), time=i) for i in range(50)])
        done = [Envelope(event=PodSucceeded(pod=f"r/{i}"), time=i) for i in range(2)]
        await shard.append(done)
        await router.append([Envelope(event=PodDeleted(pod=f"s/{i}"), time=i) for i in range(50)])
        stale = Envelope(event=PodSucceeded(pod="r/x"), time=9, fence="c", epoch=1)
        await shard.append([*done, stale])
        stop, got = await log.read_kinds(0, 0, ["pod.ok"])
        assert [e.event.pod for e in got] == ["r/0", "r/1", "r/0", "r/1"]  # type: ignore[union-attr]
        assert stop == 105
        assert sum(handed) == 5, "only the shard's records are taken from the client"
        # a run of its own of an older term than the partition holds: read, dropped
        await FencedLog(shard, fence="c", epoch=3).append([Envelope(event=PodDeleted(pod="t"))])
        await router.append([Envelope(event=PodDeleted(pod="late"), time=1)])
        await shard.append(done)
        stop, got = await log.read_kinds(0, stop, ["pod.ok"])
        assert [e.event.pod for e in got] == ["r/0", "r/1"]  # type: ignore[union-attr]
        assert [type(e.event).__name__ for e in await log.read(0, 105)] == [
            "PodDeleted",
            "RecordFenced",
            "PodSucceeded",
            "PodSucceeded",
        ]


async def test_a_read_at_the_end_of_the_log_fetches_nothing(kafka_bootstrap: str) -> None:
    """Most reads find nothing new (every poll of an idle shard or coordinator): they
    learn where the partition ends and stop there, with no fetch (one the broker held
    at the end of the log, after which the client sent another at once, cost two waits
    and about 2 ms of CPU)."""
    settings = _settings(kafka_bootstrap, "end")
    async with _logs(settings) as (log,):
        fetched: list[int] = []
        await log.append([Envelope(event=PodDeleted(pod=f"a/{i}"), time=i) for i in range(3)])
        assert len(await log.read(0, 0)) == 3
        for client in (log._probe_consumer, log._consumer, log._ends):
            getmany = client.getmany

            async def counted(*args: Any, _getmany: Any = getmany, **kwargs: Any) -> Any:
                fetched.append(1)
                return await _getmany(*args, **kwargs)

            client.getmany = counted
        for _ in range(3):
            assert await log.read(0, 3) == []
            assert await log.read_kinds(0, 3, ["pod-"]) == (3, [])
        assert fetched == []
        assert await log.end_offset(0) == 3


async def test_a_read_after_a_wait_that_saw_records_fetches_without_asking_first(
    kafka_bootstrap: str,
) -> None:
    """A shard woken by records reads them: the wait's answer told it that records are
    there, so the read fetches at once and learns where it ends from the fetch's
    answer, without a ``ListOffsets`` round trip first."""
    settings = _settings(kafka_bootstrap, "woken")
    async with _logs(settings, 2) as (log, writer):
        asked: list[int] = []
        assert await log.read(0, 0) == []
        end_offsets = log._ends.end_offsets  # type: ignore[union-attr]

        async def counted(*args: Any, **kwargs: Any) -> Any:
            asked.append(1)
            return await end_offsets(*args, **kwargs)

        log._ends.end_offsets = counted  # type: ignore[union-attr]
        waiting = asyncio.ensure_future(log.wait_for(0, 0, 30.0))
        await writer.append([Envelope(event=PodDeleted(pod=f"a/{i}"), time=i) for i in range(3)])
        await asyncio.wait_for(waiting, 30.0)
        assert [e.offset for e in await log.read(0, 0)] == [0, 1, 2]
        assert asked == []
        assert await log.read(0, 3) == [] and asked == [1], "at the end: asked, not fetched"

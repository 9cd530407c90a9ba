"""The ``EventLog`` over Kafka (aiokafka): the distributed log.

One topic, one Kafka partition per log partition. Each record's value is one msgpack
envelope; its key is the event's kind (``pod+``, ``bind``...), so that a reader that
wants some kinds only (``read_kinds``: the coordinator relaying shards' reports) skips
the others without decoding them; records its own log appended, of other kinds, it does
not even fetch (``events.kafka_runs``: the coordinator passes over the pods it routed).
Records written with the partition number as key (as before) are decoded and filtered.
Offsets are Kafka's: a transaction's commit marker
takes an offset of its own, so where a leader term writes (below) the offsets of the
records have gaps, which readers pass over (no reader counts offsets: each goes on
from the offset after the last record it read).

Contract notes, backend by backend:

- ``append`` sends every envelope of a call in one record batch: Kafka writes a batch
  whole or not at all, so the call is atomic up to the batch size limit
  (``max_batch_bytes``); a larger call is split and is then atomic per batch, except in
  a leader term's transaction (below), which makes the whole call atomic. A record
  that alone is over ``max_batch_bytes`` (less ``RECORD_OVERHEAD``,
  ``events.kafka_records``) is refused before anything is sent, with
  :class:`~events.errors.RecordTooLargeError`: the broker would refuse it for ever (its
  ``message.max.bytes``, about 1 MB by default, bounds a batch). Idempotence never
  rests on Kafka transactions: decisions carry ids and every handler is idempotent.
- ``read`` first learns where the partition ends (its high-water mark) from a
  ``ListOffsets`` request sent after the call began (so it sees every append that
  returned before), answered at once, without a fetch: a read at the end of the log
  (most reads: every poll of an idle shard or coordinator) costs that round trip only.
  (It used to learn it from the first answer to a fetch, which the broker held at the
  end of the log, after which the client sent another at once, which the next request
  of the connection waited behind: two fetches, two waits and about 2 ms of CPU for a
  read of nothing.) A read from below a high-water mark already learnt (from a wait's
  answer, the log's own appends, an earlier read) has records to fetch: it skips that
  request and learns where it ends from its first fetch's answer, sent after the call
  began as well. A read with records to fetch fetches from where it starts
  with a small "probe" consumer, whose fetches wait only ``fetch_max_wait_ms`` where
  nothing is there yet (a transaction whose commit markers are being written: a fetch
  held long would hold back the consumer's next ones, whatever their partition, as a
  broker answers a connection's requests in turn), and the rest up to that end, if one
  answer did not bring it all, with a consumer whose fetches may wait
  ``catch_up_wait_ms``: Kafka answers
  as soon as it has records, but a broker that stops gathering at the wait (tansu's
  object store, the earlier test broker, lists every batch of the partition at each
  fetch, about 1 µs a batch) must be given long enough, or a large log is read a record
  at a time, or not at all. A read while others append ends at the end it learnt; on
  its time-out it returns what it has fetched, and fails only if it fetched nothing. Between reads
  neither consumer fetches (paused): each fetch costs the broker work.
- **Fencing** (``events.fence``), on the append side: a leader term (``FencedLog``)
  appends through :meth:`KafkaLog.append_term`, one transaction per call on a
  transactional producer of the term's own (``events.kafka_terms``): once a later
  term's producer has started, the broker refuses the earlier one's appends, and the
  term ends with :class:`~events.fence.FencedError`, as on the file log and the log
  server (the role stands by). Readers read ``read_committed``: nothing of an aborted
  or open transaction is folded; an open one holds them back at it until it ends.
  Writers that lead nothing (each shard's partition has one writer, a shard) use the
  idempotent producer outside transactions: there is no term to fence, and a
  transaction costs two more round trips.
- **Fencing**, on the read side, as the second line: a reader drops (sees a
  ``RecordFenced`` in place of) a record whose term, in its header, is older than one
  its partition already holds for that fence, judged in the partition's order
  (``events.kafka_judge``), so every reader and replay drop the same records.
- Producer idempotence is on by default (``idempotence=False`` turns it off, for a
  broker that cannot do it); TLS and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) pass
  through to aiokafka.

The parts, each a module of its own: settings, TLS files and the SASL password (read
from a file only, never printed), ``events.kafka_settings``; the clients and their
restarts, ``events.kafka_clients``; records as stored, ``events.kafka_records``; the
runs of the log's own records, ``events.kafka_runs``; the read-side judgement of terms,
``events.kafka_judge``; the leader terms' producers, ``events.kafka_terms``; creating
the topic, ``events.kafka_admin``. Only these modules import aiokafka.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaTimeoutError

from events.codec import DecodeError, decode, kind_of
from events.errors import LogError
from events.fence import fenced
from events.kafka_admin import create_topic
from events.kafka_clients import KafkaClients
from events.kafka_judge import TermJudge
from events.kafka_records import encode_records, undecodable
from events.kafka_runs import Appended
from events.kafka_settings import KafkaSettings
from events.kafka_terms import TermProducers
from events.log import check_partition
from events.types import Envelope

force_setattr = msgspec.structs.force_setattr
_STEP_MS = 5
"""How often a read looks whether a fetch has been answered."""
WAIT_FETCH_MS = 500
"""How long the broker may hold a fetch of :meth:`KafkaLog.wait_for` (it answers as soon
as a record comes)."""


class KafkaLog(KafkaClients):
    """An ``EventLog`` on one Kafka topic. ``await start()`` before use."""

    def __init__(self, settings: KafkaSettings) -> None:
        super().__init__(settings)
        self._marks: dict[int, int] = {}
        """The highest high-water mark learnt per partition, from any answer: a read
        from below it has records to fetch, and learns where it ends from the fetch's
        answer instead of asking first (after :meth:`wait_for` said records came)."""
        self._wait_lock = asyncio.Lock()
        self._read_lock = asyncio.Lock()
        self._judge = TermJudge()
        """The terms of the records read and appended, judged (``events.kafka_judge``)."""
        self.terms = TermProducers(
            settings,
            call=self._call,
            send=self._append,
            highest_epoch=self.highest_epoch,
            stop=self._stop_in_background,
        )
        """The transactional producers of the leader terms this log writes."""

    @property
    def partitions(self) -> int:
        return self.settings.partitions

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        check_partition(partition, self.partitions)
        if not envelopes:
            return []
        appended: Appended = await self._call(
            "append", lambda: self._append(self._need(self._producer), envelopes, partition)
        )
        self._appended(partition, appended)
        return appended.offsets

    def _appended(self, partition: int, appended: Appended) -> None:
        """Note the records of an append that returned (so stored, and committed where
        in a transaction) as runs of this log's own, if they share one term (or none)."""
        if appended.offsets:
            self._learnt(partition, appended.offsets[-1] + 1)
        self._judge.appended(partition, appended)

    async def append_term(
        self, envelopes: Sequence[Envelope], partition: int, *, fence: str, epoch: int
    ) -> list[int]:
        """``append`` for term ``epoch`` of the leader of ``fence`` (``FencedLog`` calls
        it): in one transaction of the term's own producer (``events.kafka_terms``), or,
        with ``transactions`` off, as ``append``. Raises :class:`FencedError` once a
        later term has begun; nothing of the refused call is stored."""
        if not self.settings.transactional:
            return await self.append(envelopes, partition)
        check_partition(partition, self.partitions)
        if not envelopes:
            return []
        appended = await self.terms.append(envelopes, partition, fence, epoch)
        self._appended(partition, appended)
        return appended.offsets

    async def _append(
        self, producer: AIOKafkaProducer, envelopes: Sequence[Envelope], partition: int
    ) -> Appended:
        records, kinds, terms = encode_records(envelopes, partition, self.settings)
        offsets: list[int] = []
        batch = producer.create_batch()
        count = 0
        for key, value, headers in records:
            if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                offsets.extend(await self._send(producer, batch, partition, count))
                batch, count = producer.create_batch(), 0
                batch.append(key=key, value=value, timestamp=None, headers=headers)
            count += 1
        offsets.extend(await self._send(producer, batch, partition, count))
        return Appended(offsets, kinds, terms)

    async def _send(
        self, producer: AIOKafkaProducer, batch: Any, partition: int, count: int
    ) -> list[int]:
        if count == 0:
            return []
        batch.close()
        timeout = self.settings.request_timeout_ms / 1000
        try:
            future = await asyncio.wait_for(
                producer.send_batch(batch, self.settings.topic, partition=partition), timeout
            )
            # a producer stopped by another caller (a restart) may never answer
            meta = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise KafkaTimeoutError("no answer to a produce request") from None
        return list(range(meta.offset, meta.offset + count))

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        check_partition(partition, self.partitions)
        await self._judge_up_to(partition, offset)
        _, out = await self._call("read", lambda: self._read(partition, offset, limit))
        return out

    async def _judge_up_to(self, partition: int, offset: int) -> None:
        """Judge the terms of the records before ``offset`` not judged yet (their
        headers only), so that a read from ``offset`` can judge its own."""
        judge = self._judge
        while judge.judged.get(partition, 0) < offset:
            start = judge.judged.get(partition, 0)
            judge.own.drop_before(partition, start)
            run = judge.own.at(partition, start)
            if run is not None and judge.own_run(partition, run):
                continue  # records of ours: their terms known without fetching them
            await self._call(
                "read",
                lambda at=start: self._read(partition, at, None, frozenset()),  # type: ignore[misc]
            )
            if judge.judged.get(partition, 0) <= start:
                break  # the partition ends before ``offset``

    async def highest_epoch(self, fence: str) -> int:
        """The highest epoch the topic holds for ``fence`` (``events.fence``): every
        partition's terms judged to its end, from the headers (nothing decoded)."""
        highest = 0
        for partition in range(self.partitions):
            await self._judge_up_to(partition, await self.end_offset(partition))
            highest = max(highest, self._judge.highest(partition, fence))
        return highest

    async def read_kinds(
        self, partition: int, offset: int, kinds: Sequence[str]
    ) -> tuple[int, list[Envelope]]:
        """Like ``read``, keeping only events of ``kinds`` (tags); the others are skipped
        by their key, undecoded. Returns (the offset after the last record scanned, the
        records kept)."""
        check_partition(partition, self.partitions)
        wanted = frozenset(kind.encode() for kind in kinds)
        out: list[Envelope] = []
        while True:  # each turn reads on past a run of this log's own records, or ends
            await self._judge_up_to(partition, offset)
            offset = self._judge.past_own(partition, offset, wanted)
            until = self._judge.own.next_without(partition, offset, wanted)
            stop, records = await self._call(
                "read",
                lambda at=offset, to=until: self._read(partition, at, None, wanted, to),  # type: ignore[misc]
            )
            out += records
            if until is None or stop < until:
                return stop, out
            offset = stop

    async def _read(
        self,
        partition: int,
        offset: int,
        limit: int | None,
        kinds: frozenset[bytes] | None = None,
        until: int | None = None,
    ) -> tuple[int, list[Envelope]]:
        """Up to ``limit`` records from ``offset`` (of ``kinds`` only, if given), none
        at or after ``until``; (the offset this read goes on from, the records)."""
        tp = TopicPartition(self.settings.topic, partition)
        offset = max(offset, 0)
        out: list[Envelope] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.request_timeout_ms / 1000
        judge = self._judge
        judged = judge.judged
        judge_record = judge.record
        in_order = offset <= judged.get(partition, 0)
        """Whether every record before this read's is judged: then so is every offset
        it passes, records or not."""
        bound = until if until is not None else -1

        def most() -> int | None:
            """The most records the client need hand over (each costs it an object to
            make): what ``limit`` leaves, and no more than the offsets to ``until``."""
            left = [] if limit is None else [limit - len(out)]
            if until is not None:
                left.append(until - offset)
            return max(min(left), 1) if left else None

        def take(records: list[Any], position: int) -> None:
            """Take the records of one fetch; ``position``: where the consumer reads on
            (past offsets that hold no record a reader sees: transaction markers,
            records of aborted transactions), where this read goes on unless it
            stopped at ``limit``."""
            nonlocal offset
            for record in records:
                at = record.offset
                if at < offset:
                    continue  # a batch is fetched whole: the records before the offset asked
                if at >= bound >= 0:
                    position = bound  # nothing a reader sees before it
                    break
                offset = at + 1
                if record.headers:
                    stale = judge_record(partition, record)
                else:  # (no term: it stands; what judge.record does, without the call per record)
                    stale = 0
                    if at >= judged.get(partition, 0):
                        judged[partition] = offset
                key = record.key
                if kinds is not None and key and not key.isdigit() and key not in kinds:
                    continue  # a kind not asked for, told by the key
                try:
                    env = decode(record.value)
                except (DecodeError, TypeError):
                    undecodable(record.value, partition, at, self.settings.topic)
                if kinds is not None and kind_of(env).encode() not in kinds:
                    continue  # an older record keyed by its partition
                # freshly decoded, this read's alone: fill in where it lives, no copy
                force_setattr(env, "offset", at)
                force_setattr(env, "partition", partition)
                if stale:
                    if kinds is not None:
                        continue  # a fenced record is of no kind asked for
                    env = fenced(env, stale)
                out.append(env)
                if limit is not None and len(out) >= limit:
                    return
            offset = max(offset, position if bound < 0 else min(position, bound))
            if in_order and offset > judged.get(partition, 0):
                judged[partition] = offset

        async with self._read_lock:
            # 1. Where the partition ends now (asked after this call began: it sees
            # every append that returned before): without a fetch where no record is
            # known to be there, or else from the answer to the fetch of step 2.
            known = offset < self._marks.get(partition, 0)
            end = -1 if known else await self._high_water(partition)
            if not known and offset >= (end if until is None else min(end, until)):
                return offset, out
            # 2. The first records, by the probe, whose fetches wait little.
            records, position, mark = await self._probe(partition, offset, deadline, most())
            end = max(end, mark)
            if until is not None:
                end = min(end, until)
            take(records, position)
            if offset >= end or (limit is not None and len(out) >= limit):
                return offset, out
            # 3. The rest up to that end, by the consumer whose fetches may take
            # long enough to gather them (a broker may stop gathering at the wait).
            consumer = self._need(self._consumer)
            consumer.assign([tp])
            consumer.seek(tp, offset)
            start = offset
            try:
                while offset < end and (limit is None or len(out) < limit):
                    if loop.time() > deadline:
                        if offset > start:
                            break  # what was fetched is kept: the caller reads on from here
                        raise LogError(
                            f"kafka read of partition {partition} made no progress from "
                            f"offset {offset} in {self.settings.request_timeout_ms} ms "
                            f"(high-water mark {end})"
                        )
                    batch = await consumer.getmany(
                        tp,
                        timeout_ms=_STEP_MS * 20,
                        max_records=most(),
                    )
                    take(batch.get(tp, []), await consumer.position(tp))
            finally:
                consumer.pause(tp)  # no fetching in the background between reads
        return offset, out

    async def _probe(
        self, partition: int, offset: int, deadline: float, limit: int | None = None
    ) -> tuple[list[Any], int, int]:
        """(records the answer brought from ``offset``, at most ``limit`` of them
        (those past it are not unpacked), the offset the probe would fetch next, the
        high-water mark the answer told), from
        the first answer to a fetch sent after this call began (a fresh assignment:
        answers to fetches sent before are dropped). Where a reader sees nothing yet the
        broker holds the fetch for ``fetch_max_wait_ms``; elsewhere it answers at once."""
        probe = self._need(self._probe_consumer)
        tp = TopicPartition(self.settings.topic, partition)
        probe.assign([tp])
        probe.seek(tp, offset)
        loop = asyncio.get_running_loop()
        try:
            while True:
                batch = await probe.getmany(tp, timeout_ms=_STEP_MS, max_records=limit)
                mark = probe.highwater(tp)
                if mark is not None:
                    self._learnt(partition, int(mark))
                    return batch.get(tp, []), int(await probe.position(tp)), int(mark)
                if loop.time() > deadline:
                    # every fetch answer carries the high-water mark: none means no
                    # answer (aiokafka logs fetch errors and returns nothing)
                    raise KafkaTimeoutError(f"no fetch answer for partition {partition}")
        finally:
            probe.pause(tp)

    async def _high_water(self, partition: int) -> int:
        """The partition's high-water mark, from a ``ListOffsets`` request sent now."""
        tp = TopicPartition(self.settings.topic, partition)
        ends = await self._need(self._ends).end_offsets([tp])
        self._learnt(partition, int(ends[tp]))
        return int(ends[tp])

    def _learnt(self, partition: int, mark: int) -> None:
        if mark > self._marks.get(partition, 0):
            self._marks[partition] = mark

    async def wait_for(self, partition: int, offset: int, seconds: float) -> None:
        """Return once ``partition`` holds a record at or after ``offset`` that a reader
        sees, or after ``seconds``: a long poll, the broker holding the fetch until a
        record comes (up to ``WAIT_FETCH_MS`` at a time), so an idle reader costs a
        fetch per wait, not a read every few milliseconds."""
        await self.wait_any({partition: offset}, seconds)

    async def wait_any(self, offsets: Mapping[int, int], seconds: float) -> None:
        """:meth:`wait_for` on several partitions at once (``offsets``: partition → the
        offset a record must be at or after): return when any of them has one."""
        for partition in offsets:
            check_partition(partition, self.partitions)
        if seconds > 0 and offsets:
            await self._call("wait", lambda: self._wait_any(offsets, seconds))

    async def _wait_any(self, offsets: Mapping[int, int], seconds: float) -> None:
        async with self._wait_lock:
            if self._waiter is None:
                waiter = AIOKafkaConsumer(
                    **self.settings.client_options(),
                    enable_auto_commit=False,
                    isolation_level="read_committed",
                    fetch_max_wait_ms=WAIT_FETCH_MS,
                    max_partition_fetch_bytes=64 * 1024,  # (what it fetches is dropped)
                )
                await waiter.start()
                self._waiter = waiter
            tps = {TopicPartition(self.settings.topic, p): o for p, o in offsets.items()}
            self._waiter.assign(list(tps))
            for tp, offset in tps.items():
                self._waiter.seek(tp, max(offset, 0))
            try:
                await self._waiter.getmany(*tps, timeout_ms=int(seconds * 1000), max_records=1)
                for tp in tps:
                    mark = self._waiter.highwater(tp)
                    if mark is not None:
                        self._learnt(tp.partition, int(mark))
            finally:
                self._waiter.pause(*tps)

    async def end_offset(self, partition: int) -> int:
        check_partition(partition, self.partitions)
        return await self._call("end offset", lambda: self._end_offset(partition))

    async def _end_offset(self, partition: int) -> int:
        async with self._read_lock:
            return await self._high_water(partition)

    async def close(self) -> None:
        """:meth:`KafkaClients.close`, the producers of the leader terms held too."""
        self._stop_in_background(self.terms.release())
        await super().close()


__all__ = ["KafkaLog", "KafkaSettings", "create_topic"]

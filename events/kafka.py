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
  that alone is over ``max_batch_bytes`` (less ``RECORD_OVERHEAD``) is refused before
  anything is sent, with :class:`~events.errors.RecordTooLargeError`: the broker would
  refuse it for ever (its ``message.max.bytes``, about 1 MB by default, bounds a batch). Idempotence
  never rests on Kafka transactions: decisions carry ids and every handler is
  idempotent.
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
- **Fencing**, on the read side, as the second line: a record a leader appended
  carries its term in a header (``shoal-term``: ``FENCE:EPOCH``), and a reader drops
  (sees a ``RecordFenced`` in place of) a record whose epoch is below one its partition
  already holds for that fence. The judgement is a function of the partition's order,
  kept per partition as reads go (headers only; a read from further on first scans the
  records before it, undecoded; the records a log appended itself it judges from what
  it appended, unfetched), so every reader and replay drop the same records. It
  finds nothing to drop where terms write in transactions; it is what fences a broker
  without transactions (``transactions=false``) and what replays logs written before.
- Producer idempotence is on by default (``idempotence=False`` turns it off, for a
  broker that cannot do it); TLS and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) pass
  through to aiokafka.

Settings, TLS files and the SASL password (read from a file only, never printed):
``events.kafka_settings``.

Only this module and ``events.kafka_terms`` import aiokafka.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import ConsumerStoppedError, KafkaError, KafkaTimeoutError

from events.codec import DecodeError, decode, encode, kind_of
from events.errors import LogCorruptedError, LogError, RecordTooLargeError
from events.fence import fenced
from events.kafka_runs import Appended, OwnRuns, Run
from events.kafka_settings import KafkaSettings, guard_client_logs, redact
from events.kafka_terms import TermProducers, settle
from events.log import check_partition
from events.tasks import being_cancelled
from events.types import Envelope

FAILURES = (KafkaError, ConsumerStoppedError, OSError)
"""What a client raises when the broker goes away, or when another caller sharing this
log restarted the clients under it: each becomes a :class:`LogError`."""
T = TypeVar("T")
force_setattr = msgspec.structs.force_setattr
TERM_HEADER = "shoal-term"
"""The record header that carries a leader's term: ``FENCE:EPOCH`` (``events.fence``)."""
_STEP_MS = 5
"""How often a read looks whether a fetch has been answered."""
WAIT_FETCH_MS = 500
"""How long the broker may hold a fetch of :meth:`KafkaLog.wait_for` (it answers as soon
as a record comes)."""
PARSED_TERMS = 1024
"""Distinct term headers a log keeps parsed (a writer that makes up many only empties
the cache, it does not grow it)."""
RECORD_OVERHEAD = 128
"""Bytes a record costs in a batch beyond its key and value (Kafka's varints and
attributes, the term header): a record whose key and value leave less than this of
``max_batch_bytes`` is refused, as no batch can hold it."""


async def create_topic(
    settings: KafkaSettings, *, retention_ms: int | None = None, exist_ok: bool = True
) -> bool:
    """Create the topic with ``settings.partitions`` partitions; False if it existed."""
    options = settings.client_options()
    guard_client_logs(options.get("sasl_plain_password"))
    admin = AIOKafkaAdminClient(**options)
    try:
        await admin.start()
        existing = await admin.list_topics()
        if settings.topic in existing:
            if not exist_ok:
                raise LogError(f"topic {settings.topic!r} already exists")
            return False
        configs = {"retention.ms": str(retention_ms)} if retention_ms is not None else {}
        await admin.create_topics(
            [NewTopic(settings.topic, settings.partitions, 1, topic_configs=configs)]
        )
        await _until_served(admin, settings)
        return True
    except KafkaError as exc:
        secret = options.get("sasl_plain_password")
        raise LogError(redact(f"kafka {settings.bootstrap}: {exc}", secret)) from None
    finally:
        await admin.close()


async def _until_served(admin: AIOKafkaAdminClient, settings: KafkaSettings) -> None:
    """Wait until the broker's metadata has the new topic with a leader for every
    partition: a broker learns of a topic its controller created a moment later, and a
    client started before then would find no such topic."""
    deadline = asyncio.get_running_loop().time() + settings.request_timeout_ms / 1000
    while True:
        topics = await admin.describe_topics([settings.topic])
        parts = [p for t in topics if t["error_code"] == 0 for p in t["partitions"]]
        if len(parts) >= settings.partitions and all(p["leader"] >= 0 for p in parts):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise LogError(
                f"kafka {settings.bootstrap}: topic {settings.topic!r} created, "
                "but not served in time"
            )
        await asyncio.sleep(0.02)


class KafkaLog:
    """An ``EventLog`` on one Kafka topic. ``await start()`` before use."""

    def __init__(self, settings: KafkaSettings) -> None:
        settings.validate()
        self.settings = settings
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        """Fetches the records of a read (waits up to ``catch_up_wait_ms``)."""
        self._probe_consumer: AIOKafkaConsumer | None = None
        """Fetches a read's first records (waits up to ``fetch_max_wait_ms``)."""
        self._ends: AIOKafkaConsumer | None = None
        """Learns where partitions end (``ListOffsets``; it never fetches)."""
        self._marks: dict[int, int] = {}
        """The highest high-water mark learnt per partition, from any answer: a read
        from below it has records to fetch, and learns where it ends from the fetch's
        answer instead of asking first (after :meth:`wait_for` said records came)."""
        self._waiter: AIOKafkaConsumer | None = None
        """Waits for a partition to grow (:meth:`wait_for`; started at its first use)."""
        self._wait_lock = asyncio.Lock()
        self._read_lock = asyncio.Lock()
        self._restart_lock = asyncio.Lock()
        self._needs_restart = False
        self._secret: str | None = None
        """The SASL password the clients were started with: scrubbed from errors."""
        self._generation = 0
        """Bumped by every (re)start: a call that fails with clients of an older
        generation must not stop the new ones another caller has just started."""
        self._stopping: set[asyncio.Future[None]] = set()
        """Clients being stopped by a :meth:`close` whose caller was cancelled."""
        self._judged: dict[int, int] = {}
        """Per partition, the offset up to which its records' terms are judged."""
        self._terms: dict[int, dict[str, int]] = {}
        """Per partition, the highest epoch seen per fence (up to ``_judged``)."""
        self._dropped: dict[int, dict[int, int]] = {}
        """Per partition, the offsets of records fenced, and the epoch that fenced each."""
        self._own = OwnRuns()
        """Per partition, the runs of records this log appended: judged without
        fetching them, and passed over by a ``read_kinds`` of other kinds."""
        self._parsed: dict[bytes, tuple[str, int]] = {}
        """Term headers seen, parsed (at most ``PARSED_TERMS``: emptied when full)."""
        self.terms = TermProducers(
            settings,
            call=self._call,
            send=self._append,
            highest_epoch=self.highest_epoch,
            stop=self._stop_in_background,
        )
        """The transactional producers of the leader terms this log writes."""

    def __repr__(self) -> str:
        s = self.settings
        return f"KafkaLog({s.bootstrap!r}, topic={s.topic!r}, partitions={s.partitions})"

    @property
    def partitions(self) -> int:
        return self.settings.partitions

    async def start(self) -> None:
        """Connect, and check the topic exists with enough partitions."""
        self._generation += 1
        options = self.settings.client_options()
        self._secret = options.get("sasl_plain_password")
        guard_client_logs(self._secret)
        try:
            self._producer = AIOKafkaProducer(
                **options, **self._producer_options(), enable_idempotence=self.settings.idempotence
            )
            await self._producer.start()
            self._consumer = AIOKafkaConsumer(
                **options,
                enable_auto_commit=False,
                isolation_level="read_committed",
                fetch_max_wait_ms=self.settings.catch_up_wait_ms,
                max_partition_fetch_bytes=4 * 1024 * 1024,
            )
            await self._consumer.start()
            self._probe_consumer = AIOKafkaConsumer(
                **options,
                enable_auto_commit=False,
                isolation_level="read_committed",
                fetch_max_wait_ms=self.settings.fetch_max_wait_ms,
                max_partition_fetch_bytes=1024 * 1024,
            )
            await self._probe_consumer.start()
            # (read_uncommitted: the latest offset it is told is the high-water mark)
            self._ends = AIOKafkaConsumer(**options, enable_auto_commit=False)
            await self._ends.start()
            # every topic the broker has (a client asks about none until told which)
            found = None
            if self.settings.topic in await self._consumer.topics():
                found = await self._producer.partitions_for(self.settings.topic)
        except (KafkaError, OSError, TimeoutError) as exc:
            await self.close()
            raise LogError(
                redact(f"kafka {self.settings.bootstrap}: {exc}", self._secret)
            ) from None
        except BaseException:  # cancelled half-way: never leave a client running
            await asyncio.shield(self.close())
            raise
        if not found or len(found) < self.settings.partitions:
            await self.close()
            have = len(found) if found else 0
            raise LogError(
                f"kafka topic {self.settings.topic!r} has {have} partitions, "
                f"{self.settings.partitions} needed (create it with `shoal kafka init`)"
            )

    def _producer_options(self) -> dict[str, Any]:
        s = self.settings
        return {
            "acks": s.acks if s.acks == "all" else int(s.acks),
            "linger_ms": s.linger_ms,
            "max_batch_size": max(s.max_batch_bytes + 4096, 16384),
            "max_request_size": s.max_batch_bytes + 65536,
        }

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
        offsets = appended.offsets
        if offsets:
            self._learnt(partition, offsets[-1] + 1)
        if len(appended.terms) == 1:
            (term,) = appended.terms
            self._own.add(partition, offsets, appended.kinds, term)

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

    def _stop_in_background(self, clients: Sequence[Any]) -> asyncio.Future[None]:
        stopping = asyncio.ensure_future(_stop_clients(clients))
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)
        return stopping

    async def _append(
        self, producer: AIOKafkaProducer, envelopes: Sequence[Envelope], partition: int
    ) -> Appended:
        records = []
        limit = self.settings.max_batch_bytes
        terms: dict[tuple[str, int], list[tuple[str, bytes]]] = {}
        kinds: set[bytes] = set()
        plain = False
        """Whether a record has no term."""
        for env in envelopes:  # every record checked before any batch is sent
            as_stored = env.partition == partition and env.offset == -1  # (no copy then)
            value = encode(env if as_stored else replace_partition(env, partition))
            key = kind_of(env).encode()
            kinds.add(key)
            headers = []
            if env.epoch:  # (a call's records share a term or two: its header made once)
                term = (env.fence, env.epoch)
                headers = terms.get(term) or terms.setdefault(
                    term, [(TERM_HEADER, f"{env.fence}:{env.epoch}".encode())]
                )
            else:
                plain = True
            if len(value) + len(key) + RECORD_OVERHEAD > limit:
                raise RecordTooLargeError(
                    f"kafka {self.settings.bootstrap}: cannot append a {key.decode()!r} record",
                    size=len(value),
                    limit=limit - len(key) - RECORD_OVERHEAD,
                    setting="raise it with max_batch_bytes in the --bus URL or "
                    "SHOAL_KAFKA_MAX_BATCH_BYTES, and the broker's message.max.bytes with it",
                )
            records.append((key, value, headers))
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
        held: set[tuple[str, int] | None] = {*terms, None} if plain else set(terms)
        return Appended(offsets, frozenset(kinds), frozenset(held))

    async def _call(self, what: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` with the current clients; any way they fail (the broker went
        away, or another caller restarted them under this call) is a :class:`LogError`,
        and the clients are started again by the next call."""
        await self._ensure()
        generation = self._generation
        try:
            return await work()
        except FAILURES as exc:
            await self._broken(generation)
            raise LogError(redact(f"kafka {what} failed: {_why(exc)}", self._secret)) from None
        except asyncio.CancelledError:
            await self._stopped_under_us(generation)
            raise LogError(f"kafka {what} failed: the client was restarted under it") from None

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
        while self._judged.get(partition, 0) < offset:
            start = self._judged.get(partition, 0)
            self._own.drop_before(partition, start)
            run = self._own.at(partition, start)
            if run is not None and self._judge_own(partition, run):
                continue  # records of ours: their terms known without fetching them
            await self._call(
                "read",
                lambda at=start: self._read(partition, at, None, frozenset()),  # type: ignore[misc]
            )
            if self._judged.get(partition, 0) <= start:
                break  # the partition ends before ``offset``

    def _judge_own(self, partition: int, run: Run) -> bool:
        """Judge ``run``, records of this log's own from where judging stands (or
        before), without fetching them, as :meth:`_judge` would in order: they stand,
        and their term is then the highest of its fence. False, judging nothing, if
        the partition already holds a higher epoch for that fence (the records are
        then fetched and dropped). (A read with a limit may stop inside a run: a limit
        counts offsets, and the commit marker of a transaction before the run took
        one.)"""
        if self._judged.get(partition, 0) < run.start:
            return False  # (out of order: never so, judging goes on from where it stands)
        if run.term is not None and self._admit(partition, *run.term):
            return False
        self._judged[partition] = max(self._judged.get(partition, 0), run.end)
        return True

    async def highest_epoch(self, fence: str) -> int:
        """The highest epoch the topic holds for ``fence`` (``events.fence``): every
        partition's terms judged to its end, from the headers (nothing decoded)."""
        highest = 0
        for partition in range(self.partitions):
            await self._judge_up_to(partition, await self.end_offset(partition))
            highest = max(highest, self._terms.get(partition, {}).get(fence, 0))
        return highest

    def _judge(self, partition: int, record: Any) -> int:
        """The epoch that fences ``record`` (0: it stands), judged in offset order."""
        at = record.offset
        if at < self._judged.get(partition, 0):
            return self._dropped.get(partition, {}).get(at, 0)
        # (offsets between are no records: transaction markers, aborted transactions)
        self._judged[partition] = at + 1
        term = None
        for key, value in record.headers or ():  # (a plain loop: this runs per record)
            if key == TERM_HEADER:
                term = bytes(value)
                break
        if term is None:
            return 0
        parsed = self._parsed.get(term)
        if parsed is None:  # the records of a term share its header: parsed once
            if len(self._parsed) >= PARSED_TERMS:
                self._parsed.clear()
            fence, _, text = term.decode(errors="replace").rpartition(":")
            parsed = self._parsed[term] = (fence, int(text) if text.isdigit() else 0)
        stale = self._admit(partition, *parsed)
        if stale:
            self._dropped.setdefault(partition, {})[at] = stale
        return stale

    def _admit(self, partition: int, fence: str, epoch: int) -> int:
        """The rule :meth:`_judge` and :meth:`_judge_own` share: the epoch that fences
        a record of term ``epoch`` of ``fence`` judged next in ``partition``, in offset
        order (0: it stands, and its epoch is then the highest of its fence there)."""
        terms = self._terms.setdefault(partition, {})
        highest = terms.get(fence, 0)
        if epoch >= highest:
            terms[fence] = epoch
            return 0
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
            offset = self._past_own(partition, offset, wanted)
            until = self._own.next_without(partition, offset, wanted)
            stop, records = await self._call(
                "read",
                lambda at=offset, to=until: self._read(partition, at, None, wanted, to),  # type: ignore[misc]
            )
            out += records
            if until is None or stop < until:
                return stop, out
            offset = stop

    def _past_own(self, partition: int, offset: int, wanted: frozenset[bytes]) -> int:
        """Where a read of ``wanted`` kinds from ``offset`` goes on: past the runs of
        this log's own records there that hold none of them, judged as it goes (not
        past a run of an older term than the partition holds: that one is read)."""
        self._own.drop_before(partition, offset)  # (a reader that keeps up never judges)
        while True:
            run = self._own.at(partition, offset)
            if run is None or run.kinds & wanted:
                return offset
            if self._judged.get(partition, 0) < run.end and not self._judge_own(partition, run):
                return offset
            offset = run.end

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
        judged = self._judged
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
                    stale = self._judge(partition, record)
                else:  # (no term: it stands; what _judge does, without the call per record)
                    stale = 0
                    if at >= judged.get(partition, 0):
                        judged[partition] = offset
                key = record.key
                if kinds is not None and key and not key.isdigit() and key not in kinds:
                    continue  # a kind not asked for, told by the key
                try:
                    env = decode(record.value)
                except (DecodeError, TypeError):
                    self._undecodable(record.value, partition, at)
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

    def _undecodable(self, value: bytes | None, partition: int, offset: int) -> NoReturn:
        """Raise what is wrong with a record that did not decode, naming where it is."""
        if value is None:
            raise LogCorruptedError("record has no value", partition=partition, offset=offset)
        try:
            decode(value)
        except DecodeError as exc:
            raise LogCorruptedError(
                f"record does not decode: {exc}",
                partition=partition,
                offset=offset,
                path=f"kafka:{self.settings.topic}",
            ) from None
        raise LogCorruptedError("record does not decode", partition=partition, offset=offset)

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
        """Stop the clients. A caller cancelled meanwhile (a deposed leader's work is
        cancelled at once) gets its ``CancelledError``, and the clients are stopped all
        the same: none is left running unowned (nor is a term's producer dropped
        earlier and still stopping)."""
        terms = self.terms.release()
        clients = (
            self._producer,
            self._consumer,
            self._probe_consumer,
            self._ends,
            self._waiter,
            *terms,
        )
        self._producer = self._consumer = self._probe_consumer = self._ends = self._waiter = None
        self._stop_in_background(clients)
        await asyncio.shield(asyncio.gather(*self._stopping))

    async def _broken(self, generation: int | None = None) -> None:
        """A client of ``generation`` failed (the broker went away): drop both; the
        next call starts new ones, since clients that lived through a broker restart
        can misbehave. Clients already replaced since are left alone."""
        if generation is not None and generation != self._generation:
            return
        self._needs_restart = True
        with contextlib.suppress(Exception):
            await self.close()

    async def _stopped_under_us(self, generation: int) -> None:
        """A ``CancelledError`` reached a call: if the calling task is being cancelled,
        let it through; otherwise it came from a client another caller stopped (a
        restart after the broker went away), and the call failed like any other."""
        if being_cancelled():
            raise asyncio.CancelledError
        await self._broken(generation)

    async def _ensure(self) -> None:
        if not self._needs_restart:
            return
        async with self._restart_lock:  # callers share the log: restart it once
            if self._needs_restart:
                await self.start()  # raises LogError while the broker is still away
                self._needs_restart = False

    @staticmethod
    def _need(client: Any) -> Any:
        if client is None:
            raise LogError("the Kafka log is not started (await start())")
        return client


async def _stop_clients(clients: Sequence[Any]) -> None:
    for client in clients:
        if client is not None:
            try:  # each one stopped, whatever the other did
                if isinstance(client, AIOKafkaProducer):
                    await settle(client)
                await client.stop()
            except asyncio.CancelledError:
                # a client whose tasks were already cancelled says so on stop(); this
                # task is shielded from its caller's cancellation, so it goes on
                pass
            except Exception:  # stopping a broken client: nothing more to do
                pass


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def replace_partition(env: Envelope, partition: int) -> Envelope:
    """The envelope as stored: offset unknown until Kafka assigns it."""
    return msgspec.structs.replace(env, partition=partition, offset=-1)


__all__ = ["KafkaLog", "KafkaSettings", "create_topic"]

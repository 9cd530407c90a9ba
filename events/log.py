"""The ``EventLog`` protocol: an append-only, partitioned sequence of envelopes.

Every backend (in-memory, file, Kafka) honours the same contract, checked by one shared
test suite (``tests/events/test_log_contract.py``):

- offsets in a partition start at 0 and grow by one per record, without gaps;
- ``append`` takes any number of envelopes, and is atomic per *chunk*: a bus whose
  transport has a size limit (the log server's frame, a Kafka batch) splits a call
  into chunks under it, each stored whole or not at all, in order (another writer's
  records may fall between two); a call that fits one chunk (and every call on the
  in-memory and file logs, and a leader term's on Kafka) is atomic.
  A call that fails part-way (the writer crashed, the bus went away) has stored a
  prefix of its records: a writer that resumes after a restart counts the records of
  its last append that reached the log (``shards.control``). A record that alone is
  over the limit is refused, before anything of the call is stored, with
  :class:`~events.errors.RecordTooLargeError` naming the limit and the setting that
  raises it; the returned offsets are those the records got;
- a record, once appended, reads back equal forever (only its ``offset`` and
  ``partition`` are filled in by the log);
- reads never skip a record; a record that cannot be read is an error naming its offset.

The protocol is asynchronous because the distributed backend is; local backends
complete without suspending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from events.codec import kind_of
from events.errors import LogCorruptedError
from events.types import Envelope, RecordQuarantined


class EventLog(Protocol):
    """A partitioned, append-only log of envelopes."""

    @property
    def partitions(self) -> int:
        """Number of partitions; fixed for the life of the log."""
        ...

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        """Append ``envelopes`` to ``partition`` in order; return their offsets.

        The log sets each stored envelope's ``offset`` and ``partition``; any value the
        caller put there is replaced. Raises ``ValueError`` for a partition out of range,
        :class:`~events.errors.RecordTooLargeError` (nothing stored) for a record over
        the bus's limit. A call over the bus's chunk size is split and stored chunk by
        chunk (see the module's contract): one that raises part-way may have stored a
        prefix. Calling it twice appends twice: idempotence is the handlers' job
        (decision ids)."""
        ...

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        """Return up to ``limit`` records of ``partition`` starting at ``offset``.

        Returns an empty list at or past the end. Never blocks waiting for new records.
        Raises :class:`~events.errors.LogCorruptedError` for a record that cannot be read.
        """
        ...

    async def end_offset(self, partition: int) -> int:
        """The offset the next appended record of ``partition`` will get."""
        ...

    async def close(self) -> None:
        """Flush and release resources; safe to call twice."""
        ...


def check_partition(partition: int, partitions: int) -> None:
    """Raise ``ValueError`` unless ``0 <= partition < partitions``."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} out of range (log has {partitions})")


async def read_kinds(
    log: EventLog, partition: int, offset: int, kinds: Sequence[str]
) -> tuple[int, list[Envelope]]:
    """The records of ``partition`` from ``offset`` whose event is of one of ``kinds``
    (tags: ``"bind"``, ``"summary"``...), and the offset after the last record scanned.

    A backend that can filter without decoding what it skips (the log server filters
    on its side; Kafka records are keyed by kind) does it through its own
    ``read_kinds``; any other log is read whole and filtered here."""
    own = getattr(log, "read_kinds", None)
    if own is not None:
        stop, records = await own(partition, offset, kinds)
        return int(stop), list(records)
    records = await log.read(partition, offset)
    stop = records[-1].offset + 1 if records else offset
    wanted = set(kinds)
    return stop, [env for env in records if kind_of(env) in wanted]


async def long_poll_or_sleep(
    log: EventLog, offsets: Mapping[int, int], seconds: float, sleep: float
) -> None:
    """Wait until a partition of ``offsets`` (partition → offset) holds a record at or
    after its offset, for at most ``seconds``, where the log can long-poll (``wait_any``:
    on Kafka the broker holds a fetch on each partition until one grows, on the log
    server its ``wait`` request; so an idle reader costs one request per wait, not a read
    every few milliseconds); on any other log (memory, files), sleep ``sleep`` seconds
    (the caller then reads to see)."""
    own = getattr(log, "wait_any", None)
    if own is not None:
        await own(offsets, seconds)
    else:
        await asyncio.sleep(sleep)


async def count_kinds(
    log: EventLog, partition: int, offset: int, kinds: Sequence[str]
) -> tuple[int, int]:
    """How many records of ``partition`` from ``offset`` are of one of ``kinds``, and the
    offset after the last record scanned: :func:`read_kinds` without the records.

    The log server counts on its side (nothing crosses the socket but two integers);
    any other log is read through :func:`read_kinds` and counted here."""
    own = getattr(log, "count_kinds", None)
    if own is not None:
        stop, count = await own(partition, offset, kinds)
        return int(stop), int(count)
    stop, records = await read_kinds(log, partition, offset, kinds)
    return stop, len(records)


async def read_past_unreadable(
    log: EventLog, partition: int, offset: int, limit: int | None = None
) -> tuple[list[Envelope], list[tuple[int, str]], int]:
    """:meth:`EventLog.read`, going past records that cannot be decoded (a poison record
    another writer put in the partition) instead of stopping at them for ever.

    Returns the records read, the (offset, reason) of each record skipped, and the offset
    to read from next. Up to ``limit`` offsets are covered, skipped ones included. Each
    failed read moves past one offset, so the loop ends at the partition's end."""
    records: list[Envelope] = []
    skipped: list[tuple[int, str]] = []
    at = offset
    while limit is None or at < offset + limit:
        want = None if limit is None else offset + limit - at
        try:
            batch = await log.read(partition, at, want)
        except LogCorruptedError as exc:
            if exc.partition != partition or exc.offset < at:
                raise
            if exc.offset > at:
                records.extend(await log.read(partition, at, exc.offset - at))
            skipped.append((exc.offset, exc.reason))
            at = exc.offset + 1
            continue
        records.extend(batch)
        if batch:
            at = batch[-1].offset + 1
        break
    return records, skipped, at


async def read_rest(
    log: EventLog, partition: int, offset: int = 0, *, step: int = 50_000
) -> tuple[list[Envelope], list[tuple[int, str]], int]:
    """Every record of ``partition`` from ``offset`` to its end, read ``step`` offsets at
    a time past what cannot be decoded (:func:`read_past_unreadable`): the records, the
    (offset, reason) of those skipped, and the offset after the last."""
    records: list[Envelope] = []
    unreadable: list[tuple[int, str]] = []
    while True:
        batch, skipped, offset = await read_past_unreadable(log, partition, offset, step)
        if not batch and not skipped:
            return records, unreadable, offset
        records += batch
        unreadable += skipped


async def read_quarantined(log: EventLog, partition: int) -> tuple[list[Envelope], list[int]]:
    """Every record of ``partition``, past those that cannot be read and that a
    component of the run skipped and recorded (``RecordQuarantined``), and the offsets
    of those: replay skips them as the run did. Any other record that cannot be read is
    an error, as in :meth:`EventLog.read`."""
    records, unreadable, _ = await read_rest(log, partition)
    excused = quarantined_in(records)
    for at, reason in unreadable:
        if at not in excused:
            raise LogCorruptedError(reason, partition=partition, offset=at)
    return records, [at for at, _ in unreadable]


def quarantined_in(records: Iterable[Envelope]) -> set[int]:
    """The offsets that the ``RecordQuarantined`` records among ``records`` (all of one
    partition) name: the records of that partition a component of the run skipped."""
    return {e.event.offset for e in records if isinstance(e.event, RecordQuarantined)}

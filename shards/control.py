"""The control worker: the coordinator's I/O around its pure fold and passes.

Each ``poll``:

1. *relays* what shards reported in their partitions (placements, hand-backs,
   reservation answers, evictions, outcomes: ``events.types.REPORTS``) into the control
   partition, as copies with ``stream="relay"``, ``producer="relay-<shard>"`` and
   ``causation`` = the offset in the shard's partition. The order of the copies is the
   order the fold sees, so the coordinator stays a function of the control partition;
2. *folds* the new control records (:class:`Coordinator`), a slice of at most
   ``fold_slice`` at a time, and after each slice runs one pass and appends its outputs
   (records for shard partitions and for the control partition), each with
   ``causation`` = the offset of the last record folded and producer ``router``.

Crash safety is a shard's (``shards.worker``): a pass ran right after the record its
outputs name, and they are appended partition by partition, in causation order, each
append stored chunk by chunk where the bus has a size limit (``events.log``). A
restarted worker folds the control partition from the start (or from its newest
snapshot), re-running each recorded pass where it ran (the pass points are the
causations of router records in any partition), and appends what a pass had not got
into some partition yet, counted in records (``written_count``): a crash between two
chunks of one append leaves neither a duplicate nor a gap. An input folded after the
last recorded pass is owed a pass, which the first poll runs.

Snapshots: with ``snapshot_every`` set, the worker appends its state to the control
partition (``SnapshotTaken`` parts, producer ``coordinator``) after a pass, every that
many folded records (and, with ``snapshot_per_pod``, at least that many per pod the
coordinator holds, as a shard does): the coordinator, where the fold stands and, per
partition, the offset of the last record it appended. A restarted worker restores the
newest one and scans each partition only after that offset; one that cannot be
restored is reported and the partition is folded from the start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Final

from engine.config import SchedulerConfig
from events.codec import kind_of
from events.errors import LogCorruptedError
from events.log import EventLog, read_kinds, read_past_unreadable
from events.types import (
    REPORTS,
    Envelope,
    PodRouted,
    RecordQuarantined,
    ReservationCommitted,
    ReservationRequested,
    SnapshotTaken,
)
from shards.coordinator.coordinator import RELAY, ROUTER, Coordinator, Output
from shards.coordinator.snapshot import (
    COORDINATOR,
    restore_coordinator,
    snapshot_coordinator,
)
from shards.extenders.asker import Asker
from shards.worker import append_quarantined, append_snapshot, newest_snapshot, snapshot_due

logger = logging.getLogger(__name__)

WHOLE: Final = 1 << 62
"""A count of router records that stands for all of a pass's outputs (where a
snapshot restored the worker: the pass before it reached every partition whole)."""
FOLD_SLICE: Final = 1000
"""Control records folded before a pass and its outputs: a burst of pods reaches the
shards in slices they start on while the coordinator folds the next."""

REPORT_KINDS = tuple(str(kind.__struct_config__.tag) for kind in REPORTS)
REPORT_TAGS = frozenset(REPORT_KINDS)


class ControlWorker:
    def __init__(
        self,
        coordinator: Coordinator,
        log: EventLog,
        *,
        snapshot_every: int = 0,
        snapshot_per_pod: int = 0,
        config: SchedulerConfig | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.log = log
        self.config = config
        """The configuration a snapshot's coordinator is restored with when the log
        recorded none (the defaults, or one given in code)."""
        self.fold_slice = FOLD_SLICE
        n = coordinator.n
        self.partition = coordinator.control
        self.position = 0
        self.written = [-1] * (n + 1)
        """Per partition: the causation of the last router record it holds."""
        self.written_count = [0] * (n + 1)
        """Per partition: how many router records of that causation it holds. A bus
        stores a large append chunk by chunk (``events.log``), so a worker that died
        between two chunks left the first records of a pass's outputs there: its
        successor re-runs the pass and appends exactly the rest (:meth:`_append`)."""
        self.last_own = [-1] * (n + 1)
        """Per partition: the offset of the last record this worker (or a predecessor)
        appended there; a restart from a snapshot scans only after it."""
        self.snapshot_every = snapshot_every
        self.snapshot_per_pod = snapshot_per_pod
        self.snapshot_at = 0
        self.snapshots = 0
        self.restored_from = -1
        self.relay_from = [0] * n
        self._recovered = False
        self._owed = -1
        """An input after the last recorded pass: the next poll runs that pass."""
        self._outputs = 0
        """Outputs of the last pass: a snapshot follows only a pass that left a record
        (replay re-runs recorded passes only; the state after one that left none may
        differ in what a pass clears)."""
        self.folded = 0
        self.relayed = 0
        self.quarantined: set[int] = set()
        """Offsets of control records skipped and recorded as such."""
        self.passes = 0
        self.prepared_at: dict[str, float] = {}
        """Reservation → wall time its requests were appended (for commit latency)."""
        self.commit_seconds: list[float] = []
        self.asker = Asker()
        """Calls the HTTP extenders for the units decided here (``background`` in the
        service)."""
        """Wall seconds from appending a gang's prepare to appending its commit."""

    def __repr__(self) -> str:
        return f"ControlWorker(position={self.position}, relay_from={self.relay_from})"

    @property
    def control(self) -> Coordinator:
        return self.coordinator

    def reading_from(self) -> dict[int, int]:
        """Per partition, the offset the next poll reads from: each shard's, where the
        relay goes on; the control partition's, where the fold goes on."""
        relayed = self.coordinator.relayed
        offsets = {s: max(start, relayed[s] + 1) for s, start in enumerate(self.relay_from)}
        offsets[self.partition] = self.position
        return offsets

    async def recover(self, *, use_snapshots: bool = True) -> int:
        """Rebuild the coordinator from its partition (its newest snapshot, if any, and
        what follows), re-running each recorded pass where it ran; append what the
        last of them had not got into every partition, and return how many records that
        was."""
        n = self.coordinator.n
        start = [0] * (n + 1)
        if use_snapshots:
            found = await newest_snapshot(self.log, self.partition, COORDINATOR)
            if found is not None:
                try:
                    restored = restore_coordinator(
                        [e.event for e in found if isinstance(e.event, SnapshotTaken)],
                        self.coordinator.sharding,
                        self.config,
                    )
                    (
                        self.coordinator,
                        self.position,
                        self.written,
                        self.last_own,
                        self.relay_from,
                    ) = restored
                    # a snapshot follows a pass whose appends all returned: whole
                    self.written_count = [WHOLE] * (n + 1)
                    self.snapshot_at = self.position
                    self.restored_from = found[0].offset
                    start = [offset + 1 for offset in self.last_own]
                except ValueError as exc:
                    logger.warning(
                        "coordinator snapshot not restored; folding from the start "
                        "offset=%d error=%s",
                        found[0].offset,
                        exc,
                    )
        passes: set[int] = set()
        for partition in range(n + 1):
            offset = start[partition]
            while True:
                records, unreadable, offset = await read_past_unreadable(
                    self.log, partition, offset, 10_000
                )
                if not records and not unreadable:
                    break
                for env in records:
                    if isinstance(env.event, RecordQuarantined) and partition == self.partition:
                        self.quarantined.add(env.event.offset)
                    if env.producer == ROUTER:
                        passes.add(env.causation)
                        self._count_written(partition, env.causation)
                    if env.producer in (ROUTER, COORDINATOR) or (
                        partition == self.partition and env.stream == RELAY
                    ):
                        self.last_own[partition] = env.offset
        coordinator = self.coordinator
        last_input = -1
        appended = 0
        skipped: list[tuple[int, str]] = []
        while True:
            records, unreadable, self.position = await read_past_unreadable(
                self.log, self.partition, self.position, 10_000
            )
            skipped += unreadable
            if not records and not unreadable:
                break
            for env in records:
                coordinator.apply(env)
                if env.producer not in (ROUTER, COORDINATOR):
                    last_input = env.offset
                if env.offset in passes:
                    appended += await self._append(coordinator.schedule(), env.offset, env.time)
        if last_input > max(passes, default=-1):
            self._owed = last_input
        coordinator.engine.extenders.unanswered()  # asks with no answer in the log: again
        self._recovered = True
        await self._quarantine(skipped + coordinator.engine.unfolded)
        return appended

    async def _quarantine(self, skipped: list[tuple[int, str]]) -> None:
        """Record the control records skipped (:func:`append_quarantined`); empties the
        engine's list of records its fold refused."""
        skipped = list(skipped)
        self.coordinator.engine.unfolded.clear()
        last = await append_quarantined(
            self.log, self.partition, skipped, self.quarantined, COORDINATOR, self.coordinator.now
        )
        if last is not None:
            self.last_own[self.partition] = last

    async def poll(self) -> int:
        """Relay what shards reported, fold what is new (a pass after each slice);
        return how many records were appended."""
        appended = 0 if self._recovered else await self.recover()
        appended += await self._relay()
        appended += await self._fold()
        engine = self.coordinator.engine
        if engine.extenders.outbox:
            # the units the coordinator decides itself: it asks their extenders
            appended += await self.asker.run(
                engine,
                engine.config.extenders,
                self.log,
                self.partition,
                f"{COORDINATOR}/extenders",
            )
        if (
            self._outputs
            and not engine.extenders.in_flight
            and snapshot_due(
                self.position - self.snapshot_at,
                len(self.coordinator.engine.pods) + len(self.coordinator.engine.state.index),
                self.snapshot_every,
                self.snapshot_per_pod,
            )
        ):
            await self._snapshot()
        return appended

    async def _snapshot(self) -> None:
        parts = snapshot_coordinator(
            self.coordinator, self.position, self.written, self.last_own, self.relay_from
        )
        offsets = await append_snapshot(
            self.log,
            self.partition,
            parts,
            at=self.coordinator.now,
            causation=self.position - 1,
            producer=COORDINATOR,
        )
        self.last_own[self.partition] = offsets[-1]
        self.snapshot_at = self.position
        self.snapshots += 1

    async def _relay(self) -> int:
        n = self.coordinator.n
        copies: list[Envelope] = []
        for shard in range(n):
            start = max(self.relay_from[shard], self.coordinator.relayed[shard] + 1)
            try:
                stop, records = await read_kinds(self.log, shard, start, REPORT_KINDS)
            except LogCorruptedError:
                # a record of the shard's that does not decode (the shard quarantines
                # it): read past it, and keep the reports
                records, _, stop = await read_past_unreadable(self.log, shard, start)
                records = [env for env in records if kind_of(env) in REPORT_TAGS]
            self.relay_from[shard] = max(stop, start)
            producer = f"{RELAY}-{shard}"
            copies.extend(
                Envelope(
                    event=env.event,
                    time=env.time,
                    stream=RELAY,
                    causation=env.offset,
                    producer=producer,
                )
                for env in records
                if isinstance(env.event, REPORTS)
            )
        if not copies:
            return 0
        offsets = await self.log.append(copies, self.partition)
        self.last_own[self.partition] = offsets[-1]
        self.relayed += len(copies)
        return len(copies)

    async def _fold(self) -> int:
        """Fold the new control records, ``fold_slice`` at a time, each slice followed
        by a pass whose outputs are appended before the next slice is folded."""
        records, unreadable, position = await read_past_unreadable(
            self.log, self.partition, self.position
        )
        coordinator = self.coordinator
        appended = 0
        if unreadable:
            self.position = position
            await self._quarantine(unreadable)
        owed, self._owed = self._owed, -1
        if not records and owed >= 0:
            return await self._append(coordinator.schedule(), owed, coordinator.now)
        for start in range(0, len(records), self.fold_slice):
            self._outputs = 0
            last_input = owed
            last_time = coordinator.now
            folding = records[start : start + self.fold_slice]
            coordinator.apply_all(folding)
            for env in reversed(folding):
                if env.producer not in (ROUTER, COORDINATOR):
                    last_input, last_time = env.offset, env.time
                    break
            owed = -1
            self.position = records[min(start + self.fold_slice, len(records)) - 1].offset + 1
            self.folded += min(self.fold_slice, len(records) - start)
            if last_input >= 0:
                appended += await self._append(coordinator.schedule(), last_input, last_time)
        if coordinator.engine.unfolded:
            await self._quarantine(coordinator.engine.unfolded)
        return appended

    def _count_written(self, partition: int, cause: int) -> None:
        """Count a router record of ``cause`` found in ``partition`` (in offset order:
        a partition's router records come in the order of their causes)."""
        if cause > self.written[partition]:
            self.written[partition], self.written_count[partition] = cause, 1
        elif cause == self.written[partition]:
            self.written_count[partition] += 1

    async def _append(self, outputs: Sequence[Output], cause: int, at: int) -> int:
        """Append a pass's outputs, caused by record ``cause``, to each partition that
        does not hold them yet: the restart rule counts records, not passes. A
        partition whose last router records are of ``cause`` got the first
        ``written_count`` of them before a restart (an append stored in chunks and
        cut between two, or a pass that reached some partitions only): the same pass,
        re-run, derives the same outputs in the same order, so exactly those are
        skipped and the rest appended. One of an earlier cause holds them all."""
        self.passes += 1
        self._outputs = len(outputs)
        batches: dict[int, list[Envelope]] = {}
        stamp = max(self.coordinator.now, at)
        written = self.written
        for partition, event in outputs:
            batch = batches.get(partition)
            if batch is None:
                if cause < written[partition]:
                    continue  # appended before a restart
                batch = batches[partition] = []
            batch.append(Envelope(event=event, time=stamp, causation=cause, producer=ROUTER))
        appended = 0
        for partition in sorted(batches):
            batch = batches[partition]
            total = len(batch)
            if cause == self.written[partition]:
                batch = batch[self.written_count[partition] :]
            if batch:
                offsets = await self.log.append(batch, partition)
                self.last_own[partition] = offsets[-1]
                appended += len(batch)
                self._timestamps(batch)
            self.written[partition], self.written_count[partition] = cause, total
        return appended

    def _timestamps(self, batch: list[Envelope]) -> None:
        now = time.perf_counter()
        for env in batch:
            event = env.event
            if type(event) is PodRouted:
                continue  # (most records: one type test, not two)
            if isinstance(event, ReservationRequested) and not event.at_once:
                self.prepared_at.setdefault(event.rid, now)
            elif isinstance(event, ReservationCommitted):
                started = self.prepared_at.pop(event.rid, None)
                if started is not None:
                    self.commit_seconds.append(now - started)

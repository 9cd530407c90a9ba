"""The shard worker: consume the log, fold it into the engine, append decisions.

Each ``poll`` reads everything new in the shard's partition, folds it, and, if any input
(not a decision) was folded, runs one scheduling pass. The decisions are appended with
``causation`` = the offset of the last input folded before the pass: that is what lets
``replay`` run the very same passes and compare. A bus stores a large append chunk by
chunk (``events.log``): a shard that died between two chunks left the first of its
last pass's decisions; the restarted one re-runs that pass and appends the rest.

Records travel in batches both ways: a poll reads everything new in as few reads as the
bus needs, and a pass's decisions go out in one append. What the worker appended itself
(its decisions, snapshots) is already applied, so it is not read back:
the worker keeps the runs of offsets its appends got and reads around them (over a
socket or Kafka, reading back and decoding its own decisions was half of what a shard
process read, and a third of its transport cost). A restarted worker has no such runs
and reads its predecessor's records, as it must.

Snapshots: with ``snapshot_every`` set, after a pass with decisions that comes at least
that many records after the previous snapshot (and, with ``snapshot_per_pod``, at least
that many records for each pod the shard holds), the worker appends its state
(``SnapshotTaken`` parts, ``engine/snapshot.py``). A restarted worker looks for the
newest complete snapshot from the end of its partition backwards, restores it, and
replays only the records after it; a snapshot that cannot be restored is reported and
the partition is replayed from the start instead. ``replay --verify`` checks every
snapshot against the state it re-derives.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence

from engine.config import SchedulerConfig
from engine.engine import Engine
from engine.snapshot import SnapshotError, assemble, restore, snapshot_events
from events.errors import LogCorruptedError
from events.log import EventLog, read_past_unreadable, read_rest
from events.types import (
    Envelope,
    RecordQuarantined,
    SnapshotTaken,
    is_decision,
    is_output_of,
)
from shards.extenders.asker import Asker

logger = logging.getLogger(__name__)
SNAPSHOT_EVERY = 50_000
"""Records between snapshots by default in service (a snapshot of a large shard costs
about as much as a few hundred passes; replaying 50,000 records costs far more)."""
SNAPSHOT_PER_POD = 4
"""In service, also at least this many records between snapshots for each pod held. A
snapshot costs about 18 µs per live pod and a shard about 25 µs per record (two records
a pod), so writing them costs at most about 18 / (4 * 25), a fifth, of the time spent
on the records since the last one, however large the state grows: a fixed count alone
let a shard holding 50,000 pods spend most of its time on snapshots. Nodes count as
pods here: a node costs about 11 µs in a snapshot (the coordinator's, at 130,000 nodes
and no pods: 1.4 s), so a large cluster with few pods is not snapshotted every 50,000
records either."""


def snapshot_due(since: int, held: int, every: int, per_pod: int) -> bool:
    """Whether a worker ``since`` records past its last snapshot, holding ``held`` pods
    and nodes, writes one now (``every`` 0: never)."""
    return every > 0 and since >= max(every, per_pod * held)


class ShardWorker:
    def __init__(
        self,
        engine: Engine,
        log: EventLog,
        *,
        partition: int = 0,
        snapshot_every: int = 0,
        snapshot_per_pod: int = 0,
    ) -> None:
        self.engine = engine
        self.log = log
        self.partition = partition
        self.snapshot_every = snapshot_every
        """Records between snapshots (0: never)."""
        self.snapshot_per_pod = snapshot_per_pod
        """And at least this many records between them per pod held (0: no such floor)."""
        self.snapshot_at = 0
        """The position at the last snapshot written or restored."""
        self.snapshots = 0
        self.snapshot_seconds = 0.0
        """Wall seconds spent writing snapshots."""
        self.restored_from = -1
        """Offset of the snapshot the last recovery restored (-1: it replayed it all)."""
        self.name = f"shard-{engine.shard}"
        self.position = 0
        self._own_until = 0
        """Records below this offset that this worker appended itself are already
        applied (a restarted worker has none, so it folds its predecessor's)."""
        self._own: deque[tuple[int, int]] = deque()
        """Runs ``[start, end)`` of offsets this worker appended at or after
        ``position``, in order: reads go around them (:meth:`reading_from`)."""
        self.passes = 0
        self.pass_seconds = 0.0
        self._owed = -1
        """An input after the last recorded pass, left by a predecessor: the next poll
        runs that pass even if nothing new arrives."""
        self.quarantined: set[int] = set()
        """Offsets of the records of this partition skipped and recorded as such."""
        self.asker = Asker()
        """Calls the HTTP extenders (``background`` in the service)."""

    def __repr__(self) -> str:
        return f"ShardWorker({self.name}, position={self.position}, passes={self.passes})"

    def stats(self) -> dict[str, float]:
        extenders = self.asker.stats.as_dict() if self.asker.stats.calls else {}
        return {
            "position": self.position,
            "passes": self.passes,
            "pass_seconds": self.pass_seconds,
            **extenders,
        }

    @classmethod
    async def recover(
        cls,
        log: EventLog,
        config: SchedulerConfig | None = None,
        *,
        shard: int = 0,
        partition: int = 0,
        snapshot_every: int = 0,
        snapshot_per_pod: int = 0,
    ) -> ShardWorker:
        """A worker for a shard that ran before (killed, or its bus failed): its state
        is restored from its newest snapshot, if any, and the records after it are
        replayed, re-running each recorded pass where it ran, so that even what passes
        keep beyond their decisions (reasons already said, back-off) is as it was.
        Decisions that were computed but never appended are computed again by the
        first poll."""
        from shards.plugins import installed

        # the log may record other configurations than ``config`` (earlier runs)
        registry = installed().registry
        from shards.replay import Resume, replay

        name = f"shard-{shard}"
        resume: Resume | None = None
        found = await newest_snapshot(log, partition, name)
        if found is not None:
            parts = [e.event for e in found if isinstance(e.event, SnapshotTaken)]
            try:
                engine = restore(assemble(parts), config, shard=shard, registry=registry)
                resume = Resume(engine, parts[0].position)
            except SnapshotError as exc:
                logger.warning(
                    "snapshot not restored; replaying the partition from the start "
                    "shard=%d offset=%d error=%s",
                    shard,
                    found[0].offset,
                    exc,
                )
        start = resume.position if resume is not None else 0
        records, unreadable, position = await read_rest(log, partition, start)
        result = replay(
            records,
            config,
            verify=True,
            shard=shard,
            resume=resume,
            registry=registry,
            cut_tail=True,
        )
        if result.mismatch is not None:
            raise LogCorruptedError(
                f"shard {shard} cannot rebuild its state: {result.mismatch}",
                partition=partition,
                offset=result.mismatch.offset,
            )
        own_until = position
        if result.unappended:
            # the last pass's append was cut between two chunks: the rest, now
            # (replay's engine holds them already, as the live one did)
            offsets = await log.append(
                [
                    Envelope(
                        event=d,
                        time=result.unappended_time,
                        causation=result.unappended_cause,
                        producer=name,
                    )
                    for d in result.unappended
                ],
                partition,
            )
            logger.warning(
                "appended the rest of a pass cut by a restart shard=%d cause=%d decisions=%d",
                shard,
                result.unappended_cause,
                len(offsets),
            )
            own_until = offsets[-1] + 1
        worker = cls(
            result.engine,
            log,
            partition=partition,
            snapshot_every=snapshot_every,
            snapshot_per_pod=snapshot_per_pod,
        )
        worker.position, worker._own_until = position, own_until
        worker.snapshot_at = start
        worker.quarantined = {
            e.event.offset for e in records if isinstance(e.event, RecordQuarantined)
        }
        await worker._quarantine(unreadable + result.engine.unfolded)
        worker.restored_from = found[0].offset if resume is not None and found else -1
        worker.engine.extenders.unanswered()  # asks the log holds no answer to: sent again
        last_pass = max(
            (e.causation for e in records if e.producer == name and is_decision(e.event)),
            default=-1,
        )
        last_input = max((e.offset for e in records if not is_output_of(e, name)), default=-1)
        worker._owed = last_input if last_input > last_pass else -1
        return worker

    def reading_from(self) -> int:
        """The offset the next read starts at: ``position``, moved past the runs of
        records this worker appended itself that it has reached."""
        own = self._own
        while own and own[0][0] <= self.position:
            self.position = max(self.position, own.popleft()[1])
        return self.position

    def _appended(self, offsets: Sequence[int]) -> None:
        """Note the offsets an append of this worker got (runs of consecutive ones)."""
        own = self._own
        for offset in offsets:
            if own and own[-1][1] == offset:
                own[-1] = (own[-1][0], offset + 1)
            else:
                own.append((offset, offset + 1))

    async def _read_new(self) -> tuple[list[Envelope], list[tuple[int, str]]]:
        """Everything new in the partition but this worker's own records: one read
        per stretch between them (usually one), ``position`` moved past all of it."""
        records: list[Envelope] = []
        unreadable: list[tuple[int, str]] = []
        while True:
            start = self.reading_from()
            limit = self._own[0][0] - start if self._own else None
            batch, skipped, stop = await read_past_unreadable(
                self.log, self.partition, start, limit
            )
            records += batch
            unreadable += skipped
            self.position = max(start, stop)
            if limit is None or self.position < self._own[0][0]:
                return records, unreadable  # the end, or records not readable yet

    async def poll(self) -> int:
        """Fold what is new and run a pass if needed; return the decisions appended."""
        records, unreadable = await self._read_new()
        owed, self._owed = self._owed, -1
        if unreadable:
            await self._quarantine(unreadable)
        if not records and owed < 0:
            return await self._ask_extenders()  # (a recovered worker's unanswered asks)
        engine = self.engine
        last_input = owed
        name = self.name
        own_until = self._own_until
        folding: list[Envelope] = []
        for env in records:
            if env.offset < own_until and env.producer == name:
                continue
            if isinstance(env.event, SnapshotTaken) and env.producer == name:
                continue  # a predecessor's: folding it changes nothing
            folding.append(env)
            if not is_output_of(env, name):
                last_input = env.offset  # the router forwards decisions too: inputs here
        engine.apply_handed(folding)
        if engine.unfolded:
            await self._quarantine(engine.unfolded)
        if last_input < 0:
            return 0
        started = time.perf_counter()
        decisions = engine.schedule()
        self.pass_seconds += time.perf_counter() - started
        self.passes += 1
        if not decisions:
            return await self._ask_extenders()
        now = engine.now
        offsets = await self.log.append(
            [Envelope(event=d, time=now, causation=last_input, producer=name) for d in decisions],
            self.partition,
        )
        self._own_until = offsets[-1] + 1
        self._appended(offsets)
        asked = await self._ask_extenders()
        if not engine.extenders.in_flight and snapshot_due(
            self.position - self.snapshot_at,
            len(engine.pods) + len(engine.state.index),
            self.snapshot_every,
            self.snapshot_per_pod,
        ):
            await self._snapshot(last_input)
        return len(decisions) + asked

    async def _ask_extenders(self) -> int:
        """Call the extenders the pass asks for; their answers (inputs of the next
        pass, producer ``shard-N/extenders``) are appended to the partition."""
        if not self.engine.extenders.outbox:
            return 0
        return await self.asker.run(
            self.engine,
            self.engine.config.extenders,
            self.log,
            self.partition,
            f"{self.name}/extenders",
        )

    async def _quarantine(self, skipped: list[tuple[int, str]]) -> None:
        """Record what was skipped (:func:`append_quarantined`); ``skipped`` is emptied."""
        last = await append_quarantined(
            self.log, self.partition, skipped, self.quarantined, self.name, self.engine.now
        )
        skipped.clear()
        if last is not None:
            self._own_until = max(self._own_until, last + 1)

    async def _snapshot(self, cause: int) -> None:
        """Append the state as it is right after the pass caused by ``cause``."""
        started = time.perf_counter()
        parts = snapshot_events(self.engine, self.position, component=self.name)
        offsets = await append_snapshot(
            self.log,
            self.partition,
            parts,
            at=self.engine.now,
            causation=cause,
            producer=self.name,
        )
        self._own_until = offsets[-1] + 1
        self._appended(offsets)
        self.snapshot_at = self.position
        self.snapshots += 1
        self.snapshot_seconds += time.perf_counter() - started


async def append_quarantined(
    log_: EventLog,
    partition: int,
    skipped: Sequence[tuple[int, str]],
    known: set[int],
    component: str,
    at: int,
) -> int | None:
    """Append a ``RecordQuarantined`` for each record of ``partition`` that
    ``component`` skipped (undecodable, or refused by the fold: (offset, reason)) and
    that is not in ``known`` yet, so that the log says what was skipped and why; the
    component goes on. ``known`` gains them. The offset of the last record appended, or
    None if there was nothing new."""
    new = {offset: reason for offset, reason in skipped if offset not in known}
    if not new:
        return None
    for offset, reason in new.items():
        logger.warning(
            "record quarantined component=%s partition=%d offset=%d reason=%s",
            component,
            partition,
            offset,
            reason[:500],
        )
    known.update(new)
    offsets = await log_.append(
        [
            Envelope(
                event=RecordQuarantined(offset=o, reason=r[:1000], component=component),
                time=at,
                producer=component,
            )
            for o, r in sorted(new.items())
        ],
        partition,
    )
    return offsets[-1]


async def append_snapshot(
    log_: EventLog,
    partition: int,
    parts: Sequence[SnapshotTaken],
    *,
    at: int,
    causation: int,
    producer: str,
) -> list[int]:
    """Append a snapshot's parts in one call, stamped ``at`` (the component's time);
    their offsets. A bus that stores the call in chunks may keep only its first parts
    if the writer dies: an incomplete snapshot is never restored nor checked
    (:func:`newest_snapshot`, ``shards.replay.snapshots_in``)."""
    started = time.perf_counter()
    offsets = await log_.append(
        [Envelope(event=p, time=at, causation=causation, producer=producer) for p in parts],
        partition,
    )
    logger.info(
        "snapshot written producer=%s partition=%d offset=%d parts=%d bytes=%d seconds=%.3f",
        producer,
        partition,
        offsets[0],
        len(parts),
        sum(len(p.data) for p in parts),
        time.perf_counter() - started,
    )
    return offsets


async def newest_snapshot(
    log_: EventLog, partition: int, producer: str, *, window: int = 4096
) -> list[Envelope] | None:
    """The parts of ``producer``'s newest complete snapshot in ``partition``, searched
    from the end backwards in growing windows (None if it has none)."""
    high = await log_.end_offset(partition)
    while high > 0:
        low = max(high - window, 0)
        batch, _, _ = await read_past_unreadable(log_, partition, low, high - low)
        for env in reversed(batch):
            event = env.event
            if (
                isinstance(event, SnapshotTaken)
                and env.producer == producer
                and event.part == event.parts - 1
                and env.offset - event.part >= 0
            ):
                parts, _, _ = await read_past_unreadable(
                    log_, partition, env.offset - event.part, event.parts
                )
                if [p.event.part for p in parts if isinstance(p.event, SnapshotTaken)] == list(
                    range(event.parts)
                ) and all(p.producer == producer for p in parts):
                    return parts
        high = low
        window *= 2
    return None

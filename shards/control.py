"""The control worker: the router and coordinator's I/O around the pure fold.

Each ``poll``:

1. *relays* the reports shards appended to their partitions (hand-backs, summaries,
   reservation answers, outcomes: ``events.types.REPORTS``) into the control partition,
   as copies with ``stream="relay"``, ``producer="relay-<shard>"`` and ``causation`` =
   the offset in the shard's partition. The order of the copies is the order the fold
   sees, so the fold stays a function of the control partition alone;
2. *folds* the control partition (:class:`shards.router.Control`) and appends each
   record's outputs, with ``causation`` = that record's offset and producer ``router``.

Crash safety. The fold's outputs for control record ``k`` depend only on records
``0..k``, and outputs are appended per partition in causation order, one atomic append
per partition and poll. So a restarted worker scans each partition once for the
highest ``causation`` of a ``router`` record it holds, folds the control partition from
the start, and appends only outputs caused by later records: nothing is lost and
nothing is sent twice. Relaying resumes after the last copy the fold has seen (and a
copy of a copy is ignored by the fold in any case).
"""

from __future__ import annotations

import time

from events.log import EventLog
from events.types import REPORTS, Envelope, ReservationCommitted, ReservationRequested, ShardSummary
from shards.router import RELAY, ROUTER, Control

REPORT_KINDS = tuple(str(kind.__struct_config__.tag) for kind in REPORTS)


class ControlWorker:
    def __init__(self, control: Control, log: EventLog) -> None:
        self.control = control
        self.log = log
        self.partition = control.control
        self.position = 0
        self.written = [-1] * (control.n + 1)
        """Per partition: the causation of the last router record it holds."""
        self.relay_from = [0] * control.n
        self._recovered = False
        self.folded = 0
        self.relayed = 0
        self.prepared_at: dict[str, float] = {}
        """Reservation → wall time its requests were appended (for commit latency)."""
        self.commit_seconds: list[float] = []
        """Wall seconds from appending a gang's prepare to appending its commit."""

    def __repr__(self) -> str:
        return f"ControlWorker(position={self.position}, relay_from={self.relay_from})"

    async def recover(self) -> None:
        """Find what a previous incarnation already appended (a fresh log: nothing)."""
        for partition in range(self.control.n + 1):
            offset = 0
            while records := await self.log.read(partition, offset, 10_000):
                for env in records:
                    if env.producer == ROUTER and env.causation > self.written[partition]:
                        self.written[partition] = env.causation
                offset = records[-1].offset + 1
        self._recovered = True

    async def poll(self) -> int:
        """Fold what is new, relay what shards reported, fold again; return appended."""
        if not self._recovered:
            await self.recover()
        appended = await self._fold()
        appended += await self._relay()
        if appended:
            appended += await self._fold()
        return appended

    async def _relay(self) -> int:
        control = self.control
        copies: list[Envelope] = []
        fetch = getattr(self.log, "fetch", None)
        for shard in range(control.n):
            start = max(self.relay_from[shard], control.relayed[shard] + 1)
            if fetch is not None:  # the log server filters by kind: only reports travel
                stop, records = await fetch(shard, start, kinds=REPORT_KINDS)
                self.relay_from[shard] = max(stop, start)
            else:
                records = await self.log.read(shard, start)
                if records:
                    self.relay_from[shard] = records[-1].offset + 1
            if not records:
                continue
            producer = f"{RELAY}-{shard}"
            last_summary = -1
            for env in records:
                if isinstance(env.event, ShardSummary):
                    last_summary = env.offset
            for env in records:
                event = env.event
                if not isinstance(event, REPORTS):
                    continue
                if isinstance(event, ShardSummary) and env.offset != last_summary:
                    continue  # only the newest summary of a read matters
                copies.append(
                    Envelope(
                        event=event,
                        time=env.time,
                        stream=RELAY,
                        causation=env.offset,
                        producer=producer,
                    )
                )
        if not copies:
            return 0
        await self.log.append(copies, self.partition)
        self.relayed += len(copies)
        return len(copies)

    async def _fold(self) -> int:
        records = await self.log.read(self.partition, self.position)
        if not records:
            return 0
        control = self.control
        written = self.written
        outputs: dict[int, list[Envelope]] = {}
        for env in records:
            offset = env.offset
            for partition, event in control.apply(env):
                if offset <= written[partition]:
                    continue  # appended before a restart
                outputs.setdefault(partition, []).append(
                    Envelope(event=event, time=control.now, causation=offset, producer=ROUTER)
                )
        self.position = records[-1].offset + 1
        self.folded += len(records)
        appended = 0
        for partition in sorted(outputs):
            batch = outputs[partition]
            await self.log.append(batch, partition)
            written[partition] = batch[-1].causation
            appended += len(batch)
            self._timestamps(batch)
        return appended

    def _timestamps(self, batch: list[Envelope]) -> None:
        now = time.perf_counter()
        for env in batch:
            event = env.event
            if isinstance(event, ReservationRequested):
                self.prepared_at.setdefault(event.rid, now)
            elif isinstance(event, ReservationCommitted):
                started = self.prepared_at.pop(event.rid, None)
                if started is not None:
                    self.commit_seconds.append(now - started)

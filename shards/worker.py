"""The shard worker: consume the log, fold it into the engine, append decisions.

Each ``poll`` reads everything new in the shard's partition, folds it, and, if any input
(not a decision) was folded, runs one scheduling pass. The decisions are appended with
``causation`` = the offset of the last input folded before the pass: that is what lets
``replay`` run the very same passes and compare.
"""

from __future__ import annotations

import time

from engine.config import SchedulerConfig
from engine.scheduler import Engine
from events.errors import LogCorruptedError
from events.log import EventLog
from events.types import Envelope, is_decision


class ShardWorker:
    def __init__(self, engine: Engine, log: EventLog, *, partition: int = 0) -> None:
        self.engine = engine
        self.log = log
        self.partition = partition
        self.name = f"shard-{engine.shard}"
        self.position = 0
        self._own_until = 0
        """Records below this offset that this worker appended itself are already
        applied (a restarted worker has none, so it folds its predecessor's)."""
        self.passes = 0
        self.pass_seconds = 0.0
        self._owed = -1
        """An input after the last recorded pass, left by a predecessor: the next poll
        runs that pass even if nothing new arrives."""

    def __repr__(self) -> str:
        return f"ShardWorker({self.name}, position={self.position}, passes={self.passes})"

    def stats(self) -> dict[str, float]:
        return {"position": self.position, "passes": self.passes, "pass_seconds": self.pass_seconds}

    @classmethod
    async def recover(
        cls,
        log: EventLog,
        config: SchedulerConfig | None = None,
        *,
        shard: int = 0,
        partition: int = 0,
    ) -> ShardWorker:
        """A worker for a shard that ran before (killed, or its bus failed): its state
        is rebuilt by replaying its partition, re-running each recorded pass where it
        ran, so that even what passes keep beyond their decisions (reasons already
        said, back-off) is as it was. Decisions that were computed but never appended
        are computed again by the first poll."""
        from shards.replay import replay

        records: list[Envelope] = []
        while batch := await log.read(partition, len(records), 50_000):
            records.extend(batch)
        result = replay(records, config, verify=True, shard=shard)
        if result.mismatch is not None:
            raise LogCorruptedError(
                f"shard {shard} cannot rebuild its state: {result.mismatch}",
                partition=partition,
                offset=result.mismatch.offset,
            )
        worker = cls(result.engine, log, partition=partition)
        name = worker.name
        worker.position = worker._own_until = len(records)
        last_pass = max(
            (e.causation for e in records if e.producer == name and is_decision(e.event)),
            default=-1,
        )
        last_input = max(
            (e.offset for e in records if e.producer != name or not is_decision(e.event)),
            default=-1,
        )
        worker._owed = last_input if last_input > last_pass else -1
        return worker

    async def poll(self) -> int:
        """Fold what is new and run a pass if needed; return the decisions appended."""
        records = await self.log.read(self.partition, self.position)
        owed, self._owed = self._owed, -1
        if not records and owed < 0:
            return 0
        engine = self.engine
        last_input = owed
        name = self.name
        own_until = self._own_until
        for env in records:
            if env.offset < own_until and env.producer == name:
                continue
            engine.apply(env)
            if env.producer != name or not is_decision(env.event):
                last_input = env.offset  # the router forwards decisions too: inputs here
        if records:
            self.position = records[-1].offset + 1
        if last_input < 0:
            return 0
        started = time.perf_counter()
        decisions = engine.schedule()
        self.pass_seconds += time.perf_counter() - started
        self.passes += 1
        if not decisions:
            return 0
        now = engine.now
        offsets = await self.log.append(
            [Envelope(event=d, time=now, causation=last_input, producer=name) for d in decisions],
            self.partition,
        )
        self._own_until = offsets[-1] + 1
        return len(decisions)

"""The shard worker: consume the log, fold it into the engine, append decisions.

Each ``poll`` reads everything new in the shard's partition, folds it, and, if any input
(not a decision) was folded, runs one scheduling pass. The decisions are appended with
``causation`` = the offset of the last input folded before the pass: that is what lets
``replay`` run the very same passes and compare.
"""

from __future__ import annotations

import time

from engine.scheduler import Engine
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

    def __repr__(self) -> str:
        return f"ShardWorker({self.name}, position={self.position}, passes={self.passes})"

    def stats(self) -> dict[str, float]:
        return {"position": self.position, "passes": self.passes, "pass_seconds": self.pass_seconds}

    async def poll(self) -> int:
        """Fold what is new and run a pass if needed; return the decisions appended."""
        records = await self.log.read(self.partition, self.position)
        if not records:
            return 0
        engine = self.engine
        last_input = -1
        name = self.name
        own_until = self._own_until
        for env in records:
            if env.offset < own_until and env.producer == name:
                continue
            engine.apply(env)
            if env.producer != name or not is_decision(env.event):
                last_input = env.offset  # the router forwards decisions too: inputs here
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

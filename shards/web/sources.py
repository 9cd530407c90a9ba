"""Where the live view's snapshots come from: a replayed log (:class:`ReplaySource`,
``shoal replay LOG --serve``) or a running service's shards (:class:`LiveSource`,
``shoal serve``).

A replayed one-shard log can be shown after any of its offsets: the log is folded
again up to there (``replay(..., until=offset)``, as ``--until`` does; the last few
answers are kept). A log of several shards is shown at its end only: its partitions
are merged by time for the report, and no offset of one partition is a point in time
of the others.

A running service's view folds its bus into a report as it grows (each request reads
only what is new) and reads the nodes, cards and quotas from the shards this process
runs; with ``--role shard`` that is its own shard only.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from engine.config import SchedulerConfig
from engine.engine import Engine
from engine.framework.registry import Registry
from events.log import EventLog, read_past_unreadable
from events.types import SECOND, Envelope, QuotaDefined, QuotaSpec, SnapshotTaken, is_decision
from shards import wouldrun
from shards.replay import ReplayResult, replay
from shards.report import RunReport, merge
from shards.web.app import ViewError
from shards.web.view import RECENT, quota_specs, snapshot

KEPT: Final = 16
"""Snapshots of a replayed log kept, by offset."""
CHUNK: Final = 5000
"""Records of a partition a running service's view folds between yields."""
TIMELINE: Final = 2000
"""Points a timeline lists at most (evenly spread, the last always among them)."""


class ReplaySource:
    """A recorded log, folded again for each offset asked."""

    def __init__(
        self,
        name: str,
        parts: Sequence[Sequence[Envelope]],
        config: SchedulerConfig | None,
        registry: Registry | None,
    ) -> None:
        self.name = name
        self.parts = parts
        self.config = config
        self.registry = registry
        self._kept: OrderedDict[int | None, dict[str, Any]] = OrderedDict()
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"ReplaySource({self.name!r}, partitions={len(self.parts)})"

    @property
    def shards(self) -> int:
        return max(1, len(self.parts) - 1)

    def _records(self) -> list[Envelope]:
        return [env for env in self.parts[0] if not isinstance(env.event, SnapshotTaken)]

    async def timeline(self) -> dict[str, Any]:
        if len(self.parts) > 1:
            return {
                "log": self.name,
                "shards": self.shards,
                "offsets": [],
                "note": f"a log of {self.shards} shards is shown at its end only",
            }
        records = self._records()
        step = max(1, -(-len(records) // TIMELINE))
        chosen = records[::step]
        if records and chosen[-1] is not records[-1]:
            chosen.append(records[-1])
        return {
            "log": self.name,
            "shards": 1,
            "offsets": [
                {
                    "offset": env.offset,
                    "time_seconds": env.time / SECOND,
                    "kind": type(env.event).__name__,
                }
                for env in chosen
            ],
        }

    def _build(self, offset: int | None) -> dict[str, Any]:
        extra: dict[str, Any] = {"source": f"replay of {self.name}", "offset": offset}
        if len(self.parts) == 1:
            records = self.parts[0]
            result = replay(records, self.config, until=offset, registry=self.registry)
            decisions = (
                env
                for env in records
                if is_decision(env.event) and (offset is None or env.offset <= offset)
            )
            quotas = quota_specs(env for env in records if offset is None or env.offset <= offset)
            return snapshot([result.engine], result.report, decisions, quotas, **extra)
        control = len(self.parts) - 1
        engines = [
            replay(self.parts[s], self.config, shard=s, registry=self.registry).engine
            for s in range(control)
        ]
        report = RunReport(control=control)
        merged = merge([list(p) for p in self.parts])
        for env in merged:
            report.apply(env)
        recent = deque((env for env in merged if is_decision(env.event)), maxlen=RECENT)
        return snapshot(engines, report, recent, quota_specs(merged), **extra)

    async def would_run(self, pod: str, offset: int | None) -> dict[str, Any]:
        """A one-shard log is folded again up to ``offset``; a log of several shards,
        whole, with the coordinator's view (:func:`shards.wouldrun.explained`)."""
        if offset is not None and len(self.parts) > 1:
            raise ViewError(f"a log of {self.shards} shards is shown at its end only")
        async with self._lock:
            if len(self.parts) == 1:
                result = replay(self.parts[0], self.config, until=offset, registry=self.registry)
            else:
                result = ReplayResult(report=RunReport(), engine=Engine(self.config))
            found = wouldrun.explained(self.parts, result, self.config, self.registry, pod)
        return {
            "pod": pod,
            "unit": found.unit if found is not None else pod,
            "counterfactual": found.to_json() if found is not None else None,
        }

    async def state(self, offset: int | None) -> dict[str, Any]:
        if offset is not None and len(self.parts) > 1:
            raise ViewError(
                f"a log of {self.shards} shards is shown at its end only (offsets name "
                "points of one partition)"
            )
        async with self._lock:  # one fold at a time; the next asker finds it kept
            kept = self._kept.get(offset)
            if kept is None:
                kept = self._kept[offset] = self._build(offset)
                if len(self._kept) > KEPT:
                    self._kept.popitem(last=False)
            return kept


class LiveSource:
    """A running service: its bus folded into a report as it grows, and its shards'
    engines as they are now."""

    def __init__(
        self,
        bus: Callable[[], EventLog | None],
        engines: Callable[[], list[Engine]],
        partitions: int,
    ) -> None:
        self._bus = bus
        self._engines = engines
        self.partitions = partitions
        self.report = RunReport(control=partitions - 1 if partitions > 1 else None)
        self.recent: deque[Envelope] = deque(maxlen=RECENT)
        self.quotas: dict[str, QuotaSpec] = {}
        self.positions = [0] * partitions
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"LiveSource(partitions={self.partitions}, positions={self.positions})"

    async def _catch_up(self, bus: EventLog) -> None:
        """Fold what the bus has past ``positions``, :data:`CHUNK` records a partition
        at a time, giving the event loop back between chunks (the shards run in it)."""
        while True:
            batches = []
            for partition in range(self.partitions):
                records, _, position = await read_past_unreadable(
                    bus, partition, self.positions[partition], CHUNK
                )
                self.positions[partition] = position
                batches.append(records)
            for env in merge(batches) if self.partitions > 1 else batches[0]:
                self.report.apply(env)
                if is_decision(env.event):
                    self.recent.append(env)
                elif isinstance(env.event, QuotaDefined):
                    self.quotas[env.event.quota.namespace] = env.event.quota
            if all(len(b) < CHUNK for b in batches):
                return
            await asyncio.sleep(0)

    async def state(self, offset: int | None) -> dict[str, Any]:
        if offset is not None:
            raise ViewError("a running service is shown as it is now (offsets: replay --serve)")
        async with self._lock:
            bus = self._bus()
            if bus is None:
                raise ViewError("the bus is not open yet")
            await self._catch_up(bus)
            return snapshot(
                self._engines(), self.report, self.recent, self.quotas, source="live", offset=None
            )

    async def timeline(self) -> dict[str, Any]:
        return {"offsets": [], "note": "a running service is shown as it is now"}

    async def would_run(self, pod: str, offset: int | None) -> dict[str, Any]:
        """On the engine of this process that holds the pod (a shard sees its own
        pools only), as it is now; computed in the event loop (bounded:
        :mod:`engine.counterfactual`)."""
        if offset is not None:
            raise ViewError("a running service is shown as it is now (offsets: replay --serve)")
        for engine in self._engines():
            if pod in engine.pods:
                return wouldrun.unit_json(engine, pod)
        raise ViewError(f"no pod {pod} waits on the shards this process runs")

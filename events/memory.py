"""In-memory event log: the embedded default, and the fastest backend.

Stores the (immutable) envelopes themselves, no encoding; enforces the same contract
as the durable backends, fencing included (``events.fence``: an append of an older
leader term is refused).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from events.fence import FenceBook
from events.log import check_partition
from events.types import Envelope


class MemoryLog:
    """An ``EventLog`` held in lists, one per partition."""

    def __init__(self, partitions: int = 1) -> None:
        if partitions < 1:
            raise ValueError("a log needs at least one partition")
        self._parts: list[list[Envelope]] = [[] for _ in range(partitions)]
        self.fences = FenceBook()

    def __repr__(self) -> str:
        return f"MemoryLog(partitions={len(self._parts)}, records={self.stats()['records']})"

    @property
    def partitions(self) -> int:
        return len(self._parts)

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        check_partition(partition, len(self._parts))
        terms = self.fences.check(envelopes, partition)
        part = self._parts[partition]
        start = len(part)
        replace = msgspec.structs.replace
        part.extend(
            replace(env, offset=start + i, partition=partition) for i, env in enumerate(envelopes)
        )
        self.fences.record(partition, terms)
        return list(range(start, len(part)))

    async def highest_epoch(self, fence: str) -> int:
        """The highest epoch stored for ``fence`` (``events.fence.highest_epoch``)."""
        return self.fences.highest_of(fence)

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        check_partition(partition, len(self._parts))
        part = self._parts[partition]
        stop = len(part) if limit is None else min(len(part), offset + limit)
        return part[max(offset, 0) : stop]

    async def end_offset(self, partition: int) -> int:
        check_partition(partition, len(self._parts))
        return len(self._parts[partition])

    async def close(self) -> None:
        return None

    def stats(self) -> dict[str, int]:
        return {"partitions": len(self._parts), "records": sum(map(len, self._parts))}

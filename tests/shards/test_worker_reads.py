"""A shard worker reads around what it appended itself, and misses nothing else.

Its decisions and snapshots are applied when it makes them; reading them back (and,
over a socket or Kafka, decoding them) was half of what a shard process read. Other
writers append to the same partition at any moment, between the worker's read and its
append included, so its own records and theirs interleave: every record of theirs is
folded, in order, none of its own is read, and the log replays and restarts the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from events.memory import MemoryLog
from events.types import ClockTicked, Envelope, NodeAdded, NodeSpec, PodBound, PodSpec, PodSubmitted
from shards.replay import replay
from shards.worker import ShardWorker

WORKER = "shard-0"


class ConcurrentLog(MemoryLog):
    """A memory log where another writer appends ``cut_in`` records just before each
    append of the worker (as if they landed during its pass), and that keeps every
    record a read returned."""

    def __init__(self) -> None:
        super().__init__(1)
        self.cut_in: list[list[Envelope]] = []
        self.returned: list[Envelope] = []

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        if envelopes and envelopes[0].producer == WORKER and self.cut_in:
            await super().append(self.cut_in.pop(0), partition)
        return await super().append(envelopes, partition)

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        records = await super().read(partition, offset, limit)
        self.returned += records
        return records


def _pods(first: int, count: int) -> list[Envelope]:
    return [
        Envelope(
            event=PodSubmitted(pod=PodSpec(namespace="a", name=f"p{i}", requests={"cpu": 10})),
            producer="ingest",
        )
        for i in range(first, first + count)
    ]


steps = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans()), min_size=1, max_size=6
)
"""Per poll: pods submitted before it, pods another writer appends during its pass (if
it has one), and whether a clock tick (folded, deciding nothing) cuts in too."""


@settings(max_examples=15, deadline=None)
@given(steps=steps, snapshot_every=st.sampled_from([0, 3]))
async def test_the_worker_folds_every_other_record_and_reads_none_of_its_own(
    steps: list[tuple[int, int, bool]], snapshot_every: int
) -> None:
    log = ConcurrentLog()
    node = NodeSpec(name="n1", allocatable={"cpu": 100_000, "pods": 1000})
    await log.append([Envelope(event=NodeAdded(node=node), producer="ingest")])
    worker = await ShardWorker.recover(log, snapshot_every=snapshot_every)
    submitted = 0
    for before, during, tick in steps:
        await log.append(_pods(submitted, before))
        submitted += before
        cut_in = _pods(submitted, during)
        submitted += during
        if tick:
            cut_in.append(Envelope(event=ClockTicked(), producer="clock-0"))
        log.cut_in.append(cut_in)
        await worker.poll()
    for _ in range(len(steps) + 2):  # what cut in after the last read
        await worker.poll()

    assert [e.offset for e in log.returned if e.producer == WORKER] == []
    records = await MemoryLog.read(log, 0, 0)
    bound = {e.event.pod for e in records if isinstance(e.event, PodBound)}
    assert bound == {e.event.pod.key for e in records if isinstance(e.event, PodSubmitted)}
    assert worker.position == len(records)
    result = replay(records, verify=True)
    assert result.mismatch is None, result.mismatch
    again = await ShardWorker.recover(log)  # replays the partition, its own records included
    assert again.engine.state.pods.keys() == worker.engine.state.pods.keys()

"""A record a shard cannot read or fold is skipped and recorded, never a crash loop.

A poison record (bytes that do not decode, put in the partition by another writer) and
a well-formed hostile one (a node of 2^63 milli-CPUs, which no int64 column holds) each
made the shard that reads them exit at the same offset on every restart. Now the shard
skips each, appends a ``RecordQuarantined`` naming its offset and reason (once, however
often it restarts), and goes on deciding the records after it; replay agrees.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from engine.refusals import MAX_QUANTITY, refusal
from events.errors import LogCorruptedError
from events.memory import MemoryLog
from events.types import (
    Envelope,
    Event,
    NodeAdded,
    NodeSpec,
    PodBound,
    PodSpec,
    PodSubmitted,
    RecordQuarantined,
)
from shards.replay import replay
from shards.worker import ShardWorker


class PoisonedLog(MemoryLog):
    """A memory log whose records at ``poisoned`` offsets do not decode: a read that
    reaches one fails there, naming it, as the Kafka, file and server logs do."""

    def __init__(self, poisoned: set[int]) -> None:
        super().__init__(1)
        self.poisoned = poisoned

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        records = await super().read(partition, offset, limit)
        for env in records:
            if env.offset in self.poisoned:
                raise LogCorruptedError(
                    "record does not decode: expected `object`, got `int`",
                    partition=partition,
                    offset=env.offset,
                )
        return records


def _node(name: str, cpu: int) -> Event:
    return NodeAdded(node=NodeSpec(name=name, allocatable={"cpu": cpu, "pods": 110}))


def _pod(name: str) -> Event:
    return PodSubmitted(pod=PodSpec(namespace="a", name=name, requests={"cpu": 100}))


async def _fill(log: MemoryLog, events: Sequence[Event]) -> None:
    await log.append([Envelope(event=e, time=i + 1) for i, e in enumerate(events)])


async def _run(log: MemoryLog) -> list[Envelope]:
    worker = await ShardWorker.recover(log)
    for _ in range(5):
        await worker.poll()
    return await log.read(0, 0) if not isinstance(log, PoisonedLog) else await _readable(log)


async def _readable(log: PoisonedLog) -> list[Envelope]:
    return [e for e in await MemoryLog.read(log, 0, 0) if e.offset not in log.poisoned]


def _quarantined(records: list[Envelope]) -> dict[int, str]:
    return {
        e.event.offset: e.event.reason for e in records if isinstance(e.event, RecordQuarantined)
    }


def _bound(records: list[Envelope]) -> set[str]:
    return {e.event.pod for e in records if isinstance(e.event, PodBound)}


@pytest.mark.parametrize("poison_at", [1, 2, 3])
async def test_an_undecodable_record_is_quarantined_and_the_shard_goes_on(poison_at: int) -> None:
    log = PoisonedLog({poison_at})
    await _fill(log, [_node("n1", 4000), _pod("before"), _pod("poison"), _pod("after")])
    records = await _run(log)
    assert list(_quarantined(records)) == [poison_at]
    assert "does not decode" in _quarantined(records)[poison_at]
    kept = {"a/before", "a/poison", "a/after"} - {
        ["", "a/before", "a/poison", "a/after"][poison_at]
    }
    assert _bound(records) == kept
    # started again (the same record is still there): nothing recorded twice
    records = await _run(log)
    assert list(_quarantined(records)) == [poison_at]
    result = replay(records, verify=True)
    assert result.mismatch is None, result.mismatch
    assert result.verified >= 2


async def test_a_node_no_column_can_hold_is_quarantined_and_the_shard_goes_on() -> None:
    log = MemoryLog()
    huge = 1 << 63
    await _fill(log, [_node("n1", 4000), _node("huge", huge), _pod("p1"), _pod("p2")])
    records = await _run(log)
    assert list(_quarantined(records)) == [1]
    assert f"cpu={huge}" in _quarantined(records)[1]
    assert _bound(records) == {"a/p1", "a/p2"}
    assert {e.event.node for e in records if isinstance(e.event, PodBound)} == {"n1"}
    records = await _run(log)
    assert list(_quarantined(records)) == [1]
    result = replay(records, verify=True)
    assert result.mismatch is None, result.mismatch


@pytest.mark.parametrize(
    "event",
    [
        _node("n", MAX_QUANTITY + 1),
        _node("n", -1),
        PodSubmitted(pod=PodSpec(namespace="a", name="p", requests={"memory": 1 << 64})),
        PodSubmitted(pod=PodSpec(namespace="a", name="p", priority=-(1 << 63))),
    ],
)
def test_values_beyond_the_columns_are_refused(event: Event) -> None:
    assert refusal(event) is not None


def test_values_within_the_columns_are_folded() -> None:
    assert refusal(_node("n", MAX_QUANTITY)) is None
    assert refusal(PodSubmitted(pod=PodSpec(namespace="a", name="p", priority=-5))) is None

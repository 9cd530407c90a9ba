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
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.devices import CARDS_LABEL, GPU, MAX_NODE_CARDS
from engine.refusals import MAX_QUANTITY, refusal
from engine.snapshot import encode_state
from events.errors import LogCorruptedError
from events.log import read_quarantined
from events.memory import MemoryLog
from events.remote import LogServer, RemoteLog
from events.types import (
    Envelope,
    Event,
    NodeAdded,
    NodeSpec,
    PodBound,
    PodSpec,
    PodSubmitted,
    RecordQuarantined,
    SnapshotTaken,
)
from shards.replay import replay, replay_routed
from shards.worker import ShardWorker
from tests.shards.fleet import SHARDS, Fleet, bound_at_least, gang, pods, set_up


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
        NodeAdded(node=NodeSpec(name="n", allocatable={GPU: MAX_NODE_CARDS + 1})),
        NodeAdded(
            node=NodeSpec(name="n", allocatable={GPU: 200_000}, labels={CARDS_LABEL: "99999"})
        ),
    ],
)
def test_values_beyond_the_columns_are_refused(event: Event) -> None:
    assert refusal(event) is not None


def test_values_within_the_columns_are_folded() -> None:
    assert refusal(_node("n", MAX_QUANTITY)) is None
    assert refusal(NodeAdded(node=NodeSpec(name="n", allocatable={GPU: MAX_NODE_CARDS}))) is None
    # the label states the physical cards where the resource counts shared replicas
    labelled = NodeSpec(name="n", allocatable={GPU: 200_000}, labels={CARDS_LABEL: "8"})
    assert refusal(NodeAdded(node=labelled)) is None
    assert refusal(PodSubmitted(pod=PodSpec(namespace="a", name="p", priority=-5))) is None


async def test_poison_in_every_partition_stops_no_process() -> None:
    """Real processes over the log server: a hostile writer puts bytes that do not decode
    in a shard's partition and in the control partition, and a node no column can hold
    in the control partition. No process exits; the work before and after is decided,
    a gang across both shards included; each poison is recorded once, by its
    partition's reader; the log replays exactly, past what was quarantined."""
    async with LogServer(SHARDS + 1) as server:
        log = await RemoteLog.connect(server.url)
        ingest = await set_up(log)

        async def poison(partition: int) -> None:
            await log._call(["append", partition, [["pod+", b"\xc1 not msgpack"]]])

        fleet = Fleet(server.url)
        roles = ["coordinator", "binder", *(f"shard-{i}" for i in range(SHARDS))]
        try:
            for role in roles:
                await fleet.start(role)
            await ingest(pods("before", 4))
            await bound_at_least(log, 4)  # before the poison
            await poison(0)
            await poison(SHARDS)
            await ingest([_node("huge", 1 << 63)])
            await ingest(gang("wide", 30) + pods("after", 4))
            await bound_at_least(log, 38)  # after it
            assert all(p.returncode is None for p in fleet.procs.values()), {
                r: p.returncode for r, p in fleet.procs.items()
            }
        finally:
            await fleet.stop()
        parts = [(await read_quarantined(log, p))[0] for p in range(SHARDS + 1)]
        await log.close()
    shard_0 = _quarantined(parts[0])
    control = _quarantined(parts[SHARDS])
    assert len(shard_0) == 1 and "malformed" in next(iter(shard_0.values()))
    assert len(control) == 2, control
    assert any("cpu=" in reason for reason in control.values()), control
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, str(verified.mismatch)


@settings(max_examples=60, deadline=None)
@given(
    position=st.integers(-(2**63), 2**64 - 1),
    part=st.integers(-(2**63), 2**64 - 1),
    parts=st.integers(-(2**63), 2**64 - 1),
    data=st.binary(max_size=64),
)
async def test_a_hostile_snapshot_never_stops_a_restart(
    position: int, part: int, parts: int, data: bytes
) -> None:
    """A snapshot record with any fields (no parts, parts beyond 64 bits, a position
    out of the partition, bytes that are not a state) is ignored: the shard replays
    its partition from the start and reaches the state it would without it."""
    events = [_node("n1", 4000), _pod("p1"), _pod("p2")]
    clean, hostile = MemoryLog(), MemoryLog()
    for log in (clean, hostile):
        await _fill(log, events)
    snapshot = SnapshotTaken(
        component="shard-0", position=position, part=part, parts=parts, digest="x", data=data
    )
    await hostile.append([Envelope(event=snapshot, time=9, producer="shard-0", causation=2)])
    expected = await ShardWorker.recover(clean)
    worker = await ShardWorker.recover(hostile)
    assert worker.restored_from == -1
    assert encode_state(worker.engine) == encode_state(expected.engine)

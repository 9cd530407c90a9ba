"""Appends stored in chunks, and a coordinator that dies between two of them.

A bus with a size limit (the log server's frame, a Kafka batch) stores a large append
chunk by chunk (``events.log``): the coordinator's forwarding of a shard's nodes at
130,000 nodes is about 48 MB, three times the log server's default frame. A
coordinator killed between two chunks has left the first records of one pass's
outputs in a partition; its successor re-runs the pass and must append exactly the
rest: no record twice, none lost, and replay ``--verify`` derives what the log holds.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.model.pools import POOL_LABEL, Sharding
from events.codec import encode
from events.log import EventLog
from events.memory import MemoryLog
from events.remote import LogServer, RemoteLog, ServerLimits
from events.types import Envelope, Event, SchedulerConfigured, ShardingConfigured
from shards.control import ControlWorker
from shards.coordinator.coordinator import ROUTER, Coordinator
from shards.replay import replay, replay_routed
from shards.worker import ShardWorker
from tests.builders import make_node, make_pod


class Crash(Exception):
    """The process died here."""


class ChunkedLog:
    """Stores each append in chunks of at most ``limit`` records, one ``append`` of the
    log under it per chunk (as the log server stores a large append frame by frame);
    with ``crash_after`` set, the process dies right after that many chunks in all,
    whatever is left of the call never stored."""

    def __init__(self, inner: EventLog, limit: int, crash_after: int | None = None) -> None:
        self.inner = inner
        self.limit = limit
        self.crash_after = crash_after
        self.chunks = 0
        self.cut: tuple[int, int] | None = None
        """Where it died: (records of the call stored, records of the call)."""

    @property
    def partitions(self) -> int:
        return self.inner.partitions

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        offsets: list[int] = []
        for start in range(0, len(envelopes), self.limit):
            offsets += await self.inner.append(envelopes[start : start + self.limit], partition)
            self.chunks += 1
            if self.chunks == self.crash_after:
                self.cut = (len(offsets), len(envelopes))
                raise Crash
        return offsets

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        return await self.inner.read(partition, offset, limit)

    async def end_offset(self, partition: int) -> int:
        return await self.inner.end_offset(partition)

    async def close(self) -> None:
        await self.inner.close()


def _inputs(shards: int, nodes: int, pods: int) -> list[Event]:
    events: list[Event] = [
        ShardingConfigured(config=Sharding(shards=shards).to_json()),
        SchedulerConfigured(config=""),
    ]
    events += [
        make_node(f"n{i}").cpu("4").label(POOL_LABEL, f"p{i % shards}").added()
        for i in range(nodes)
    ]
    events += [make_pod(f"pod{i}").cpu(str(1 + i % 3)).submitted() for i in range(pods)]
    return events


async def _run(
    shards: int,
    limit: int,
    crash_after: int,
    fold_slice: int,
    *,
    at_once: bool = False,
    snapshot_every: int = 0,
) -> tuple[MemoryLog, str]:
    """Inputs in two bursts to a coordinator (appending through a chunked log that
    kills it after ``crash_after`` chunks) and its shards, until all is quiet; the
    coordinator is started again from the log after it died (``at_once``: and polled
    before the shards), from its newest snapshot where it wrote some. The log, and
    where the coordinator died."""
    memory = MemoryLog(shards + 1)
    control = shards
    inputs = _inputs(shards, nodes=8 * shards, pods=12 * shards)
    bursts = [inputs[: len(inputs) // 2], inputs[len(inputs) // 2 :]]
    chunked = ChunkedLog(memory, limit, crash_after)
    coordinator = ControlWorker(
        Coordinator(Sharding(shards=shards)), chunked, snapshot_every=snapshot_every
    )
    coordinator.fold_slice = fold_slice
    workers = [ShardWorker(Engine(shard=i), memory, partition=i) for i in range(shards)]
    crashed = ""
    for burst in bursts:
        await memory.append([Envelope(event=e, producer="ingest") for e in burst], control)
        for _ in range(200):  # bounded: a run settles in a few rounds
            moved = 0
            try:
                moved += await coordinator.poll()
            except Crash:
                assert chunked.cut is not None
                stored, of = chunked.cut
                crashed = f"died after {stored} of {of} records of an append"
                # a new process: nothing of the old one's memory, the same log
                coordinator = ControlWorker(
                    Coordinator(Sharding(shards=shards)),
                    ChunkedLog(memory, limit),
                    snapshot_every=snapshot_every,
                )
                coordinator.fold_slice = fold_slice
                if at_once:  # before any shard reads what the first one left
                    moved += await coordinator.poll()
                moved += 1
            for worker in workers:
                moved += await worker.poll()
            if not moved:
                break
        else:
            raise AssertionError("the run did not settle")
    return memory, crashed


async def _parts(log: MemoryLog) -> list[list[Envelope]]:
    return [await log.read(p, 0) for p in range(log.partitions)]


def _router(parts: list[list[Envelope]]) -> list[list[tuple[int, Event]]]:
    return [[(e.causation, e.event) for e in part if e.producer == ROUTER] for part in parts]


@pytest.mark.parametrize("shards", [1, 2])
@settings(max_examples=12, deadline=None)
@given(
    limit=st.integers(1, 12),
    crash_after=st.integers(1, 40),
    fold_slice=st.sampled_from([4, 9, 1000]),
    snapshot_every=st.sampled_from([0, 0, 6]),
)
def test_a_coordinator_killed_between_two_chunks_appends_exactly_the_rest(
    shards: int, limit: int, crash_after: int, fold_slice: int, snapshot_every: int
) -> None:
    """Wherever the coordinator dies among the chunks of its appends (its outputs, its
    relays of the shards' reports, its snapshots), the restarted one appends exactly
    what is missing: replay re-derives every pass's outputs and finds each in the log
    once (a record twice, or one left out, is a mismatch or an unforwarded tail), and
    the shards' decisions verify too."""

    async def check() -> None:
        log, crashed = await _run(
            shards, limit, crash_after, fold_slice, snapshot_every=snapshot_every
        )
        note(crashed or "never died")
        parts = await _parts(log)
        result = replay_routed(parts, verify=True)
        assert result.mismatch is None, result.mismatch
        assert result.unforwarded == 0
        for part in _router(parts):  # no record twice in a partition
            assert len({(cause, repr(event)) for cause, event in part}) == len(part)

    asyncio.run(check())


@pytest.mark.parametrize("shards", [1, 2])
def test_a_restarted_coordinator_appends_the_rest_of_a_cut_append(shards: int) -> None:
    """The first pass forwards every node and routes every pod in appends of many
    records; the coordinator dies after the first chunk of the first of them. Its
    successor appends the rest, and the log ends as a run that never died (appending
    in the same chunks) leaves it, record for record."""

    async def check() -> None:
        crashed_log, crashed = await _run(shards, 3, crash_after=2, fold_slice=1000, at_once=True)
        stored, of = map(int, re.findall(r"\d+", crashed))
        assert stored == 6 < of, crashed  # in the middle of forwarding shard 0's nodes
        whole_log, never = await _run(shards, 3, crash_after=10**9, fold_slice=1000, at_once=True)
        assert not never
        assert _router(await _parts(crashed_log)) == _router(await _parts(whole_log))

    asyncio.run(check())


@pytest.mark.parametrize("shards", [1, 2])
async def test_a_coordinator_forwards_more_nodes_than_one_frame_holds(shards: int) -> None:
    """The 130,000-node case in small: the coordinator's first pass forwards every node
    to its shard in one append of several frames of a log server whose frame holds a
    few dozen of them; each shard gets them all, and the log replays."""
    limits = ServerLimits(max_frame=12 << 10, max_buffered=1 << 20)
    async with LogServer(shards + 1, limits=limits) as server:
        log = await RemoteLog.connect(server.url)
        inputs = _inputs(shards, nodes=300, pods=40)
        await log.append([Envelope(event=e, producer="ingest") for e in inputs], shards)
        coordinator = ControlWorker(Coordinator(Sharding(shards=shards)), log)
        workers = [ShardWorker(Engine(shard=i), log, partition=i) for i in range(shards)]
        for _ in range(100):
            moved = await coordinator.poll()
            for worker in workers:
                moved += await worker.poll()
            if not moved:
                break
        assert sum(len(w.engine.state.index) for w in workers) == 300
        parts = [await log.read(p, 0) for p in range(shards + 1)]
        result = replay_routed(parts, verify=True)
        assert result.mismatch is None, result.mismatch
        assert result.unforwarded == 0
        forwarded = [e for e in parts[0] if e.producer == ROUTER]
        assert len({e.causation for e in forwarded}) == 1, "one pass forwarded them"
        assert sum(len(encode(e)) for e in forwarded) > limits.max_frame
        await log.close()


async def _shard_run(limit: int, crash_after: int) -> tuple[list[Envelope], str]:
    """One shard on its own partition, appending its decisions through a chunked log
    that kills it after ``crash_after`` chunks; started again from the log
    (``ShardWorker.recover``) after it died. Its partition, and where it died."""
    memory = MemoryLog(1)
    inputs: list[Event] = [SchedulerConfigured(config="")]
    inputs += [make_node(f"n{i}").cpu("4").added() for i in range(4)]
    pods = [make_pod(f"pod{i}").cpu(str(1 + i % 3)).submitted() for i in range(24)]
    worker = ShardWorker(Engine(shard=0), ChunkedLog(memory, limit, crash_after))
    crashed = ""
    for burst in (inputs + pods[:12], pods[12:]):
        await memory.append([Envelope(event=e, producer="ingest") for e in burst])
        for _ in range(50):
            try:
                moved = await worker.poll()
            except Crash:
                assert isinstance(worker.log, ChunkedLog) and worker.log.cut is not None
                stored, of = worker.log.cut
                crashed = f"died after {stored} of {of} records of an append"
                worker = await ShardWorker.recover(memory)
                moved = 1
            if not moved:
                break
    return await memory.read(0, 0), crashed


@settings(max_examples=8, deadline=None)
@given(limit=st.integers(1, 6), crash_after=st.integers(1, 12))
def test_a_shard_killed_between_two_chunks_of_its_decisions_appends_the_rest(
    limit: int, crash_after: int
) -> None:
    """A shard that died in the middle of appending a pass's decisions rebuilds from
    the log, re-runs that pass, and appends the decisions the log lacks (it used to
    refuse to start: replay found fewer decisions than it derived). The log ends as
    one whose shard never died, decision for decision, and replays."""

    async def check() -> None:
        records, crashed = await _shard_run(limit, crash_after)
        note(crashed or "never died")
        whole, never = await _shard_run(limit, 10**9)
        assert not never
        result = replay(records, verify=True)
        assert result.mismatch is None, result.mismatch

        def decided(part: list[Envelope]) -> list[tuple[int, Event]]:
            return [(e.causation, e.event) for e in part if e.producer == "shard-0"]

        assert decided(records) == decided(whole)

    asyncio.run(check())

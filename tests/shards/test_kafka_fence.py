"""A deposed leader's late record in Kafka takes no effect. With transactions (the
default) the broker refuses it: the deposed writer's producer is fenced by the new
term's, the append raises ``FencedError`` and nothing of it is stored. Without them (a
broker that has none, or a log written before) Kafka stores it, and the run's readers
and ``shoal replay --verify`` drop it the same way. Either way the run verifies."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from events.fence import FencedError, FencedLog
from events.kafka import KafkaLog, KafkaSettings, create_topic
from events.types import Envelope, NodeAdded, NodeRemoved, RecordFenced
from shards.inputs.scenario import load_scenario
from shards.simulate import simulate
from tests.shards.test_cli import QUICKSTART, run_json


class LateRecord:
    """A Kafka log into which, right after the first nodes are appended, the ingest
    term of another process (``deposed``, epoch 1) begins, a new one begins (epoch 2),
    and the deposed one's late append follows: the removal of the first node, which
    would leave pods with nowhere to go."""

    def __init__(self, inner: KafkaLog, deposed: KafkaLog) -> None:
        self.inner = inner
        self.deposed = deposed
        self.injected = False
        self.refused: list[FencedError] = []

    @property
    def partitions(self) -> int:
        return self.inner.partitions

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        offsets = await self.inner.append(envelopes, partition)
        added = [e.event for e in envelopes if isinstance(e.event, NodeAdded)]
        if added and not self.injected:
            self.injected = True
            now = envelopes[-1].time
            old = FencedLog(self.deposed, fence="shoal-ingest", epoch=1)
            await old.begin([partition], holder="a", now=now)
            await FencedLog(self.inner, fence="shoal-ingest", epoch=2).begin(
                [partition], holder="b", now=now
            )
            late = Envelope(event=NodeRemoved(name=added[0].node.name), time=now)
            try:
                await old.append([late], partition)
            except FencedError as exc:
                self.refused.append(exc)
        return offsets


async def _run(bootstrap: str, topic: str, transactions: bool) -> tuple[list[Envelope], int]:
    settings = KafkaSettings(
        bootstrap=bootstrap, topic=topic, partitions=1, transactions=transactions
    )
    await create_topic(settings)
    log, deposed = KafkaLog(settings), KafkaLog(settings)
    await log.start()
    await deposed.start()
    try:
        bus = LateRecord(log, deposed)
        await simulate(load_scenario([QUICKSTART]), bus)  # type: ignore[arg-type]
        return await log.read(0, 0), len(bus.refused)
    finally:
        await deposed.close()
        await log.close()


@pytest.mark.parametrize("transactions", [True, False], ids=["refused", "dropped"])
def test_a_late_record_of_a_deposed_term_takes_no_effect_in_the_run_or_in_replay(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str], transactions: bool
) -> None:
    topic = f"fence-{uuid.uuid4().hex[:10]}"
    records, refused = asyncio.run(_run(kafka_bootstrap, topic, transactions))
    fenced = [e.event.kind for e in records if isinstance(e.event, RecordFenced)]
    removed = [e for e in records if isinstance(e.event, NodeRemoved)]
    if transactions:  # the broker refused it: the deposed writer knows, nothing is stored
        assert (refused, fenced, removed) == (1, [], [])
    else:  # stored, and dropped by every reader
        assert (refused, fenced, removed) == (0, ["NodeRemoved"], [])
    in_memory = run_json(capsys, "simulate", QUICKSTART)
    replayed = run_json(capsys, "replay", f"kafka://{kafka_bootstrap}?topic={topic}", "--verify")
    assert replayed["verify"]["ok"] is True
    assert replayed["pods"] == in_memory["pods"]  # the node was never removed

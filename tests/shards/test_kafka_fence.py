"""A deposed leader's late record in Kafka (which stores it: no broker-side fencing
against the test broker) takes no effect: the run's readers drop it, and ``shoal replay
--verify`` drops it the same way and verifies."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from events.fence import FencedLog
from events.kafka import KafkaLog, KafkaSettings, create_topic
from events.types import Envelope, NodeAdded, NodeRemoved, RecordFenced
from shards.inputs.scenario import load_scenario
from shards.simulate import simulate
from tests.shards.test_cli import QUICKSTART, run_json


class LateRecord:
    """A Kafka log into which, right after the first nodes are appended, a new ingest
    term begins (epoch 2) and the deposed one's late append lands (epoch 1): the
    removal of the first node, which would leave pods with nowhere to go."""

    def __init__(self, inner: KafkaLog) -> None:
        self.inner = inner
        self.injected = False

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
            await FencedLog(self.inner, fence="shoal-ingest", epoch=2).begin(
                [partition], holder="b", now=envelopes[-1].time
            )
            late = Envelope(event=NodeRemoved(name=added[0].node.name), time=envelopes[-1].time)
            await FencedLog(self.inner, fence="shoal-ingest", epoch=1).append([late], partition)
        return offsets


async def _run(bootstrap: str, topic: str) -> list[Envelope]:
    settings = KafkaSettings(bootstrap=bootstrap, topic=topic, partitions=1)
    await create_topic(settings)
    log = KafkaLog(settings)
    await log.start()
    try:
        await simulate(load_scenario([QUICKSTART]), LateRecord(log))  # type: ignore[arg-type]
        return await log.read(0, 0)
    finally:
        await log.close()


def test_a_late_record_of_a_deposed_term_is_dropped_by_the_run_and_by_replay(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"fence-{uuid.uuid4().hex[:10]}"
    records = asyncio.run(_run(kafka_bootstrap, topic))
    fenced = [e for e in records if isinstance(e.event, RecordFenced)]
    assert [e.event.kind for e in fenced] == ["NodeRemoved"]
    in_memory = run_json(capsys, "simulate", QUICKSTART)
    replayed = run_json(capsys, "replay", f"kafka://{kafka_bootstrap}?topic={topic}", "--verify")
    assert replayed["verify"]["ok"] is True
    assert replayed["pods"] == in_memory["pods"]  # the node was never removed

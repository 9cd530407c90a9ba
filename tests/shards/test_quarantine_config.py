"""A recorded configuration naming a plugin that is not installed, put in the log by
another writer, is skipped and recorded by the run (the shard at one shard, the
coordinator at several) and skipped by replay the same way, which still verifies.

Replay used to load the plugins of every configuration in the log and refused the
whole log for the one it could not load; a configuration that enabled such a plugin
stopped the shard that folded it, at the same offset on every restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from events.filelog import FileLog
from events.types import (
    SECOND,
    Envelope,
    PluginUsed,
    PodSubmitted,
    RecordQuarantined,
    SchedulerConfigured,
)
from shards.cli import main
from shards.commands import sharding_for
from shards.inputs.scenario import Scenario, TimedEvent
from shards.simulate import simulate
from tests.builders import make_node, make_pod

MISSING = "NotInstalledPlugin"
USED = (PluginUsed(name=MISSING, distribution="shoal-hostile", version="6.6.6"),)
ENABLED = json.dumps(
    {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "plugins": {"score": {"enabled": [{"name": MISSING, "weight": 5}]}},
            }
        ],
    }
)
HOSTILE = {
    "listed": SchedulerConfigured(config="", plugins=USED),
    "enabled": SchedulerConfigured(config=ENABLED, plugins=USED),
}


class Intruder:
    """A log another writer shares: right after the first pods arrive in the inputs'
    partition, it appends ``hostile`` there."""

    def __init__(self, inner: FileLog, hostile: SchedulerConfigured) -> None:
        self.inner = inner
        self.hostile = hostile
        self.at: int | None = None

    @property
    def partitions(self) -> int:
        return self.inner.partitions

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        offsets = await self.inner.append(envelopes, partition)
        if (
            self.at is None
            and partition == self.partitions - 1
            and any(isinstance(e.event, PodSubmitted) for e in envelopes)
        ):
            event = Envelope(event=self.hostile, time=envelopes[-1].time, producer="intruder")
            (self.at,) = await self.inner.append([event], partition)
        return offsets

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        return await self.inner.read(partition, offset, limit)

    async def end_offset(self, partition: int) -> int:
        return await self.inner.end_offset(partition)

    async def close(self) -> None:
        await self.inner.close()


def _scenario() -> Scenario:
    items: list[tuple[float, Any]] = [(0, make_node(f"n{i}").cpu("4").added()) for i in range(4)]
    items += [(0, make_pod(f"a{i}").cpu("1").submitted()) for i in range(4)]
    items += [(5, make_pod(f"b{i}").cpu("1").submitted()) for i in range(4)]
    events = [TimedEvent(round(t * SECOND), i, e) for i, (t, e) in enumerate(items)]
    return Scenario(events=events)


async def _run(path: Path, shards: int, kind: str) -> tuple[int, int, list[tuple[int, int, str]]]:
    """Simulate with the intruder; the partition and offset of its record, and the
    (partition, offset, reason) of every record the run quarantined."""
    log = Intruder(FileLog(path, partitions=shards + 1 if shards > 1 else 1), HOSTILE[kind])
    result = await simulate(_scenario(), log, sharding=sharding_for(shards))
    assert log.at is not None, "the intruder wrote"
    pods = result.report.pods
    assert len(pods) == 8 and all(p.phase == "Bound" for p in pods.values()), pods
    quarantined = []
    for partition in range(log.partitions):
        for env in await log.read(partition, 0):
            if isinstance(env.event, RecordQuarantined):
                quarantined.append((partition, env.event.offset, env.event.reason))
    await log.close()
    return log.partitions - 1, log.at, quarantined


@pytest.mark.parametrize("shards", [1, 2, 4])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_configuration_naming_a_missing_plugin_is_skipped_by_the_run_and_by_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, kind: str
) -> None:
    path = tmp_path / "run.events"
    partition, at, quarantined = asyncio.run(_run(path, shards, kind))
    # skipped once, where the inputs are (not sent on to the shards), naming the plugin
    assert [(p, o) for p, o, _ in quarantined] == [(partition, at)]
    assert MISSING in quarantined[0][2]
    capsys.readouterr()
    assert main(["replay", str(path), "--verify"]) == 0
    out, err = capsys.readouterr()
    assert "verified:" in out
    assert f"quarantined are skipped (offsets {at})" in err
    assert main(["replay", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(q["partition"], q["offset"]) for q in data["quarantined"]] == [(partition, at)]
    assert data["summary"]["bound"] == 8

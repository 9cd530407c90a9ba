"""A snapshot written by the version before the engine forgot what is over (format 2:
no retention state, no heap of time-outs) is refused cleanly: a restarted shard folds
its partition from the start and reaches the state of a shard never stopped, and
``replay --verify`` counts it as skipped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from engine.snapshot import FORMAT, assemble, encode_state, snapshot_parts
from events.memory import MemoryLog
from events.types import Envelope, SnapshotTaken
from shards.inputs.scenario import load_scenario
from shards.replay import replay
from shards.simulate import simulate
from shards.worker import ShardWorker

ROOT = Path(__file__).resolve().parents[2]
NEW_IN_3 = ("retired", "depending", "deadlines")


def _as_format_2(parts: list[SnapshotTaken]) -> list[SnapshotTaken]:
    """The snapshot as an earlier version wrote it: format 2, without the state that
    format 3 added (format 4 added the host ports bound on each node, in the cluster
    state's columns; format 5 the nodes' annotations; format 7 the pod disruption
    budgets; format 8 GPU cards counted in quotas in milli-cards; format 9 the counts a move
    budget reads and the rescheduler's memo of shapes with no plan; format 10 whether a
    reservation part's pods are in no gang; format 11 the GPU cards the coordinator chose
    for a part's pods, and whether a shard's learnt shapes are the coordinator's, and the preemptors a
    shard holds room for; format 12 the GPU cards planned for a gang after its evictions; format 13 the pods a
    plan of moves takes from the shard that holds its part; format 14 the coordinator's second
    steps of plans of moves; format 15 the move budget counted over every shard and the pods
    handed to a node; format 16 drops the preemptors a shard held room for; format 17 a
    pod's record without its unused ``extra``)."""
    tree = msgspec.msgpack.decode(assemble(parts))
    tree["format"] = 2
    tree["state"] = [pair for pair in tree["state"] if pair[0] not in NEW_IN_3]
    raw = msgspec.msgpack.encode(tree)
    return snapshot_parts(raw, parts[0].position, component=parts[0].component)


def test_a_format_2_snapshot_is_refused_and_the_partition_replayed() -> None:
    assert FORMAT == 17
    scenario = load_scenario([ROOT / "examples" / "batch.yaml"])

    async def go() -> tuple[ShardWorker, list[Envelope], list[Envelope]]:
        log = MemoryLog()
        await simulate(scenario, log, snapshot_every=20)
        records = await log.read(0, 0)
        old = MemoryLog()
        i = 0
        rewritten: list[Envelope] = []
        while i < len(records):
            event = records[i].event
            if isinstance(event, SnapshotTaken):
                group = records[i : i + event.parts]
                parts = [e.event for e in group if isinstance(e.event, SnapshotTaken)]
                for env, part in zip(group, _as_format_2(parts), strict=True):
                    rewritten.append(msgspec.structs.replace(env, event=part))
                i += event.parts
            else:
                rewritten.append(records[i])
                i += 1
        await old.append(rewritten)
        return await ShardWorker.recover(old), records, await old.read(0, 0)

    worker, records, old = asyncio.run(go())
    assert any(isinstance(e.event, SnapshotTaken) for e in old)
    assert worker.restored_from == -1  # refused: folded from the start instead
    assert encode_state(worker.engine) == encode_state(replay(records, verify=True).engine)
    verified = replay(old, verify=True)
    assert verified.mismatch is None and verified.older_snapshots > 0 and verified.snapshots == 0

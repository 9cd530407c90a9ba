"""How long a shard takes to come back, with and without snapshots.

The ``churn`` shape (pods arriving over ten simulated minutes, each running a while, on
``nodes`` nodes) is simulated twice on one shard: once writing a snapshot every
``snapshot_every`` records, once without. Each log is then recovered as a restarted
shard would (``ShardWorker.recover``): the first from its newest snapshot and the records
after it, the second by replaying everything. Both must reach the same state (the
harness checks); the report gives the two times, their ratio, and what the snapshots
cost to write and store.

``shoal loadtest --recovery --nodes 5000 --pods 20000`` runs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engine.snapshot import encode_state
from events.errors import ShoalError
from events.memory import MemoryLog
from events.types import SnapshotTaken
from loadtest.stress import churn
from shards.simulate import simulate
from shards.worker import ShardWorker


async def run_recovery(
    nodes: int,
    pods: int,
    *,
    snapshot_every: int,
    seed: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    scenario = churn(nodes, pods, seed)
    if progress:
        progress("simulating with snapshots")
    with_snapshots = MemoryLog()
    run = await simulate(scenario, with_snapshots, snapshot_every=snapshot_every)
    written = int(run.stats["snapshots"])
    if progress:
        progress("simulating without snapshots")
    without = MemoryLog()
    await simulate(scenario, without)
    records = await with_snapshots.read(0, 0)
    parts = [e.event for e in records if isinstance(e.event, SnapshotTaken)]
    snapshots = len({p.digest for p in parts})

    async def recover(log: MemoryLog) -> tuple[float, ShardWorker]:
        started = time.perf_counter()
        worker = await ShardWorker.recover(log)
        return time.perf_counter() - started, worker

    if progress:
        progress("recovering from the newest snapshot")
    fast, restored = await recover(with_snapshots)
    if progress:
        progress("recovering from the start")
    slow, replayed = await recover(without)
    same = encode_state(restored.engine) == encode_state(replayed.engine)
    if not same:
        raise ShoalError("recovery from a snapshot reached another state than a replay")
    tail = restored.position - (restored.restored_from if restored.restored_from >= 0 else 0)
    return {
        "shape": {
            "nodes": nodes,
            "pods": pods,
            "seed": seed,
            "snapshot_every": snapshot_every,
            "workload": "churn",
        },
        "records": len(records),
        "snapshots": snapshots,
        "snapshot_bytes": sum(len(p.data) for p in parts) // max(snapshots, 1),
        "snapshot_write_seconds": run.stats["snapshot_seconds"] / written if written else 0.0,
        "recover_seconds": {"from_snapshot": fast, "from_start": slow},
        "speedup": slow / fast if fast > 0 else 0.0,
        "restored_from": restored.restored_from,
        "records_replayed_after_snapshot": tail,
        "same_state": same,
    }

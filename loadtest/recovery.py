"""How long a shard takes to come back, with and without snapshots.

The ``churn`` shape (pods arriving over ten simulated minutes, each running a while, on
``nodes`` nodes) is simulated twice on one shard: once writing a snapshot every
``snapshot_every`` records, once without. Each log is then recovered as a restarted
shard would (``ShardWorker.recover``): the first from its newest snapshot and the records
after it, the second by replaying everything. Both must reach the same state (the
harness checks); the report gives the two times, their ratio, and what the snapshots
cost to write and store. Then a real ``shoal worker shard`` process is started on the
log with snapshots (served by a log server) and one new pod, a few times: the report
gives the median seconds from its exec to the end of its start-up (imports), to its
recovery, and to its first decision.

``shoal loadtest --recovery --nodes 5000 --pods 20000`` runs it.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from engine.snapshot import encode_state
from events.errors import ShoalError
from events.memory import MemoryLog
from events.remote import LogServer, RemoteLog
from events.types import Envelope, PodSpec, PodSubmitted, SnapshotTaken, is_decision
from loadtest.stress import churn
from shards.simulate import simulate
from shards.worker import ShardWorker

STARTS = 3
"""Process starts measured (the median is reported)."""
PHASES = (
    ("started", "worker shard starting"),
    ("recovered", "recovered at offset"),
)
"""The lines of a shard's log (``-v``) that end each phase of its start, in order."""


async def run_recovery(
    nodes: int,
    pods: int,
    *,
    snapshot_every: int,
    seed: int = 1,
    starts: int = STARTS,
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
    process = await time_to_first_decision(records, starts=starts, progress=progress)
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
        "process_start": process,
    }


async def time_to_first_decision(
    records: list[Envelope], *, starts: int = STARTS, progress: Callable[[str], None] | None
) -> dict[str, Any]:
    """Seconds from the exec of ``shoal worker shard`` to its first decision, on a log
    server holding ``records`` (one shard's partition) and one new pod: the median of
    ``starts`` starts, each with a new pod, and the median time each phase ended
    (imports and start-up, recovery from the newest snapshot, the first pass)."""
    firsts: list[float] = []
    phases: dict[str, list[float]] = {name: [] for name, _ in PHASES}
    async with LogServer(2) as server:
        log = await RemoteLog.connect(server.url)
        try:
            for i in range(0, len(records), 10_000):
                await log.append(
                    [
                        Envelope(event=r.event, time=r.time, producer=r.producer)
                        for r in records[i : i + 10_000]
                    ],
                    0,
                )
            for start in range(starts):
                if progress:
                    progress(f"starting a shard process ({start + 1} of {starts})")
                seen, first = await _one_start(log, server.url, f"first-{start}")
                firsts.append(first)
                for name, _ in PHASES:
                    phases[name].append(seen.get(name, first))
        finally:
            await log.close()
    return {
        "starts": starts,
        "first_decision_seconds": statistics.median(firsts),
        "phase_ended_seconds": {name: statistics.median(t) for name, t in phases.items()},
    }


async def _one_start(log: RemoteLog, url: str, name: str) -> tuple[dict[str, float], float]:
    """Start a shard process after appending pod ``name``; when each phase ended and
    when it decided the pod (seconds from the exec)."""
    offset = await log.end_offset(0)
    pod = PodSpec(namespace="probe", name=name, requests={"cpu": 1})
    await log.append([Envelope(event=PodSubmitted(pod=pod), time=time.time_ns())], 0)
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shards.cli",
        "-v",
        "worker",
        "shard",
        "--bus",
        url,
        "--shard-id",
        "0",
        stderr=asyncio.subprocess.PIPE,
    )
    seen: dict[str, float] = {}

    async def watch() -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            for phase, text in PHASES:
                if text.encode() in line and phase not in seen:
                    seen[phase] = time.monotonic() - started

    watching = asyncio.create_task(watch())
    try:
        deadline = started + 300
        while True:
            decided = [
                e
                for e in await log.read(0, offset)
                if is_decision(e.event) and getattr(e.event, "pod", "") == pod.key
            ]
            if decided:
                return seen, time.monotonic() - started
            if proc.returncode is not None or time.monotonic() > deadline:
                raise ShoalError(f"the shard process never decided {pod.key}")
            await asyncio.sleep(0.005)
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        await watching

"""Dry run of a job against a running ``shoal serve``'s current state (``shoal whatif
JOB.yaml --serve URL``, answered by ``POST /api/whatif``: :mod:`shards.web.whatif`).

Why not :mod:`shards.dryrun`'s way: that one feeds a recorded run's *inputs* again and
lets a simulated cluster re-derive every placement and completion. A running service's
log holds what was observed on a real cluster (pods found bound, completions,
deletions, bindings that failed there), so its inputs fed again would not give its
state (:mod:`shards.whatif` refuses such a log for that reason). Here the state is not
re-derived from the inputs: it is the log as recorded, decisions and observations
included, which is what the service's own engines are a fold of.

How: the records of every partition, up to where they end when the request comes, are
copied into an in-memory log; each shard's engine (and, with several shards, the
coordinator) is rebuilt from the copy as a restarted one would be (its newest snapshot
and what follows, every recorded pass re-run and verified): a copy of the state the
service holds, never the live engines, and nothing is written to the live log. A
simulated cluster is given what runs where, as the log says. Then the job's objects
arrive at the service's clock now (their ``shoal.io/arrive-at``, if any, counts from
then), and the copy runs on a simulated clock (:func:`shards.simulate.drive`) until
nothing is left to do, at the service's shard count, sharding and recorded
configuration.

What "when" means against a real cluster: shoal does not know when a running pod will
end. A pod that carries ``shoal.io/runtime`` is taken to end that many seconds after it
was bound (at once, if that is already past); any other running pod runs on. A job pod
that needs one of those to end waits for it (``wait_seconds``); one that needs a pod
without the annotation to end is never placed, with the engine's reason. Pending pods
already in the queue compete with the job as they would. The answer says so (``note``).

The answer has the shape of the ``--log`` form's (:class:`shards.dryrun.DryRun`):
``at_seconds`` is the service's clock (Unix seconds), ``placed_at_seconds`` too.

Cost: reading the whole log, rebuilding the engines (from their newest snapshots where
the service writes them) and the simulated continuation, once per dry run; the service
runs one dry run at a time, off its event loop (in a thread of its own).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from events.errors import InputError, LogError
from events.log import EventLog, read_past_unreadable
from events.memory import MemoryLog
from events.types import (
    BindFailed,
    Envelope,
    PodBound,
    PodDeleted,
    PodFailed,
    PodMigrated,
    PodSucceeded,
    PodUnbound,
    RecordQuarantined,
)
from shards import dryrun
from shards.binder import Binder
from shards.cluster import SimulatedCluster
from shards.control import ControlWorker
from shards.coordinator.coordinator import RELAY, ROUTER, Coordinator, relay_source
from shards.inputs.scenario import TimedEvent, check_topology, load_scenario
from shards.plugins import installed
from shards.replay import recorded_config
from shards.report import merge
from shards.simulate import drive
from shards.whatif import log_sharding
from shards.worker import ShardWorker

MAX_JOB_BYTES: Final = 4 * 1024 * 1024
"""The largest job a service dry-runs (larger: 413)."""
CHUNK: Final = 5000
"""Records of a partition read between yields to the event loop."""
NOTE: Final = (
    "against a running cluster: pods that carry shoal.io/runtime are taken to end that "
    "long after they were bound (at once if that is past); other running pods run on, "
    "their end is unknown; waits count from the request"
)
JOB_NAME: Final = "job.yaml"


async def read_live(bus: EventLog) -> list[list[Envelope]]:
    """Every record of every partition of a running service's bus (the control
    partition last), yielding to the event loop between chunks, cut to a point every
    partition had reached (:func:`consistent_cut`). A record that cannot be read stands
    as a ``RecordQuarantined`` at its offset."""
    parts: list[list[Envelope]] = []
    for partition in range(bus.partitions):
        records: list[Envelope] = []
        position = 0
        while True:
            batch, unreadable, position = await read_past_unreadable(
                bus, partition, position, CHUNK
            )
            filler = {
                offset: Envelope(
                    event=RecordQuarantined(offset=offset, reason=reason[:200], component="whatif"),
                    offset=offset,
                    producer="whatif",
                )
                for offset, reason in unreadable
            }
            records.extend(sorted([*batch, *filler.values()], key=lambda e: e.offset))
            if not batch and not unreadable:
                break
            await asyncio.sleep(0)
        parts.append(records)
    return consistent_cut(parts)


def consistent_cut(parts: Sequence[Sequence[Envelope]]) -> list[list[Envelope]]:
    """``parts`` (read one partition after another while the service ran on) cut to a
    point every partition had reached: no relayed copy in the control partition of a
    shard's record the copy lacks, no router record in a shard's partition caused by a
    control record the copy lacks (a rebuilt coordinator would take them for work
    done). Each cut can call for the other; they only shrink, so this ends."""
    if len(parts) == 1:
        return [list(parts[0])]
    control = len(parts) - 1
    ends = [p[-1].offset + 1 if p else 0 for p in parts]
    while True:
        cut = list(ends)
        for env in parts[control]:
            source = relay_source(env.producer, control) if env.stream == RELAY else None
            if env.offset >= cut[control] or (source is not None and env.causation >= ends[source]):
                cut[control] = min(cut[control], env.offset)
                break
        for shard in range(control):
            for env in parts[shard]:
                if env.offset >= cut[shard] or (
                    env.producer == ROUTER and env.causation >= cut[control]
                ):
                    cut[shard] = min(cut[shard], env.offset)
                    break
        if cut == ends:
            return [[e for e in p if e.offset < end] for p, end in zip(parts, ends, strict=True)]
        ends = cut


def load_job(body: bytes) -> dryrun.Job:
    """The job a request's body describes (YAML or JSON documents, as a job file holds);
    :class:`~events.errors.InputError` names the document and field of what is wrong."""
    with tempfile.TemporaryDirectory(prefix="shoal-whatif-") as folder:
        path = Path(folder) / JOB_NAME
        path.write_bytes(body)
        try:
            scenario = load_scenario([str(path)])
        except InputError as exc:
            raise InputError(
                exc.message.replace(f"{folder}/", ""),
                location=exc.location.replace(f"{folder}/", ""),
            ) from None
    return dryrun.job_of(scenario, JOB_NAME)


def primed_cluster(parts: Sequence[Sequence[Envelope]]) -> SimulatedCluster:
    """A simulated cluster that holds what the log says runs where: its nodes, pods
    submitted and not over, and placements (decided or found on the cluster) that no
    failed binding took back; a running pod with ``shoal.io/runtime`` ends that long
    after it was bound."""
    cluster = SimulatedCluster()
    routed = len(parts) > 1
    control = len(parts) - 1
    moves: list[PodMigrated] = []  # a run of moves: one step, as the binder makes it
    moved_at = 0
    for env in merge([list(p) for p in parts]):
        event = env.event
        if routed and (
            env.stream == "relay" if env.partition == control else env.producer == "router"
        ):
            continue  # a copy: the original is folded where it was written
        if isinstance(event, PodMigrated):
            moves.append(event)
            moved_at = env.time
            continue
        if moves:
            cluster.migrate_all(moves, moved_at)
            moves = []
        match event:
            case PodBound():
                cluster.bind(event, env.time)
            case BindFailed(pod=pod, node=node, decision_id=decision):
                cluster.unbind(PodUnbound(pod=pod, node=node, decision_id=decision, reason=""))
            case PodUnbound():
                cluster.unbind(event)
            case PodSucceeded(pod=pod) | PodFailed(pod=pod):
                cluster.observe(Envelope(event=PodDeleted(pod=pod)))  # over: it holds nothing
            case _:
                cluster.observe(env)
    if moves:
        cluster.migrate_all(moves, moved_at)
    return cluster


async def copy_of(parts: Sequence[Sequence[Envelope]]) -> MemoryLog:
    """An in-memory log holding ``parts`` at their offsets; refuses a partition whose
    first records are gone (a topic's retention deleted them)."""
    log = MemoryLog(len(parts))
    for partition, records in enumerate(parts):
        if records and records[0].offset != 0:
            raise LogError(
                f"partition {partition} starts at offset {records[0].offset} (its first "
                "records were deleted): a dry run needs the whole log"
            )
        if records:
            await log.append(records, partition)
    return log


async def dry_run_live(
    parts: Sequence[Sequence[Envelope]], job: dryrun.Job, now: int
) -> dryrun.DryRun:
    """The job submitted at ``now`` (the service's clock, ns) to a copy of the state
    ``parts`` (a running service's log) holds, run until nothing is left to do."""
    dryrun.check_names(parts, job, "the service's log")
    config = recorded_config(parts[-1])
    check_topology(config, job.scenario)
    sharding = log_sharding(parts)
    routed = len(parts) > 1
    shards = len(parts) - 1 if routed else 1
    log = await copy_of(parts)
    ends = [len(p) for p in parts]
    cluster = primed_cluster(parts)
    workers = [
        await ShardWorker.recover(log, config, shard=s, partition=s if routed else 0)
        for s in range(shards)
    ]
    router = None
    if routed:
        assert sharding is not None  # a log of several partitions records its sharding
        router = ControlWorker(
            Coordinator(sharding, config, installed().registry), log, config=config
        )
        await router.recover()
    binder = Binder(cluster, log, shards=shards)
    binder.positions = ends  # what the log holds is applied already (primed_cluster)
    start = max([now, *(env.time for p in parts for env in p[-1:])])
    feed = [TimedEvent(start + t.time, t.order, t.event) for t in job.scenario.events]
    await drive(feed, log, workers, router, binder, start=start)
    run = [await log.read(p, 0) for p in range(log.partitions)]
    return dryrun.DryRun(dryrun.Point(start), shards, False, dryrun.answers(run, job))


def answer(parts: list[list[Envelope]], job: dryrun.Job, now: int) -> dict[str, object]:
    """:func:`dry_run_live` on an event loop of its own (for a thread), as JSON."""
    result = asyncio.run(dry_run_live(parts, job, now))
    return {"source": "live", **result.to_json(), "note": NOTE}

"""A driver for the routed system that interleaves, crashes and loses at random.

It runs the same components as ``simulate --shards N`` (control worker, shard workers,
binder over the simulated cluster) but, at every step, polls them in a random order,
lets some of them sit out a step, loses appends (the component "crashes" before its
output is stored, and restarts from the log) and restarts components outright. The
simulated cluster also refuses some binds, as a real API server does when capacity is
taken behind the scheduler's back. At quiet points it checks that no gang is bound
partially; at the end it lets everything settle without faults, so that the final
state can be checked against the invariants.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.engine import Engine
from engine.model.groups import group_is_over
from engine.model.pools import Sharding
from engine.model.reservations import HELD, STAGING
from events.errors import LogError
from events.log import EventLog
from events.memory import MemoryLog
from events.types import (
    BindFailed,
    ClockTicked,
    Envelope,
    Event,
    PodBound,
    PodGroupSubmitted,
    PodSubmitted,
    SchedulerConfigured,
    ShardingConfigured,
)
from shards.binder import Binder
from shards.cluster import SimulatedCluster
from shards.control import ControlWorker
from shards.coordinator.coordinator import Coordinator
from shards.coordinator.flights import ABORTING, PREPARING
from shards.inputs.scenario import Scenario
from shards.report import RunReport, merge
from shards.worker import ShardWorker

DEBUG = bool(os.environ.get("SHOAL_CHAOS_DEBUG"))


class LossyLog:
    """Appends through it fail (nothing stored) when the dice say so."""

    def __init__(self, inner: EventLog, rng: random.Random, loss: float) -> None:
        self.inner = inner
        self.rng = rng
        self.loss = loss
        self.enabled = True
        self.lost = 0

    @property
    def partitions(self) -> int:
        return self.inner.partitions

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        if self.enabled and self.rng.random() < self.loss:
            self.lost += 1
            raise LogError("append lost (injected)")
        return await self.inner.append(envelopes, partition)

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        return await self.inner.read(partition, offset, limit)

    async def end_offset(self, partition: int) -> int:
        return await self.inner.end_offset(partition)

    async def close(self) -> None:
        await self.inner.close()


class FlakyCluster(SimulatedCluster):
    """Refuses a share of binds, as if someone else had used the capacity."""

    def __init__(self, rng: random.Random, refuse: float) -> None:
        super().__init__()
        self.rng = rng
        self.refuse = refuse
        self.enabled = True
        self.double_binds = 0

    def bind(self, decision: PodBound, now: int) -> list[Event]:
        current = self.running.get(decision.pod)
        if current is not None and current[1] != decision.decision_id:
            self.double_binds += 1
        if self.enabled and current is None and self.rng.random() < self.refuse:
            self.bind_failures += 1
            return [
                BindFailed(
                    pod=decision.pod,
                    node=decision.node,
                    decision_id=decision.decision_id,
                    reason="conflict (injected)",
                )
            ]
        return super().bind(decision, now)


@dataclass
class ChaosResult:
    log: MemoryLog
    engines: list[Engine]
    control: Coordinator
    cluster: FlakyCluster
    report: RunReport
    partial_gangs: list[str] = field(default_factory=list)
    restarts: int = 0
    lost: int = 0


async def run_chaos(
    scenario: Scenario,
    sharding: Sharding,
    *,
    seed: int,
    loss: float = 0.05,
    restart: float = 0.05,
    skip: float = 0.2,
    refuse: float = 0.05,
    min_members: dict[str, int] | None = None,
    snapshot_every: int = 0,
    runs: dict[str, str] | None = None,
) -> ChaosResult:
    """``min_members`` by gang, checked at quiet points; ``runs`` names, per pod, the
    gang it is checked under where that is not its group (a group's name run again:
    each run is checked on its own, as ``ml/g0``, ``ml/g0#2``, … in the order the
    group's PodGroups are submitted). A pod not named there joins its group's run, or
    the next run where that one is over when the pod comes (:func:`_run_joined`)."""
    rng = random.Random(seed)
    n = sharding.shards
    memory = MemoryLog(n + 1)
    log = LossyLog(memory, rng, loss)
    await memory.append(
        [
            Envelope(event=ShardingConfigured(config=sharding.to_json()), producer="ingest"),
            Envelope(event=SchedulerConfigured(config=""), producer="ingest"),
        ],
        n,
    )
    workers = [
        ShardWorker(Engine(shard=i), log, partition=i, snapshot_every=snapshot_every)
        for i in range(n)
    ]
    router = ControlWorker(Coordinator(sharding), log, snapshot_every=snapshot_every)
    cluster = FlakyCluster(rng, refuse)
    binder = Binder(cluster, memory, shards=n)  # the cluster side does not crash here
    member_of: dict[str, str] = {}
    submitted: dict[str, int] = {}
    """PodGroups submitted so far, by group."""
    partial: list[str] = []
    restarts = 0

    async def restart_shard(i: int) -> None:
        nonlocal restarts
        restarts += 1
        workers[i] = await ShardWorker.recover(
            log, shard=i, partition=i, snapshot_every=snapshot_every
        )

    async def restart_router() -> None:
        nonlocal restarts, router
        restarts += 1
        router = ControlWorker(Coordinator(sharding), log, snapshot_every=snapshot_every)

    async def step(calm: bool) -> int:
        """One round of polls in random order; returns what was appended."""
        order: list[int] = list(range(-1, n))
        rng.shuffle(order)
        moved = 0
        for who in [*order, n]:
            if not calm and who < n and rng.random() < skip:
                continue
            if not calm and who < n and rng.random() < restart:
                await (restart_router() if who < 0 else restart_shard(who))
            try:
                if who < 0:
                    moved += await router.poll()
                elif who < n:
                    moved += await workers[who].poll()
                else:
                    moved += await binder.poll(now)
            except LogError:
                await (restart_router() if who < 0 else restart_shard(who))
                moved += 1  # something was computed; poll again
        return moved

    feed = scenario.events
    i = 0
    now = 0
    calm = False
    same_time = 0
    last_now = -1
    while True:
        if DEBUG:
            print(f"t={now / 1e9:g} records={memory.stats()['records']} restarts={restarts}")
        same_time = same_time + 1 if now == last_now else 0
        last_now = now
        if same_time > 200:
            raise AssertionError(f"time stands still at {now / 1e9:g}s:\n{await _tail(memory)}")
        batch: list[Envelope] = []
        while i < len(feed) and feed[i].time <= now:
            event = feed[i].event
            if isinstance(event, PodSubmitted) and event.pod.group:
                member_of[event.pod.key] = (runs or {}).get(event.pod.key) or _run_joined(
                    router.control.engine, event.pod.group, submitted.get(event.pod.group, 0)
                )
            elif isinstance(event, PodGroupSubmitted):
                submitted[event.group.key] = submitted.get(event.group.key, 0) + 1
            batch.append(Envelope(event=event, time=now, producer="ingest"))
            i += 1
        batch.extend(Envelope(event=e, time=now, producer="cluster") for e in cluster.due(now))
        wake = router.control.next_wakeup()
        if not batch and wake is not None and wake <= now:
            batch.append(Envelope(event=ClockTicked(), time=now, producer="clock"))
        if batch:
            await memory.append(batch, n)
        for shard, worker in enumerate(workers):
            wake = worker.engine.next_wakeup()
            if wake is not None and wake <= now:
                await memory.append(
                    [Envelope(event=ClockTicked(), time=now, producer="clock")], shard
                )
        rounds = 0
        while True:
            moved = await step(calm)
            rounds += 1
            if rounds > 500:
                raise AssertionError(
                    f"no quiet point at {now / 1e9:g}s:\n{await _tail(memory)}", memory
                )
            # quiet: a last full round without faults to be sure
            if not moved and (calm or rounds > 3) and not await step(True):
                break
        if min_members:
            partial.extend(_partial_gangs(cluster, member_of, min_members, now))
        times = [cluster.next_time(), router.control.next_wakeup()]
        times += [w.engine.next_wakeup() for w in workers]
        future = [t for t in times if t is not None]
        if i < len(feed):
            future.append(feed[i].time)
        if not future:
            if not calm:
                calm = True  # settle without faults before the final checks
                log.enabled = cluster.enabled = False
                continue
            break
        now = max(now, min(future))
    parts = [await memory.read(p, 0) for p in range(n + 1)]
    report = RunReport(control=n)
    for env in merge(parts):
        report.apply(env)
    return ChaosResult(
        log=memory,
        engines=[w.engine for w in workers],
        control=router.control,
        cluster=cluster,
        report=report,
        partial_gangs=partial,
        restarts=restarts,
        lost=log.lost,
    )


def _run_joined(engine: Engine, group: str, submitted: int) -> str:
    """The run of ``group`` a pod coming now joins (``submitted``: its PodGroups so far):
    pods join a group by its name, so where the group's run is over (its pods all gone:
    a job preempted whole, say) the pod founds the next run, which the next PodGroup of
    that name will declare (:func:`engine.model.groups.group_is_over`)."""
    info = engine.groups.get(group)
    if submitted and info is not None and group_is_over(info, engine.pods):
        return f"{group}#{submitted + 1}"
    return group if submitted <= 1 else f"{group}#{submitted}"


def _partial_gangs(
    cluster: SimulatedCluster, member_of: dict[str, str], min_members: dict[str, int], now: int
) -> list[str]:
    """Gangs with some members running but fewer than minMember, none finished yet."""
    running: dict[str, int] = {}
    for pod in cluster.running:
        group = member_of.get(pod)
        if group in min_members:
            running[group] = running.get(group, 0) + 1
    return [
        f"{group}: {count} of {min_members[group]} running at {now / 1e9:g}s"
        for group, count in sorted(running.items())
        if count < min_members[group] and group not in _finished_groups(cluster, member_of)
    ]


def _finished_groups(cluster: SimulatedCluster, member_of: dict[str, str]) -> set[str]:
    return {g for pod, g in member_of.items() if pod not in cluster.specs}


def leaked_reservations(result: ChaosResult) -> list[str]:
    leaks = [
        f"shard {e.shard}: {rid} {res.state}"
        for e in result.engines
        for rid, res in e.reservations.items()
        if res.state in (STAGING, HELD)
    ]
    leaks += [
        f"coordinator: {c.rid} {c.stage}"
        for c in result.control.claims.values()
        if c.stage in (PREPARING, ABORTING)
    ]
    return leaks


def unknown_to_the_coordinator(result: ChaosResult) -> list[str]:
    """Pods a shard holds on a node that the coordinator's view does not place there
    (the room they take on that shard stays taken, and the coordinator plans that node
    as free)."""
    view = result.control.engine.state
    unknown = []
    for engine in result.engines:
        for key, placed in engine.state.pods.items():
            node = engine.state.names[placed.slot]
            seen = view.pods.get(key)
            if seen is None or view.names[seen.slot] != node:
                where = "nowhere" if seen is None else view.names[seen.slot]
                unknown.append(f"shard {engine.shard}: {key} on {node}, coordinator: {where}")
    return unknown


def describe(result: ChaosResult) -> str:
    return json.dumps({"restarts": result.restarts, "lost": result.lost, **result.report.counts()})


async def _tail(log: MemoryLog, count: int = 12) -> str:
    lines = []
    for partition in range(log.partitions):
        records = await log.read(partition, 0)
        lines.append(f"partition {partition}: {len(records)} records")
        for env in records[-count:]:
            lines.append(
                f"  {env.offset} t={env.time / 1e9:g} {env.producer} <- {env.causation}: "
                f"{str(env.event)[:200]}"
            )
    return "\n".join(lines)

"""Real processes, real SIGKILL: shards, the coordinator and the binder die at random
points of a run with cross-shard gangs and are started again.

The test serves the log itself (the in-memory log server, on 127.0.0.1, stopped at the
end), writes a cluster of GPU nodes in two pools (one per shard) and a workload whose
big gangs no single shard can hold, starts ``shoal worker`` for each component, and
kills one of them with SIGKILL every few hundred milliseconds while more work arrives.
Once every piece of work is decided (conditions read from the log, never a time of
silence: a restarted component on a busy machine may say nothing for many seconds) it
checks, from the log alone: no pod bound twice, no node over-committed, no gang bound
with fewer than minMember members, no reservation left open, no pod lost, and
``replay --verify`` passing on the whole log.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import pytest

from engine.model.reservations import HELD, STAGING
from events.remote import LogServer, RemoteLog
from events.types import (
    BindFailed,
    Envelope,
    PodBound,
    PodGroupSubmitted,
    PodSubmitted,
    PodUnbound,
    ReservationRequested,
    ShardingConfigured,
)
from shards.coordinator.flights import ABORTING, COMMITTED, PREPARING
from shards.replay import replay, replay_routed
from shards.report import WAITING, RunReport, merge
from tests.shards.fleet import GPUS, SHARDS, Fleet, gang, pods, set_up


async def _settled(log: RemoteLog, limit: float) -> list[int]:
    """Wait until every piece of work is decided, whatever the time it takes: the
    coordinator has forwarded every record and has no claim or flight under way, no shard
    holds an open reservation, and every pod is bound or has been tried (pending with the
    reason of an attempt). A restarted component on a busy machine may be silent for many
    seconds, so silence proves nothing; only these conditions do. ``limit`` is a deadline
    for a run that never gets there, which fails with what is still open. Returns where
    each partition ended when everything was decided."""
    deadline = time.monotonic() + limit
    left: list[str] = ["nothing read yet"]
    while time.monotonic() < deadline:
        parts = [await log.read(p, 0) for p in range(log.partitions)]
        left = _undecided(parts)
        if not left:
            return [part[-1].offset + 1 if part else 0 for part in parts]
        await asyncio.sleep(0.5)
    raise AssertionError(f"the run never settled in {limit:.0f} s: {'; '.join(left[:5])}")


async def _forwarded(log: RemoteLog, limit: float) -> None:
    """Wait until the coordinator has forwarded every shard's record (a condition, read
    from the log; ``limit``: a deadline for a run that never gets there)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        parts = [await log.read(p, 0) for p in range(log.partitions)]
        if not replay_routed(parts, verify=True).unforwarded:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"records still not forwarded after {limit:.0f} s")


def _undecided(parts: list[list[Envelope]]) -> list[str]:
    """What is still under way in ``parts`` (empty: everything is decided)."""
    result = replay_routed(parts, verify=True)
    if result.mismatch is not None:
        return []  # the check that follows reports it
    left: list[str] = []
    coordinator = result.coordinator
    if coordinator is None:
        return ["the coordinator has not started"]
    if result.unforwarded:
        left.append(f"{result.unforwarded} records not forwarded")
    if coordinator.flights:
        left.append(f"flights under way: {sorted(coordinator.flights)}")
    left += [
        f"claim {c.rid} {c.stage}" for c in coordinator.claims.values() if c.stage != COMMITTED
    ]
    for shard in range(SHARDS):
        engine = replay(parts[shard], verify=True, shard=shard).engine
        left += [
            f"shard {shard} reservation {r}"
            for r in engine.reservations.values()
            if r.state in (STAGING, HELD)
        ]
    report = RunReport(control=SHARDS)
    for env in merge(parts):
        report.apply(env)
    submitted = [e.event.pod.key for e in parts[-1] if isinstance(e.event, PodSubmitted)]
    left += [
        f"{key} not tried yet"
        for key in submitted
        if report.pods[key].phase == "Pending" and report.pods[key].reason == WAITING
    ]
    return left


@pytest.mark.parametrize("seed", [1, 2])
async def test_sigkill_anywhere_loses_nothing(seed: int) -> None:
    rng = random.Random(seed)
    async with LogServer(SHARDS + 1) as server:
        log = await RemoteLog.connect(server.url)
        ingest = await set_up(log)
        fleet = Fleet(server.url)
        roles = ["coordinator", "binder", *(f"shard-{i}" for i in range(SHARDS))]
        for role in roles:
            await fleet.start(role)
        waves = [
            gang("wide-a", 26),
            gang("local-b", 4) + gang("local-c", 6) + pods("a", 3),
            gang("wide-d", 28),
            pods("e", 3),
        ]
        try:
            for round_ in range(12):
                if round_ % 3 == 0 and waves:
                    await ingest(waves.pop(0))
                await asyncio.sleep(rng.uniform(0.05, 0.4))
                victim = rng.choice(roles)
                await fleet.kill(victim)
                await asyncio.sleep(rng.uniform(0.0, 0.2))
                await fleet.start(victim)
            for wave in waves:
                await ingest(wave)
            settled = await _settled(log, 300.0)
            # a shard may still decide (a pending pod's retry after its back-off) while
            # the others stop: the coordinator, stopped last, forwards what they wrote
            await fleet.stop(keep="coordinator")
            await _forwarded(log, 120.0)
        finally:
            await fleet.stop()
        parts = [await log.read(p, 0) for p in range(SHARDS + 1)]
        await log.close()

    assert sum(fleet.kills.values()) == 12
    _check(parts, settled)


def _begun_after(parts: list[list[Envelope]], settled: list[int]) -> set[str]:
    """Reservations first requested of a shard after the run settled. A gang still
    pending retries after its back-off, so the coordinator may begin one while the
    shards are being stopped; no stopped shard answers it, so it stays open, which says
    nothing of the run (everything begun before was decided: :func:`_settled`)."""
    seen: set[str] = set()
    early: set[str] = set()
    for shard in range(SHARDS):
        for env in parts[shard]:
            if isinstance(env.event, ReservationRequested):
                seen.add(env.event.rid)
                if env.offset < settled[shard]:
                    early.add(env.event.rid)
    return seen - early


def _check(parts: list[list[Envelope]], settled: list[int]) -> None:
    late = _begun_after(parts, settled)
    records = merge(parts)
    # Bindings as the cluster holds them: a PodBound not refused and not taken back.
    refused = {e.event.decision_id for e in records if isinstance(e.event, BindFailed)}
    active: dict[str, tuple[str, str]] = {}
    for env in records:
        event = env.event
        if isinstance(event, PodBound) and event.decision_id not in refused:
            assert event.pod not in active or active[event.pod][1] == event.decision_id, (
                f"{event.pod} bound twice: {active[event.pod]} and {event.decision_id}"
            )
            active[event.pod] = (event.node, event.decision_id)
        elif isinstance(event, PodUnbound) and active.get(event.pod, ("", ""))[1] == (
            event.decision_id
        ):
            del active[event.pod]
    specs = {e.event.pod.key: e.event.pod for e in parts[-1] if isinstance(e.event, PodSubmitted)}
    used: Counter[str] = Counter()
    for pod, (node, _) in active.items():
        used[node] += specs[pod].requests.get("nvidia.com/gpu", 0)
    assert all(count <= GPUS for count in used.values()), used
    minimum = {
        e.event.group.key: e.event.group.min_member
        for e in parts[-1]
        if isinstance(e.event, PodGroupSubmitted)
    }
    bound_members = Counter(specs[p].group for p in active if specs[p].group)
    for group, count in bound_members.items():
        assert count >= minimum[group], f"gang {group} bound with {count} < {minimum[group]}"
    # No reservation left open, on any shard or at the coordinator.
    for shard in range(SHARDS):
        engine = replay(parts[shard], verify=True, shard=shard).engine
        open_ = [
            r
            for r in engine.reservations.values()
            if r.state in (STAGING, HELD) and r.rid not in late
        ]
        assert open_ == [], f"shard {shard} holds {open_}"
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, str(verified.mismatch)
    assert verified.unforwarded == 0
    assert verified.snapshots > 0
    coordinator = verified.coordinator
    assert coordinator is not None
    assert not [
        c.rid
        for c in coordinator.claims.values()
        if c.stage in (PREPARING, ABORTING) and c.rid not in late
    ]
    assert coordinator.counters["committed"] >= 1, coordinator.counters
    # No pod lost: bound, or pending with a reason somewhere.
    report = RunReport(control=SHARDS)
    for env in records:
        report.apply(env)
    for key in specs:
        view = report.pods[key]
        assert view.phase in {"Bound", "Pending"}, (key, view)
        assert (view.phase == "Bound") == (key in active), (key, view)
        assert view.phase == "Bound" or view.reason, (key, view)
    assert (
        any(specs[p].group == "train/wide-a" for p in active)
        or report.pods["train/wide-a-00"].reason
    )


def _sharding_json(control: list[Envelope]) -> str:
    for env in control:
        if isinstance(env.event, ShardingConfigured):
            return env.event.config
    raise AssertionError("no sharding configuration")

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
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from engine.model.pools import Sharding
from engine.model.reservations import HELD, STAGING
from events.remote import LogServer, RemoteLog
from events.types import (
    SECOND,
    BindFailed,
    Envelope,
    Event,
    GroupSpec,
    NodeAdded,
    NodeSpec,
    PodBound,
    PodGroupSubmitted,
    PodSpec,
    PodSubmitted,
    PodUnbound,
    SchedulerConfigured,
    ShardingConfigured,
)
from shards.coordinator.flights import ABORTING, COMMITTED, PREPARING
from shards.replay import replay, replay_routed
from shards.report import WAITING, RunReport, merge

SHARDS = 2
NODES_PER_SHARD = 6
GPUS = 4


def _nodes() -> list[NodeSpec]:
    return [
        NodeSpec(
            name=f"gpu-{i:02d}",
            allocatable={"cpu": 64000, "memory": 256 << 30, "pods": 110, "nvidia.com/gpu": GPUS},
            labels={"shoal.io/pool": f"pool-{i % SHARDS}"},
        )
        for i in range(NODES_PER_SHARD * SHARDS)
    ]


def _gang(name: str, size: int) -> list[Event]:
    group = GroupSpec(namespace="train", name=name, min_member=size, timeout=120 * SECOND)
    members: list[Event] = [
        PodSubmitted(
            pod=PodSpec(
                namespace="train",
                name=f"{name}-{m:02d}",
                requests={"cpu": 1000, "nvidia.com/gpu": 1},
                group=group.key,
            )
        )
        for m in range(size)
    ]
    return [PodGroupSubmitted(group=group), *members]


def _pods(prefix: str, count: int) -> list[Event]:
    return [
        PodSubmitted(
            pod=PodSpec(namespace="web", name=f"{prefix}-{i}", requests={"nvidia.com/gpu": 1})
        )
        for i in range(count)
    ]


class Fleet:
    """The component processes, started and killed by role."""

    def __init__(self, url: str, logs: Path | None = None) -> None:
        self.url = url
        self.logs = logs
        """Where each role's standard error goes (``ROLE.log``, appended), if given."""
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.kills: Counter[str] = Counter()

    def said(self, role: str) -> str:
        """What ``role`` has written to its standard error so far (with ``logs``)."""
        assert self.logs is not None
        path = self.logs / f"{role}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    async def start(self, role: str) -> None:
        args = ["worker", role.split("-", maxsplit=1)[0], "--bus", self.url]
        if role.startswith("shard-"):
            args += ["--shard-id", role.split("-")[1]]
        if role != "binder":
            # snapshots often, so that restarts restore them (and replay checks them)
            args += ["--snapshot-every", "40"]
        if self.logs is None:
            self.procs[role] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "shards.cli", *args, env={**os.environ}
            )
            return
        with open(self.logs / f"{role}.log", "ab") as err:
            self.procs[role] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "shards.cli", *args, env={**os.environ}, stderr=err
            )

    async def kill(self, role: str) -> None:
        proc = self.procs[role]
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()
        self.kills[role] += 1

    async def stop(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs.values():
            await proc.wait()


async def _settled(log: RemoteLog, limit: float) -> None:
    """Wait until every piece of work is decided, whatever the time it takes: the
    coordinator has forwarded every record and has no claim or flight under way, no shard
    holds an open reservation, and every pod is bound or has been tried (pending with the
    reason of an attempt). A restarted component on a busy machine may be silent for many
    seconds, so silence proves nothing; only these conditions do. ``limit`` is a deadline
    for a run that never gets there, which fails with what is still open."""
    deadline = time.monotonic() + limit
    left: list[str] = ["nothing read yet"]
    while time.monotonic() < deadline:
        parts = [await log.read(p, 0) for p in range(log.partitions)]
        left = _undecided(parts)
        if not left:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"the run never settled in {limit:.0f} s: {'; '.join(left[:5])}")


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
    sharding = Sharding(shards=SHARDS, reservation_timeout=3 * SECOND)
    async with LogServer(SHARDS + 1) as server:
        log = await RemoteLog.connect(server.url)

        async def ingest(events: list[Event]) -> None:
            now = time.time_ns()
            await log.append(
                [Envelope(event=e, time=now, producer="ingest") for e in events], SHARDS
            )

        await ingest(
            [
                ShardingConfigured(config=sharding.to_json()),
                SchedulerConfigured(),
                *(NodeAdded(node=n) for n in _nodes()),
            ]
        )
        fleet = Fleet(server.url)
        roles = ["coordinator", "binder", *(f"shard-{i}" for i in range(SHARDS))]
        for role in roles:
            await fleet.start(role)
        waves = [
            _gang("wide-a", 26),
            _gang("local-b", 4) + _gang("local-c", 6) + _pods("a", 3),
            _gang("wide-d", 28),
            _pods("e", 3),
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
            await _settled(log, 300.0)
        finally:
            await fleet.stop()
        parts = [await log.read(p, 0) for p in range(SHARDS + 1)]
        await log.close()

    assert sum(fleet.kills.values()) == 12
    _check(parts)


def _check(parts: list[list[Envelope]]) -> None:
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
        open_ = [r for r in engine.reservations.values() if r.state in (STAGING, HELD)]
        assert open_ == [], f"shard {shard} holds {open_}"
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, str(verified.mismatch)
    assert verified.unforwarded == 0
    assert verified.snapshots > 0
    coordinator = verified.coordinator
    assert coordinator is not None
    assert not [c.rid for c in coordinator.claims.values() if c.stage in (PREPARING, ABORTING)]
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

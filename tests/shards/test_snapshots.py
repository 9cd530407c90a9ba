"""Snapshots: a restored engine continues exactly as the one that was never stopped;
snapshots in the log are verified by replay and used by recovery; a snapshot that is
corrupt, forged or incomplete is refused with a reason and costs only time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.model.pools import Sharding
from engine.snapshot import (
    FORMAT,
    SnapshotError,
    assemble,
    digest,
    encode_state,
    restore,
    snapshot_events,
    snapshot_parts,
)
from events.memory import MemoryLog
from events.types import Envelope, SchedulerConfigured, SnapshotTaken, is_decision
from shards.control import ControlWorker
from shards.coordinator.coordinator import Coordinator
from shards.coordinator.snapshot import COORDINATOR, coordinator_state
from shards.inputs.scenario import Scenario, load_scenario
from shards.replay import Resume, replay, replay_routed
from shards.simulate import simulate
from shards.worker import (
    SNAPSHOT_EVERY,
    SNAPSHOT_PER_POD,
    ShardWorker,
    newest_snapshot,
    snapshot_due,
)
from tests.builders import make_node, make_pod
from tests.shards.test_batch_properties import batch_scenario

ROOT = Path(__file__).resolve().parents[2]


def _record(scenario: Scenario, snapshot_every: int = 0) -> list[Envelope]:
    async def go() -> list[Envelope]:
        log = MemoryLog()
        await simulate(scenario, log, snapshot_every=snapshot_every)
        return await log.read(0, 0)

    return asyncio.run(go())


def _decisions(records: list[Envelope]) -> list[Any]:
    return [e.event for e in records if is_decision(e.event)]


@settings(max_examples=60)
@given(batch_scenario(), st.data())
def test_a_restored_engine_continues_exactly(scenario: Scenario, data: st.DataObject) -> None:
    """Cut a run after any pass, snapshot, restore, replay the rest: every later
    decision is the same, and so is the final state, byte for byte."""
    records = _record(scenario)
    full = replay(records, verify=True)
    assert full.mismatch is None
    causes = sorted({e.causation for e in records if is_decision(e.event)})
    if not causes:
        return
    cut = data.draw(st.sampled_from(causes))
    head = replay(records, verify=True, until=cut)
    raw = encode_state(head.engine)
    # a driver asks when to wake the engine as often as it likes between passes; the
    # question drops superseded back-off records, and must not change the snapshot
    asked = replay(records, verify=True, until=cut).engine
    asked.next_wakeup()
    assert encode_state(asked) == raw
    restored = restore(raw)
    assert encode_state(restored) == raw
    tail = replay(records, verify=True, resume=Resume(restored, cut + 1))
    assert tail.mismatch is None, tail.mismatch
    assert head.verified + tail.verified == full.verified
    assert encode_state(tail.engine) == encode_state(full.engine)


def test_snapshots_in_the_log_change_no_decision_and_replay_checks_them() -> None:
    scenario = load_scenario([str(ROOT / "examples" / "batch.yaml")])
    plain = _record(scenario)
    with_snapshots = _record(scenario, snapshot_every=5)
    taken = [e for e in with_snapshots if isinstance(e.event, SnapshotTaken)]
    assert len(taken) >= 3
    assert _decisions(with_snapshots) == _decisions(plain)
    result = replay(with_snapshots, verify=True)
    assert result.mismatch is None
    assert result.snapshots == len({e.event.digest for e in taken})  # type: ignore[union-attr]
    # a snapshot whose state is not what the pass left is a mismatch, located
    first = taken[0]
    forged = msgspec.structs.replace(
        first, event=msgspec.structs.replace(first.event, digest="0" * 64)
    )  # type: ignore[type-var]
    tampered = [forged if e is first else e for e in with_snapshots]
    bad = replay(tampered, verify=True)
    assert bad.mismatch is not None and bad.mismatch.offset == first.offset
    assert "snapshot differs" in str(bad.mismatch)


def test_recovery_restores_the_newest_snapshot_and_equals_a_full_replay() -> None:
    scenario = load_scenario([str(ROOT / "examples" / "batch.yaml")])
    records = _record(scenario, snapshot_every=5)
    newest = max(e.offset for e in records if isinstance(e.event, SnapshotTaken))

    async def go() -> None:
        log = MemoryLog()
        await log.append(records)
        worker = await ShardWorker.recover(log)
        assert worker.restored_from >= 0
        found = await newest_snapshot(log, 0, "shard-0", window=3)  # crosses windows
        assert found is not None and found[-1].offset == newest
        full = replay(records, verify=True)
        assert encode_state(worker.engine) == encode_state(full.engine)
        assert worker.position == len(records)

    asyncio.run(go())


def test_a_corrupt_snapshot_costs_only_time() -> None:
    """Recovery refuses a snapshot whose bytes do not add up, says so, and replays the
    partition from the start instead: the same state, nothing lost."""
    scenario = load_scenario([str(ROOT / "examples" / "batch.yaml")])
    records = _record(scenario, snapshot_every=5)
    expected = encode_state(replay(records, verify=True).engine)
    taken = [e for e in records if isinstance(e.event, SnapshotTaken)]
    last = taken[-1]
    assert isinstance(last.event, SnapshotTaken)
    garbled = msgspec.structs.replace(last.event, data=last.event.data[:-3] + b"xyz")
    damaged = [msgspec.structs.replace(e, event=garbled) if e is last else e for e in records]

    async def go() -> ShardWorker:
        log = MemoryLog()
        await log.append(damaged)
        return await ShardWorker.recover(log)

    worker = asyncio.run(go())
    assert worker.restored_from == -1
    assert encode_state(worker.engine) == expected


def test_snapshots_of_several_shards_replay() -> None:
    scenario = load_scenario([str(ROOT / "examples" / "batch.yaml")])

    async def go() -> list[list[Envelope]]:
        log = MemoryLog(4)
        await simulate(scenario, log, sharding=Sharding(shards=3), snapshot_every=3)
        return [await log.read(p, 0) for p in range(4)]

    parts = asyncio.run(go())
    result = replay_routed(parts, verify=True)
    assert result.mismatch is None
    assert result.snapshots > 0


def test_parts_are_small_and_reassemble() -> None:
    records = _record(load_scenario([str(ROOT / "examples" / "batch.yaml")]))
    engine = replay(records).engine
    parts = snapshot_events(engine, 7, component="shard-0", chunk=100)
    assert len(parts) > 2 and all(len(p.data) <= 100 for p in parts)
    raw = assemble(parts)
    assert digest(raw) == parts[0].digest
    assert encode_state(restore(raw)) == encode_state(engine)
    with pytest.raises(SnapshotError, match="belong together"):
        assemble(parts[:-1])
    with pytest.raises(SnapshotError, match="belong together"):
        assemble([parts[1], parts[0], *parts[2:]])


# --------------------------------------------------------------------------- hostile


def _tree(state: list[Any], **extra: Any) -> bytes:
    return msgspec.msgpack.encode(
        {"format": FORMAT, "shard": 0, "config": "", "state": state, **extra}
    )


def _valid_state() -> list[Any]:
    records = _record(load_scenario([str(ROOT / "examples" / "quickstart.yaml")]))
    tree = msgspec.msgpack.decode(encode_state(replay(records).engine))
    state: list[Any] = tree["state"]
    return state


def _with(state: list[Any], name: str, node: Any) -> list[Any]:
    return [[k, node if k == name else v] for k, v in state]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda s: b"\x00garbage", "unreadable"),
        (lambda s: msgspec.msgpack.encode([1, 2]), "not a format"),
        (lambda s: _tree(s, format=99), "not a format"),
        (lambda s: _tree(s, shard=3), "of shard 3, not of shard 0"),
        (lambda s: _tree(s, config="{not json"), "configuration is invalid"),
        (lambda s: _tree(s[1:]), "missing state"),
        (lambda s: _tree([*s, ["intruder", 1]]), "unexpected attribute"),
        (lambda s: _tree(_with(s, "now", ["L", []])), "wrong kind"),
        (lambda s: _tree(_with(s, "pods", ["O", "os.system", []])), "not a snapshot class"),
        (lambda s: _tree(_with(s, "pods", ["O", "PodInfo", [["__class__", 1]]])), "not state"),
        (lambda s: _tree(_with(s, "pods", ["Z", 1])), "unknown node kind"),
        (lambda s: _tree(_with(s, "pods", ["R", 10_000])), "dangling reference"),
        (lambda s: _tree(_with(s, "pods", ["D", [[["L", []], 1]]])), "unhashable"),
        (lambda s: _tree(_with(s, "pods", ["N", "|O", [1], b"x"])), "malformed array"),
        (lambda s: _tree(_with(s, "pods", ["N", "<i8", [2], b"x"])), "does not match"),
        (lambda s: _tree(_with(s, "pods", ["N", "<i8", [-1], b""])), "malformed array shape"),
        (lambda s: _tree(_with(s, "pods", ["S", "PodSpec", b"\xc1"])), "malformed PodSpec"),
        (lambda s: _tree(_with(s, "pods", ["S", "Engine", b""])), "malformed struct"),
        (lambda s: _tree(_with(s, "pods", ["V", "ClusterEvent", "Nope"])), "no ClusterEvent"),
        (lambda s: _tree(_with(s, "pods", _deep(200))), "nested too deeply"),
        (
            lambda s: _tree(_with(s, "pods", ["D", [["ns/p", ["O", "PodInfo", []]]]])),
            "a pod without its spec",
        ),
        (
            lambda s: _tree(
                _with(s, "pods", ["W", ["N", "<i8", [2], b"\0" * 16], "<i8", [4], [8], 0])
            ),
            "outside its base",
        ),
    ],
)
def test_hostile_snapshots_are_refused_with_a_reason(build: Any, message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        restore(build(_valid_state()))


def _deep(n: int) -> Any:
    node: Any = ["L", []]
    for _ in range(n):
        node = ["L", [node]]
    return node


def test_the_coordinator_restores_its_snapshot_and_replay_checks_it() -> None:
    """A coordinator restarted from its newest snapshot stands where one that folded the
    whole control partition stands, appending nothing twice; a snapshot that does not
    match the fold is a mismatch at its offset."""
    scenario = load_scenario([str(ROOT / "examples" / "batch.yaml")])
    sharding = Sharding(shards=3)

    async def go() -> None:
        log = MemoryLog(4)
        await simulate(scenario, log, sharding=sharding, snapshot_every=3)
        parts = [await log.read(p, 0) for p in range(4)]
        taken = [e for e in parts[3] if isinstance(e.event, SnapshotTaken)]
        assert taken and all(e.producer == COORDINATOR for e in taken)
        assert replay_routed(parts, verify=True).mismatch is None
        sizes = [len(p) for p in parts]
        restarted = ControlWorker(Coordinator(sharding), log, snapshot_every=3)
        await restarted.recover()
        assert restarted.restored_from == max(e.offset for e in taken) - taken[-1].event.part  # type: ignore[union-attr]
        folded = ControlWorker(Coordinator(sharding), log)
        await folded.recover(use_snapshots=False)
        assert folded.restored_from == -1
        assert restarted.written == folded.written
        assert await folded.poll() == 0
        assert await restarted.poll() == 0
        assert [len(await log.read(p, 0)) for p in range(4)] == sizes  # nothing appended
        assert restarted.position == folded.position
        assert coordinator_state(restarted.control) == coordinator_state(folded.control)
        # a forged digest of the fold's state is caught by replay
        first = taken[0]
        tree = msgspec.msgpack.decode(assemble([first.event]))  # type: ignore[list-item]
        tree["state_digest"] = "0" * 64
        (forged,) = snapshot_parts(
            msgspec.msgpack.encode(tree),
            first.event.position,
            component=COORDINATOR,  # type: ignore[union-attr]
        )
        tampered = [list(p) for p in parts]
        i = tampered[3].index(first)
        tampered[3][i] = msgspec.structs.replace(first, event=forged)
        bad = replay_routed(tampered, verify=True)
        assert bad.mismatch is not None and "coordinator snapshot differs" in str(bad.mismatch)

    asyncio.run(go())


@pytest.mark.parametrize(
    ("since", "pods", "every", "per_pod", "due"),
    [
        (49_999, 0, 50_000, 4, False),
        (50_000, 0, 50_000, 4, True),
        (50_000, 12_500, 50_000, 4, True),  # 4 * 12,500 = 50,000: the count decides
        (50_000, 12_501, 50_000, 4, False),  # a larger state: wait for 4 records a pod
        (200_000, 50_000, 50_000, 4, True),
        (199_999, 50_000, 50_000, 4, False),
        (5, 1_000, 5, 0, True),  # no floor per pod: the count alone
        (10**9, 0, 0, 4, False),  # never
    ],
)
def test_when_a_snapshot_is_due(since: int, pods: int, every: int, per_pod: int, due: bool) -> None:
    assert snapshot_due(since, pods, every, per_pod) is due


def test_a_worker_holding_many_pods_waits_for_records_in_proportion() -> None:
    """With a floor per pod, a shard holding many pods writes its snapshot only once
    that many records per pod have passed; without it, at the count given."""
    nodes = [make_node(f"n{i}").cpu("64").added() for i in range(2)]
    pods = [make_pod(f"p{i}").cpu("100m").submitted() for i in range(30)]

    async def snapshots_after(per_pod: int, batches: int) -> int:
        log = MemoryLog()
        worker = ShardWorker(Engine(), log, snapshot_every=10, snapshot_per_pod=per_pod)
        await log.append([Envelope(event=SchedulerConfigured()), *map(_ingested, nodes)])
        await worker.poll()
        for batch in range(batches):
            await log.append([_ingested(p) for p in pods[batch * 10 : batch * 10 + 10]])
            await worker.poll()
        return sum(1 for e in await log.read(0, 0) if isinstance(e.event, SnapshotTaken))

    # A batch is 10 pods in and 10 decisions out; the check follows each pass, counting
    # the records read since the last snapshot (3 setup records and the first batch's
    # pods: 13; then each batch's pods, the previous decisions and snapshot part: 21),
    # against 10 and the floor per pod and node held (12, 22, 32: the 2 nodes count).
    assert asyncio.run(snapshots_after(0, 3)) == 3  # 13, 21, 21 >= 10
    assert asyncio.run(snapshots_after(1, 3)) == 2  # 13 >= 12, 21 < 22, 42 >= 32
    assert asyncio.run(snapshots_after(4, 3)) == 0  # 13 < 48, 34 < 88, 55 < 128


def test_nodes_held_count_toward_the_floor_like_pods() -> None:
    """A large cluster with few pods is snapshotted in proportion to its nodes too (a
    node costs about what a pod does to write), not every ``every`` records."""

    async def snapshots(nodes: int) -> int:
        log = MemoryLog()
        worker = ShardWorker(Engine(), log, snapshot_every=10, snapshot_per_pod=1)
        added = [_ingested(make_node(f"n{i}").cpu("64").added()) for i in range(nodes)]
        await log.append([Envelope(event=SchedulerConfigured()), *added])
        await worker.poll()
        for batch in range(3):
            pods = [make_pod(f"p{batch}-{i}").cpu("100m").submitted() for i in range(10)]
            await log.append([_ingested(p) for p in pods])
            await worker.poll()
        return sum(1 for e in await log.read(0, 0) if isinstance(e.event, SnapshotTaken))

    # 2 nodes: as in the test above, two snapshots in three batches
    assert asyncio.run(snapshots(2)) == 2
    # 60 nodes: one after the setup (61 records), then fewer records than nodes and
    # pods held (counting pods only, each batch of 10 would have written one)
    assert asyncio.run(snapshots(60)) == 1


def _ingested(event: Any) -> Envelope:
    return Envelope(event=event, producer="ingest")


def test_the_service_default_has_the_floor_and_a_number_given_is_kept() -> None:
    from shards.cli import build_parser
    from shards.commands import snapshots

    parse = build_parser().parse_args
    default = parse(["worker", "shard", "--bus", "memory", "--shard-id", "0"])
    assert snapshots(default) == (SNAPSHOT_EVERY, SNAPSHOT_PER_POD)
    given = parse(["worker", "shard", "--bus", "memory", "--snapshot-every", "40"])
    assert snapshots(given) == (40, 0)
    assert snapshots(parse(["serve", "--snapshot-every", "0"])) == (0, 0)


def test_a_run_held_for_its_group_is_in_the_snapshot() -> None:
    """A shard holding a gang's next run (its PodGroup created again while the first
    run runs) restores it from a snapshot and starts it as the one never stopped."""
    from engine.snapshot import restore
    from events.types import GroupSpec, PodGroupSubmitted, PodSucceeded
    from tests.engine.test_engine import bound, feed

    def run(engine: Engine, spec: GroupSpec, prefix: str) -> list[Any]:
        pods = [
            make_pod(f"{prefix}{i}").cpu("1").uid(f"{prefix}{i}").group("default/job")
            for i in (0, 1)
        ]
        return feed(engine, PodGroupSubmitted(group=spec), *(p.submitted() for p in pods))

    engine = Engine()
    feed(engine, make_node("a").cpu("4").added())
    spec = GroupSpec(namespace="default", name="job", min_member=2)
    run(engine, msgspec.structs.replace(spec, uid="g1"), "w")
    run(engine, msgspec.structs.replace(spec, uid="g2"), "v")
    assert list(engine.next_runs) == ["default/job"]
    copy = restore(encode_state(engine))
    assert encode_state(copy) == encode_state(engine)
    finished = [PodSucceeded(pod="default/w0"), PodSucceeded(pod="default/w1")]
    assert (
        bound(feed(copy, *finished))
        == bound(feed(engine, *finished))
        == {
            "default/v0": "a",
            "default/v1": "a",
        }
    )

"""The coordinator folds a slice of control records with the submissions of pods in
bulk (:meth:`shards.coordinator.coordinator.Coordinator.apply_all`) and a shard's
placements in bulk: the same view, the same pass, the same records as folding each
record alone (which is what ``replay --verify`` does)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.pools import POOL_LABEL, Sharding
from events.memory import MemoryLog
from events.types import (
    SECOND,
    Envelope,
    Event,
    GroupSpec,
    PodDeleted,
    PodGroupSubmitted,
    PodSubmitted,
    ShardSummary,
)
from shards.coordinator.coordinator import Coordinator
from shards.inputs.scenario import Scenario
from shards.replay import replay, replay_routed
from shards.simulate import SimulationResult, simulate
from tests.builders import make_node, make_pod, relayed
from tests.engine.test_bulk_fold import _same, _state
from tests.shards.coordinator_kit import at, pinned

POOLS = ("pa", "pb")


def _coordinator(shards: int) -> Coordinator:
    coordinator = Coordinator(pinned(shards, **{p: i % shards for i, p in enumerate(POOLS)}))
    for i in range(6):
        node = make_node(f"n{i}").cpu("8").memory("32Gi").label(POOL_LABEL, POOLS[i % 2])
        coordinator.apply(Envelope(event=node.added(), offset=i, producer="ingest"))
    return coordinator


def _event(kind: int, name: int) -> Event:
    pod = make_pod(f"p{name}")
    if kind == 0:
        return pod.cpu("1").submitted()
    if kind == 1:
        return pod.cpu("2").memory("1Gi").selector(**{POOL_LABEL: "pb"}).submitted()
    if kind == 2:
        return pod.cpu("1").priority(1 << 63).submitted()  # refused: out of range
    if kind == 3:
        return pod.cpu("1").group("default/g").submitted()
    if kind == 4:
        return pod.cpu("1").uid(f"u{name}").submitted()
    return PodDeleted(pod=f"default/p{name}")


records = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 11), st.integers(0, 2)), min_size=1, max_size=40
)
STEPS = (0, SECOND, 700 * SECOND)
"""How far time moves on at a record: not at all, a little, past the window that
finished pods are kept for (their names are forgotten in the fold)."""


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 2, 4]), records, records)
def test_a_slice_folded_in_bulk_is_folded_record_by_record(
    shards: int, first: list[tuple[int, int, int]], second: list[tuple[int, int, int]]
) -> None:
    bulk, alone = _coordinator(shards), _coordinator(shards)
    offset = 100
    time = 0
    for part in (first, second):
        envelopes = []
        for kind, name, later in part:  # (deleted pods are finished: kept a while)
            offset += 1
            time += STEPS[later]
            envelopes.append(
                Envelope(event=_event(kind, name), offset=offset, time=time, producer="ingest")
            )
        bulk.apply_all(envelopes)
        for env in envelopes:
            alone.apply(env)
        _same(_state(bulk.engine), _state(alone.engine))
        assert bulk.engine.unfolded == alone.engine.unfolded
        out = bulk.schedule()
        assert out == alone.schedule()
        # each shard places what it was handed on the first of its nodes it names
        for shard in range(shards):
            placed = {
                event.pod.key: f"n{shard % 2 if shards > 1 else 0}"
                for partition, event in out
                if partition == shard and type(event).__name__ == "PodRouted"
            }
            if placed:
                offset += 1
                summary = ShardSummary(shard=shard, seen=offset, placed=placed, nodes=3)
                for coordinator in (bulk, alone):
                    coordinator.apply(relayed(summary, shard, offset, time=time))
        _same(_state(bulk.engine), _state(alone.engine))
        assert bulk.flights == alone.flights
        assert bulk.schedule() == alone.schedule()


def _runs_scenario() -> Scenario:
    """Nodes, then runs of identical pods of three templates, interleaved, arriving
    at several instants (some finish, a gang among them)."""
    nodes = [make_node(f"n{i}").cpu("8").memory("32Gi").added() for i in range(8)]
    first = []
    for i in range(24):
        if i % 3 == 2:
            first.append(make_pod(f"b{i}").cpu("2").memory("1Gi").submitted())
        else:
            first.append(make_pod(f"a{i}").cpu("1").runtime(5).submitted())
    gang: list[Event] = [
        PodGroupSubmitted(group=GroupSpec(namespace="default", name="g", min_member=3))
    ]
    gang += [make_pod(f"g{i}").cpu("1").group("default/g").submitted() for i in range(3)]
    later = [make_pod(f"c{i}").cpu("500m").submitted() for i in range(12)]
    return Scenario(events=[*at(0, nodes), *at(1, first), *at(2, gang, 100), *at(8, later, 200)])


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_runs_of_identical_pods_end_as_on_one_shard_and_replay_state_for_state(
    shards: int,
) -> None:
    """Folded in bulk by the coordinator, runs of identical pods end as on one shard,
    and the log replays: every decision, and every snapshot of the coordinator's state
    (taken by the live fold, compared with a fold of one record at a time)."""
    scenario = _runs_scenario()
    pods = sum(1 for e in scenario.events if isinstance(e.event, PodSubmitted))

    async def go() -> tuple[SimulationResult, list[list[Envelope]]]:
        log = MemoryLog(shards + 1 if shards > 1 else 1)
        sharding = Sharding(shards=shards) if shards > 1 else None
        result = await simulate(scenario, log, sharding=sharding, snapshot_every=7)
        return result, [await log.read(p, 0) for p in range(log.partitions)]

    result, parts = asyncio.run(go())
    report = result.report.to_json()
    assert len(report["pods"]) == pods
    assert all(view["phase"] in ("Bound", "Succeeded") for view in report["pods"].values())
    if shards == 1:
        assert replay(parts[0], verify=True).mismatch is None
        return
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, verified.mismatch
    assert verified.snapshots > 0
    assert result.control is not None
    assert result.control.folded_in_bulk >= pods - len(scenario.events) // 10

"""The coordinator folds a slice of control records with the submissions of pods in
bulk (:meth:`shards.coordinator.coordinator.Coordinator.apply_all`) and a shard's
placements in bulk: the same view, the same pass, the same records as folding each
record alone (which is what ``replay --verify`` does)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.pools import POOL_LABEL
from events.types import SECOND, Envelope, Event, PodDeleted, ShardSummary
from shards.coordinator.coordinator import Coordinator
from tests.builders import make_node, make_pod, relayed
from tests.engine.test_bulk_fold import _same, _state
from tests.shards.coordinator_kit import pinned

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


@settings(max_examples=40, deadline=None)
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

"""Each shard's sums over the nodes a kind of pod may use
(:class:`shards.coordinator.handover.Sums`), kept up to date from the nodes that
placements changed, are the sums over every node made again."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.pools import POOL_LABEL
from events.types import Envelope, PodSubmitted, PoolReassigned
from shards.coordinator.choice import shard_columns
from shards.coordinator.coordinator import Coordinator
from shards.coordinator.dispatch import ShardDispatch
from tests.builders import make_node, make_pod
from tests.shards.coordinator_kit import pinned

POOLS = ("pa", "pb", "pc")


def _pod(i: int, kind: int) -> PodSubmitted:
    pod = make_pod(f"p{i}").cpu(str(1 + kind)).memory(f"{kind + 1}Gi")
    if kind == 1:
        pod = pod.selector(disk="ssd")
    return pod.submitted()


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([2, 3]),
    st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=2, max_size=9),
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8), st.booleans()), max_size=40),
)
def test_sums_kept_up_to_date_are_the_sums_made_again(
    shards: int, nodes: list[tuple[int, bool]], steps: list[tuple[int, int, bool]]
) -> None:
    coordinator = Coordinator(pinned(shards, **{p: i % shards for i, p in enumerate(POOLS)}))
    engine = coordinator.engine
    for i, (pool, ssd) in enumerate(nodes):
        node = make_node(f"n{i}").cpu("32").memory("64Gi").label(POOL_LABEL, POOLS[pool])
        if ssd:
            node = node.label("disk", "ssd")
        coordinator.apply(Envelope(event=node.added(), offset=i, producer="ingest"))
    pods = [_pod(i, i % 2) for i in range(41)]
    for offset, pod in enumerate(pods, start=100):
        coordinator.apply(Envelope(event=pod, offset=offset, producer="ingest"))
    dispatch = engine.dispatch
    assert isinstance(dispatch, ShardDispatch)
    checks = dispatch.checks
    framework = engine.profiles.framework_for(engine.pods[pods[0].pod.key])
    assert framework is not None
    for index, slot, release in steps:
        key = pods[index].pod.key
        if release:
            engine.release(key)
        elif key not in engine.state.pods and slot < len(nodes):
            engine.place(key, slot, f"{key}#1")
        for kind in (0, 1):
            pod = engine.pods[pods[kind].pod.key]
            view = checks.shard_view(framework, pod)
            static = framework.static_feasible(pod, engine.state)
            again = shard_columns(engine.state, static, coordinator.routing.slot_shard, shards)
            assert np.array_equal(view.base, again)


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 4), st.integers(1, 6), st.integers(0, 3))
def test_counts_per_shard_follow_a_pool_handed_to_another_shard(
    shards: int, nodes: int, to: int
) -> None:
    """What the coordinator remembers per shard between passes (``Ledger.cached``)
    follows a pool that changes hands, though no node or placement changed."""
    to %= shards
    coordinator = Coordinator(pinned(shards, pa=(to + 1) % shards))
    for i in range(nodes):
        node = make_node(f"n{i}").cpu("8").memory("8Gi").label(POOL_LABEL, "pa")
        coordinator.apply(Envelope(event=node.added(), offset=i, producer="ingest"))
    feasible = np.ones(coordinator.engine.state.high_water, dtype=bool)

    def counts() -> list[int]:
        return coordinator.cached(("counts",), lambda: coordinator.feasible_counts(feasible))

    assert counts()[(to + 1) % shards] == nodes
    moved = PoolReassigned(pool="pa", shard=to)
    coordinator.apply(Envelope(event=moved, offset=nodes, producer="ingest"))
    assert counts() == [0] * shards  # in transit: no shard owns them


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 4), st.integers(1, 5), st.integers(0, 3), st.integers(0, 3))
def test_a_pool_reassigned_while_it_moves_is_refused_and_named(
    shards: int, nodes: int, first: int, second: int
) -> None:
    """A pool's nodes move to one owner at a time: reassigning it again before the new
    owner has taken it over is refused, with a reason, and the first move goes on."""
    first, second = 1 + first % (shards - 1), second % shards  # pa starts on shard 0
    coordinator = Coordinator(pinned(shards, pa=0))
    for i in range(nodes):
        node = make_node(f"n{i}").cpu("8").memory("8Gi").label(POOL_LABEL, "pa")
        coordinator.apply(Envelope(event=node.added(), offset=i, producer="ingest"))
    for offset, to in ((nodes, first), (nodes + 1, second)):
        moved = PoolReassigned(pool="pa", shard=to)
        coordinator.apply(Envelope(event=moved, offset=offset, producer="ingest"))
    assert coordinator.routing.pool_shard["pa"] == first
    assert coordinator.routing.moving["pa"] == tuple(sorted(f"n{i}" for i in range(nodes)))
    (offset, reason), *_ = coordinator.engine.unfolded
    assert offset == nodes + 1 and "still moving to shard" in reason

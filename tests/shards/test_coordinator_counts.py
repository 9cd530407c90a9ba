"""Each shard's count of the nodes that pass every filter for a kind of pod
(:class:`shards.coordinator.handover.Counted`), kept across batches and brought up to
date from the nodes changed since, is the count made again over every node; a kind
with one pod in a batch is scored per shard as the first pod of a run of its kind
would be."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.framework.cycle import CycleState
from engine.model.pools import POOL_LABEL
from events.types import Envelope, PodSubmitted, PoolReassigned
from shards.coordinator.choice import run_scores
from shards.coordinator.coordinator import Coordinator
from shards.coordinator.dispatch import ShardDispatch
from tests.builders import make_node, make_pod
from tests.shards.coordinator_kit import pinned

POOLS = ("pa", "pb", "pc")
KINDS = 3


def _pod(i: int, kind: int) -> PodSubmitted:
    pod = make_pod(f"p{i}").cpu(str(1 + kind)).memory(f"{kind + 1}Gi")
    if kind == 1:
        pod = pod.selector(disk="ssd")
    return pod.submitted()


STEP = st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 8), st.integers(0, 2))
"""(what: place, release, move a pool, add a node; a pod; a slot; a pool or shard)."""


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([1, 2, 4]),
    st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=2, max_size=9),
    st.lists(STEP, max_size=40),
    st.sampled_from([0, 1, 48]),
)
def test_counts_kept_across_batches_are_the_counts_made_again(
    shards: int,
    nodes: list[tuple[int, bool]],
    steps: list[tuple[int, int, int, int]],
    scalar: int,
) -> None:
    """``scalar``: nodes changed up to which they are counted one by one (0: always
    the vectorised update)."""
    coordinator = Coordinator(pinned(shards, **{p: i % shards for i, p in enumerate(POOLS)}))
    engine = coordinator.engine
    offset = 0

    def add(i: int, pool: int, ssd: bool) -> None:
        nonlocal offset
        node = make_node(f"n{i}").cpu("4").memory("8Gi").label(POOL_LABEL, POOLS[pool])
        if ssd:
            node = node.label("disk", "ssd")
        coordinator.apply(Envelope(event=node.added(), offset=offset, producer="ingest"))
        offset += 1

    for i, (pool, ssd) in enumerate(nodes):
        add(i, pool, ssd)
    pods = [_pod(i, i % KINDS) for i in range(41)]
    for submitted in pods:
        coordinator.apply(Envelope(event=submitted, offset=offset, producer="ingest"))
        offset += 1
    dispatch = engine.dispatch
    assert isinstance(dispatch, ShardDispatch)
    checks = dispatch.checks
    checks.counted.scalar = scalar
    added = len(nodes)
    for what, index, slot, which in steps:
        key = pods[index].pod.key
        if what == 0 and key not in engine.state.pods and slot < engine.state.high_water:
            if engine.state.fits(engine.pods[key].request, slot):
                engine.place(key, slot, f"{key}#1")
        elif what == 1:
            engine.release(key)
        elif what == 2 and POOLS[which] not in coordinator.routing.moving:
            # (a pool already on its way to a shard is not moved again here: the
            # coordinator's routing does not take a second move before the first ends)
            moved = PoolReassigned(pool=POOLS[which], shard=slot % shards)
            coordinator.apply(Envelope(event=moved, offset=offset, producer="ingest"))
            offset += 1
        elif what == 3:
            add(added, which, slot % 2 == 0)
            added += 1
        for kind in range(KINDS):
            pod = engine.pods[pods[kind].pod.key]
            framework = engine.profiles.framework_for(pod)
            assert framework is not None
            kept = checks.counts(("counts", pod.shape_key), [pod], [framework])
            again = coordinator.feasible_counts(framework.feasible(CycleState(), pod, engine.state))
            assert kept == again


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([2, 3]),
    st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=2, max_size=9),
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8)), max_size=30),
    st.integers(2, 5),
)
def test_a_kind_with_one_pod_scores_the_shards_as_a_run_of_them_would_first(
    shards: int, nodes: list[tuple[int, bool]], placed: list[tuple[int, int]], run: int
) -> None:
    """``run_scores`` for one pod (scored without the wide table of a run) is the
    first column of the table for a run of several."""
    coordinator = Coordinator(pinned(shards, **{p: i % shards for i, p in enumerate(POOLS)}))
    engine = coordinator.engine
    for i, (pool, ssd) in enumerate(nodes):
        node = make_node(f"n{i}").cpu("4").memory("8Gi").label(POOL_LABEL, POOLS[pool])
        if ssd:
            node = node.label("disk", "ssd")
        coordinator.apply(Envelope(event=node.added(), offset=i, producer="ingest"))
    pods = [_pod(i, i % KINDS) for i in range(41)]
    for offset, submitted in enumerate(pods, start=100):
        coordinator.apply(Envelope(event=submitted, offset=offset, producer="ingest"))
    for index, slot in placed:
        key = pods[index].pod.key
        if key not in engine.state.pods and engine.state.fits(engine.pods[key].request, slot):
            engine.place(key, slot, f"{key}#1")
    dispatch = engine.dispatch
    assert isinstance(dispatch, ShardDispatch)
    for kind in range(KINDS):
        pod = engine.pods[pods[kind].pod.key]
        framework = engine.profiles.framework_for(pod)
        assert framework is not None
        view = dispatch.checks.shard_view(framework, pod)
        alone = run_scores(framework, pod, view, coordinator.pending, 1)
        wide = run_scores(framework, pod, view, coordinator.pending, run)
        assert [row[0] for row in alone] == [row[0] for row in wide]

"""The coordinator hands the plain pods at the head of its queue over in one step
(:func:`shards.coordinator.batches.hand_batch`): in queue order, each
while a shard certainly holds it, and a run of identical pods exactly as handing them
over one by one would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.pools import POOL_LABEL
from events.types import PodRouted, PodSubmitted
from tests.builders import make_node, make_pod
from tests.shards.coordinator_kit import Control, in_pool, pinned, sent


def _cluster(shards: int, sizes: list[list[int]]) -> Control:
    """Pool ``pI`` on shard ``I`` with nodes of ``sizes[I]`` cpus (and a pool ``any``
    spread nowhere: every pod is held to ``pods``, the label all nodes carry)."""
    control = Control(pinned(shards, **{f"p{i}": i for i in range(shards)}))
    control.input(
        *[
            make_node(f"n{i}-{j}")
            .cpu(str(cpu))
            .label(POOL_LABEL, f"p{i}")
            .label("pods", "yes")
            .added()
            for i in range(shards)
            for j, cpu in enumerate(sizes[i])
        ]
    )
    return control


def _pod(name: str, cpu: int) -> PodSubmitted:
    return make_pod(name).cpu(str(cpu)).selector(pods="yes").submitted()


@settings(max_examples=25, deadline=None)
@given(
    shards=st.sampled_from([2, 4]),
    sizes=st.lists(st.lists(st.integers(2, 16), min_size=0, max_size=3), min_size=4, max_size=4),
    pods=st.integers(1, 14),
    cpu=st.integers(1, 4),
)
def test_a_run_of_identical_pods_goes_where_one_by_one_it_would(
    shards: int, sizes: list[list[int]], pods: int, cpu: int
) -> None:
    """Submitted together, a run of identical pods is handed over in one step, to the
    same shards, in the same order, under the same decision ids, as when each comes
    alone (a pass after each, the ones before it pending on their shards)."""
    together = _cluster(shards, sizes)
    alone = _cluster(shards, sizes)
    batch = [_pod(f"p{i}", cpu) for i in range(pods)]
    out = together.input(*batch)
    expected = []
    for pod in batch:
        expected += alone.input(pod)
    routed = [(p, e.pod.name, e.decision_id) for p, e in sent(out, PodRouted)]
    assert routed == [(p, e.pod.name, e.decision_id) for p, e in sent(expected, PodRouted)]
    assert together.coordinator.counters["batches"] == (1 if routed else 0)


def test_pods_of_several_kinds_are_handed_over_together_in_queue_order() -> None:
    """A and B pods interleaved; A is held to pool pa (2 nodes, shard 1): the first two
    A and the B pods before the third A go in one step; the third A does not certainly
    fit (two A pods may take both nodes), so it waits at the head of the queue and the
    B pod behind it waits too (one queue order: nothing overtakes it)."""
    control = Control(pinned(2, pa=1, pb=0))
    control.input(
        make_node("a0").cpu("6").label(POOL_LABEL, "pa").added(),
        make_node("a1").cpu("6").label(POOL_LABEL, "pa").added(),
        make_node("b0").cpu("16").label(POOL_LABEL, "pb").added(),
        make_node("b1").cpu("16").label(POOL_LABEL, "pb").added(),
    )
    order = ["a1", "b1", "a2", "b2", "a3", "b3"]
    out = control.input(
        *[
            in_pool(name, "pa", "5") if name[0] == "a" else in_pool(name, "pb", "1")
            for name in order
        ]
    )
    routed = [(p, e.pod.name) for p, e in sent(out, PodRouted)]
    assert routed == [(1, "a1"), (0, "b1"), (1, "a2"), (0, "b2")]
    assert control.coordinator.counters["batches"] == 1
    assert control.coordinator.inflight == [2, 2]


def test_a_kind_with_one_pod_in_a_batch_goes_to_its_best_shard() -> None:
    """Behind the lead, a pod of another kind, alone of its kind in the batch, is scored
    over the shards like any run (here the emptier shard 1), not sent to the first shard
    that can hold it."""
    control = _cluster(2, [[4, 4], [16, 16]])
    out = control.input(_pod("a", 2), _pod("b", 1))
    routed = [(p, e.pod.name) for p, e in sent(out, PodRouted)]
    assert routed == [(1, "a"), (1, "b")]
    assert control.coordinator.counters["batches"] == 1

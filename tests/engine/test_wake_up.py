"""Room freed on nodes wakes the same parked pods whatever order the nodes' finishes are
heard in, each node's in its own order: each bucket of parked pods (one shape) is woken
up to what the freed node can hold of its request, measured against that node's whole
room, not what buckets woken before it leave. A coordinator hears of the pods that
finish on different shards in another order than one shard does; both must then try
the same pods."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from events.types import NodeAdded, PodSubmitted, PodSucceeded
from tests.builders import env, make_node, make_pod

NODES = 3

# running pods: (node, CPUs); parked pods: CPUs (each size a bucket)
RUNNING = st.lists(st.tuples(st.integers(0, NODES - 1), st.integers(1, 3)), min_size=3, max_size=9)
PARKED = st.lists(st.sampled_from([1, 2, 3, 4]), min_size=4, max_size=14)


def _engine(running: list[tuple[int, int]], parked: list[int]) -> Engine:
    engine = Engine()
    for i in range(NODES):
        engine.apply(env(NodeAdded(node=make_node(f"n{i}").cpu("6").spec())))
    for j, (node, cpu) in enumerate(running):
        spec = make_pod(f"r{j}").cpu(str(cpu)).on(f"n{node}").spec()
        engine.apply(env(PodSubmitted(pod=spec)))
    engine.schedule()
    for j, cpu in enumerate(parked):
        engine.apply(env(PodSubmitted(pod=make_pod(f"w{j}").cpu(str(cpu)).spec())))
    engine.schedule()
    return engine


def _parked_after(running: list[tuple[int, int]], parked: list[int], order: list[str]) -> set[str]:
    """The pods left parked once the running pods of ``order`` finished, in that order."""
    engine = _engine(running, parked)
    waiting = {k for k in engine.pods if k not in engine.state.pods}
    for key in order:
        engine.apply(env(PodSucceeded(pod=key, node=""), 30))
    return {k for k in waiting if engine.queue.where(k) == "unschedulable"}


@settings(max_examples=150, deadline=None)
@given(RUNNING, PARKED, st.integers(0, 2**32 - 1))
def test_the_pods_woken_do_not_depend_on_the_order_of_the_nodes_finishes(
    running: list[tuple[int, int]], parked: list[int], seed: int
) -> None:
    engine = _engine(running, parked)
    placed = engine.state.pods
    finishing = [k for k in placed if k.startswith("default/r")]
    # another interleaving of the nodes' finishes, each node's in its own order
    queues: dict[int, list[str]] = {}
    for key in finishing:
        queues.setdefault(placed[key].slot, []).append(key)
    rng = random.Random(seed)
    interleaved: list[str] = []
    while any(queues.values()):
        slot = rng.choice(sorted(s for s, left in queues.items() if left))
        interleaved.append(queues[slot].pop(0))
    assert _parked_after(running, parked, finishing) == _parked_after(running, parked, interleaved)

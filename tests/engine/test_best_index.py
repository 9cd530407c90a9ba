"""The indexed paths of one placement (engine/framework/best.py, the per-shape scores
under a shared spread mask, engine/plugins/spread_cache.py) decide exactly as the full
scans they stand in for: the same node for every pod, ties broken the same way."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.framework import best, runtime
from engine.framework.best import BestIndex, Limits
from engine.framework.cycle import CycleState
from engine.framework.results import select
from engine.model.pods import pod_info
from engine.plugins import kernels, spread_cache
from engine.plugins.topology_spread import PodTopologySpread
from events.types import (
    ClockTicked,
    Event,
    NodeAdded,
    NodeRemoved,
    PodDeleted,
    PodSubmitted,
    PodSucceeded,
)
from tests.builders import env, make_node, make_pod

SMALL = settings(max_examples=30, deadline=None)


@contextmanager
def tiny_blocks() -> Iterator[None]:
    """Blocks of 4 slots and the index on every shard size: small clusters then
    span many blocks and every attempt selects through the index; and room for one
    derived score array per shape and two in all (evictions happen)."""
    saved = best.BLOCK, best._SHIFT, Limits.min_nodes, runtime.DERIVED, runtime.DERIVED_TOTAL
    shapes = runtime.SHAPE_CACHE_SIZE
    best.BLOCK, best._SHIFT, Limits.min_nodes = 4, 2, 0  # type: ignore[misc]
    runtime.DERIVED, runtime.DERIVED_TOTAL, runtime.SHAPE_CACHE_SIZE = 1, 2, 2
    try:
        yield
    finally:
        best.BLOCK, best._SHIFT, Limits.min_nodes, runtime.DERIVED, runtime.DERIVED_TOTAL = saved  # type: ignore[misc]
        runtime.SHAPE_CACHE_SIZE = shapes


@contextmanager
def index_kind(compiled: bool) -> Iterator[None]:
    """The index refreshed and selecting in one compiled call (numba, as loaded with
    the resource kernel, which then also gives a shape's first scores), or with numpy."""
    saved = best.compiled()
    if compiled:
        if not kernels.available():
            pytest.skip("numba is not available here")
        kernels.warm_up()
    best.use_compiled(kernels.index_kernel() if compiled else None)
    try:
        yield
    finally:
        best.use_compiled(saved)


KINDS = pytest.mark.parametrize("compiled", [False, True], ids=["numpy", "compiled"])


@KINDS
@given(
    st.integers(1, 70),
    st.lists(
        st.tuples(st.lists(st.integers(0, 69), max_size=8), st.integers(-1, 4), st.integers(0, 99)),
        min_size=1,
        max_size=25,
    ),
    st.integers(-1, 4),
)
@SMALL
def test_the_index_selects_as_the_full_scan(
    compiled: bool, used: int, rounds: list[tuple[list[int], int, int]], fill: int
) -> None:
    """Random score arrays (few values: many ties), rewritten a few slots at a time
    as the framework does (the index told first), and random rotations; refreshed
    and selected with numpy and in the compiled loop."""
    with tiny_blocks(), index_kind(compiled):
        _select_rounds(used, rounds, fill)


def _select_rounds(used: int, rounds: list[tuple[list[int], int, int]], fill: int) -> None:
    scores = np.full(used + (-used) % 4 + 4, -1, dtype=np.int64)
    scores[:used] = fill
    index = BestIndex(scores)
    for slots, value, tiebreak in rounds:
        live = [s for s in slots if s < used]
        index.touch(live)
        for i, slot in enumerate(live):
            scores[slot] = value + i % 2
        assert index.select(used, tiebreak) == select(scores, used, tiebreak)


@given(
    st.lists(st.sampled_from(["2", "3", "4", "8"]), min_size=1, max_size=40),
    st.lists(
        st.tuples(st.lists(st.integers(0, 39), max_size=12), st.integers(0, 99)),
        min_size=1,
        max_size=12,
    ),
)
@SMALL
def test_the_resource_kernel_keeps_the_index_in_step(
    cpus: list[str], rounds: list[tuple[list[int], int]]
) -> None:
    """The compiled refresh of a shape's scores, keeping the shape's index in step as
    it writes (instead of telling it): after each round of pods placed on random
    nodes (a node may recur), every block maximum and its count are the scores' own,
    and the index selects as the full scan."""
    if not kernels.available():
        pytest.skip("numba is not available here")
    with tiny_blocks(), index_kind(True):
        engine = Engine()
        for i, cpu in enumerate(cpus):
            engine.apply(env(make_node(f"n{i}").cpu(cpu).memory("16Gi").added(), i))
        state = engine.state
        framework = engine.profiles.frameworks["default-scheduler"]
        kernel = framework.kernel
        assert kernel is not None
        pod = pod_info(make_pod("x").cpu("1").memory("1Gi").spec(), state.resources, 0)
        static = framework.static_feasible(pod, state)
        params = kernel.params(pod.request, state)
        assert params is not None
        size = state.capacity
        feasible = np.zeros(size, dtype=np.bool_)
        local = np.zeros(size, dtype=np.int64)
        masked = np.full(size, -1, dtype=np.int64)
        kernel.run(list(range(len(cpus))), static, state, params, feasible, local, masked)
        index = BestIndex(masked)
        used = state.high_water
        assert index.select(used, 0) == select(masked, used, 0)
        placed = 0
        for slots, tiebreak in rounds:
            live = [s for s in slots if s < len(cpus)]
            for slot in live:
                spec = make_pod(f"q{placed}").cpu("1").memory("1Gi").spec()
                state.assume(f"default/q{placed}", slot, pod_info(spec, state.resources, 1).request)
                placed += 1
            assert index.follows(len(live))
            kernel.run(live, static, state, params, feasible, local, masked, index)
            blocks, counts = best._block_max(masked)
            assert index.blocks.tolist() == blocks.tolist()
            assert index.counts.tolist() == counts.tolist()
            assert index.select(used, tiebreak) == select(masked, used, tiebreak)


ZONES = ["a", "b", "c"]


@st.composite
def cluster_event(draw: Any) -> Event:
    if draw(st.integers(0, 9)) == 0:
        return NodeRemoved(name=f"n{draw(st.integers(0, 23))}")
    node = make_node(f"n{draw(st.integers(0, 23))}").cpu(draw(st.sampled_from(["2", "4", "8"])))
    if draw(st.integers(0, 5)):
        node = node.label("zone", draw(st.sampled_from(ZONES)))
    if draw(st.integers(0, 5)) == 0:
        node = node.taint("dedicated", "x")
    return NodeAdded(node=node.memory("16Gi").spec())


@st.composite
def pod_event(draw: Any) -> Event:
    name = f"p{draw(st.integers(0, 60))}"
    # a spread counts the pods of the pod's own namespace only
    namespace = draw(st.sampled_from(["default", "default", "other"]))
    kind = draw(st.sampled_from(["submit"] * 6 + ["delete", "succeed"]))
    if kind == "delete":
        return PodDeleted(pod=f"{namespace}/{name}")
    if kind == "succeed":
        return PodSucceeded(pod=f"{namespace}/{name}")
    template = draw(st.integers(0, 4))  # pods of one template share shape and constraints
    pod = make_pod(name, namespace).cpu(["100m", "500m", "1", "250m", "2"][template])
    pod = pod.memory("256Mi")
    pod = pod.labels(app=f"t{template}")
    if template in (1, 3):
        pod = pod.spread("zone", max_skew=template // 2 + 1, app=f"t{template}")
    if template == 3:
        pod = pod.tolerate("dedicated")
    if template == 4:
        pod = pod.selector(zone="b")
    return pod.submitted()


sequences = st.lists(
    st.one_of(cluster_event(), pod_event(), pod_event(), st.just(ClockTicked())),
    min_size=1,
    max_size=70,
)


def _decide(sequence: list[Event], *, indexed: bool, incremental: bool = True) -> list[Event]:
    saved = Limits.min_nodes
    Limits.min_nodes = 0 if indexed else 1 << 30
    try:
        engine = Engine()
        for framework in engine.profiles.frameworks.values():
            framework.incremental = incremental
        out: list[Event] = []
        for i, event in enumerate(sequence):
            engine.apply(env(event, i))
            out.extend(engine.schedule())
            for framework in engine.profiles.frameworks.values():
                # derived scores are held only for shapes still cached (memory bounded)
                cached = {id(shape) for shape in framework._shapes.values()}
                assert set(framework._derived_order) <= cached
        return out
    finally:
        Limits.min_nodes = saved


@KINDS
@given(sequences)
@SMALL
def test_indexed_placements_equal_the_full_scan(compiled: bool, sequence: list[Event]) -> None:
    """Random clusters (zones, taints, nodes added and removed) and random pods of a
    few templates (spread over zones, selectors, tolerations), placed, deleted and
    finished: every decision is the full scan's (the index with numpy or compiled)."""
    with tiny_blocks(), index_kind(compiled):
        indexed = _decide(sequence, indexed=True)
    assert indexed == _decide(sequence, indexed=False)
    assert indexed == _decide(sequence, indexed=False, incremental=False)


@contextmanager
def tallied(on: bool = True) -> Iterator[None]:
    """Spread counts kept per node (from a required label's log, or recounted on the
    changed nodes) on every cluster size, or never: counted whole each time."""
    saved = spread_cache.Tallies.min_nodes, spread_cache.Tallies.by_label
    spread_cache.Tallies.min_nodes = 0 if on else 1 << 30
    spread_cache.Tallies.by_label = on
    try:
        yield
    finally:
        spread_cache.Tallies.min_nodes, spread_cache.Tallies.by_label = saved


@contextmanager
def listed(on: bool) -> Iterator[None]:
    """Spread verdicts over few domains taken in plain Python (or always with numpy)."""
    saved = spread_cache._LISTED
    spread_cache._LISTED = saved if on else -1  # type: ignore[misc]
    try:
        yield
    finally:
        spread_cache._LISTED = saved  # type: ignore[misc]


@pytest.mark.parametrize(
    ("tallies", "in_python"),
    [(False, True), (True, True), (True, False)],
    ids=["counted", "tallied", "tallied-numpy"],
)
@given(sequences, st.lists(pod_event(), min_size=1, max_size=8))
@SMALL
def test_the_spread_mask_is_the_reference_verdict(
    tallies: bool, in_python: bool, sequence: list[Event], probes: list[Event]
) -> None:
    """The cached DoNotSchedule mask equals ``labelled & within`` computed whole, for
    pods asked about after any history (the cache kept across the run; its counts of
    matching pods per domain counted whole, or kept by recounting the nodes changed
    since; the verdict per domain in plain Python, as for a few domains, or with
    numpy, as for many)."""
    with tallied(tallies), listed(in_python):
        _probe_spread(sequence, probes)


def _probe_spread(sequence: list[Event], probes: list[Event]) -> None:
    engine = Engine()
    framework = engine.profiles.frameworks["default-scheduler"]
    spread = framework.plugins["PodTopologySpread"]
    assert isinstance(spread, PodTopologySpread)
    state = engine.state
    for i, event in enumerate(sequence):
        engine.apply(env(event, i))
        engine.schedule()
        for j, probe in enumerate(probes):
            if not isinstance(probe, PodSubmitted) or not probe.pod.spread_constraints:
                continue
            spec = probe.pod
            state.ensure_rows()
            pod = pod_info(spec, state.resources, 10_000 + j)
            labelled, within = spread.verdicts(pod, state)
            got = spread.filter(CycleState(), pod, state)
            assert not got.flags.writeable
            assert got.tolist() == (labelled & within).tolist()


@st.composite
def spread_pod_event(draw: Any) -> Event:
    """Pods of two namespaces, most labelled alike, half spread over zones (skew 1)."""
    name = f"p{draw(st.integers(0, 12))}"
    namespace = draw(st.sampled_from(["default", "other"]))
    kind = draw(st.sampled_from(["submit"] * 4 + ["delete", "succeed"]))
    if kind == "delete":
        return PodDeleted(pod=f"{namespace}/{name}")
    if kind == "succeed":
        return PodSucceeded(pod=f"{namespace}/{name}")
    # a name may come back with other labels
    pod = make_pod(name, namespace).cpu("1").memory("256Mi")
    pod = pod.labels(app=draw(st.sampled_from(["web", "web", "db"])))
    if draw(st.booleans()):
        pod = pod.spread("zone", max_skew=1, app="web")
    if draw(st.integers(0, 3)) == 0:
        pod = pod.tolerate("dedicated")
    if draw(st.integers(0, 3)) == 0:
        pod = pod.selector(disk="ssd")
    return pod.submitted()


@given(st.lists(spread_pod_event(), min_size=1, max_size=40))
@SMALL
def test_spread_counts_kept_per_node_equal_a_recount(sequence: list[Event]) -> None:
    """On a fixed cluster (three zones, one node tainted, some with SSDs), pods of
    two namespaces come and go; after each event, the cached DoNotSchedule mask of a
    spread pod of either namespace, tolerating the taint or not, selecting SSDs (the
    other nodes' pods do not count) or not, equals the reference verdict."""
    with tallied():
        _recount(sequence)


def _recount(sequence: list[Event]) -> None:
    engine = Engine()
    framework = engine.profiles.frameworks["default-scheduler"]
    spread = framework.plugins["PodTopologySpread"]
    assert isinstance(spread, PodTopologySpread)
    nodes = []
    for i in range(7):
        node = make_node(f"n{i}").cpu("4").memory("16Gi").label("zone", ZONES[i % 3])
        if i < 4:
            node = node.label("disk", "ssd")
        nodes.append(node.taint("dedicated", "x") if i == 6 else node)
    for i, node in enumerate(nodes):
        engine.apply(env(NodeAdded(node=node.spec()), i))
    state = engine.state
    probes = [
        make_pod(f"probe{j}", ns).labels(app="web").spread("zone", max_skew=1, app="web")
        for j, ns in enumerate(["default", "other"])
    ]
    probes += [p.tolerate("dedicated") for p in probes]
    probes += [p.selector(disk="ssd") for p in probes]
    for i, event in enumerate(sequence):
        engine.apply(env(event, 100 + i))
        engine.schedule()
        for j, probe in enumerate(probes):
            state.ensure_rows()
            pod = pod_info(probe.spec(), state.resources, 10_000 + j)
            labelled, within = spread.verdicts(pod, state)
            got = spread.filter(CycleState(), pod, state)
            assert got.tolist() == (labelled & within).tolist()

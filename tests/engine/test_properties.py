"""Invariants over random event sequences (hypothesis).

- no decision ever commits a node beyond its allocatable;
- keeping per-shape results between attempts decides exactly as computing afresh;
- the bookkeeping (used = sum of placed pods) always holds;
- no two pods on one node bind overlapping host ports.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.engine import Engine
from engine.framework import runtime
from events.types import (
    ClockTicked,
    Event,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    PodBound,
    PodDeleted,
    PodSucceeded,
)
from tests.builders import env, make_node, make_pod

NODES = [f"n{i}" for i in range(6)]


@st.composite
def node_event(draw: Any) -> Event:
    name = draw(st.sampled_from(NODES))
    node = (
        make_node(name)
        .cpu(draw(st.sampled_from(["1", "2", "4", "8"])))
        .memory(draw(st.sampled_from(["1Gi", "4Gi", "16Gi"])))
    )
    if draw(st.booleans()):
        node = node.gpu(draw(st.integers(0, 4)))
    if draw(st.integers(0, 4)) == 0:
        node = node.taint("dedicated", "x")
    if draw(st.booleans()):
        node = node.label("zone", draw(st.sampled_from(["a", "b"])))
    kind = draw(st.sampled_from(["add", "add", "update", "remove"]))
    if kind == "remove":
        return NodeRemoved(name=name)
    return NodeAdded(node=node.spec()) if kind == "add" else NodeUpdated(node=node.spec())


@st.composite
def pod_event(draw: Any) -> Event:
    name = f"p{draw(st.integers(0, 30))}"
    kind = draw(st.sampled_from(["submit", "submit", "submit", "delete", "succeed"]))
    if kind == "delete":
        return PodDeleted(pod=f"default/{name}")
    if kind == "succeed":
        return PodSucceeded(pod=f"default/{name}")
    pod = (
        make_pod(name)
        .cpu(draw(st.sampled_from(["100m", "500m", "1", "3"])))
        .memory(draw(st.sampled_from(["0", "512Mi", "2Gi"])))
        .priority(draw(st.integers(0, 3)))
    )
    if draw(st.integers(0, 3)) == 0:
        pod = pod.gpu(draw(st.integers(1, 2)))
    if draw(st.integers(0, 4)) == 0:
        pod = pod.tolerate("dedicated")
    if draw(st.integers(0, 4)) == 0:
        pod = pod.selector(zone=draw(st.sampled_from(["a", "b"])))
    if draw(st.integers(0, 4)) == 0:
        pod = pod.prefer(10, "zone", "In", "a")
    if draw(st.integers(0, 3)) == 0:
        pod = pod.host_port(
            draw(st.sampled_from([80, 443])), ip=draw(st.sampled_from(["0.0.0.0", "10.0.0.1"]))
        )
    return pod.submitted()


events = st.lists(st.one_of(node_event(), pod_event(), st.just(ClockTicked())), max_size=60)


def run(sequence: list[Event], *, incremental: bool, kernel: bool = True) -> list[Event]:
    engine = Engine()
    for framework in engine.profiles.frameworks.values():
        framework.incremental = incremental
        if not kernel:
            framework.kernel = None
    decisions: list[Event] = []
    for i, event in enumerate(sequence):
        engine.apply(env(event, i))
        free_before = engine.state.free.copy()
        out = engine.schedule()
        decisions.extend(out)
        touched = {engine.state.index[d.node] for d in out if isinstance(d, PodBound)}
        for slot in touched:
            # nodes that were within allocatable stay within it
            ok_before = (free_before[:, slot] >= 0).all()
            assert not ok_before or (engine.state.free[:, slot] >= 0).all(), "over-committed"
        engine.state.check_invariants()
        _no_port_shared(engine)
    return decisions


def _no_port_shared(engine: Engine) -> None:
    by_node: dict[int, list[tuple[str, int, str]]] = {}
    for placed in engine.state.pods.values():
        for port in placed.ports:
            bound = by_node.setdefault(placed.slot, [])
            for protocol, number, ip in bound:
                assert (protocol, number) != (port.protocol, port.port) or (
                    "0.0.0.0" not in (ip, port.ip) and ip != port.ip
                ), "two pods bind one host port"
            bound.append((port.protocol, port.port, port.ip))


@given(events)
def test_no_overcommit_and_incremental_equals_full(sequence: list[Event]) -> None:
    assert run(sequence, incremental=True) == run(sequence, incremental=False)


@given(events)
def test_small_incremental_limit_decides_the_same(sequence: list[Event]) -> None:
    old = runtime.INCREMENTAL_LIMIT
    runtime.INCREMENTAL_LIMIT = 1
    try:
        small = run(sequence, incremental=True)
    finally:
        runtime.INCREMENTAL_LIMIT = old
    assert small == run(sequence, incremental=False)


def test_view_scores_equal_full_scores() -> None:
    engine = Engine()
    for i in range(50):
        engine.apply(env(make_node(f"n{i}").cpu(str(1 + i % 7)).memory(f"{1 + i % 5}Gi").added()))
    for i in range(40):
        engine.apply(env(make_pod(f"p{i}").cpu("300m").memory("300Mi").submitted()))
    engine.schedule()
    framework = engine.profiles.frameworks["default-scheduler"]
    from engine.framework.cycle import CycleState
    from engine.model.pods import pod_info

    pod = pod_info(make_pod("x").cpu("1").memory("1Gi").spec(), engine.state.resources, 999)
    slots = np.array([3, 17, 42, 5])
    view = engine.state.view(slots)
    for entry in framework.scores:
        if entry.plugin.local:
            full = entry.plugin.score(CycleState(), pod, engine.state, engine.state.valid)
            part = entry.plugin.score(CycleState(), pod, view, view.valid)
            assert list(np.asarray(full)[slots]) == list(np.asarray(part))


@given(
    st.lists(
        st.tuples(st.integers(0, 64), st.integers(0, 256), st.integers(0, 8)),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.tuples(st.integers(0, 8000), st.integers(0, 64), st.integers(0, 2)), max_size=8),
    st.sampled_from(["LeastAllocated", "MostAllocated"]),
)
def test_one_slot_forms_equal_the_vectorised_plugins(
    nodes: list[tuple[int, int, int]], pods: list[tuple[int, int, int]], strategy: str
) -> None:
    from engine.framework.cycle import CycleState
    from engine.model.pods import pod_info
    from engine.plugins.fit import NodeResourcesBalancedAllocation, NodeResourcesFit

    engine = Engine()
    for i, (cpu, mem, gpu) in enumerate(nodes):
        node = make_node(f"n{i}").cpu(str(cpu)).memory(f"{mem}Gi").gpu(gpu)
        engine.apply(env(node.added()))
    state = engine.state
    fit = NodeResourcesFit({"scoringStrategy": {"type": strategy}})
    balanced = NodeResourcesBalancedAllocation()
    for i, (milli, gib, gpu) in enumerate(pods):
        builder = make_pod(f"p{i}").cpu(f"{milli}m").memory(f"{gib}Gi").gpu(gpu)
        pod = pod_info(builder.spec(), state.resources, i)
        state.ensure_rows()
        mask = np.ones(state.capacity, dtype=np.bool_)
        for plugin in (fit, balanced):
            whole = plugin.score(CycleState(), pod, state, mask)
            for slot in range(len(nodes)):
                expected = whole if isinstance(whole, int) else int(whole[slot])
                assert plugin.score_one(pod, state, slot) == expected
        filtered = fit.filter(CycleState(), pod, state)
        for slot in range(len(nodes)):
            assert fit.filter_one(pod, state, slot) == bool(filtered[slot])
        slot = 0
        if fit.filter_one(pod, state, slot):
            state.assume(pod.key, slot, pod.request, 0)

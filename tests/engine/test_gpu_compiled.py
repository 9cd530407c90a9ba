"""The compiled scoring of FGD and ShoalGpu gives the numpy path's scores and cards,
pod after pod, on random clusters, workloads and pods (placed where the policy says, so
the incremental refresh of the changed nodes is compared too)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.framework.cycle import CycleState
from engine.model.devices import GPU, MODEL_LABEL, SHOAL_MILLI
from engine.model.state import ClusterState
from engine.plugins import kernels
from engine.plugins.gpu.fgd import GpuFragmentation
from engine.plugins.gpu.shoal import ShoalGpu
from events.types import NodeSelectorRequirement, NodeSelectorTerm, NodeSpec, PodSpec
from tests.engine.test_gpu_policies import info

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba is not installed")

GIB = 1 << 30
MODELS = ("A100", "T4", "V100")

shape_st = st.fixed_dictionaries(
    {
        "cpu": st.integers(0, 8).map(lambda x: x * 1000),
        "weight": st.integers(1, 50),
    },
    optional={"memory": st.integers(0, 16).map(lambda x: x * GIB)},
).flatmap(
    lambda base: st.one_of(
        st.just(base),
        st.builds(
            lambda milli, models: {
                **base,
                "gpus": 1,
                "gpuMilli": milli,
                **({"models": models} if models else {}),
            },
            st.sampled_from([100, 250, 500, 1000]),
            st.lists(st.sampled_from(MODELS), max_size=2, unique=True),
        ),
        st.builds(lambda n: {**base, "gpus": n, "gpuMilli": 1000}, st.integers(2, 8)),
    )
)
node_st = st.tuples(
    st.integers(0, 32).map(lambda x: x * 1000),  # cpu
    st.integers(0, 64).map(lambda x: x * GIB),  # memory
    st.sampled_from([0, 1, 2, 4, 8]),  # cards
    st.sampled_from(MODELS),
)
pod_st = st.tuples(
    st.integers(0, 8).map(lambda x: x * 500),  # cpu
    st.integers(0, 16).map(lambda x: x * GIB),  # memory
    st.sampled_from([0, 1, 2, 4]),  # cards
    st.sampled_from([50, 300, 500, 700, 1000]),  # per-card milli (one card)
    st.lists(st.sampled_from(MODELS), max_size=1),
)
leave_st = st.lists(st.integers(0, 11), max_size=4)
"""Pods (by index) that leave again after the pod of that index is placed."""


def spec_of(i: int, cpu: int, memory: int, cards: int, milli: int, models: list[str]) -> PodSpec:
    requests = {"cpu": cpu, "memory": memory}
    if cards == 1 and milli < 1000:
        requests[SHOAL_MILLI] = milli
    elif cards:
        requests[GPU] = cards
    affinity = None
    if models and cards:
        req = NodeSelectorRequirement(key=MODEL_LABEL, operator="In", values=tuple(models))
        affinity = (NodeSelectorTerm(match_expressions=(req,)),)
    return PodSpec(namespace="ns", name=f"p{i}", requests=requests, required_affinity=affinity)


@contextmanager
def numpy_only() -> Iterator[None]:
    kernels.configure(jit=False)
    try:
        yield
    finally:
        kernels.configure(jit=True)


@settings(max_examples=25, deadline=None)
@given(
    workload=st.lists(shape_st, min_size=1, max_size=6),
    nodes=st.lists(node_st, min_size=1, max_size=6),
    pods=st.lists(pod_st, min_size=1, max_size=12),
    shoal=st.booleans(),
    exact=st.booleans(),
    shares=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 7), st.sampled_from([100, 250, 500, 1000])),
        max_size=10,
    ),
    leave=leave_st,
)
def test_compiled_scores_and_cards_are_the_numpy_paths(
    workload: list[dict[str, Any]],
    nodes: list[tuple[int, int, int, str]],
    pods: list[tuple[int, int, int, int, list[str]]],
    shoal: bool,
    exact: bool,
    shares: list[tuple[int, int, int]],
    leave: list[int],
) -> None:
    state = ClusterState()
    for n, (cpu, memory, cards, model) in enumerate(nodes):
        allocatable = {"cpu": cpu, "memory": memory, "pods": 100, GPU: cards}
        state.add_node(NodeSpec(name=f"n{n}", allocatable=allocatable, labels={MODEL_LABEL: model}))
    # shares already running on any card (so cards come in any order of free milli)
    for i, (n, c, milli) in enumerate(shares):
        p = info(state, spec_of(-1 - i, 0, 0, 1, milli, []))
        slot = n % len(nodes)
        count = int(state.cards.count[slot])
        card = c % max(count, 1)
        if count and state.cards.free[slot, card] >= milli:
            state.assume(p.key, slot, p.request, devices=(card,))
    plugin = ShoalGpu if shoal else GpuFragmentation
    args = {"targetWorkload": workload, "resolution": "exact" if exact else "simulator"}
    compiled, reference = plugin(args, "here"), plugin(args, "here")
    placed: list[str] = []
    top = state.high_water
    for i, raw in enumerate(pods):
        p = info(state, spec_of(i, *raw))
        top = state.high_water
        fits = [s for s in range(top) if _fits(state, p, s)]
        if not fits:  # the framework scores only pods some node fits
            continue
        got = compiled.score(CycleState(), p, state, state.valid.copy())
        with numpy_only():
            expected = reference.score(CycleState(), p, state, state.valid.copy())
        assert compiled._kernel is not None and reference._kernel is None
        assert got[:top].tolist() == expected[:top].tolist()
        for slot in range(top):
            assert compiled.choose_cards(p, state, slot) == reference.choose_cards(p, state, slot)
        # placed on the best node it fits, on the chosen card
        slot = max(fits, key=lambda s: int(got[s]))
        state.assume(p.key, slot, p.request, devices=compiled.choose_cards(p, state, slot))
        placed.append(p.key)
        # pods leave again: their nodes' cards change back (the journal names them twice)
        for k in leave:
            if k < len(placed) and placed[k] in state.pods:
                state.forget(placed[k])
    assert (
        compiled.node_fragmentation(state).tolist() == reference.node_fragmentation(state).tolist()
    )
    # the card counts the kernel keeps with F are those of the cards now
    assert compiled._tally[:top].tolist() == _tally(compiled, state)[:top].tolist()


def _tally(plugin: GpuFragmentation, state: ClusterState) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Per slot and level, the cards that hold the level and the free milli of the rest."""
    assert plugin._shapes is not None
    free = np.maximum(state.cards.free, 0)
    levels = plugin._shapes.levels
    enough = free[:, None, :] >= levels[None, :, None]
    count = enough.sum(axis=2)
    small = np.where(enough, 0, free[:, None, :]).sum(axis=2)
    return np.concatenate([count, small], axis=1).astype(np.int64)


def _fits(state: ClusterState, p: Any, slot: int) -> bool:
    free = state.free[:, slot]
    if any(free[row] < amount for row, amount in p.request):
        return False
    return p.gpu is None or state.cards.fits(slot, p.gpu)


def test_a_run_without_numba_scores_with_numpy() -> None:
    state = ClusterState()
    state.add_node(NodeSpec(name="a", allocatable={"cpu": 8000, "memory": GIB, GPU: 2}))
    workload = [{"cpu": 1000, "gpuMilli": 500, "gpus": 1, "weight": 1}]
    plugin = ShoalGpu({"targetWorkload": workload}, "here")
    with numpy_only():
        plugin.score(CycleState(), info(state, spec_of(0, 1000, 0, 1, 500, [])), state, state.valid)
    assert plugin._kernel is None
    np.testing.assert_array_equal(plugin.node_fragmentation(state)[:1], [0])

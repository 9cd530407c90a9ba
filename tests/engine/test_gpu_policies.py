"""The GPU placement policies: hand-computed scores, FGD's fragmentation against its
definition, and the card a sharing pod is given."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.framework.cycle import CycleState
from engine.model.devices import GPU, MODEL_LABEL, SHOAL_MILLI
from engine.model.pods import PodInfo, pod_info
from engine.model.shapes import ShapeCounts
from engine.model.state import ClusterState
from engine.plugins.gpu.baselines import (
    GpuBestFit,
    GpuClustering,
    GpuDotProduct,
    GpuMMinusN,
    GpuPacking,
    GpuRandom,
)
from engine.plugins.gpu.cache import CachedScore
from engine.plugins.gpu.fgd import GpuFragmentation
from engine.plugins.gpu.fragment import Resolved, fragmentation, fragmentation_after_share
from engine.plugins.gpu.workload import Shape, TargetWorkload
from events.types import NodeSelectorRequirement, NodeSelectorTerm, NodeSpec, PodSpec

MIB = 1 << 20
RAW = {"tieBreak": "none"}  # the 0..100 scores, without the name order folded in


def node(name: str, cpu: int, cards: int, model: str = "G2") -> NodeSpec:
    return NodeSpec(
        name=name,
        allocatable={"cpu": cpu, "memory": 1 << 40, "pods": 100, GPU: cards},
        labels={MODEL_LABEL: model},
    )


def pod(
    name: str, cpu: int, cards: int = 0, milli: int = 1000, models: tuple[str, ...] = ()
) -> PodSpec:
    requests = {"cpu": cpu}
    if cards > 1 or (cards == 1 and milli == 1000):
        requests[GPU] = cards
    elif cards == 1:
        requests[SHOAL_MILLI] = milli
    affinity = None
    if models:
        req = NodeSelectorRequirement(key=MODEL_LABEL, operator="In", values=models)
        affinity = (NodeSelectorTerm(match_expressions=(req,)),)
    return PodSpec(namespace="ns", name=name, requests=requests, required_affinity=affinity)


def place(
    state: ClusterState, spec: PodSpec, slot: int, devices: tuple[int, ...] | None = None
) -> None:
    info = pod_info(spec, state.resources, 0)
    state.ensure_rows()
    state.assume(info.key, slot, info.request, devices=devices)


def info(state: ClusterState, spec: PodSpec) -> PodInfo:
    out = pod_info(spec, state.resources, 0)
    state.ensure_rows()
    return out


def scores(plugin: CachedScore | GpuRandom, state: ClusterState, spec: PodSpec) -> list[int]:
    p = info(state, spec)
    feasible = state.valid.copy()
    out = plugin.score(CycleState(), p, state, feasible)
    return [int(x) for x in out[: state.high_water]]


def two_nodes() -> ClusterState:
    """a: 64 cpu, 8 cards, one of them half used (4 cpu); b: 32 cpu, 2 idle cards."""
    state = ClusterState()
    state.add_node(node("a", 64_000, 8))
    state.add_node(node("b", 32_000, 2, "T4"))
    place(state, pod("x", 4000, 1, 500), 0)
    return state


def test_best_fit() -> None:
    state = two_nodes()
    # pod 8 cpu, 1 card: a: c-c' = 52000, G-G' = 7500-1000 = 6500: (52000 + 16*6500)/256000
    # = 0.609 -> floor(100 - 60.9) = 39; b: 24000 + 16*1000 = 40000 -> 100 - 15.6 -> 84
    assert scores(GpuBestFit(RAW), state, pod("p", 8000, 1)) == [39, 84]


def test_dot_product() -> None:
    state = two_nodes()
    # pod 8 cpu, 1 card: a: (60000*8000 + 256*7500*1000) / 128000^2 = 0.1465 -> 100 - 7.3 = 92
    # b: (32000*8000 + 256*2000*1000) / 128000^2 = 0.0469 -> 100 - 2.3 = 97
    assert scores(GpuDotProduct(RAW), state, pod("p", 8000, 1)) == [92, 97]


def test_packing() -> None:
    state = two_nodes()
    # share of 300: a shares its used card (500 free): 100 - (50/10) = 95; b all idle: 33 - 2
    assert scores(GpuPacking(RAW), state, pod("p", 1000, 1, 300)) == [95, 31]
    # two whole cards: a is used, takes 2 idle: 50 - 2 = 48; b: 33 - 2 = 31
    assert scores(GpuPacking(RAW), state, pod("q", 1000, 2)) == [48, 31]
    assert scores(GpuPacking(RAW), state, pod("r", 1000)) == [0, 0]  # CPU only


def test_clustering() -> None:
    state = two_nodes()
    # a holds one sharing pod (idle 7500): 25*(8000-7500)//8000 = 1; b none yet (idle 2000): 18
    # sharing pod: a has only its kind: 1 + 75; b no GPU pod: 18 + 25
    assert scores(GpuClustering(RAW), state, pod("p", 1000, 1, 300)) == [76, 43]
    # one whole card: a has only other kinds: 1 + 0
    assert scores(GpuClustering(RAW), state, pod("q", 1000, 1)) == [1, 43]


def test_m_minus_n() -> None:
    state = two_nodes()
    # 2 cards: a has m = 7 idle: 100 - 5; b m = 2: 100 - 0
    assert scores(GpuMMinusN(RAW), state, pod("p", 1000, 2)) == [95, 100]
    # share of 300: a's best card has 500: 100 - 200//10 = 80; b: 1000 free: 100 - 70 = 30
    assert scores(GpuMMinusN(RAW), state, pod("q", 1000, 1, 300)) == [80, 30]


def test_ties_go_to_the_smallest_node_name() -> None:
    state = ClusterState()
    state.add_node(node("b", 32_000, 2))
    state.add_node(node("a", 32_000, 2))
    # equal nodes, 0..100 score 84 on both: score * (slots + 1) + rank, "a" ranks 2
    slots = state.capacity + 1
    assert scores(GpuBestFit(), state, pod("p", 8000, 1)) == [84 * slots + 1, 84 * slots + 2]


def test_random_is_seeded_and_deterministic() -> None:
    state = two_nodes()
    spec = pod("p", 1000, 1)
    first = scores(GpuRandom({"seed": 7}, "here"), state, spec)
    assert first == scores(GpuRandom({"seed": 7}, "here"), state, spec)
    assert first != scores(GpuRandom({"seed": 8}, "here"), state, spec)
    assert all(x >= 0 for x in first)


def test_fgd_chooses_the_card_with_least_fragmentation() -> None:
    # one shape: 500 milli of a card; a node with cards 1000, 600, 500 (cpu ample)
    state = ClusterState()
    state.add_node(node("a", 64_000, 3))
    place(state, pod("x", 0, 1, 400), 0, devices=(1,))
    place(state, pod("y", 0, 1, 500), 0, devices=(2,))
    workload = [{"cpu": 0, "gpuMilli": 500, "gpus": 1, "weight": 1}]
    plugin = GpuFragmentation({"targetWorkload": workload, "resolution": "exact"}, "here")
    p = info(state, pod("p", 0, 1, 500))
    plugin.score(CycleState(), p, state, state.valid.copy())
    # F before: no card below 500: 0. On card 0 (1000 -> 500): 0; on card 1 (600 -> 100):
    # 100 is now too small: +100; on card 2 (500 -> 0): 0. Cards 0 and 2 tie; card 2 has
    # less free milli.
    assert plugin.choose_cards(p, state, 0) == (2,)


def test_fgd_learns_its_workload_from_the_pods_it_scores() -> None:
    state = two_nodes()
    plugin = GpuFragmentation({}, "here")
    for i in range(4):  # rebuilt at 1, 2 and 4 pods (powers of two), then every 1,024
        plugin.score(CycleState(), info(state, pod(f"p{i}", 1000, 1, 300)), state, state.valid)
    assert plugin.workload.shapes == (Shape(1000, 300, 1),)
    assert plugin.workload.weights == (4,)


def _reference(shapes: list[tuple[Shape, int]], cpu: int, cards: list[int], model: str) -> int:
    """PROTOCOL.md's definition, one node and one shape at a time."""
    idle = sum(cards)
    total = 0
    for shape, weight in shapes:
        if (
            shape.milli == 0
            or (shape.models and model not in shape.models)
            or cpu < shape.cpu
            or sum(1 for g in cards if g >= shape.milli) < shape.cards
        ):
            fragment = idle
        else:
            fragment = sum(g for g in cards if g < shape.milli)
        total += weight * fragment
    return total


MODELS = ("A", "B")
shape_st = st.builds(
    lambda cpu, cards, milli, models: Shape(
        cpu, 0 if cards == 0 else (1000 if cards > 1 else milli), cards, models if cards else ()
    ),
    st.integers(0, 8).map(lambda x: x * 1000),
    st.integers(0, 4),
    st.integers(1, 1000),
    st.sampled_from([(), ("A",), ("B",), ("A", "B")]),
)


@settings(max_examples=200, deadline=None)
@given(
    shapes=st.lists(st.tuples(shape_st, st.integers(1, 50)), min_size=1, max_size=6),
    nodes=st.lists(
        st.tuples(
            st.integers(0, 8).map(lambda x: x * 1000),
            st.lists(st.integers(0, 1000), min_size=0, max_size=4),
            st.sampled_from(MODELS),
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_fragmentation_is_the_protocols_definition(
    shapes: list[tuple[Shape, int]], nodes: list[tuple[int, list[int], str]]
) -> None:
    allowed = np.ones((len(shapes), len(MODELS) + 1), dtype=np.bool_)
    for i, (shape, _) in enumerate(shapes):
        if shape.models:
            allowed[i] = [False] + [m in shape.models for m in MODELS]
    resolved = Resolved(
        cpu=np.array([s.cpu for s, _ in shapes]),
        milli=np.array([s.milli for s, _ in shapes]),
        cards=np.array([s.cards for s, _ in shapes]),
        weight=np.array([w for _, w in shapes]),
        allowed=allowed,
        gpu=np.array([s.milli > 0 for s, _ in shapes]),
        bound=0,
    )
    width = 4
    free = np.array([cards + [0] * (width - len(cards)) for _, cards, _ in nodes])
    got = fragmentation(
        resolved,
        np.array([cpu for cpu, _, _ in nodes]),
        free,
        np.array([MODELS.index(m) for _, _, m in nodes]),
    )
    expected = [_reference(shapes, cpu, cards, m) for cpu, cards, m in nodes]
    assert got.tolist() == expected


@settings(max_examples=100, deadline=None)
@given(
    shapes=st.lists(st.tuples(shape_st, st.integers(1, 50)), min_size=1, max_size=5),
    nodes=st.lists(
        st.tuples(
            st.integers(0, 8).map(lambda x: x * 1000),
            st.lists(st.integers(0, 1000), min_size=3, max_size=3),
        ),
        min_size=1,
        max_size=4,
    ),
    pod_cpu=st.integers(0, 4).map(lambda x: x * 1000),
    milli=st.integers(1, 1000),
)
def test_the_share_shortcut_is_fragmentation_of_each_state_after(
    shapes: list[tuple[Shape, int]], nodes: list[tuple[int, list[int]]], pod_cpu: int, milli: int
) -> None:
    resolved = Resolved(
        cpu=np.array([s.cpu for s, _ in shapes]),
        milli=np.array([s.milli for s, _ in shapes]),
        cards=np.array([s.cards for s, _ in shapes]),
        weight=np.array([w for _, w in shapes]),
        allowed=np.ones((len(shapes), 2), dtype=np.bool_),
        gpu=np.array([s.milli > 0 for s, _ in shapes]),
        bound=0,
    )
    cpu = np.array([c for c, _ in nodes])
    free = np.array([cards for _, cards in nodes])
    model = np.zeros(len(nodes), dtype=np.int64)
    got = fragmentation_after_share(resolved, cpu, free, model, pod_cpu, milli)
    for k in range(len(nodes)):
        for w in range(3):
            if free[k, w] < milli:
                continue
            after = free[k : k + 1].copy()
            after[0, w] -= milli
            expected = fragmentation(resolved, cpu[k : k + 1] - pod_cpu, after, model[:1])
            assert got[k, w] == expected[0]


def test_simulator_resolution_is_the_published_sigmoid() -> None:
    state = two_nodes()
    workload = [{"cpu": 0, "gpuMilli": 500, "gpus": 1, "weight": 3}, {"cpu": 0, "weight": 1}]
    plugin = GpuFragmentation({"targetWorkload": workload}, "here")
    plugin.node_fragmentation(state)
    # ΔF in weight units; the simulator's x = -ΔF / (Σw * 1000) with Σw = 4
    for delta in (-9000, -4000, -1, 0, 1, 2000, 4000, 30000):
        expected = int(100 / (1 + np.exp(delta / 4000)))
        assert int(plugin.quantised(np.array([delta]))[0]) == expected, delta


def test_target_workload_keeps_shapes_covering_95_percent() -> None:
    a, b, c = Shape(1, 0, 0), Shape(2, 500, 1), Shape(3, 1000, 8)
    workload = TargetWorkload.of_shapes([a] * 60 + [b] * 36 + [c] * 4)
    # 60% then 96%: c is left out; weights are the counts (probabilities 60/96, 36/96)
    assert workload.shapes == (a, b)
    assert workload.weights == (60, 36)


def test_a_learned_workload_is_state_a_restored_engine_learns_alike() -> None:
    """FGD with no ``targetWorkload`` learns from the pods submitted: the counts are
    engine state, so an engine restored from a snapshot halfway decides every later
    pod as the engine that ran from the start."""
    from engine.config import parse_config
    from engine.engine import Engine
    from engine.snapshot import encode_state, restore
    from events.types import NodeAdded, NodeSpec, PodSpec, PodSubmitted
    from tests.builders import env

    config = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [
                {
                    "plugins": {
                        "score": {
                            "disabled": [{"name": "*"}],
                            "enabled": [{"name": "GpuFragmentation", "weight": 1}],
                        }
                    }
                }
            ],
        }
    )
    engine = Engine(config)
    for i in range(6):
        node = NodeSpec(name=f"n{i}", allocatable={"cpu": 64000, "nvidia.com/gpu": 2 + i % 3 * 2})
        engine.apply(env(NodeAdded(node=node)))
    shares = [250, 500, 1000, 300, 700, 250, 500, 1000, 400, 600] * 4

    def pod(i: int) -> PodSubmitted:
        milli = shares[i]
        requests = {"cpu": 1000 * (1 + i % 3)}
        requests["nvidia.com/gpu" if milli == 1000 else "shoal.io/gpu-milli"] = (
            1 + i % 2 if milli == 1000 else milli
        )
        return PodSubmitted(pod=PodSpec(namespace="d", name=f"p{i}", requests=requests))

    half = len(shares) // 2
    for i in range(half):
        engine.apply(env(pod(i), i))
        engine.schedule()
    restored = restore(encode_state(engine))
    assert restored.shapes.total == engine.shapes.total == half
    for i in range(half, len(shares)):
        for e in (engine, restored):
            e.apply(env(pod(i), i))
        assert restored.schedule() == engine.schedule()


def test_fgd_learning_from_the_engine_keeps_its_cached_scores() -> None:
    # the workload learnt from the engine's shape counts is re-derived only when the
    # counts change; scoring again with nothing changed reuses the shape's scores (the
    # two versions, the counts' and the state's, are kept apart)
    class Handle:
        shapes = ShapeCounts()

    state = two_nodes()
    handle = Handle()
    first = info(state, pod("p0", 1000, 1, 300))
    handle.shapes.add(first)
    plugin = GpuFragmentation({}, "here", handle)  # type: ignore[arg-type]
    for i in range(5):
        plugin.score(CycleState(), info(state, pod(f"p{i}", 1000, 1, 300)), state, state.valid)
    assert plugin.counters["full"] == 1
    assert plugin.counters["reused"] == 4

"""ShoalGpu's rules where they decide otherwise than FGD: stranded GPU (cpu and memory
a node's idle cards need) and model pressure (cards restricted pods depend on)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.framework.cycle import CycleState
from engine.model.devices import GPU, MODEL_LABEL
from engine.model.state import ClusterState
from engine.plugins.gpu.cache import CachedScore
from engine.plugins.gpu.fgd import GpuFragmentation
from engine.plugins.gpu.fragment import largest_room, model_codes, resolve
from engine.plugins.gpu.shoal import ShoalGpu, model_pressure, remainder_cost, stranded
from engine.plugins.gpu.workload import parse_workload
from events.types import NodeSpec, PodSpec
from shards.cli import main
from tests.engine.test_gpu_policies import info, place, pod

GIB = 1 << 30


def gpu_node(name: str, cpu: int, cards: int, model: str = "G2", memory: int = 1 << 40) -> NodeSpec:
    return NodeSpec(
        name=name,
        allocatable={"cpu": cpu, "memory": memory, "pods": 100, GPU: cards},
        labels={MODEL_LABEL: model},
    )


def chosen(plugin: CachedScore, state: ClusterState, spec: Any) -> str:
    """The node the plugin scores highest (its name tie-break folded in)."""
    scores = plugin.score(CycleState(), info(state, spec), state, state.valid.copy())
    name = state.names[int(np.argmax(scores[: state.high_water]))]
    assert name is not None
    return name


def both(workload: list[dict[str, Any]]) -> tuple[GpuFragmentation, ShoalGpu]:
    args = {"targetWorkload": workload}
    return GpuFragmentation(args, "here"), ShoalGpu(args, "here")


def test_a_cpu_only_pod_goes_where_it_strands_no_gpu() -> None:
    # one shape: a card and 4 cpu (4 cpu per 1000 milli). "a": 8 idle cards, 32 cpu (just
    # enough); "b": 8 idle cards, 128 cpu. A pod of 8 cpu and no GPU changes FGD's F
    # nowhere (the shape still fits both), so FGD takes "a" by name. On "a" it leaves
    # 24 cpu for 8,000 idle milli: 8000 - 24000 * 1000 / 4000 = 2000 stranded; on "b"
    # 120 cpu feed them all: 0. ShoalGpu takes "b".
    state = ClusterState()
    state.add_node(gpu_node("a", 32_000, 8))
    state.add_node(gpu_node("b", 128_000, 8))
    workload = [{"cpu": 4000, "gpuMilli": 1000, "gpus": 1, "weight": 1}]
    fgd, shoal = both(workload)
    spec = pod("p", 8000)
    assert chosen(fgd, state, spec) == "a"
    assert chosen(shoal, state, spec) == "b"
    # every change counts at the exact resolution, and scores stay non-negative
    exact = ShoalGpu({"targetWorkload": workload, "resolution": "exact", "tieBreak": "none"}, "")
    scores = exact.score(CycleState(), info(state, spec), state, state.valid.copy())
    # 3 * W * cards per node * 1000, plus the dearest remainder: a card left with 999
    # milli, which no frequent size (only whole cards here) fills, 16 * W * 999
    bound = 3 * 1 * 8 * 1000 + 16 * 1 * 999
    assert scores[:2].tolist() == [bound - 2000, bound]


def test_memory_counts_like_cpu() -> None:
    # the shape asks 8 GiB per card; "a" has 64 GiB for 8 cards, "b" 256 GiB. A pod of
    # 32 GiB and no GPU: FGD ignores memory and takes "a"; on "a" ShoalGpu would leave
    # 32 GiB for 8,000 milli (4,000 stranded), on "b" 224 GiB (none): "b".
    state = ClusterState()
    state.add_node(gpu_node("a", 128_000, 8, memory=64 * GIB))
    state.add_node(gpu_node("b", 128_000, 8, memory=256 * GIB))
    workload = [{"cpu": 1000, "memory": 8 * GIB, "gpuMilli": 1000, "gpus": 1, "weight": 1}]
    fgd, shoal = both(workload)
    spec = PodSpec(namespace="ns", name="p", requests={"cpu": 1000, "memory": 32 * GIB})
    assert chosen(fgd, state, spec) == "a"
    assert chosen(shoal, state, spec) == "b"
    shapes = resolve(parse_workload(workload, "here"), state, memory=True)
    idle = np.array([8000, 8000])
    cpu = np.array([127_000, 127_000])
    assert stranded(shapes, idle, cpu, np.array([32 * GIB, 224 * GIB])).tolist() == [4000, 0]


def test_unrestricted_pods_keep_off_the_model_restricted_pods_need() -> None:
    # "a": one T4 card; "b": 8 G2 cards. Workload: a card on any model (weight 99), a
    # card on T4 only (weight 1). T4's pressure: its 1,000 milli carry all the T4 demand
    # (1 * 1000 of 100 * 1000) scaled to the cluster's 9,000: 1000/1000 * 9000 * 1000 /
    # 100000 = 90 permille. An unrestricted card: FGD's ΔF is 0 on "a", -1000 on "b" (a
    # card the T4 shape could not use anyway), -10 milli at the probabilities: both score
    # 50, and the name gives "a". ShoalGpu adds 100 * 1000 * 90 / 1000 = 9000 on "a"
    # (score 47) and takes "b".
    state = ClusterState()
    state.add_node(gpu_node("a", 64_000, 1, "T4"))
    state.add_node(gpu_node("b", 64_000, 8, "G2"))
    workload = [
        {"cpu": 1000, "gpuMilli": 1000, "gpus": 1, "weight": 99},
        {"cpu": 1000, "gpuMilli": 1000, "gpus": 1, "models": ["T4"], "weight": 1},
    ]
    fgd, shoal = both(workload)
    spec = pod("p", 1000, 1)
    assert chosen(fgd, state, spec) == "a"
    assert chosen(shoal, state, spec) == "b"
    shapes = resolve(parse_workload(workload, "here"), state)
    codes = model_codes(state)
    pressure = model_pressure(shapes, codes, state.cards.count)
    t4 = state.label_code(MODEL_LABEL, "T4")
    g2 = state.label_code(MODEL_LABEL, "G2")
    assert t4 is not None and g2 is not None
    assert (pressure[t4 + 1], pressure[g2 + 1]) == (90, 0)


SCENARIO = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: default-scheduler
    plugins:
      score:
        disabled: [{name: "*"}]
        enabled: [{name: ShoalGpu}]
    pluginConfig:
      - name: ShoalGpu
        args:
          targetWorkload:
            - {cpu: 4000, memory: 17179869184, gpuMilli: 1000, gpus: 1, weight: 20}
            - {cpu: 2000, gpuMilli: 500, gpus: 1, weight: 10}
            - {cpu: 4000, gpuMilli: 1000, gpus: 1, models: [T4], weight: 4}
            - {cpu: 8000, weight: 3}
"""


def scenario(tmp_path: Path) -> Path:
    """Two G2 machines (8 cards, 48 and 96 cpu), two T4 ones (2 cards, 104 cpu); single
    cards on any model (p0-p5), shares (p6-p9), cpu-only pods (p10-p12), then single
    cards on T4 only (p13-p15), one a second (JSON documents are YAML)."""
    docs = [SCENARIO]
    nodes = [("g2-a", "G2", 8, 48), ("g2-b", "G2", 8, 96)]
    nodes += [("a-t4", "T4", 2, 104), ("b-t4", "T4", 2, 104)]
    for name, model, cards, cpu in nodes:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {MODEL_LABEL: model}},
            "status": {"allocatable": {"cpu": str(cpu), "memory": "512Gi", GPU: str(cards)}},
        }
        docs.append(json.dumps(node))
    kinds = [("4", "16Gi", GPU, "1", "")] * 6
    kinds += [("2", "8Gi", "shoal.io/gpu-milli", "500", "")] * 4
    kinds += [("8", "32Gi", "", "", "")] * 3
    kinds += [("4", "16Gi", GPU, "1", "T4")] * 3
    for i, (cpu, memory, gpu, amount, model) in enumerate(kinds):
        requests = {"cpu": cpu, "memory": memory} | ({gpu: amount} if gpu else {})
        spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": requests}}]}
        if model:
            term = {"matchExpressions": [{"key": MODEL_LABEL, "operator": "In", "values": [model]}]}
            spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            }
        meta = {
            "name": f"p{i}",
            "namespace": "default",
            "annotations": {"shoal.io/arrive-at": str(i)},
        }
        docs.append(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}))
    path = tmp_path / "shoal-gpu.yaml"
    path.write_text("\n---\n".join(docs))
    return path


@pytest.mark.parametrize("shards", [1, 2])
def test_shoal_gpu_runs_replay_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    path = scenario(tmp_path)
    log = tmp_path / "run.events"
    assert main(["simulate", str(path), "--shards", str(shards), "--log", str(log), "--json"]) == 0
    pods = json.loads(capsys.readouterr().out)["pods"]
    assert all(p["node"] is not None for p in pods.values()), pods
    if shards == 1:
        # the unrestricted cards keep off T4, which the T4-only pods need
        t4_pods = {k for k, p in pods.items() if p["node"].endswith("t4")}
        assert {f"default/p{i}" for i in range(13, 16)} <= t4_pods
        assert not {f"default/p{i}" for i in range(6)} & t4_pods
    assert main(["replay", str(log), "--verify"]) == 0


REMAINDER_WORKLOAD = [
    {"cpu": 1000, "gpuMilli": 1000, "gpus": 1, "weight": 10},
    {"cpu": 1000, "gpuMilli": 650, "gpus": 1, "weight": 2},
    {"cpu": 1000, "gpuMilli": 470, "gpus": 1, "weight": 2},
    {"cpu": 1000, "gpuMilli": 320, "gpus": 1, "weight": 2},
    {"cpu": 1000, "gpuMilli": 230, "gpus": 1, "weight": 2},
]


def test_a_share_goes_where_the_workload_is_likely_to_fill_its_card() -> None:
    # one card each: "a" holds a 650 share (350 free), "b" a 470 share (530 free). A
    # share of 230 leaves 120 on "a" or 300 on "b". FGD's gradient (and ShoalGpu's
    # before the remainder term) sees 120 idle for nearly every shape against 300 idle
    # for most, and takes "a": 650 + 230 on one card, 470 alone on the other. The
    # remainder term: L(r), the milli expected to stay idle when the one-card sizes
    # (1000 weight 10; 650, 470, 320, 230 weight 2 each) fill the card in proportion
    # to their weights (any size that fits is enough weight to fill, f = 1):
    # L(120) = 120 (nothing fits), L(300) = L(70) = 70 (only 230 fits),
    # L(350) = (L(120) + L(30)) / 2 = 75, L(530) = (L(300) + L(210) + L(60)) / 3 = 113.
    # On "a" 350 -> 120 costs 120 - 75 = +45 milli, on "b" 530 -> 300 costs 70 - 113 =
    # -43, each times 16 * W (W = 18): ShoalGpu takes "b", keeping 350 for a 320.
    state = ClusterState()
    state.add_node(gpu_node("a", 64_000, 1))
    state.add_node(gpu_node("b", 64_000, 1))
    place(state, pod("held-a", 1000, 1, 650), 0, (0,))
    place(state, pod("held-b", 1000, 1, 470), 1, (0,))
    fgd, shoal = both(REMAINDER_WORKLOAD)
    spec = pod("p", 1000, 1, 230)
    assert chosen(fgd, state, spec) == "a"
    assert chosen(shoal, state, spec) == "b"
    shapes = resolve(parse_workload(REMAINDER_WORKLOAD, "here"), state)
    cost = remainder_cost(shapes)
    assert [int(cost[r]) // (16 * 18) for r in (120, 300, 350, 530, 0)] == [120, 70, 75, 113, 0]
    # the score's change is the change of what moves are judged by (the potential)
    exact = ShoalGpu(
        {"targetWorkload": REMAINDER_WORKLOAD, "resolution": "exact", "tieBreak": "none"}, ""
    )
    slots = np.array([0, 1])
    before = exact.potential(state, slots)
    scores, cards = exact.evaluate(info(state, spec), state, slots)
    place(state, spec, 1, (int(cards[1]),))
    after = exact.potential(state, slots)
    assert int((after - before).sum()) == exact.offset() - int(scores[1])


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 1000), min_size=1, max_size=4),
    weights=st.lists(st.integers(1, 50), min_size=5, max_size=5),
)
def test_a_remainder_costs_at_most_itself_and_all_of_itself_where_nothing_fits(
    sizes: list[int], weights: list[int]
) -> None:
    # one-card shapes of ``sizes`` and a cpu-only shape (in W, not in the fill)
    workload: list[dict[str, Any]] = [
        {"cpu": 1000, "gpuMilli": size, "gpus": 1, "weight": weight}
        for size, weight in zip(sizes, weights, strict=False)
    ]
    workload.append({"cpu": 1000, "weight": weights[-1]})
    state = ClusterState()
    state.add_node(gpu_node("a", 64_000, 1))
    shapes = resolve(parse_workload(workload, "here"), state)
    cost = remainder_cost(shapes).tolist()
    unit = 16 * int(shapes.weight.sum())
    assert cost[0] == 0
    assert all(0 <= cost[r] <= unit * r for r in range(1001))
    assert all(cost[r] == unit * r for r in range(min(sizes)))
    if len(set(sizes)) == 1:
        # one size fills the card with as many as fit: the rest stays idle
        assert all(cost[r] == unit * (r % sizes[0]) for r in range(1001))


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.sampled_from([0, 250, 500, 1000]), st.integers(1, 4), st.integers(1, 8)),
        min_size=1,
        max_size=4,
    ),
    nodes=st.lists(
        st.tuples(st.integers(0, 16), st.lists(st.sampled_from([0, 250, 600, 1000]), max_size=4)),
        min_size=1,
        max_size=6,
    ),
)
def test_the_room_for_the_largest_shape_is_counted_in_pods(
    shapes: list[tuple[int, int, int]], nodes: list[tuple[int, list[int]]]
) -> None:
    # shapes (milli per card, cards, cpu; weight 1 + cpu % 3); nodes (free cpu, free
    # milli per card); several cards are whole cards
    shapes = [(milli, cards if milli == 1000 else 1, cpu) for milli, cards, cpu in shapes]
    workload: list[dict[str, Any]] = [
        {"cpu": cpu * 1000, "gpuMilli": milli, "gpus": cards if milli else 0, "weight": 1 + cpu % 3}
        for milli, cards, cpu in shapes
    ]
    state = ClusterState()
    state.add_node(gpu_node("a", 64_000, 1))
    resolved = resolve(parse_workload(workload, "here"), state)
    width = 4
    cpu = np.array([c * 1000 for c, _ in nodes], dtype=np.int64)
    free = np.array([cards + [0] * (width - len(cards)) for _, cards in nodes], dtype=np.int64)
    got = largest_room(resolved, cpu, free, np.zeros(len(nodes), dtype=np.int64)).tolist()
    # the most GPU in all; of those, the most weight; the first of equals
    gpu = [
        (milli * cards, 1 + cpu % 3, -i) for i, (milli, cards, cpu) in enumerate(shapes) if milli
    ]
    if not gpu:
        assert got == [0] * len(nodes)
        return
    milli, cards, need = shapes[-max(gpu)[2]]
    # several shares on one card; whole cards, a pod per ``cards`` of them; cpu too
    expected = [
        min(
            sum(f // milli for f in free_cards)
            if cards == 1
            else sum(f >= milli for f in free_cards) // cards,
            c // need,
        )
        for c, free_cards in nodes
    ]
    assert got == expected

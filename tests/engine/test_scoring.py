"""Score arithmetic, table-driven; expectations are kube-scheduler's own test cases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.framework.cycle import CycleState
from engine.model.pods import pod_info
from engine.model.state import ClusterState
from engine.plugins.fit import NodeResourcesBalancedAllocation, NodeResourcesFit
from events.errors import InputError
from tests.builders import make_node, make_pod


def two_nodes() -> ClusterState:
    state = ClusterState()
    state.add_node(make_node("n1").cpu("4").memory(10000).spec())
    state.add_node(make_node("n2").cpu("6").memory(10000).spec())
    return state


def scores(plugin: Any, state: ClusterState, cpu: str, memory: int) -> list[int]:
    pod = pod_info(make_pod("p").cpu(cpu).memory(memory).spec(), state.resources, 0)
    out = plugin.score(CycleState(), pod, state, state.valid)
    return [int(x) for x in np.broadcast_to(out, state.valid.shape)[:2]]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # n1: cpu (4000-3000)*100/4000 = 25, memory (10000-5000)*100/10000 = 50 → 75/2 = 37
        # n2: cpu (6000-3000)*100/6000 = 50, memory 50 → 50
        ({}, [37, 50]),
        # n1: cpu 3000*100/4000 = 75, memory 50 → 125/2 = 62; n2: 50, 50 → 50
        ({"scoringStrategy": {"type": "MostAllocated"}}, [62, 50]),
        # weights cpu 3, memory 1: n1 (25*3 + 50)/4 = 31; n2 (50*3 + 50)/4 = 50
        (
            {
                "scoringStrategy": {
                    "resources": [{"name": "cpu", "weight": 3}, {"name": "memory", "weight": 1}]
                }
            },
            [31, 50],
        ),
        # shape (0→10, 100→0) scaled by 10: n1 cpu util 75 → 25, memory util 50 → 50;
        # round((25 + 50) / 2) = 38. n2: 50, 50 → 50
        (
            {
                "scoringStrategy": {
                    "type": "RequestedToCapacityRatio",
                    "requestedToCapacityRatio": {
                        "shape": [{"utilization": 0, "score": 10}, {"utilization": 100, "score": 0}]
                    },
                }
            },
            [38, 50],
        ),
    ],
    ids=["least", "most", "weighted", "ratio"],
)
def test_fit_strategies(args: dict[str, Any], expected: list[int]) -> None:
    assert scores(NodeResourcesFit(args), two_nodes(), "3", 5000) == expected


def test_balanced_allocation() -> None:
    # n1: fractions 0.75 and 0.5 → std 0.125 → (1 - 0.125)*100 = 87; n2: 0.5, 0.5 → 100
    assert scores(NodeResourcesBalancedAllocation(), two_nodes(), "3", 5000) == [87, 100]


def test_pod_without_requests_is_scored_with_nonzero_defaults() -> None:
    state = ClusterState()
    state.add_node(make_node("n").cpu("1").memory(1000 << 20).spec())
    pod = pod_info(make_pod("p").spec(), state.resources, 0)
    # cpu (1000-100)*100/1000 = 90, memory (1000-200)Mi*100/1000Mi = 80 → 85
    out = NodeResourcesFit().score(CycleState(), pod, state, state.valid)
    assert int(np.asarray(out)[0]) == 85


def test_overcommitted_request_scores_zero() -> None:
    state = ClusterState()
    state.add_node(make_node("n").cpu("1").memory(100).spec())
    # cpu request 2000 > 1000 → 0; memory 50 of 100 → 50; (0 + 50)/2 = 25
    assert scores(NodeResourcesFit(), state, "2", 50)[0] == 25


def test_missing_resource_is_left_out_of_the_mean() -> None:
    state = ClusterState()
    state.add_node(make_node("n").cpu("4").memory(100).spec())
    plugin = NodeResourcesFit(
        {
            "scoringStrategy": {
                "resources": [{"name": "cpu"}, {"name": "nvidia.com/gpu", "weight": 5}]
            }
        }
    )
    # the node has no GPUs: only cpu counts: (4000-1000)*100/4000 = 75
    assert scores(plugin, state, "1", 0)[0] == 75


GPU_TOO = [{"name": "cpu"}, {"name": "memory"}, {"name": "nvidia.com/gpu"}]


@pytest.mark.parametrize(
    ("plugin", "expected"),
    [
        # cpu 3000*100/4000 = 75, memory 5000*100/10000 = 50 → 62 on both: n1's GPUs
        # (none asked for) are left out, as kube-scheduler leaves out an extended
        # resource the pod does not request
        (
            NodeResourcesFit({"scoringStrategy": {"type": "MostAllocated", "resources": GPU_TOO}}),
            [62, 62],
        ),
        # (4000-3000)*100/4000 = 25, 50 → 37 on both
        (NodeResourcesFit({"scoringStrategy": {"resources": GPU_TOO}}), [37, 37]),
        # fractions 0.75 and 0.5 on both → 87
        (NodeResourcesBalancedAllocation({"resources": GPU_TOO}), [87, 87]),
    ],
    ids=["most", "least", "balanced"],
)
def test_an_extended_resource_the_pod_does_not_request_is_not_scored(
    plugin: Any, expected: list[int]
) -> None:
    state = ClusterState()
    state.add_node(make_node("n1").cpu("4").memory(10000).gpu(8).spec())
    state.add_node(make_node("n2").cpu("4").memory(10000).spec())
    assert scores(plugin, state, "3", 5000) == expected


def test_an_extended_resource_the_pod_requests_is_scored() -> None:
    state = ClusterState()
    state.add_node(make_node("n1").cpu("4").memory(10000).gpu(8).spec())
    pod = pod_info(make_pod("p").cpu("3").memory(5000).gpu(2).spec(), state.resources, 0)
    plugin = NodeResourcesFit({"scoringStrategy": {"type": "MostAllocated", "resources": GPU_TOO}})
    # 75, 50 and the GPU's 2*100/8 = 25 → 150/3 = 50
    assert int(np.asarray(plugin.score(CycleState(), pod, state, state.valid))[0]) == 50


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"scoringStrategy": {"type": "Fastest"}}, "unknown type"),
        ({"scoringStrategy": {"resources": []}}, "non-empty list"),
        ({"scoringStrategy": {"resources": [{"name": "cpu", "weight": 0}]}}, "weight"),
        ({"scoringStrategy": {"resources": [{"weight": 1}]}}, "resource name"),
        ({"scoringStrategy": {"type": "RequestedToCapacityRatio"}}, "utilization, score"),
        (
            {
                "scoringStrategy": {
                    "type": "RequestedToCapacityRatio",
                    "requestedToCapacityRatio": {
                        "shape": [{"utilization": 50, "score": 1}, {"utilization": 10, "score": 2}]
                    },
                }
            },
            "increase",
        ),
        ({"scoringStrategy": "x"}, "mapping"),
    ],
)
def test_bad_fit_args(args: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        NodeResourcesFit(args)


@pytest.mark.parametrize(
    "plugin",
    [
        NodeResourcesFit(),
        NodeResourcesBalancedAllocation(),
        NodeResourcesFit(
            {
                "scoringStrategy": {
                    "resources": [
                        {"name": "cpu", "weight": 2},
                        {"name": "memory", "weight": 7},
                        {"name": "nvidia.com/gpu", "weight": 3},
                    ]
                }
            }
        ),
    ],
    ids=["least", "balanced", "least-weighted-gpu"],
)
def test_fast_paths_equal_the_general_formula(plugin: Any) -> None:
    """Nodes that all have cpu and memory take the fast path; adding one node without
    memory sends the whole array down the general path. Both must agree."""
    import random

    rng = random.Random(7)
    state = ClusterState()
    for i in range(300):
        state.add_node(
            make_node(f"n{i}").cpu(str(rng.randint(1, 64))).memory(rng.randint(1, 1 << 36)).spec()
        )
    for i in range(400):
        slot = rng.randrange(300)
        pod = pod_info(
            make_pod(f"p{i}")
            .cpu(f"{rng.randint(0, 4000)}m")
            .memory(rng.randint(0, 1 << 33))
            .spec(),
            state.resources,
            i,
        )
        state.assume(pod.key, slot, pod.request)
    probe = pod_info(make_pod("x").cpu("1500m").memory(3 << 30).spec(), state.resources, 0)
    view = state.view(np.arange(300))
    fast = np.asarray(plugin.score(CycleState(), probe, view, view.valid))
    state.add_node(make_node("no-memory").cpu("8").memory(0).spec())
    general = np.asarray(plugin.score(CycleState(), probe, state, state.valid))
    assert list(fast) == list(general[:300])

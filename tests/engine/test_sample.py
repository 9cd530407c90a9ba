"""``percentageOfNodesToScore``: only the first K feasible nodes of kube-scheduler's scan
are scored (engine.framework.sample), checked against that scan written out as a loop."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.framework.runtime import Framework
from engine.framework.sample import nodes_to_find, sample
from engine.model.pods import PodInfo, pod_info
from engine.model.state import ClusterState
from engine.plugins.registry import builtin_registry
from events.errors import InputError
from tests.builders import make_node, make_pod


def config(**fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        **fields,
    }


def framework(percentage: int | None) -> Framework:
    raw = config() if percentage is None else config(percentageOfNodesToScore=percentage)
    return Framework(parse_config(raw).profiles[0], builtin_registry(), Engine())


@pytest.mark.parametrize(
    ("nodes", "percentage", "expected"),
    [
        (99, 10, 99),  # fewer than minFeasibleNodesToFind (100): every node
        (1000, 10, 100),  # 1000 * 10 / 100 = 100
        (1000, 5, 100),  # 50, raised to the minimum of 100
        (1000, 50, 500),
        (1000, 100, 1000),
        (1000, 0, 420),  # adaptive: 50 - 1000/125 = 42 per cent
        (5000, 0, 500),  # 50 - 40 = 10 per cent
        (10000, 0, 500),  # 50 - 80 < 5: 5 per cent
        (250, 1, 100),
    ],
)
def test_nodes_to_find_is_kube_schedulers_arithmetic(
    nodes: int, percentage: int, expected: int
) -> None:
    assert nodes_to_find(percentage, nodes) == expected


def kube_scan(state: ClusterState, pod: PodInfo, find: int) -> list[int]:
    """kube-scheduler's findNodesThatPassFilters, sequentially: nodes in order from the
    start, stopping at the ``find``-th that fits (here: cpu and memory free)."""
    nodes = [slot for slot in range(state.high_water) if state.valid[slot]]
    start = pod.tiebreak % len(nodes)
    found: list[int] = []
    for i in range(len(nodes)):
        slot = nodes[(start + i) % len(nodes)]
        if all(state.free[row, slot] >= need for row, need in pod.request):
            found.append(slot)
            if len(found) == find:
                break
    return found


def cluster(cpus: list[int], removed: set[int]) -> ClusterState:
    state = ClusterState()
    for i, cpu in enumerate(cpus):
        state.add_node(make_node(f"n{i}").cpu(cpu).memory(8 << 30).spec())
    for i in sorted(removed):
        state.remove_node(f"n{i}")
    return state


@settings(max_examples=8, deadline=None)
@given(
    cpus=st.lists(st.integers(1, 64), min_size=100, max_size=400),
    removed=st.sets(st.integers(0, 99), max_size=5),
    percentage=st.integers(0, 100),
    name=st.text("abcdefgh", min_size=1, max_size=6),
)
def test_a_pod_goes_to_the_best_of_the_nodes_kube_scheduler_scans(
    cpus: list[int], removed: set[int], percentage: int, name: str
) -> None:
    state = cluster(cpus, removed)
    pod = pod_info(make_pod(name).cpu(2).memory(1 << 30).spec(), state.resources, 0)
    sampled, exact = framework(percentage), framework(None)
    # every node's score, as the exact profile sees it (the default scores are per node
    # here: no taints, affinities or spread constraints to normalise over the sample)
    feasible = exact.feasible(CycleState(), pod, state)
    scores, _ = exact.score(CycleState(), pod, state, feasible)
    scanned = kube_scan(state, pod, nodes_to_find(percentage, len(state.index)))
    attempt = sampled.schedule(pod, state)
    if not scanned:
        assert attempt.slot == -1
        return
    assert attempt.slot in scanned
    assert scores[attempt.slot] == max(scores[s] for s in scanned)
    best = exact.schedule(pod, state)
    assert scores[best.slot] == scores.max()  # unset: the best of all, as before


def test_the_best_node_outside_the_scan_is_not_chosen() -> None:
    """1,000 nodes, 10 per cent: 100 scanned. The roomiest node sits half the cluster
    away from where this pod's scan starts: only the exact default finds it."""
    pod_spec = make_pod("p").cpu(1).spec()
    probe = ClusterState()
    probe.add_node(make_node("x").spec())
    tiebreak = pod_info(pod_spec, probe.resources, 0).tiebreak
    big = (tiebreak % 1000 + 500) % 1000
    state = cluster([64 if i == big else 4 for i in range(1000)], set())
    pod = pod_info(pod_spec, state.resources, 0)
    assert framework(None).schedule(pod, state).slot == big
    chosen = framework(10).schedule(pod, state).slot
    assert chosen != big and chosen in kube_scan(state, pod, 100)


def test_the_field_is_honoured_not_warned_and_a_profile_overrides_it() -> None:
    parsed = parse_config(
        config(
            percentageOfNodesToScore=30,
            profiles=[
                {"schedulerName": "a"},
                {"schedulerName": "b", "percentageOfNodesToScore": 0},
            ],
        )
    )
    assert [p.percentage_of_nodes_to_score for p in parsed.profiles] == [30, 0]
    assert not [w for w in parsed.warnings if "percentageOfNodesToScore" in w]
    assert parse_config(config()).profiles[0].percentage_of_nodes_to_score is None


@pytest.mark.parametrize("value", [101, -1, "10", True, 2.5])
@pytest.mark.parametrize("where", ["top", "profile"])
def test_a_bad_percentage_is_refused_naming_the_field(value: Any, where: str) -> None:
    raw = (
        config(percentageOfNodesToScore=value)
        if where == "top"
        else config(profiles=[{"percentageOfNodesToScore": value}])
    )
    location = "config." if where == "top" else r"config\.profiles\[0\]\."
    with pytest.raises(InputError, match=f"{location}percentageOfNodesToScore: must be"):
        parse_config(raw)


def test_without_score_plugins_the_first_feasible_node_is_taken() -> None:
    """kube-scheduler looks for one feasible node when nothing scores them."""
    raw = config(
        percentageOfNodesToScore=50,
        profiles=[{"plugins": {"score": {"disabled": [{"name": "*"}]}}}],
    )
    sampled = Framework(parse_config(raw).profiles[0], builtin_registry(), Engine())
    state = cluster([1 if i % 3 else 8 for i in range(300)], set())
    pod = pod_info(make_pod("q").cpu(2).spec(), state.resources, 0)
    assert [sampled.schedule(pod, state).slot] == kube_scan(state, pod, 1)
    assert np.count_nonzero(sampled.feasible(CycleState(), pod, state)) == 100


@settings(max_examples=30, deadline=None)
@given(
    fits=st.lists(st.booleans(), min_size=1, max_size=300),
    removed=st.sets(st.integers(0, 299), max_size=20),
    find=st.integers(1, 40),
    start=st.integers(0, 2**32 - 1),
)
def test_the_sample_is_the_first_feasible_nodes_of_the_scan(
    fits: list[bool], removed: set[int], find: int, start: int
) -> None:
    state = cluster([1] * len(fits), {i for i in removed if i < len(fits) - 1})
    feasible = np.array([f and bool(v) for f, v in zip(fits, state.valid, strict=False)])
    feasible = np.concatenate((feasible, np.zeros(state.capacity - feasible.size, bool)))
    nodes = [slot for slot in range(state.high_water) if state.valid[slot]]
    first = start % len(nodes)
    scan = [nodes[(first + i) % len(nodes)] for i in range(len(nodes))]
    expected = [slot for slot in scan if feasible[slot]][:find]
    assert sorted(np.flatnonzero(sample(feasible, state, find, start))) == sorted(expected)

"""Which victims preemption takes: kube-scheduler's order (``pickOneNodeForPreemption``:
fewest budget violations, then the lowest highest victim priority, then the smallest
sum of priorities, then the fewest victims, then the latest start), for pods and for
gangs, at 1, 2 and 4 shards, each run replayed with ``--verify``.

Priority comes before the number of victims: a priority-1000 pod evicts two
priority-100 pods before one priority-500 pod (issue #28, item 1). The scenarios show
each rule; the property checks random clusters against kube-scheduler's rule written
out in the test.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import node, pod, pod_group

SHARDS = (1, 2, 4)


def simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int
) -> dict[str, Any]:
    data, _ = shoal(tmp_path, capsys, text, shards)
    return data


def preempted(data: dict[str, Any]) -> set[str]:
    return {p["pod"] for p in data["preemptions"]}


def pinned(name: str, where: str, *, cpu: str, priority: int, at: float = 0) -> str:
    return pod(name, cpu=cpu, priority=priority, at=at, selector={"shoal.io/pool": where})


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("high", "low", "many"), [(500, 100, 2), (101, 100, 4)])
def test_lower_priorities_go_before_fewer_victims(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    high: int,
    low: int,
    many: int,
) -> None:
    """Node a runs one pod of priority ``high``, node b ``many`` pods of priority
    ``low`` (a's pool first, so that a's shard is asked first); the urgent pod needs a
    whole node. kube-scheduler takes the node whose highest victim priority is lowest:
    b's ``many`` pods go, a's one pod stays."""
    text = node("a", cpu=8, labels={"shoal.io/pool": "pa"})
    text += node("b", cpu=8, labels={"shoal.io/pool": "pb"})
    text += pinned("one", "pa", cpu="8", priority=high)
    cpu = str(8 // many)
    text += "".join(pinned(f"many-{i}", "pb", cpu=cpu, priority=low) for i in range(many))
    text += pod("urgent", cpu="8", priority=1000, at=10)
    data = simulate(tmp_path, capsys, text, shards)
    assert data["pods"]["default/urgent"]["node"] == "b"
    assert preempted(data) == {f"default/many-{i}" for i in range(many)}
    assert data["pods"]["default/one"]["phase"] == "Bound"


@pytest.mark.parametrize("shards", SHARDS)
def test_then_the_node_whose_most_valuable_victims_started_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Nodes b and c each run a priority-100 and a priority-50 pod (equal highest
    priority, sum and count). kube-scheduler then takes the node whose highest-priority
    victims started last: c (its priority-100 pod started at 5, b's at 0), although
    b's priority-50 pod started later than any of c's."""
    text = node("b", cpu=8, labels={"shoal.io/pool": "pb"})
    text += node("c", cpu=8, labels={"shoal.io/pool": "pc"})
    text += pinned("hi-b", "pb", cpu="4", priority=100, at=0)
    text += pinned("lo-c", "pc", cpu="4", priority=50, at=1)
    text += pinned("hi-c", "pc", cpu="4", priority=100, at=5)
    text += pinned("lo-b", "pb", cpu="4", priority=50, at=8)
    text += pod("urgent", cpu="8", priority=1000, at=10)
    data = simulate(tmp_path, capsys, text, shards)
    assert data["pods"]["default/urgent"]["node"] == "c"
    assert preempted(data) == {"default/hi-c", "default/lo-c"}


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("size", [2, 3])
def test_a_gang_takes_the_lowest_priorities_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, size: int
) -> None:
    """A priority-1000 gang of ``size`` whole-node members; node a runs one pod of
    priority 500, each other node two pods of priority 100. The gang takes the
    priority-100 pods and leaves the priority-500 pod running."""
    text = node("a", cpu=8, labels={"shoal.io/pool": "pa"})
    text += pinned("one", "pa", cpu="8", priority=500)
    for n in range(size):
        text += node(f"n{n}", cpu=8, labels={"shoal.io/pool": f"p{n}"})
        text += pinned(f"low-{n}-0", f"p{n}", cpu="4", priority=100)
        text += pinned(f"low-{n}-1", f"p{n}", cpu="4", priority=100)
    text += pod_group("urgent", size, at=10)
    text += "".join(
        pod(f"urgent-{i}", cpu="8", priority=1000, group="urgent", at=10) for i in range(size)
    )
    data = simulate(tmp_path, capsys, text, shards)
    members = [f"default/urgent-{i}" for i in range(size)]
    assert all(data["pods"][m]["phase"] == "Bound" for m in members)
    assert data["pods"]["default/one"]["phase"] == "Bound"
    assert preempted(data) == {f"default/low-{n}-{i}" for n in range(size) for i in range(2)}


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_is_judged_whole_not_member_by_member(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """A priority-1000 gang of a 4-cpu member (first) and an 8-cpu member. Node b runs
    two 4-cpu pods of priority 100, node a a 4-cpu pod of priority 200 beside one the
    gang may not evict, node c one 8-cpu pod of priority 500. Member by member, the
    small member takes half of b and the large one then needs c (highest victim 500);
    judged whole, the large member takes b and the small one a (highest victim 200)."""
    text = "".join(node(n, cpu=8, labels={"shoal.io/pool": f"p{n}"}) for n in "abc")
    text += pinned("keep", "pa", cpu="4", priority=2000)
    text += pinned("mid", "pa", cpu="4", priority=200)
    text += pinned("low-0", "pb", cpu="4", priority=100)
    text += pinned("low-1", "pb", cpu="4", priority=100)
    text += pinned("high", "pc", cpu="8", priority=500)
    text += pod_group("job", 2, at=10)
    text += pod("job-small", cpu="4", priority=1000, group="job", at=10)
    text += pod("job-large", cpu="8", priority=1000, group="job", at=10)
    data = simulate(tmp_path, capsys, text, shards)
    assert data["pods"]["default/job-large"]["node"] == "b"
    assert data["pods"]["default/job-small"]["node"] == "a"
    assert preempted(data) == {"default/low-0", "default/low-1", "default/mid"}
    assert data["pods"]["default/high"]["phase"] == "Bound"


# ------------------------------------------------------------ the rule, against a reference


def _kube_choice(
    nodes: list[list[tuple[str, int, int, int]]], need: int, cpu: int
) -> tuple[str, set[str]]:
    """kube-scheduler's preemption for a pod of ``need`` cpu above every priority here,
    written out: per node, remove every pod, reprieve the most valuable first (higher
    priority, then earlier start) while the pod still fits; then the node of least
    (highest victim priority, sum of priority + 2**31, number of victims, -earliest
    start of the highest-priority victims), the first by name on a tie. ``nodes``: per
    node its pods as (name, cpu, priority, start)."""
    best: tuple[tuple[int, int, int, int, str], set[str]] | None = None
    for index, pods in enumerate(nodes):
        free = cpu
        victims = []
        for name, size, priority, start in sorted(pods, key=lambda p: (-p[2], p[3], p[0])):
            if free - size >= need:
                free -= size
            else:
                victims.append((name, priority, start))
        top = max(p for _, p, _ in victims)
        cost = (
            top,
            sum(p + 2**31 for _, p, _ in victims),
            len(victims),
            -min(s for _, p, s in victims if p == top),
            f"n{index}",
        )
        if best is None or cost < best[0]:
            best = (cost, {name for name, _, _ in victims})
    assert best is not None
    return best[0][-1], best[1]


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shards=st.sampled_from(SHARDS),
    nodes=st.lists(
        st.lists(
            st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([0, 10, 100, 500])),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=4,
    ),
    need=st.integers(4, 8),
)
def test_the_node_and_victims_are_kube_schedulers(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    nodes: list[list[tuple[int, int]]],
    need: int,
) -> None:
    """Random nodes of 8 cpu running pods of random sizes and priorities, each started
    at its own time; a pod of priority 1000 that fits no node as it stands preempts
    exactly what kube-scheduler's rule picks."""
    cpu = 8
    layout: list[list[tuple[str, int, int, int]]] = []
    start = 0
    for n, pods in enumerate(nodes):
        here: list[tuple[str, int, int, int]] = []
        for i, (size, priority) in enumerate(pods):
            if sum(p[1] for p in here) + size <= cpu:
                here.append((f"p{n}-{i}", size, priority, start))
                start += 1
        layout.append(here)
    assume(all(cpu - sum(p[1] for p in here) < need for here in layout))
    text = "".join(
        node(f"n{n}", cpu=cpu, labels={"shoal.io/pool": f"p{n}"}) for n in range(len(layout))
    )
    for n, here in enumerate(layout):
        for name, size, priority, at in here:
            text += pinned(name, f"p{n}", cpu=str(size), priority=priority, at=at)
    text += pod("urgent", cpu=str(need), priority=1000, at=start + 1)
    where, victims = _kube_choice(layout, need, cpu)
    run = Path(tempfile.mkdtemp(dir=tmp_path))  # (one folder per example)
    data = simulate(run, capsys, text, shards)
    assert data["pods"]["default/urgent"]["node"] == where
    assert preempted(data) == {f"default/{v}" for v in victims}

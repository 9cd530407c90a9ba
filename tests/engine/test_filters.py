"""Filter plugins over all nodes at once; each row reads as the Kubernetes rule."""

from __future__ import annotations

import pytest

from engine.framework.cycle import CycleState
from engine.model.pods import PodInfo, pod_info
from engine.model.state import ClusterState
from engine.plugins.fit import NodeResourcesFit
from engine.plugins.node_affinity import NodeAffinity
from engine.plugins.node_name import NodeName
from engine.plugins.taints import TaintToleration, tolerates_one
from engine.plugins.unschedulable import NodeUnschedulable
from events.types import Taint, Toleration
from tests.builders import PodBuilder, make_node, make_pod


@pytest.fixture
def state() -> ClusterState:
    s = ClusterState()
    s.add_node(make_node("a").label("zone", "x").label("gen", "3").spec())
    s.add_node(make_node("b").label("zone", "y").label("gen", "5").spec())
    s.add_node(make_node("c").label("gen", "v1").spec())
    return s


def passing(plugin: object, state: ClusterState, pod: PodBuilder) -> list[str]:
    info: PodInfo = pod_info(pod.spec(), state.resources, 0)
    state.ensure_rows()
    mask = plugin.filter(CycleState(), info, state) & state.valid  # type: ignore[attr-defined]
    return [state.names[i] or "" for i in range(state.capacity) if mask[i]]


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (make_pod("p"), ["a", "b", "c"]),
        (make_pod("p").selector(zone="x"), ["a"]),
        (make_pod("p").selector(zone="x", gen="5"), []),
        (make_pod("p").selector(zone="never-seen"), []),
        (make_pod("p").require("zone", "In", "x", "y"), ["a", "b"]),
        (make_pod("p").require("zone", "NotIn", "x"), ["b", "c"]),  # NotIn matches no label
        (make_pod("p").require("zone", "Exists"), ["a", "b"]),
        (make_pod("p").require("zone", "DoesNotExist"), ["c"]),
        (make_pod("p").require("gen", "Gt", "3"), ["b"]),  # "v1" is not an integer
        (make_pod("p").require("gen", "Lt", "5"), ["a"]),
        (
            make_pod("p").require("zone", "In", "x").require("zone", "In", "y"),
            ["a", "b"],
        ),  # terms OR
        (
            make_pod("p").selector(gen="5").require("zone", "In", "x", "y"),
            ["b"],
        ),  # selector AND affinity
    ],
    ids=lambda v: (
        ""
        if isinstance(v, list)
        else repr(v.fields.get("node_selector") or v.fields.get("required_affinity"))
    ),
)
def test_node_affinity(state: ClusterState, pod: PodBuilder, expected: list[str]) -> None:
    assert passing(NodeAffinity(), state, pod) == expected


def test_preferred_affinity_scores_normalised(state: ClusterState) -> None:
    info = pod_info(
        make_pod("p").prefer(30, "zone", "In", "x").prefer(10, "gen", "Exists").spec(),
        state.resources,
        0,
    )
    plugin = NodeAffinity()
    raw = plugin.score(CycleState(), info, state, state.valid)
    # a: 30 + 10 = 40, b: 10, c: 10 → normalised by the max 40: 100, 25, 25
    assert list(plugin.normalize(raw, state.valid)[:3]) == [100, 25, 25]  # type: ignore[index]


@pytest.mark.parametrize(
    ("toleration", "taint", "ok"),
    [
        (Toleration(key="k", value="v"), Taint(key="k", value="v", effect="NoSchedule"), True),
        (Toleration(key="k", value="w"), Taint(key="k", value="v", effect="NoSchedule"), False),
        (
            Toleration(key="k", operator="Exists"),
            Taint(key="k", value="v", effect="NoExecute"),
            True,
        ),
        (Toleration(operator="Exists"), Taint(key="anything", effect="NoSchedule"), True),
        (
            Toleration(key="k", operator="Exists", effect="NoExecute"),
            Taint(key="k", effect="NoSchedule"),
            False,
        ),
        (Toleration(key="other", operator="Exists"), Taint(key="k", effect="NoSchedule"), False),
    ],
)
def test_toleration_matching(toleration: Toleration, taint: Taint, ok: bool) -> None:
    assert tolerates_one(toleration, taint) is ok


def test_taints_filter_and_score() -> None:
    state = ClusterState()
    state.add_node(make_node("hard").taint("gpu", "yes", "NoSchedule").spec())
    state.add_node(make_node("soft").taint("spot", "", "PreferNoSchedule").spec())
    state.add_node(make_node("clean").spec())
    plugin = TaintToleration()
    assert passing(plugin, state, make_pod("p")) == ["soft", "clean"]
    assert passing(plugin, state, make_pod("p").tolerate("gpu")) == ["hard", "soft", "clean"]
    info = pod_info(make_pod("p").spec(), state.resources, 0)
    raw = plugin.score(CycleState(), info, state, state.valid)
    # soft has 1 intolerable PreferNoSchedule taint (the max): reversed → 0; others 100
    assert list(plugin.normalize(raw, state.valid)[:3]) == [100, 0, 100]  # type: ignore[index]
    rejected = ~plugin.filter(CycleState(), info, state) & state.valid
    assert plugin.reasons(CycleState(), info, state, rejected) == {
        "node(s) had untolerated taint {gpu: yes}": 1
    }


def test_unschedulable_and_node_name() -> None:
    state = ClusterState()
    state.add_node(make_node("cordoned").cordoned().spec())
    state.add_node(make_node("open").spec())
    assert passing(NodeUnschedulable(), state, make_pod("p")) == ["open"]
    tolerant = make_pod("p").tolerate("node.kubernetes.io/unschedulable", effect="NoSchedule")
    assert passing(NodeUnschedulable(), state, tolerant) == ["cordoned", "open"]
    assert passing(NodeName(), state, make_pod("p").on("open")) == ["open"]
    assert passing(NodeName(), state, make_pod("p").on("missing")) == []


def test_fit_filter_and_reasons() -> None:
    state = ClusterState()
    state.add_node(make_node("small").cpu("1").memory("1Gi").spec())
    state.add_node(make_node("big").cpu("8").memory("1Gi").gpu(2).spec())
    state.add_node(make_node("full").cpu("8").memory("8Gi").pods(0).spec())
    plugin = NodeResourcesFit()
    pod = make_pod("p").cpu("2").memory("2Gi")
    assert passing(plugin, state, pod) == []
    info = pod_info(pod.spec(), state.resources, 0)
    state.ensure_rows()
    rejected = ~plugin.filter(CycleState(), info, state) & state.valid
    assert plugin.reasons(CycleState(), info, state, rejected) == {
        "Insufficient cpu": 1,
        "Insufficient memory": 2,
        "Too many pods": 1,
    }
    assert passing(plugin, state, make_pod("g").cpu("1").gpu(2)) == ["big"]
    assert passing(plugin, state, make_pod("g").gpu(3)) == []

"""User plugin classes as registry factories: typed args, the handle, the per-node
adapter (the same verdicts and scores as a vectorised plugin), and a user score
deciding placements in the engine."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.framework.userplugins import NodeView, plugin_factory
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo, pod_info
from engine.model.state import Bools, ClusterState, Ints
from engine.plugins.registry import builtin_registry
from events.errors import InputError
from events.types import PodBound
from tests.builders import env, make_node, make_pod

SPEED = "example.com/mbps"


class SpeedArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    minimum_mbps: int = 0


def _speed(annotations: dict[str, str]) -> int:
    raw = annotations.get(SPEED, "")
    return int(raw) if raw.isdigit() else -1


class VectorSpeed:
    """Vectorised: a static filter (speed >= minimum) and a score (the speed, capped)."""

    name = "Speed"
    Args = SpeedArgs
    static = False
    unresolvable = True
    local = False

    def __init__(self, args: SpeedArgs | None) -> None:
        self.args = args or SpeedArgs()

    def _speeds(self, state: ClusterState) -> Ints:
        out = np.full(state.capacity, -1, dtype=np.int64)
        for slot in range(state.high_water):
            out[slot] = _speed(state.node_annotations[slot])
        return out

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        cpu = state.resources.row("cpu")
        fits = state.free[cpu] >= 1000
        return fits & (self._speeds(state) >= self.args.minimum_mbps)

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        return {"slow": int(rejected.sum())}

    def events(self) -> frozenset[ClusterEvent]:
        return frozenset(ClusterEvent)

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools) -> Ints:
        return np.clip(self._speeds(state), 0, 100)


class NodeSpeed:
    """The same, per node (wrapped by the adapter)."""

    name = "Speed"
    Args = SpeedArgs

    def __init__(self, args: SpeedArgs | None) -> None:
        self.args = args or SpeedArgs()

    def filter_node(self, pod: PodInfo, node: NodeView) -> bool:
        return node.free["cpu"] >= 1000 and _speed(dict(node.annotations)) >= self.args.minimum_mbps

    def score_node(self, pod: PodInfo, node: NodeView) -> int:
        return _speed(dict(node.annotations))


def build(cls: type, args: dict[str, Any], handle: Handle | None = None) -> Any:
    return plugin_factory(cls, "Speed")(args, "plugin Speed", handle or Engine())


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(st.integers(0, 4), st.one_of(st.none(), st.integers(0, 200))),
        min_size=1,
        max_size=12,
    ),
    minimum=st.integers(0, 150),
    removed=st.sets(st.integers(0, 11), max_size=3),
)
def test_the_per_node_adapter_gives_what_the_vectorised_plugin_gives(
    nodes: list[tuple[int, int | None]], minimum: int, removed: set[int]
) -> None:
    state = ClusterState()
    for i, (cpu, speed) in enumerate(nodes):
        node = make_node(f"n{i}").cpu(str(cpu))
        if speed is not None:
            node = node.annotate(**{SPEED: str(speed)})
        state.add_node(node.spec())
    for i in sorted(removed):
        state.remove_node(f"n{i}")
    pod = pod_info(make_pod("p").cpu("1").spec(), state.resources, 0)
    args = {"minimumMbps": minimum}
    vector, per_node = build(VectorSpeed, args), build(NodeSpeed, args)
    cycle = CycleState()
    want = vector.filter(cycle, pod, state) & state.valid
    got = per_node.filter(cycle, pod, state) & state.valid
    assert want.tolist() == got.tolist()
    assert per_node.reasons(cycle, pod, state, ~got & state.valid) == {
        "rejected by Speed": int((~got & state.valid).sum())
    }
    feasible = want
    assert (
        np.where(feasible, vector.score(cycle, pod, state, feasible), 0).tolist()
        == np.where(feasible, per_node.score(cycle, pod, state, feasible), 0).tolist()
    )


@pytest.mark.parametrize(
    ("cls", "args", "message"),
    [
        (VectorSpeed, {"minimumMbps": "fast"}, "plugin Speed: args.minimumMbps: Expected `int`"),
        (
            VectorSpeed,
            {"maximum": 3},
            "plugin Speed: args: Object contains unknown field `maximum`",
        ),
    ],
)
def test_bad_args_name_the_field(cls: type, args: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as caught:
        build(cls, args)
    assert message in str(caught.value)


def test_a_plugin_without_args_refuses_them_and_one_named_otherwise_is_refused() -> None:
    class Plain:
        name = "Speed"
        local = False

        def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, f: Bools) -> int:
            return 0

    class Misnamed(Plain):
        name = "Other"

    class HalfFilter:
        name = "Speed"

        def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
            return state.valid

    with pytest.raises(InputError, match=r"takes no args, got \['x'\]"):
        build(Plain, {"x": 1})
    with pytest.raises(InputError, match="is named 'Other', not 'Speed'"):
        build(Misnamed, {})
    with pytest.raises(InputError, match="has filter\\(\\) but not static, unresolvable, local"):
        build(HalfFilter, {})
    assert build(Plain, {}).name == "Speed"


class Handled:
    """Reads the handle: scores nodes by how many pods of the pod's namespace they run."""

    name = "Crowd"
    local = False

    def __init__(self, handle: Handle) -> None:
        self.handle = handle

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, f: Bools) -> Ints:
        out = np.zeros(state.capacity, dtype=np.int64)
        for key, placed in state.pods.items():
            other = self.handle.pods.get(key)
            if other is not None and other.spec.namespace == pod.spec.namespace:
                out[placed.slot] += 10
        return out


@pytest.mark.parametrize("cls", [VectorSpeed, NodeSpeed])
def test_a_user_plugin_places_pods_in_the_engine(cls: type) -> None:
    registry = builtin_registry()
    registry.register("Speed", plugin_factory(cls, "Speed"))
    registry.register("Crowd", plugin_factory(Handled, "Crowd"))
    config = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [
                {
                    "plugins": {
                        "multiPoint": {"enabled": [{"name": "Speed"}, {"name": "Crowd"}]},
                        "score": {"enabled": [{"name": "Speed", "weight": 10}]},
                    },
                    "pluginConfig": [{"name": "Speed", "args": {"minimumMbps": 20}}],
                }
            ],
        }
    )
    engine = Engine(config, registry=registry)
    for event in (
        make_node("slow").cpu("8").annotate(**{SPEED: "10"}).added(),
        make_node("fast").cpu("8").annotate(**{SPEED: "90"}).added(),
        make_node("medium").cpu("8").annotate(**{SPEED: "50"}).added(),
        make_node("unmeasured").cpu("8").added(),
        *(make_pod(f"p{i}").cpu("1").submitted() for i in range(3)),
    ):
        engine.apply(env(event))
    out = engine.schedule()
    # fast: 90 * 10 = 900 beats medium's 500 whatever the resource scores (at most ~300)
    assert {d.pod: d.node for d in out if isinstance(d, PodBound)} == {
        "default/p0": "fast",
        "default/p1": "fast",
        "default/p2": "fast",
    }
    with pytest.raises(InputError, match="unknown plugin 'Speed'"):
        Engine(config)  # the built-ins alone do not know it

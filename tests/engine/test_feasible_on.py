"""A pod's filters on one node (``Framework.feasible_on``: a placement the coordinator
directed to a node, checked by the shard that owns it) say what the filters over every
node say of that node (``Framework.feasible``), with and without the rules that read
other nodes, on random clusters and pods."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.framework.cycle import CycleState
from tests.builders import env, make_pod
from tests.engine.test_brief_failure import NODE, engine_with_nodes, with_rules

POD = st.tuples(
    st.sampled_from([1, 2, 3, 6]),  # cpu
    st.sampled_from(["", "a", "b"]),  # zone it selects ("" any)
    st.booleans(),  # tolerates the taint
    st.sampled_from(["", "anti", "spread"]),  # a rule that reads other nodes
)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(NODE, min_size=1, max_size=6),
    running=st.lists(
        st.tuples(st.integers(0, 7), st.sampled_from([1, 2, 4]), st.booleans()), max_size=12
    ),
    pod=POD,
)
def test_the_filters_on_one_node_say_what_the_filters_over_every_node_say(
    nodes: list[tuple[int, str, bool, bool]],
    running: list[tuple[int, int, bool]],
    pod: tuple[int, str, bool, str],
) -> None:
    engine = engine_with_nodes(nodes)
    for j, (at, cpu, labelled) in enumerate(running):
        spec = make_pod(f"r{j}").cpu(str(cpu)).on(f"n{at % len(nodes)}").tolerate()
        if labelled:
            spec = spec.labels(app="w")
        engine.apply(env(spec.submitted()))
    engine.schedule()
    cpu, zone, tolerate, rule = pod
    spec = with_rules(make_pod("p").cpu(str(cpu)), zone, tolerate, rule)
    engine.apply(env(spec.submitted(), time=1))
    info = engine.pods["default/p"]
    framework = engine.profiles.framework_for(info)
    assert framework is not None
    state = engine.state
    for local_only in (False, True):
        cycle = CycleState()
        if not framework.run_pre_filters(cycle, info, state).ok:
            return
        whole = framework.feasible(cycle, info, state, local_only=local_only)
        for slot in range(len(nodes)):
            cycle = CycleState()
            framework.run_pre_filters(cycle, info, state)
            one = framework.feasible_on(cycle, info, state, slot, local_only=local_only)
            assert one == bool(whole[slot])

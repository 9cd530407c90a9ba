"""The pod table's cheap question, "has any placed pod inter-pod terms?", asked with
only the pods placed since the last sync looked at (not every pod of the changed
nodes), answers as a walk over every placed pod does, whatever was placed, moved or
released in between."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.pods import PodInfo, pod_info
from engine.model.podtable import has_terms, pod_table
from engine.model.state import ClusterState
from tests.builders import make_node, make_pod

HOST = "kubernetes.io/hostname"
NODES = 4
PODS = 12

# (what, pod, node): place a pod (again: moved), release it, or ask the table
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["place", "place", "release", "ask"]),
        st.integers(0, PODS - 1),
        st.integers(0, NODES - 1),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(terms=st.sets(st.integers(0, PODS - 1), max_size=3), steps=STEPS)
def test_terms_are_found_among_the_pods_placed_since_the_last_sync(
    terms: set[int], steps: list[tuple[str, int, int]]
) -> None:
    state = ClusterState()
    slots = [state.add_node(make_node(f"n{i}").cpu("64").spec()) for i in range(NODES)]
    pods: dict[str, PodInfo] = {}
    for i in range(PODS):
        builder = make_pod(f"p{i}").cpu("1").labels(app="x")
        if i in terms:
            builder = builder.anti(HOST, app="x")
        info = pod_info(builder.spec(), state.resources, i)
        pods[info.key] = info
    keys = sorted(pods)
    for what, pod, node in steps:
        key = keys[pod]
        if what == "place":
            state.assume(key, slots[node], pods[key].request)
        elif what == "release":
            state.forget(key)
        else:
            table = pod_table(state, pods, rows=False)
            placed_with_terms = {
                k: p.slot for k, p in state.pods.items() if has_terms(pods[k].spec)
            }
            if table.rows:
                assert table.with_terms == placed_with_terms
            else:  # rows not kept yet: no placed pod has terms
                assert not placed_with_terms
    table = pod_table(state, pods, rows=True)
    assert table.with_terms == {k: p.slot for k, p in state.pods.items() if has_terms(pods[k].spec)}

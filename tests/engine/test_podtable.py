"""The pod table's cheap question, "has any placed pod inter-pod terms?", asked with
only the pods placed since the last sync looked at (not every pod of the changed
nodes), answers as a walk over every placed pod does, whatever was placed, moved or
released in between; and a label's log, replayed by a reader, gives the pods that
carry the label per node."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model import podtable
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
        if not _apply(state, what, key, slots[node], pods[key]):
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


@settings(max_examples=100, deadline=None)
@given(
    labelled=st.sets(st.integers(0, PODS - 1)),
    steps=STEPS,
    keep=st.sampled_from([4, 4096]),
)
def test_a_label_log_replays_to_the_pods_carrying_the_label(
    labelled: set[int], steps: list[tuple[str, int, int]], keep: int
) -> None:
    """A reader that follows a label from some moment, applying the log's entries
    since, holds per node the placed pods that carry the label; the log says when
    it dropped entries the reader had not read (it then counts whole again)."""
    saved = podtable._LOG
    podtable._LOG = keep  # type: ignore[misc]
    try:
        _follow(labelled, steps)
    finally:
        podtable._LOG = saved  # type: ignore[misc]


def _follow(labelled: set[int], steps: list[tuple[str, int, int]]) -> None:
    state = ClusterState()
    slots = [state.add_node(make_node(f"n{i}").cpu("64").spec()) for i in range(NODES)]
    pods: dict[str, PodInfo] = {}
    for i in range(PODS):
        builder = make_pod(f"p{i}").cpu("1").labels(app="x" if i in labelled else "y", n=str(i))
        info = pod_info(builder.spec(), state.resources, i)
        pods[info.key] = info
    keys = sorted(pods)

    def carrying() -> list[int]:
        counts = [0] * NODES
        for key, placed in state.pods.items():
            if pods[key].spec.labels["app"] == "x":
                counts[slots.index(placed.slot)] += 1
        return counts

    table = pod_table(state, pods)
    log = table.label_log("app", "x")
    per_node, read = carrying(), log.end
    for what, pod, node in steps:
        key = keys[pod]
        _apply(state, what, key, slots[node], pods[key])
        table = pod_table(state, pods)
        entries = log.since(read) if table.followed("app", "x") is log else None
        if entries is None:  # dropped (or the table rebuilt): count whole, follow again
            log = table.label_log("app", "x")
            per_node, read = carrying(), log.end
            continue
        for slot, sign, spec in entries:
            assert spec.labels["app"] == "x"
            per_node[slots.index(slot)] += sign
        read = log.end
        assert per_node == carrying()


def _apply(state: ClusterState, what: str, key: str, slot: int, pod: PodInfo) -> bool:
    """Carry out a drawn step: place or release ``key``; False for any other step."""
    if what == "place":
        state.assume(key, slot, pod.request)
    elif what == "release":
        state.forget(key)
    else:
        return False
    return True


# (what, pod, node): as STEPS, and pods placed in bulk, a pod's spec replaced (a name
# that comes back with other labels), a node's labels changed
ROWS_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["place", "place", "bulk", "release", "respec", "relabel", "ask"]),
        st.integers(0, PODS - 1),
        st.integers(0, NODES - 1),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(steps=ROWS_STEPS)
def test_rows_kept_in_step_are_the_rows_built_whole(steps: list[tuple[str, int, int]]) -> None:
    """Synced from the journal after any run of changes (pods placed one by one or in
    bulk, several on one node, moved, released, given another spec, nodes changed),
    the table holds the rows a table built from scratch holds: each placed pod once,
    on its node, with its current spec, and the label log a reader follows agrees."""
    state = ClusterState()
    slots = [state.add_node(make_node(f"n{i}").cpu("64").spec()) for i in range(NODES)]
    pods: dict[str, PodInfo] = {}
    for i in range(PODS):
        info = pod_info(make_pod(f"p{i}").cpu("1").labels(app="x").spec(), state.resources, i)
        pods[info.key] = info
    keys = sorted(pods)
    table = pod_table(state, pods)
    log = table.label_log("app", "x")
    per_node, read = [0] * NODES, log.end
    respecs = 0
    for what, pod, node in steps:
        key = keys[pod]
        if what == "bulk":  # this pod and the next two not placed, on one node
            batch = [k for k in keys[pod:] + keys[:pod] if k not in state.pods][:3]
            state.assume_all([(k, slots[node], pods[k].request, 0) for k in batch])
        elif what == "respec":  # (of a pod not placed: placed, it is released first)
            state.forget(key)
            respecs += 1
            app = "x" if respecs % 2 == 0 else "y"
            spec = make_pod(f"p{pod}").cpu("1").labels(app=app).spec()
            pods[key] = pod_info(spec, state.resources, 100 + respecs)
        elif what == "relabel":
            state.update_node(make_node(f"n{node}").cpu("64").label("v", str(pod)).spec())
        elif what != "ask":
            _apply(state, what, key, slots[node], pods[key])
            continue
        table = pod_table(state, pods)
        whole = podtable.PodTable()
        whole.sync(state, pods, rows=True)
        got = {k: (int(table.node[r]), table.specs[r]) for k, r in table.row_of.items()}
        want = {k: (int(whole.node[r]), whole.specs[r]) for k, r in whole.row_of.items()}
        assert got == want
        assert table.on_slot == whole.on_slot
        entries = log.since(read) if table.followed("app", "x") is log else None
        if entries is None:
            log = table.label_log("app", "x")
            read = log.end
            per_node = _carrying(state, table, slots)
            continue
        for slot, sign, _ in entries:
            per_node[slots.index(slot)] += sign
        read = log.end
        assert per_node == _carrying(state, table, slots)


def _carrying(state: ClusterState, table: podtable.PodTable, slots: list[int]) -> list[int]:
    """Per node, the rows of the table that carry ``app=x`` (as the log counts them)."""
    counts = [0] * len(slots)
    for row in table.row_of.values():
        spec = table.specs[row]
        if spec is not None and spec.labels.get("app") == "x":
            counts[slots.index(int(table.node[row]))] += 1
    return counts

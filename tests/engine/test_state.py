from __future__ import annotations

import numpy as np

from engine.model.pods import make_request
from engine.model.resources import CPU, MEMORY, PODS
from engine.model.state import ClusterState
from tests.builders import make_node, make_pod


def test_add_update_remove_and_slot_reuse() -> None:
    state = ClusterState()
    a = state.add_node(make_node("a").cpu("4").label("zone", "x").spec())
    b = state.add_node(make_node("b").cpu("8").spec())
    assert (a, b) == (0, 1)
    assert state.alloc[CPU, b] == 8000 and state.free[CPU, b] == 8000
    assert state.label_columns["zone"][a] == state.label_code("zone", "x")
    assert state.label_columns["zone"][b] == -1
    state.update_node(make_node("a").cpu("2").spec())
    assert state.alloc[CPU, a] == 2000
    assert state.label_columns["zone"][a] == -1, "labels are replaced, not merged"
    assert state.remove_node("a") == []
    assert not state.valid[a]
    c = state.add_node(make_node("c").spec())
    assert c == a, "the lowest free slot is reused"
    state.check_invariants()


def test_assume_forget_and_idempotence() -> None:
    state = ClusterState()
    slot = state.add_node(make_node("n").cpu("4").memory("8Gi").spec())
    request = make_request(make_pod("p").cpu("1").memory("1Gi").spec(), state.resources)
    state.assume("ns/p", slot, request)
    state.assume("ns/p", slot, request)  # twice changes nothing
    assert state.used[CPU, slot] == 1000 and state.used[PODS, slot] == 1
    assert state.free[MEMORY, slot] == 7 << 30
    assert state.forget("ns/p") == slot
    assert state.forget("ns/p") is None
    assert state.used[:, slot].sum() == 0
    state.check_invariants()


def test_nonzero_requests_for_scoring() -> None:
    state = ClusterState()
    slot = state.add_node(make_node("n").spec())
    request = make_request(make_pod("p").spec(), state.resources)
    state.assume("ns/p", slot, request)
    assert state.used[CPU, slot] == 0
    assert state.nonzero_used[CPU, slot] == 100
    assert state.nonzero_used[MEMORY, slot] == 200 << 20


def test_remove_node_forgets_its_pods() -> None:
    state = ClusterState()
    slot = state.add_node(make_node("n").spec())
    state.assume("ns/p", slot, make_request(make_pod("p").cpu("1").spec(), state.resources))
    assert state.remove_node("n") == ["ns/p"]
    assert "ns/p" not in state.pods
    state.check_invariants()


def test_growth_keeps_columns() -> None:
    state = ClusterState()
    for i in range(200):
        state.add_node(make_node(f"n{i}").label("i", str(i)).taint("t", str(i % 3)).spec())
    assert state.capacity >= 200
    assert state.valid[:200].all() and not state.valid[200:].any()
    assert state.label_columns["i"][150] == state.label_code("i", "150")
    assert state.label_numeric("i")[150] == 150


def test_extended_resources_get_rows() -> None:
    state = ClusterState()
    slot = state.add_node(make_node("g").gpu(8).spec())
    row = state.resources.get("nvidia.com/gpu")
    assert row is not None and state.alloc[row, slot] == 8


def test_copy_is_independent() -> None:
    state = ClusterState()
    slot = state.add_node(make_node("n").spec())
    staged = state.copy()
    staged.assume("ns/p", slot, make_request(make_pod("p").cpu("1").spec(), state.resources))
    assert state.used[CPU, slot] == 0 and staged.used[CPU, slot] == 1000
    assert "ns/p" not in state.pods


def test_journal_and_view() -> None:
    state = ClusterState()
    for name in "abc":
        state.add_node(make_node(name).spec())
    mark = state.journal_end
    state.assume("ns/p", 2, make_request(make_pod("p").cpu("1").spec(), state.resources))
    assert state.changed_since(mark) == [2]
    view = state.view(np.array([2, 0]))
    assert view.capacity == 2
    assert list(view.free[CPU]) == [3000, 4000]
    assert state.changed_since(-5) is None


def test_any_set_agrees_with_numpy() -> None:
    from engine.model.state import any_set

    assert not any_set(np.zeros(0, bool))
    assert not any_set(np.zeros(7, bool))
    for at in (0, 3, 6):
        mask = np.zeros(7, bool)
        mask[at] = True
        assert any_set(mask)
    assert any_set(np.ones(5, bool))

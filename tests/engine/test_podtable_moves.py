"""The table of placed pods that inter-pod rules and spread constraints read stays in
step with the cluster state, whatever the order of the slots that changed."""

from __future__ import annotations

from engine.model.pods import pod_info
from engine.model.podtable import PodTable, pod_table
from engine.model.state import ClusterState
from events.types import LabelSelector
from tests.builders import make_node, make_pod


def test_a_pod_that_moved_to_a_lower_slot_stays_in_the_table() -> None:
    """Pod ``p`` sits on slot 1 when the table is synced; it is then taken off and
    placed on slot 0 (a tentative placement and its undo, as a pass makes them), with
    another change on slot 1. Syncing slot 0 first found ``p`` already in the table
    (with slot 1's row) and kept it; syncing slot 1 then removed it: a placed pod no
    spread constraint or anti-affinity counted."""
    state = ClusterState()
    for name in ("a", "b"):
        state.add_node(make_node(name).cpu("4").spec())
    pods = {}
    for name in ("p", "q"):
        spec = make_pod(name).cpu("1").labels(app="x").spec()
        pods[spec.key] = pod_info(spec, state.resources, len(pods))
    p, q = pods["default/p"], pods["default/q"]
    state.assume(p.key, 1, p.request)
    table = pod_table(state, pods)
    assert table.node[table.row_of[p.key]] == 1
    state.forget(p.key)
    state.assume(p.key, 0, p.request)
    state.assume(q.key, 1, q.request)
    table = pod_table(state, pods)
    fresh = PodTable()
    fresh.sync(state, pods, rows=True)
    selector = LabelSelector(match_labels={"app": "x"})
    for t in (table, fresh):
        assert list(t.per_node(t.matching(selector, ("default",), False), 2)) == [1, 1]
    assert table.node[table.row_of[p.key]] == 0

"""The binder's bookkeeping of victims (shards/kube/victims.py), as a rule: a binding
waiting for a node is released only once no victim holds that node, and no binding
waits past its deadline."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from events.types import PodBound
from shards.kube.victims import Victims

NODES = ["n1", "n2"]
PODS = [f"p{i}" for i in range(4)]

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("hold"), st.sampled_from(NODES), st.sampled_from(PODS)),
        st.tuples(st.just("gone"), st.sampled_from(PODS), st.just("")),
        st.tuples(st.just("wait"), st.sampled_from(NODES), st.sampled_from(PODS)),
        st.tuples(st.just("tick"), st.just(""), st.just("")),
    ),
    max_size=40,
)


@given(_ops)
def test_a_binding_is_released_only_onto_a_node_no_victim_holds(
    ops: list[tuple[str, str, str]],
) -> None:
    victims = Victims(nomination_timeout=10, eviction_attempts=3, eviction_backoff=1, recheck=1)
    now = 0
    for i, (op, a, b) in enumerate(ops):
        if op == "hold":
            victims.hold(a, f"victim-{b}", "uid")
        elif op == "gone":
            victims.gone(f"victim-{a}")
        elif op == "wait":
            event = PodBound(pod=f"pod-{b}", node=a, decision_id=f"d{i}", attempt=1)
            if victims.holds(a):
                assert victims.wait(i, event, now)
                assert not victims.wait(i, event, now)  # the same decision waits once
        else:
            now += 3
        for event in victims.released():
            assert not victims.holds(event.node)
        for event, _ in victims.late(now):
            assert event.node in NODES
        for ws in victims.waiting.values():
            assert all(w.deadline > now for w in ws)
        assert sorted(victims.pending()) == sorted(
            w.offset for ws in victims.waiting.values() for w in ws
        )
    now += 10
    victims.released()
    victims.late(now)
    assert not victims.waiting  # every binding ended: bound or failed


def test_an_eviction_is_tried_a_bounded_number_of_times() -> None:
    victims = Victims(nomination_timeout=100, eviction_attempts=3, eviction_backoff=2, recheck=1)
    victims.hold("n1", "v", "uid")
    event = PodBound(pod="p", node="n1", decision_id="d", attempt=1)
    assert victims.wait(0, event, 0)
    assert victims.refused("v", "n1", 0, "429", now=0) is None
    assert [e.due for _, e in victims.evictions_due(2)] == [2]  # 2, then 4: doubling
    assert victims.refused("v", "n1", 0, "429", now=2) is None
    assert victims.evictions_due(5) == [] and victims.evictions["v"].due == 6
    assert victims.refused("v", "n1", 0, "429", now=6) == [event]  # given up
    assert not victims.evictions and not victims.waiting

"""What ``shoal extender``'s bind remembers of the pods it judged: bounded, most recent
first, and exactly the nodes it let each pod go to."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shards.extenders.judged import JudgedPods

PODS = st.sampled_from([f"ns/p{i}" for i in range(6)])
UIDS = st.sampled_from(["", "u1", "u2"])
NODES = st.frozensets(st.sampled_from([f"n{i}" for i in range(5)]), max_size=5)
OPS = st.lists(
    st.tuples(st.sampled_from(["filter", "prioritize", "forget"]), PODS, UIDS, NODES),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(OPS, st.integers(1, 4), st.integers(1, 12))
def test_memory_stays_bounded_and_the_latest_judgement_holds(
    ops: list[tuple[str, str, str, frozenset[str]]], max_pods: int, max_nodes: int
) -> None:
    judged = JudgedPods(max_pods=max_pods, max_nodes=max_nodes)
    latest: dict[str, tuple[str, frozenset[str], bool]] = {}
    for verb, key, uid, nodes in ops:
        if verb == "forget":
            judged.forget(key)
            latest.pop(key, None)
            assert judged.check(key, uid, "n0")[1]
            continue
        before = latest.get(key)
        if verb == "filter":
            judged.filtered(key, uid, nodes)
        else:
            judged.prioritized(key, uid, nodes)
        if verb == "filter" or not (before and before[2] and before[0] == uid):
            latest[key] = (uid, nodes, verb == "filter")
        # the pod just judged is remembered, with the nodes that judgement allows
        want_uid, allowed, _ = latest[key]
        for node in ("n0", "n1", "n2", "n3", "n4"):
            got_uid, why = judged.check(key, uid, node)
            assert (why == "") == (node in allowed), (node, allowed, why)
            if not why:
                assert got_uid == (want_uid or uid)
        if want_uid:  # another pod of the same name is not this one
            assert all(judged.check(key, "other-uid", n)[1] for n in allowed)
        stats = judged.stats()
        assert stats["pods"] <= max_pods
        assert stats["nodes"] <= max_nodes or stats["pods"] == 1
        # forgotten, least recent first: those still remembered keep their judgement
        latest = {k: v for k, v in latest.items() if k in judged}
    for key, (uid, allowed, _) in latest.items():
        assert all(judged.check(key, uid, n)[1] == "" for n in allowed)

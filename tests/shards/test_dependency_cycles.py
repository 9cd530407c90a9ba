"""Pods that come one by one (through an API server, where no file is checked whole)
may close a cycle of dependencies: a gang member that depends on another member of its
gang, two jobs that depend on each other. Such a unit never starts; it is told why
(``dependency-cycle``, the names along the cycle), and nothing else waits for it
under that answer unless a cycle is really in its way.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.model.pools import Sharding
from engine.passes.answers import CYCLE
from events.types import GroupSpec, PodGroupSubmitted, PodSubmitted, PodUnschedulable
from tests.builders import env, make_node, make_pod
from tests.shards.coordinator_kit import at, simulated


def _said(engine: Engine) -> dict[str, PodUnschedulable]:
    return {d.pod: d for d in engine.schedule() if isinstance(d, PodUnschedulable)}


def test_a_gang_member_that_depends_on_another_member_is_told_the_cycle() -> None:
    engine = Engine()
    engine.apply(env(make_node("n0").cpu("8").added()))
    engine.apply(env(PodGroupSubmitted(group=GroupSpec(namespace="ml", name="g", min_member=2))))
    engine.apply(env(make_pod("m0", "ml").cpu("1").group("ml/g").submitted()))
    late = make_pod("m1", "ml").cpu("1").group("ml/g").spec()
    engine.apply(env(PodSubmitted(pod=msgspec.structs.replace(late, depends_on=("ml/m0",)))))
    said = _said(engine)
    assert set(said) == {"ml/m0", "ml/m1"}
    for record in said.values():
        assert record.reason == f"{CYCLE}ml/g -> ml/m0 -> ml/g"
        assert record.answer is not None and record.answer.kind == "dependency-cycle"
    assert not engine.state.pods


def test_a_pod_waiting_for_a_pending_pod_is_not_told_a_cycle() -> None:
    engine = Engine()
    engine.apply(env(make_node("n0").cpu("1").added()))
    engine.apply(env(make_pod("big").cpu("2").submitted()))  # never fits
    after = msgspec.structs.replace(make_pod("after").cpu("1").spec(), depends_on=("default/big",))
    engine.apply(env(PodSubmitted(pod=after)))
    said = _said(engine)
    assert said["default/after"].answer is not None
    assert said["default/after"].answer.kind == "dependency"


@st.composite
def graphs(draw: Any) -> tuple[list[str], dict[str, str], dict[str, list[str]]]:
    """Up to six pods, some in one gang (minMember: all of them), each depending on
    some others (self-loops aside)."""
    n = draw(st.integers(2, 6))
    pods = [f"p{i}" for i in range(n)]
    gang = draw(st.sets(st.sampled_from(pods), max_size=n))
    group_of = dict.fromkeys(gang, "g")
    deps = {
        p: sorted(draw(st.sets(st.sampled_from([q for q in pods if q != p]), max_size=2)))
        for p in pods
    }
    return pods, group_of, deps


@settings(deadline=None, max_examples=60)
@given(graphs())
def test_a_unit_is_told_a_cycle_exactly_when_one_is_in_its_way(
    graph: tuple[list[str], dict[str, str], dict[str, list[str]]],
) -> None:
    pods, group_of, deps = graph
    engine = Engine()
    engine.apply(env(make_node("n0").cpu("64").added()))
    members = [p for p in pods if p in group_of]
    if members:
        group = GroupSpec(namespace="default", name="g", min_member=len(members))
        engine.apply(env(PodGroupSubmitted(group=group)))
    for p in pods:
        builder = make_pod(p).cpu("1").runtime(60)
        if p in group_of:
            builder = builder.group("default/g")
        spec = msgspec.structs.replace(
            builder.spec(), depends_on=tuple(f"default/{d}" for d in deps[p])
        )
        engine.apply(env(PodSubmitted(pod=spec)))
    said = _said(engine)
    # the reference: names waiting for names (a pod for its dependencies, a member for
    # its gang, the gang for its members' dependencies); a unit waits for good when
    # some name it reaches reaches itself again
    edges: dict[str, set[str]] = {p: set(deps[p]) for p in pods}
    if members:
        edges["g"] = {d for m in members for d in deps[m]}
        for m in members:
            edges[m].add("g")
    reach = {a: set(b) for a, b in edges.items()}
    names = list(reach)
    for k in names:  # transitive closure (Floyd-Warshall)
        for i in names:
            if k in reach[i]:
                reach[i] |= reach[k]
    stuck = {a for a in reach if any(x in reach[x] for x in reach[a] | {a})}
    for p in pods:
        key = f"default/{p}"
        unit = "g" if p in group_of else p
        if unit in stuck:
            assert key not in engine.state.pods
            assert said[key].reason.startswith(CYCLE), (p, said[key].reason)
            chain = said[key].reason.removeprefix(CYCLE).split(" -> ")
            cycle = [c.removeprefix("default/") for c in chain]
            assert cycle[0] == cycle[-1]
            for a, b in itertools.pairwise(cycle):
                assert b in edges[a], (cycle, edges)
        elif key in said:
            assert not said[key].reason.startswith(CYCLE), (p, said[key].reason)


@pytest.mark.parametrize("shards", [2, 4])
def test_several_shards_tell_the_cycle_as_one_does(shards: int) -> None:
    """At several shards the coordinator holds dependent units: it tells the same cycle,
    and the log replays."""
    group = GroupSpec(namespace="ml", name="g", min_member=2)
    member = make_pod("m1", "ml").cpu("1").group("ml/g").spec()
    a = make_pod("a").cpu("1").spec()
    b = make_pod("b").cpu("1").spec()
    events = [
        make_node("n0").cpu("8").added(),
        PodGroupSubmitted(group=group),
        make_pod("m0", "ml").cpu("1").group("ml/g").submitted(),
        PodSubmitted(pod=msgspec.structs.replace(member, depends_on=("ml/m0",))),
        PodSubmitted(pod=msgspec.structs.replace(a, depends_on=("default/b",))),
        PodSubmitted(pod=msgspec.structs.replace(b, depends_on=("default/a",))),
        make_pod("free").cpu("1").submitted(),
    ]
    data, _ = simulated(at(0, events), Sharding(shards=shards))
    pods = data["pods"]
    assert pods["default/free"]["phase"] == "Bound"
    for key in ("ml/m0", "ml/m1", "default/a", "default/b"):
        assert pods[key]["phase"] == "Pending"
        assert pods[key]["reason"].startswith(CYCLE), pods[key]
    assert pods["ml/m1"]["reason"] == f"{CYCLE}ml/g -> ml/m0 -> ml/g"
    assert pods["default/a"]["reason"] == f"{CYCLE}default/a -> default/b -> default/a"

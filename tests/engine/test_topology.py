"""Topology-aware gangs in the engine: the rules of :mod:`engine.passes.topology` as
properties over random leaves (each node holds one member), and each node's domain
under Volcano HyperNodes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.config import parse_config
from engine.engine import Engine
from engine.model.state import ClusterState
from engine.model.topology import DomainIndex, parse_topology
from events.types import GroupSpec, PodBound, PodGroupSubmitted, PodUnschedulable
from tests.builders import env, make_node, make_pod

LEAF = "example.com/leaf"
SPINE = "example.com/spine"


def engine() -> Engine:
    return Engine(
        parse_config(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "topology": {
                    "levels": [
                        {"nodeLabel": SPINE, "name": "spine"},
                        {"nodeLabel": LEAF, "name": "leaf"},
                    ]
                },
            }
        )
    )


def run(
    sizes: list[int], members: int, *, required: str = "", preferred: str = ""
) -> tuple[dict[str, str], list[PodUnschedulable]]:
    """Leaves ``l0``, ``l1``... of ``sizes`` nodes (4 cpu) under one spine, and a gang of
    ``members`` pods of 3 cpu: where each member went (node → leaf), and why not."""
    e = engine()
    for leaf, size in enumerate(sizes):
        for k in range(size):
            node = make_node(f"l{leaf}-{k}").cpu("4").label(LEAF, f"l{leaf}").label(SPINE, "s")
            e.apply(env(node.added()))
    group = GroupSpec(
        namespace="default",
        name="g",
        min_member=members,
        topology_required=required,
        topology_preferred=preferred,
    )
    e.apply(env(PodGroupSubmitted(group=group)))
    for i in range(members):
        e.apply(env(make_pod(f"m{i}").cpu("3").group("default/g").submitted()))
    out = e.schedule()
    placed = {d.pod: d.node.rsplit("-", 1)[0] for d in out if isinstance(d, PodBound)}
    return placed, [d for d in out if isinstance(d, PodUnschedulable)]


leaves = st.lists(st.integers(1, 5), min_size=1, max_size=5)


@given(leaves, st.integers(1, 7))
def test_required_takes_the_tightest_leaf_that_holds_the_gang(sizes: list[int], m: int) -> None:
    placed, why = run(sizes, m, required="leaf")
    holding = [leaf for leaf, size in enumerate(sizes) if size >= m]
    if not holding:
        assert placed == {}
        assert why and all("no leaf holds its" in w.reason for w in why)
        return
    tightest = min(holding, key=lambda leaf: (sizes[leaf], f"l{leaf}"))
    assert set(placed.values()) == {f"l{tightest}"}
    assert len(placed) == m


@given(leaves, st.integers(1, 12))
def test_preferred_spans_the_fewest_leaves(sizes: list[int], m: int) -> None:
    placed, _ = run(sizes, m, preferred="leaf")
    if sum(sizes) < m:
        assert placed == {}
        return
    fewest = 0
    total = 0
    for size in sorted(sizes, reverse=True):
        fewest += 1
        total += size
        if total >= m:
            break
    assert len(placed) == m
    assert len(set(placed.values())) == fewest


def test_hypernodes_give_each_node_its_domain_per_tier() -> None:
    topology = parse_topology(
        {
            "hyperNodes": [
                {
                    "name": "leaf-a",
                    "tier": 1,
                    "members": [{"type": "Node", "selector": {"regexMatch": {"pattern": "^a"}}}],
                },
                {
                    "name": "leaf-b",
                    "tier": 1,
                    "tierName": "leaf",
                    "members": [
                        {
                            "type": "Node",
                            "selector": {
                                "labelMatch": {
                                    "matchExpressions": [
                                        {"key": "rack", "operator": "In", "values": ["r2"]}
                                    ]
                                }
                            },
                        }
                    ],
                },
                {
                    "name": "spine",
                    "tier": 2,
                    "members": [
                        {"type": "HyperNode", "selector": {"exactMatch": {"name": "leaf-a"}}},
                        {"type": "HyperNode", "selector": {"exactMatch": {"name": "leaf-b"}}},
                    ],
                },
            ]
        },
        "topology",
    )
    assert [level.name for level in topology.levels] == ["leaf", "tier-2"]
    assert topology.resolve("leaf") == 0 and topology.resolve("2") == 1
    state = ClusterState()
    for node in (
        make_node("a1"),
        make_node("b1").label("rack", "r2"),
        make_node("c1").label("rack", "r3"),
    ):
        state.add_node(node.spec())
    index = DomainIndex(topology)
    names = index.names(state, 0)
    leaf = [names[c] if c >= 0 else None for c in index.codes(state, 0)[:3]]
    assert leaf == ["leaf-a", "leaf-b", None]
    spine = index.codes(state, 1)[:3].tolist()
    assert spine[0] == spine[1] >= 0 and spine[2] == -1

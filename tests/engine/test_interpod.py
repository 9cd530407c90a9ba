"""InterPodAffinity and PodTopologySpread: kube-scheduler's filters and scores to the
integer, over all nodes at once, and the rule that no placement ever breaks a required
(anti-)affinity or a ``DoNotSchedule`` spread, whatever arrives and leaves over time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.model.pods import PodInfo, pod_info
from engine.model.state import ClusterState
from engine.plugins.interpod_affinity import InterPodAffinity
from engine.plugins.topology_spread import PodTopologySpread
from events.types import (
    ClockTicked,
    LabelSelector,
    PodBound,
    PodMigrated,
    PodPreempted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    PodUnschedulable,
)
from tests.builders import PodBuilder, env, make_node, make_pod

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


@dataclass
class _Handle:
    """What the plugins read of an engine: the pods (their specs)."""

    pods: dict[str, PodInfo] = field(default_factory=dict)


@dataclass
class Cluster:
    """Nodes and placed pods for one plugin call."""

    state: ClusterState = field(default_factory=ClusterState)
    handle: _Handle = field(default_factory=_Handle)

    def node(self, name: str, zone: str = "", **labels: str) -> Cluster:
        builder = make_node(name).cpu("64").label(HOST, name)
        if zone:
            builder = builder.label(ZONE, zone)
        for key, value in labels.items():
            builder = builder.label(key, value)
        self.state.add_node(builder.spec())
        return self

    def place(self, pod: PodBuilder, node: str) -> Cluster:
        info = pod_info(pod.spec(), self.state.resources, len(self.handle.pods))
        self.handle.pods[info.key] = info
        self.state.assume(info.key, self.state.index[node], info.request)
        return self

    def info(self, pod: PodBuilder) -> PodInfo:
        return pod_info(pod.spec(), self.state.resources, 10_000)


def _names(c: Cluster, mask: np.ndarray[Any, Any]) -> list[str]:
    return [c.state.names[s] or "" for s in range(c.state.capacity) if c.state.valid[s] and mask[s]]


def _by_node(c: Cluster, values: Any) -> dict[str, int]:
    return {
        c.state.names[s] or "": int(values[s]) for s in range(c.state.capacity) if c.state.valid[s]
    }


def ipa(c: Cluster, **args: Any) -> InterPodAffinity:
    return InterPodAffinity(args, "test", c.handle)  # type: ignore[arg-type]


def pts(c: Cluster, **args: Any) -> PodTopologySpread:
    return PodTopologySpread(args, "test", c.handle)  # type: ignore[arg-type]


# ------------------------------------------------------------------ InterPodAffinity filter


def test_required_anti_affinity_keeps_replicas_apart_and_existing_pods_keep_theirs() -> None:
    c = Cluster().node("a1", zone="a").node("a2", zone="a").node("b1", zone="b")
    c.place(make_pod("web-0").labels(app="web").anti(HOST, app="web"), "a1")
    plugin = ipa(c)
    replica = c.info(make_pod("web-1").labels(app="web").anti(HOST, app="web"))
    assert _names(c, plugin.filter(CycleState(), replica, c.state)) == ["a2", "b1"]
    # a pod without terms of its own, matched by web-0's term: kept off a1 (symmetry)
    plain = c.info(make_pod("other").labels(app="web"))
    assert plugin.applies(plain, c.state)
    assert _names(c, plugin.filter(CycleState(), plain, c.state)) == ["a2", "b1"]
    # a pod nobody's term matches: the filter does not apply (shape caches stay)
    stranger = c.info(make_pod("stranger").labels(app="db"))
    assert not plugin.applies(stranger, c.state)
    zone_anti = c.info(make_pod("z").labels(app="z").anti(ZONE, app="web"))
    assert _names(c, plugin.filter(CycleState(), zone_anti, c.state)) == ["b1"]


def test_required_affinity_follows_its_target_and_the_first_of_a_series_may_start() -> None:
    c = Cluster().node("a1", zone="a").node("b1", zone="b").node("nozone")
    c.place(make_pod("db").labels(app="db"), "a1")
    plugin = ipa(c)
    api = c.info(make_pod("api").affine(ZONE, app="db"))
    assert _names(c, plugin.filter(CycleState(), api, c.state)) == ["a1"]
    # no pod matches yet, and the pod matches its own term: any node with the key
    first = c.info(make_pod("cache-0").labels(app="cache").affine(ZONE, app="cache"))
    assert _names(c, plugin.filter(CycleState(), first, c.state)) == ["a1", "b1"]
    # no pod matches and the pod does not match its own term: nowhere
    orphan = c.info(make_pod("orphan").affine(ZONE, app="cache"))
    assert _names(c, plugin.filter(CycleState(), orphan, c.state)) == []
    reasons = plugin.reasons(CycleState(), orphan, c.state, c.state.valid.copy())
    assert reasons == {"node(s) didn't match pod affinity rules": 3}


def test_terms_look_only_in_their_namespaces() -> None:
    c = Cluster().node("a1", zone="a").node("b1", zone="b")
    c.place(make_pod("db", namespace="data").labels(app="db"), "a1")
    plugin = ipa(c)
    same_ns = c.info(make_pod("api").affine(ZONE, app="db"))  # looks in "default" only
    assert _names(c, plugin.filter(CycleState(), same_ns, c.state)) == []
    spec = make_pod("api2").affine(ZONE, app="db").spec()
    term = msgspec.structs.replace(spec.pod_affinity[0], namespaces=("data",))
    other = pod_info(msgspec.structs.replace(spec, pod_affinity=(term,)), c.state.resources, 1)
    assert _names(c, plugin.filter(CycleState(), other, c.state)) == ["a1"]
    everywhere = msgspec.structs.replace(term, namespaces=(), all_namespaces=True)
    anywhere = pod_info(
        msgspec.structs.replace(spec, pod_affinity=(everywhere,)), c.state.resources, 2
    )
    assert _names(c, plugin.filter(CycleState(), anywhere, c.state)) == ["a1"]


# ------------------------------------------------------------------ InterPodAffinity score

# kube-scheduler's arithmetic: topologyScore[key][value] sums, over placed pods, the
# weights of the terms they match (anti-affinity subtracts); a node scores the sum over
# its domains; NormalizeScore maps min..max of the feasible nodes onto 0..100, truncated.
IPA_SCORES = [
    (
        "preferred affinity to the zone of one matching pod",
        [("db", {"app": "db"}, "a1")],
        make_pod("api").prefer_pods(5, ZONE, app="db"),
        {},
        # raw: a1, a2 (zone a) 5, b1 0 → (5-0)/(5-0)*100 = 100 for zone a, 0 for b
        {"a1": 100, "a2": 100, "b1": 0},
    ),
    (
        "preferred anti-affinity subtracts",
        [("db", {"app": "db"}, "a1"), ("db2", {"app": "db"}, "b1")],
        make_pod("api").prefer_pods(4, ZONE, app="db").prefer_pods(3, HOST, anti=True, app="db"),
        {},
        # raw: a1 = 4*1 (zone a) - 3*1 (host a1) = 1; a2 = 4; b1 = 4 - 3 = 1
        # min 1, max 4: a1 (1-1)/3*100 = 0, a2 100, b1 0
        {"a1": 0, "a2": 100, "b1": 0},
    ),
    (
        "two matching pods in a zone count twice",
        [("d0", {"app": "db"}, "a1"), ("d1", {"app": "db"}, "a2"), ("d2", {"app": "db"}, "b1")],
        make_pod("api").prefer_pods(10, ZONE, app="db"),
        {},
        # raw: zone a 20, zone b 10 → min 10, max 20: a → 100, b → (10-10)/10 = 0
        {"a1": 100, "a2": 100, "b1": 0},
    ),
    (
        "an existing pod's required affinity attracts at hardPodAffinityWeight",
        [("api-0", {"app": "api", "@affine": "web"}, "b1")],
        make_pod("web").labels(app="web"),
        {"hardPodAffinityWeight": 7},
        # raw: zone b += 7 (api-0's required term matches the web pod) → b1 100, others 0
        {"a1": 0, "a2": 0, "b1": 100},
    ),
    (
        "hardPodAffinityWeight 0 turns the symmetry off",
        [("api-0", {"app": "api", "@affine": "web"}, "b1")],
        make_pod("web").labels(app="web"),
        {"hardPodAffinityWeight": 0},
        {"a1": 0, "a2": 0, "b1": 0},
    ),
    (
        "thirds truncate",
        [("d0", {"app": "db"}, "a1"), ("d1", {"app": "db"}, "a2"), ("d2", {"app": "db"}, "a2")],
        make_pod("api").prefer_pods(1, HOST, app="db"),
        {},
        # raw: a1 1, a2 2, b1 0 → a1 100 * 1/2 = 50, a2 100, b1 0
        {"a1": 50, "a2": 100, "b1": 0},
    ),
]


@pytest.mark.parametrize(
    ("placed", "incoming", "args", "expected"),
    [case[1:] for case in IPA_SCORES],
    ids=[case[0] for case in IPA_SCORES],
)
def test_inter_pod_affinity_scores_as_kube_scheduler(
    placed: list[tuple[str, dict[str, str], str]],
    incoming: PodBuilder,
    args: dict[str, Any],
    expected: dict[str, int],
) -> None:
    c = Cluster().node("a1", zone="a").node("a2", zone="a").node("b1", zone="b")
    for name, labels, node in placed:
        builder = make_pod(name).labels(**{k: v for k, v in labels.items() if k[0] != "@"})
        if "@affine" in labels:
            builder = builder.affine(ZONE, app=labels["@affine"])
        c.place(builder, node)
    plugin = ipa(c, **args)
    feasible = c.state.valid.copy()
    raw = plugin.score(CycleState(), c.info(incoming), c.state, feasible)
    final = plugin.normalize(raw, feasible)
    got = _by_node(c, final) if not isinstance(final, int) else dict.fromkeys(expected, final)
    assert got == expected


# ------------------------------------------------------------------ PodTopologySpread filter


def test_do_not_schedule_keeps_the_skew() -> None:
    c = Cluster().node("a1", zone="a").node("a2", zone="a").node("b1", zone="b").node("bare")
    for i, node in enumerate(["a1", "a2"]):
        c.place(make_pod(f"w{i}").labels(app="w"), node)
    plugin = pts(c)
    pod = c.info(make_pod("w2").labels(app="w").spread(ZONE, 1, app="w"))
    # zone a holds 2, zone b 0: on a the skew would be 2 + 1 - 0 = 3 > 1; b: 0 + 1 - 0 = 1
    assert _names(c, plugin.filter(CycleState(), pod, c.state)) == ["b1"]
    reasons = plugin.reasons(
        CycleState(), pod, c.state, c.state.valid & ~plugin.filter(CycleState(), pod, c.state)
    )
    assert reasons == {
        "node(s) didn't match pod topology spread constraints (missing required label)": 1,
        "node(s) didn't match pod topology spread constraints": 2,
    }
    loose = c.info(make_pod("w3").labels(app="w").spread(ZONE, 3, app="w"))
    assert _names(c, plugin.filter(CycleState(), loose, c.state)) == ["a1", "a2", "b1"]
    # minDomains 3 with 2 zones: the global minimum counts as 0 (b: 0 + 1 - 0 = 1 ≤ 2;
    # a: 2 + 1 - 0 = 3 > 2)
    few = c.info(make_pod("w4").labels(app="w").spread(ZONE, 2, min_domains=3, app="w"))
    assert _names(c, plugin.filter(CycleState(), few, c.state)) == ["b1"]


def test_spread_counts_only_the_pods_namespace_and_eligible_nodes() -> None:
    c = Cluster().node("a1", zone="a").node("b1", zone="b").node("c1", zone="c", pool="x")
    c.place(make_pod("w0", namespace="other").labels(app="w"), "a1")
    plugin = pts(c)
    pod = c.info(make_pod("w").labels(app="w").spread(ZONE, 1, app="w"))
    assert _names(c, plugin.filter(CycleState(), pod, c.state)) == ["a1", "b1", "c1"]
    c.place(make_pod("w1").labels(app="w"), "b1")
    # zones a, c hold 0, b holds 1: b would be 2 - 0 > 1
    assert _names(c, plugin.filter(CycleState(), pod, c.state)) == ["a1", "c1"]
    # held to the pool of c1 by a node selector (nodeAffinityPolicy Honor): only zone c
    # is eligible and counted (0 there, the minimum): b1's pod is not counted, so every
    # node passes this filter (a1 and b1 are NodeAffinity's to refuse)
    held = c.info(make_pod("h").labels(app="w").selector(pool="x").spread(ZONE, 1, app="w"))
    assert _names(c, plugin.filter(CycleState(), held, c.state)) == ["a1", "b1", "c1"]


# ------------------------------------------------------------------ PodTopologySpread score

# kube-scheduler's arithmetic: per ScheduleAnyway constraint, cnt * log(domains + 2) +
# (maxSkew - 1), summed and rounded; hostname counts the node's own pods, with domains =
# the scored nodes; then 100 * (max + min - s) // max.
PTS_SCORES = [
    (
        "zone counts",
        [("a1", 2), ("b1", 1)],
        make_pod("w").labels(app="w").spread(ZONE, 1, "ScheduleAnyway", app="w"),
        # 3 zones (a, b, c): weight log(5) = 1.609; a: round(2 * 1.609) = 3, b: 2, c: 0
        # max 3, min 0: a 100*(3+0-3)//3 = 0, b 100*(3-2)//3 = 33, c 100
        {"a1": 0, "a2": 0, "b1": 33, "c1": 100},
    ),
    (
        "hostname counts",
        [("a1", 2), ("b1", 1)],
        make_pod("w").labels(app="w").spread(HOST, 2, "ScheduleAnyway", app="w"),
        # 4 nodes: weight log(6) = 1.792; a1: round(2 * 1.792 + 1) = 5, a2: 1, b1: 3, c1: 1
        # max 5, min 1: a1 100*(5+1-5)//5 = 20, a2 100, b1 60, c1 100
        {"a1": 20, "a2": 100, "b1": 60, "c1": 100},
    ),
    (
        "nothing placed: every node the same",
        [],
        make_pod("w").labels(app="w").spread(ZONE, 1, "ScheduleAnyway", app="w"),
        # every node raw 0: max 0 → 100 everywhere
        {"a1": 100, "a2": 100, "b1": 100, "c1": 100},
    ),
]


@pytest.mark.parametrize(
    ("placed", "incoming", "expected"),
    [case[1:] for case in PTS_SCORES],
    ids=[case[0] for case in PTS_SCORES],
)
def test_topology_spread_scores_as_kube_scheduler(
    placed: list[tuple[str, int]], incoming: PodBuilder, expected: dict[str, int]
) -> None:
    c = (
        Cluster()
        .node("a1", zone="a")
        .node("a2", zone="a")
        .node("b1", zone="b")
        .node("c1", zone="c")
    )
    n = 0
    for node, count in placed:
        for _ in range(count):
            c.place(make_pod(f"p{n}").labels(app="w"), node)
            n += 1
    plugin = pts(c)
    feasible = c.state.valid.copy()
    raw = plugin.score(CycleState(), c.info(incoming), c.state, feasible)
    final = plugin.normalize(raw, feasible)
    assert not isinstance(final, int)
    assert _by_node(c, final) == expected


def test_system_default_constraints_select_with_the_owner_selector() -> None:
    c = Cluster().node("a1", zone="a").node("b1", zone="b")
    c.place(make_pod("w0").labels(app="w"), "a1")
    plugin = pts(c)
    spec = make_pod("w1").labels(app="w").spec()
    owned = pod_info(
        msgspec.structs.replace(spec, owner_selector=LabelSelector(match_labels={"app": "w"})),
        c.state.resources,
        1,
    )
    assert [x.topology_key for x in plugin.constraints(owned)] == [HOST, ZONE]
    assert plugin.constraints(c.info(make_pod("x"))) == ()
    feasible = c.state.valid.copy()
    final = plugin.normalize(plugin.score(CycleState(), owned, c.state, feasible), feasible)
    # host (maxSkew 3, 2 nodes: log 4): a1 1*1.386+2, b1 2; zone (maxSkew 5, 2 zones):
    # a 1*1.386+4, b 4 → a1 round(8.77) = 9, b1 6 → a1 100*(9+6-9)//9 = 66, b1 100
    assert _by_node(c, final) == {"a1": 66, "b1": 100}
    with pytest.raises(Exception, match="defaultConstraints must be empty"):
        pts(
            c,
            defaultConstraints=[
                {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}
            ],
        )
    listed = pts(
        c,
        defaultingType="List",
        defaultConstraints=[
            {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}
        ],
    )
    assert _names(c, listed.filter(CycleState(), owned, c.state)) == ["b1"]


# ------------------------------------------------------------------ no placement breaks a rule


def _matches(term: Any, spec: PodSpec) -> bool:
    if not term.all_namespaces and spec.namespace not in term.namespaces:
        return False
    return all(spec.labels.get(k) == v for k, v in term.selector.match_labels.items())


def allowed(
    pod: PodSpec,
    node: str,
    placed: Mapping[str, tuple[PodSpec, str]],
    labels: Mapping[str, Mapping[str, str]],
) -> bool:
    """kube-scheduler's required rules, written node by node from the specs: the
    reference the vectorised plugins are held to."""
    here = labels[node]
    others = list(placed.values())
    if pod.pod_affinity:
        terms = pod.pod_affinity
        if not all(t.topology_key in here for t in terms):
            return False
        matching = [(s, n) for s, n in others if all(_matches(t, s) for t in terms)]
        near = all(
            any(labels[n].get(t.topology_key) == here[t.topology_key] for _, n in matching)
            for t in terms
        )
        if not near:
            counted = any(t.topology_key in labels[n] for _, n in matching for t in terms)
            if counted or not all(_matches(t, pod) for t in terms):
                return False
    for t in pod.pod_anti_affinity:
        if t.topology_key in here and any(
            _matches(t, s) and labels[n].get(t.topology_key) == here[t.topology_key]
            for s, n in others
        ):
            return False
    for s, n in others:
        for t in s.pod_anti_affinity:
            if (
                _matches(t, pod)
                and t.topology_key in labels[n]
                and here.get(t.topology_key) == labels[n][t.topology_key]
            ):
                return False
    hard = [c for c in pod.spread_constraints if c.when_unsatisfiable == "DoNotSchedule"]
    keys = {c.topology_key for c in hard}
    for c in hard:
        if c.topology_key not in here:
            return False
        counts: dict[str, int] = {}
        for ml in labels.values():
            if keys <= set(ml):
                counts.setdefault(ml[c.topology_key], 0)
        for s, n in others:
            if (
                s.namespace == pod.namespace
                and keys <= set(labels[n])
                and all(s.labels.get(k) == v for k, v in c.selector.match_labels.items())
            ):
                counts[labels[n][c.topology_key]] += 1
        low = min(counts.values()) if len(counts) >= c.min_domains else 0
        own = all(pod.labels.get(k) == v for k, v in c.selector.match_labels.items())
        if counts.get(here[c.topology_key], 0) + own - low > c.max_skew:
            return False
    return True


RULES = st.sampled_from(
    ["none", "anti-host", "anti-zone", "affine-zone", "spread-zone", "spread-host"]
)


@st.composite
def workloads(draw: Any) -> tuple[list[dict[str, str]], list[tuple[int, PodSpec]]]:
    nodes = []
    for i in range(draw(st.integers(2, 6))):
        zone = draw(st.sampled_from(["a", "b", "c", ""]))
        nodes.append({HOST: f"n{i}", **({ZONE: zone} if zone else {})})
    pods = []
    for i in range(draw(st.integers(1, 14))):
        app = draw(st.sampled_from(["x", "y"]))
        target = draw(st.sampled_from(["x", "y"]))
        rule = draw(RULES)
        builder = make_pod(f"p{i}").labels(app=app).cpu("1")
        if draw(st.booleans()):
            builder = builder.runtime(draw(st.integers(1, 4)))
        if rule == "anti-host":
            builder = builder.anti(HOST, app=target)
        elif rule == "anti-zone":
            builder = builder.anti(ZONE, app=target)
        elif rule == "affine-zone":
            builder = builder.affine(ZONE, app=target)
        elif rule == "spread-zone":
            builder = builder.spread(ZONE, draw(st.integers(1, 2)), app=target)
        elif rule == "spread-host":
            builder = builder.spread(HOST, 1, min_domains=draw(st.integers(1, 3)), app=target)
        pods.append((draw(st.integers(0, 5)), builder.spec()))
    return nodes, pods


@settings(max_examples=120, deadline=None)
@given(workloads())
def test_no_placement_breaks_a_required_rule(
    case: tuple[list[dict[str, str]], list[tuple[int, PodSpec]]],
) -> None:
    nodes, pods = case
    engine = Engine()
    labels: dict[str, dict[str, str]] = {}
    for node in nodes:
        builder = make_node(node[HOST]).cpu("3")
        for key, value in node.items():
            builder = builder.label(key, value)
        engine.apply(env(builder.added()))
        labels[node[HOST]] = node
    specs = {spec.key: spec for _, spec in pods}
    placed: dict[str, tuple[PodSpec, str]] = {}
    ends: dict[str, int] = {}
    for t in range(40):
        for at, spec in pods:
            if at == t:
                engine.apply(env(PodSubmitted(pod=spec), t))
        for key, end in sorted(ends.items()):
            if end == t:
                engine.apply(env(PodSucceeded(pod=key, node=placed[key][1]), t))
                del placed[key], ends[key]
        engine.apply(env(ClockTicked(), t))
        for decision in engine.schedule():
            if isinstance(decision, PodBound):
                spec = specs[decision.pod]
                assert allowed(spec, decision.node, placed, labels), (decision, placed)
                placed[decision.pod] = (spec, decision.node)
                if spec.runtime is not None:
                    ends[decision.pod] = t + spec.runtime // 1_000_000_000
            elif isinstance(decision, PodPreempted):
                placed.pop(decision.pod, None)
                ends.pop(decision.pod, None)
            elif isinstance(decision, PodMigrated):
                # moved to make room (the rescheduler): its new node must allow it too
                spec, _ = placed.pop(decision.pod)
                assert allowed(spec, decision.to_node, placed, labels), (decision, placed)
                placed[decision.pod] = (spec, decision.to_node)
                if spec.runtime is not None:
                    ends[decision.pod] = t + spec.runtime // 1_000_000_000
            elif isinstance(decision, PodUnschedulable):
                assert decision.reason
        engine.state.check_invariants()

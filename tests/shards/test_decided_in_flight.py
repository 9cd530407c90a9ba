"""A plain pod with inter-pod rules or spread constraints is decided on the
coordinator while pods handed to shards are still under way (``ShardDispatch._early``),
where that is exact: no pod under way may count for its rules, and its node keeps room
whatever those pods take on its shard. Otherwise it waits for them, as before. The
records a pass makes show which: the pod handed to the node the coordinator chose
(``PodRouted`` with a node) in the same pass as the hand-over, or nothing until the
shard has answered.

And, as a property, spread deployments beside plain ones end the same at 1, 2 and 4
shards (every log replayed with ``--verify``), never above their skew."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.model.pools import POOL_LABEL, Sharding
from events.types import (
    Event,
    LabelSelector,
    NodeAdded,
    PodAffinityTerm,
    PodHandedBack,
    PodRouted,
    PodSubmitted,
    ReservationDenied,
    ReservationRequested,
)
from shards.inputs.scenario import TimedEvent
from tests.builders import make_node, make_pod
from tests.shards.coordinator_kit import (
    Control,
    at,
    directed,
    handed,
    pinned,
    records,
    sent,
    shoal,
    simulated,
)

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def two_zones(cpu: str = "8", per: int = 1) -> Control:
    """Two shards (pool p0 on shard 0, p1 on shard 1), each with ``per`` nodes in zones
    a and b."""
    control = Control(pinned(2, p0=0, p1=1))
    control.input(
        *(
            make_node(f"{zone}{i}-{j}")
            .cpu(cpu)
            .label(ZONE, zone)
            .label(POOL_LABEL, f"p{i}")
            .added()
            for zone in "ab"
            for i in range(2)
            for j in range(per)
        )
    )
    return control


def spread_pod(name: str, cpu: str = "1") -> PodSubmitted:
    return make_pod(name).cpu(cpu).labels(app="web").spread(ZONE, 1, app="web").submitted()


def decided_early(control: Control, *flying: PodSubmitted, spread: PodSubmitted) -> bool:
    """Hand ``flying`` over, then submit ``spread`` in the same pass: whether the spread
    pod's reservation was asked for before any of them landed."""
    out = control.input(*flying, spread)
    routed = {e.pod.name for _, e in handed(out)}
    assert routed == {f.pod.name for f in flying}, routed
    reserved = [e for _, e in directed(out)]
    early = control.coordinator.counters["early"]
    assert early == len(reserved)
    return bool(reserved)


def test_a_spread_pod_is_decided_while_other_pods_fly() -> None:
    control = two_zones()
    plain = make_pod("plain").cpu("1").labels(app="other").submitted()
    assert decided_early(control, plain, spread=spread_pod("s"))


def test_a_spread_pod_waits_for_a_flying_pod_its_selector_matches() -> None:
    # a pod with the spread pod's labels (and no constraint of its own) is under way:
    # where it lands changes the counts, so the spread pod waits for it
    control = two_zones()
    shadow = make_pod("shadow").cpu("1").labels(app="web").submitted()
    assert not decided_early(control, shadow, spread=spread_pod("s"))


def test_a_flying_pod_of_another_namespace_does_not_count() -> None:
    control = two_zones()
    elsewhere = make_pod("shadow", "other").cpu("1").labels(app="web").submitted()
    assert decided_early(control, elsewhere, spread=spread_pod("s"))


def big_pods(cpu: str = "7") -> list[PodSubmitted]:
    """One pod per shard, held to its pool (p0 on shard 0, p1 on shard 1)."""
    return [
        make_pod(f"big{i}")
        .cpu(cpu)
        .labels(app="other")
        .selector(**{POOL_LABEL: f"p{i}"})
        .submitted()
        for i in range(2)
    ]


def test_a_spread_pod_waits_where_flying_pods_may_take_its_room() -> None:
    # every node has 8 cpu; 7 cpu were handed to each shard in an earlier pass: they
    # may all land on the node the spread pod would get, so it waits
    control = two_zones()
    assert len(sent(control.input(*big_pods()), PodRouted)) == 2
    out = control.input(spread_pod("s", "2"))
    assert not sent(out, ReservationRequested) and not directed(out)
    assert control.coordinator.counters["early"] == 0


def test_a_spread_pod_goes_ahead_of_the_pods_before_it_in_its_batch() -> None:
    # the same pods in one pass: the spread pod is decided in place, and its part is
    # sent ahead of the hand-overs to its shard, which takes it on first; each shard
    # has another node for its big pod, so every pod still certainly fits
    control = two_zones()
    out = control.input(*big_pods(), spread_pod("s", "2"))
    ((shard, part),) = directed(out)
    records = [event for partition, event in out if partition == shard]
    first_routed = next(i for i, e in enumerate(records) if isinstance(e, PodRouted) and not e.node)
    assert records.index(part) < first_routed
    assert control.coordinator.counters["early"] == 1


def test_a_spread_pod_waits_where_its_shard_has_no_node_to_spare() -> None:
    # two 7-cpu pods for pool p0's two nodes, then a spread pod held to p0: it would
    # take one of the nodes they certainly fit on, so it is not decided in place, and
    # the pod behind it waits too (queue order)
    control = two_zones()
    big = [
        make_pod(f"big{i}").cpu("7").labels(app="other").selector(**{POOL_LABEL: "p0"})
        for i in range(2)
    ]
    spread = (
        make_pod("s")
        .cpu("2")
        .labels(app="web")
        .spread(ZONE, 1, app="web")
        .selector(**{POOL_LABEL: "p0"})
        .submitted()
    )
    after = make_pod("after").cpu("1").labels(app="other").submitted()
    out = control.input(*(b.submitted() for b in big), spread, after)
    assert sorted(e.pod.name for _, e in handed(out)) == ["big0", "big1"]
    assert not sent(out, ReservationRequested) and not directed(out)


def test_room_left_whatever_lands_allows_the_early_decision() -> None:
    control = two_zones()
    small = [
        make_pod(f"small{i}").cpu("3").labels(app="other").selector(**{POOL_LABEL: f"p{i}"})
        for i in range(2)
    ]
    assert decided_early(control, *(s.submitted() for s in small), spread=spread_pod("s", "2"))


def test_a_pod_with_required_anti_affinity_is_decided_while_other_pods_fly() -> None:
    control = two_zones()
    plain = make_pod("plain").cpu("1").labels(app="other").submitted()
    lonely = make_pod("lonely").cpu("1").labels(app="web").anti(HOST, app="web").submitted()
    assert decided_early(control, plain, spread=lonely)


def test_a_pod_waits_for_a_flying_pod_its_affinity_term_selects() -> None:
    control = two_zones()
    db = make_pod("db").cpu("1").labels(app="db").submitted()
    api = make_pod("api").cpu("1").affine(ZONE, app="db").submitted()
    assert not decided_early(control, db, spread=api)


def test_a_term_over_every_namespace_counts_flying_pods_of_any_namespace() -> None:
    control = two_zones()
    elsewhere = make_pod("db", "other").cpu("1").labels(app="db").submitted()
    term = PodAffinityTerm(
        topology_key=HOST, selector=LabelSelector(match_labels={"app": "db"}), all_namespaces=True
    )
    spec = make_pod("api").cpu("1").spec()
    api = PodSubmitted(pod=msgspec.structs.replace(spec, pod_anti_affinity=(term,)))
    assert not decided_early(control, elsewhere, spread=api)
    # the same term over its own namespace only: the pod under way does not count
    control = two_zones()
    own = msgspec.structs.replace(term, all_namespaces=False, namespaces=("default",))
    api = PodSubmitted(pod=msgspec.structs.replace(spec, pod_anti_affinity=(own,)))
    assert decided_early(control, elsewhere, spread=api)


def test_the_pods_behind_a_waiting_spread_pod_wait_too() -> None:
    # 7 cpu under way to each shard's 8-cpu nodes (an earlier pass): the spread pod
    # behind them may find no room, so it waits, and the plain pod behind it waits too
    # (queue order)
    control = two_zones()
    control.input(*big_pods())
    after = make_pod("after").cpu("1").labels(app="other").submitted()
    out = control.input(spread_pod("s", "2"), after)
    assert not sent(out, PodRouted)
    assert not sent(out, ReservationRequested)


# ----------------------------------------------------------------------------- property


def _zone_node(name: str, zone: str, pool: str, role: str, cpu: int) -> str:
    return f"""
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{{ZONE}: {zone}, {POOL_LABEL}: {pool}, role: {role}}}
status: {{allocatable: {{cpu: "{cpu}", memory: 64Gi, pods: "110"}}}}
---"""


def _deployment(name: str, replicas: int, role: str, skew: int | None) -> str:
    spread = (
        f"""
      topologySpreadConstraints:
      - maxSkew: {skew}
        topologyKey: {ZONE}
        whenUnsatisfiable: DoNotSchedule
        labelSelector: {{matchLabels: {{app: {name}}}}}"""
        if skew is not None
        else ""
    )
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      nodeSelector: {{role: {role}}}{spread}
      containers: [{{name: c, image: x, resources: {{requests: {{cpu: "1"}}}}}}]
---"""


@st.composite
def spread_scenarios(draw: st.DrawFn) -> tuple[str, dict[str, tuple[int, list[int]]]]:
    """Zones of nodes in pools spread over the shards: per spread deployment its own
    nodes (its room per zone drawn, so that the skew binds), plain deployments on
    nodes of their own, interleaved in the order they come. Returns the text and, per
    spread deployment, its skew and room per zone."""
    zones = draw(st.integers(2, 3))
    text = []
    spread: dict[str, tuple[int, list[int]]] = {}
    deployments = []
    for d in range(draw(st.integers(1, 2))):
        name = f"s{d}"
        skew = draw(st.integers(1, 3))
        room = [draw(st.integers(0, 4)) for _ in range(zones)]
        for z, cpu in enumerate(room):
            if cpu:
                zone = "abc"[z]
                text.append(_zone_node(f"{name}-{zone}", zone, f"p{(d + z) % 4}", name, cpu))
        spread[name] = (skew, room)
        deployments.append(_deployment(name, draw(st.integers(1, 10)), name, skew))
    for z in range(zones):
        text.append(_zone_node(f"plain-{'abc'[z]}", "abc"[z], f"p{z % 4}", "plain", 64))
    for d in range(draw(st.integers(1, 3))):
        deployments.append(_deployment(f"d{d}", draw(st.integers(1, 12)), "plain", None))
    order = draw(st.permutations(deployments))
    return "".join(text) + "".join(order), spread


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(spread_scenarios())
def test_spread_deployments_end_the_same_at_any_shard_count(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    scenario: tuple[str, dict[str, tuple[int, list[int]]]],
) -> None:
    text, spread = scenario
    tmp_path: Path = tmp_path_factory.mktemp("spread")
    placed: dict[int, dict[str, int]] = {}
    for shards in (1, 2, 4):
        data, _ = shoal(tmp_path, capsys, text, shards)
        counts: dict[str, int] = {}
        per_zone: dict[str, dict[str, int]] = {name: {} for name in spread}
        for key, view in data["pods"].items():
            app = key.split("/", 1)[1].rsplit("-", 2)[0]
            if view["node"]:
                counts[app] = counts.get(app, 0) + 1
                if app in spread:
                    zone = view["node"].rsplit("-", 1)[1]
                    per_zone[app][zone] = per_zone[app].get(zone, 0) + 1
        for name, (skew, room) in spread.items():
            present = [per_zone[name].get("abc"[z], 0) for z, cpu in enumerate(room) if cpu]
            if present:
                assert max(present) - min(present) <= skew, (shards, name, per_zone[name])
        placed[shards] = counts
    assert placed[2] == placed[1] and placed[4] == placed[1], placed


def test_the_count_of_flying_labels_follows_the_flights() -> None:
    # kept as flights come and land (in bulk, from a shard's summary), it equals what
    # is made again from the flights themselves (as after a restore)
    control = two_zones(cpu="16", per=2)
    coordinator = control.coordinator
    out = control.input(
        *(make_pod(f"w{i}").cpu("1").labels(app="web").submitted() for i in range(3)),
        *(make_pod(f"o{i}").cpu("1").labels(app="other").submitted() for i in range(2)),
    )
    routed = sent(out, PodRouted)
    assert len(routed) == 5

    def rebuilt() -> dict[object, int]:
        coordinator._flying_of = None
        return dict(coordinator.flying_labels())

    kept = dict(coordinator.flying_labels())
    assert kept == rebuilt() and sum(kept.values()) == 5
    shard, first = routed[0]
    node = next(n for n, s in coordinator.routing.node_shard.items() if s == shard)
    control.placed(shard, {first.pod.key: node}, nodes=4)
    kept = dict(coordinator.flying_labels())
    assert kept == rebuilt() and sum(kept.values()) == 4


# ------------------------------------------------- property: decided in place, never refused


@st.composite
def shared_nodes(draw: st.DrawFn) -> tuple[list[TimedEvent], int, dict[str, int]]:
    """Small nodes in zones and pools shared by plain pods (some held to a pool) and
    spread pods (per deployment its skew), all submitted at once, so that they meet in
    one batch, on nodes they compete for."""
    shards = draw(st.sampled_from([2, 4]))
    zones = draw(st.integers(2, 3))
    nodes: list[Event] = []
    for i in range(draw(st.integers(2, 8))):
        nodes.append(
            make_node(f"n{i}")
            .cpu(str(draw(st.integers(2, 8))))
            .label(ZONE, "abc"[i % zones])
            .label(POOL_LABEL, f"p{i % 4}")
            .added()
        )
    skews = {f"s{d}": draw(st.integers(1, 2)) for d in range(draw(st.integers(1, 2)))}
    pods: list[Event] = []
    for i in range(draw(st.integers(2, 16))):
        cpu = str(draw(st.integers(1, 4)))
        kind = draw(st.sampled_from(["plain", "pooled", *skews]))
        if kind in skews:
            builder = make_pod(f"{kind}-{i}").cpu(cpu).labels(app=kind)
            pods.append(builder.spread(ZONE, skews[kind], app=kind).submitted())
        elif kind == "pooled":
            pool = f"p{draw(st.integers(0, 3))}"
            pods.append(make_pod(f"q-{i}").cpu(cpu).selector(**{POOL_LABEL: pool}).submitted())
        else:
            pods.append(make_pod(f"plain-{i}").cpu(cpu).labels(app="plain").submitted())
    return at(0, nodes) + at(1, pods, order=100), shards, skews


@settings(max_examples=25, deadline=None)
@given(shared_nodes())
def test_a_pod_decided_in_a_batch_is_never_refused_nor_any_pod_handed_back(
    scenario: tuple[list[TimedEvent], int, dict[str, int]],
) -> None:
    # a spread pod decided in its place keeps its room (its part goes ahead of the
    # batch's hand-overs), and every pod handed over still certainly fits (the batch
    # spares a node for it): no shard denies a part or hands a pod back, the spread
    # constraints hold, and the log replays (``simulated`` verifies it)
    events, shards, skews = scenario
    pools = tuple((f"p{i}", i % shards) for i in range(4))
    data, parts = simulated(events, Sharding(shards=shards, pools=pools))
    assert not records(parts, ReservationDenied)
    assert not records(parts, PodHandedBack)
    zone_of = {
        e.node.name: e.node.labels[ZONE]
        for e in (t.event for t in events)
        if isinstance(e, NodeAdded)
    }
    for app, skew in skews.items():
        per_zone = dict.fromkeys(sorted(set(zone_of.values())), 0)
        for key, view in data["pods"].items():
            if key.split("/", 1)[1].startswith(f"{app}-") and view["node"]:
                per_zone[zone_of[view["node"]]] += 1
        assert max(per_zone.values()) - min(per_zone.values()) <= skew, (app, per_zone)

"""NodePorts: host ports conflict as kube-scheduler decides, over all nodes at once,
folded from placements and kept through staging, snapshots and requeue."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.model.pods import pod_info
from engine.model.quota import QuotaTable
from engine.model.state import ClusterState
from engine.model.statement import Statement
from engine.plugins.node_ports import REASON, NodePorts
from engine.snapshot import encode_state, restore
from events.types import (
    GroupSpec,
    HostPort,
    PodBound,
    PodGroupSubmitted,
    PodSucceeded,
    PodUnschedulable,
)
from tests.builders import PodBuilder, env, make_node, make_pod

# kube-scheduler's nodeports tests, as rows: what the node's pod binds, what the new
# pod wants, whether they conflict.
CONFLICTS = [
    # (bound: protocol, ip, port), (wanted: protocol, ip, port), conflict
    (("TCP", "0.0.0.0", 8080), ("TCP", "0.0.0.0", 8080), True),
    (("TCP", "0.0.0.0", 8080), ("UDP", "0.0.0.0", 8080), False),  # other protocol
    (("TCP", "0.0.0.0", 8080), ("TCP", "0.0.0.0", 8081), False),  # other port
    (("TCP", "127.0.0.1", 8080), ("TCP", "127.0.0.2", 8080), False),  # other address
    (("TCP", "127.0.0.1", 8080), ("TCP", "127.0.0.1", 8080), True),
    (("TCP", "127.0.0.1", 8080), ("TCP", "0.0.0.0", 8080), True),  # 0.0.0.0: every address
    (("TCP", "0.0.0.0", 8080), ("TCP", "127.0.0.1", 8080), True),
    (("UDP", "10.0.0.1", 53), ("UDP", "0.0.0.0", 53), True),
    (("SCTP", "10.0.0.1", 9), ("TCP", "10.0.0.1", 9), False),
]


def _pod(name: str, *ports: tuple[str, str, int]) -> PodBuilder:
    pod = make_pod(name).cpu("1")
    for protocol, ip, port in ports:
        pod = pod.host_port(port, protocol, ip)
    return pod


def _passing(state: ClusterState, pod: PodBuilder) -> list[str]:
    info = pod_info(pod.spec(), state.resources, 0)
    mask = NodePorts().filter(CycleState(), info, state) & state.valid
    return [state.names[i] or "" for i in np.flatnonzero(mask)]


@pytest.mark.parametrize(("bound", "wanted", "conflict"), CONFLICTS)
def test_host_ports_conflict_as_kube_scheduler_decides(
    bound: tuple[str, str, int], wanted: tuple[str, str, int], conflict: bool
) -> None:
    state = ClusterState()
    for name in ("a", "b"):
        state.add_node(make_node(name).cpu("8").spec())
    holder = pod_info(_pod("holder", bound).spec(), state.resources, 0)
    state.assume(holder.key, 0, holder.request, ports=holder.spec.host_ports)
    assert _passing(state, _pod("new", wanted)) == (["b"] if conflict else ["a", "b"])


def test_a_pod_without_host_ports_passes_everywhere() -> None:
    state = ClusterState()
    state.add_node(make_node("a").cpu("8").spec())
    holder = pod_info(_pod("holder", ("TCP", "0.0.0.0", 80)).spec(), state.resources, 0)
    state.assume(holder.key, 0, holder.request, ports=holder.spec.host_ports)
    assert _passing(state, make_pod("plain")) == ["a"]


def _reference(placed: dict[int, list[HostPort]], wanted: tuple[HostPort, ...], slot: int) -> bool:
    """kube-scheduler's ``CheckConflict``, one node and one port at a time."""
    for want in wanted:
        for have in placed.get(slot, []):
            if (have.protocol, have.port) != (want.protocol, want.port):
                continue
            if "0.0.0.0" in (want.ip, have.ip) or want.ip == have.ip:
                return False
    return True


ports = st.builds(
    HostPort,
    port=st.sampled_from([80, 443, 8080]),
    protocol=st.sampled_from(["TCP", "UDP"]),
    ip=st.sampled_from(["0.0.0.0", "10.0.0.1", "10.0.0.2"]),
)
steps = st.lists(
    st.tuples(st.booleans(), st.integers(0, 3), st.lists(ports, max_size=3, unique=True)),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(steps=steps, wanted=st.lists(ports, min_size=1, max_size=3, unique=True))
def test_the_vectorised_filter_matches_the_rule_node_by_node(
    steps: list[tuple[bool, int, list[HostPort]]], wanted: list[HostPort]
) -> None:
    """Pods placed and released in any order: the filter over all nodes agrees with the
    rule applied to each node's placed pods, and the counts stay consistent."""
    state = ClusterState()
    for i in range(4):
        state.add_node(make_node(f"n{i}").cpu("100").spec())
    live: dict[str, tuple[int, list[HostPort]]] = {}
    for i, (place, slot, bound) in enumerate(steps):
        if place or not live:
            key = f"default/p{i}"
            state.assume(key, slot, ((0, 1),), ports=tuple(bound))
            live[key] = (slot, bound)
        else:
            key = sorted(live)[i % len(live)]
            state.forget(key)
            del live[key]
        state.check_invariants()
    placed: dict[int, list[HostPort]] = {}
    for slot, bound in live.values():
        placed.setdefault(slot, []).extend(bound)
    pod = make_pod("new")
    for port in wanted:
        pod = pod.host_port(port.port, port.protocol, port.ip)
    info = pod_info(pod.spec(), state.resources, 0)
    expected = [f"n{s}" for s in range(4) if _reference(placed, info.spec.host_ports, s)]
    assert _passing(state, pod) == expected
    if not live:
        assert state.host_ports == {}


def test_staging_and_discarding_restores_the_ports() -> None:
    state = ClusterState()
    state.add_node(make_node("a").cpu("8").spec())
    holder = pod_info(_pod("holder", ("TCP", "0.0.0.0", 80)).spec(), state.resources, 0)
    state.assume(holder.key, 0, holder.request, ports=holder.spec.host_ports)
    statement = Statement(state, QuotaTable(state.resources))
    statement.evict(holder.key, "default")
    assert _passing(state, _pod("new", ("TCP", "0.0.0.0", 80))) == ["a"]
    statement.discard()
    assert _passing(state, _pod("new", ("TCP", "0.0.0.0", 80))) == []
    copy = state.copy()
    copy.forget(holder.key)
    assert _passing(state, _pod("new", ("TCP", "0.0.0.0", 80))) == []
    state.check_invariants()
    copy.check_invariants()


def _feed(engine: Engine, *events: object, at: float = 0) -> list[object]:
    for event in events:
        engine.apply(env(event, at))  # type: ignore[arg-type]
    return list(engine.schedule())


def test_pods_on_one_host_port_spread_and_the_last_waits_for_a_freed_node() -> None:
    engine = Engine()
    nodes = [make_node(n).cpu("8").added() for n in ("a", "b")]
    web = [
        _pod(f"web-{i}", ("TCP", "0.0.0.0", 80)).runtime(60 if i == 0 else 600) for i in range(3)
    ]
    out = _feed(engine, *nodes, *(p.submitted() for p in web))
    bound = {d.pod: d.node for d in out if isinstance(d, PodBound)}
    assert set(bound) == {"default/web-0", "default/web-1"}
    assert sorted(bound.values()) == ["a", "b"]
    (failure,) = [d for d in out if isinstance(d, PodUnschedulable)]
    assert failure.plugins == ("NodePorts",)
    assert failure.rejections == {REASON: 2}
    # another port on the same nodes still fits
    out = _feed(engine, _pod("api", ("TCP", "0.0.0.0", 8080)).submitted())
    assert [d.pod for d in out if isinstance(d, PodBound)] == ["default/api"]
    out = _feed(engine, PodSucceeded(pod="default/web-0"), at=60)
    assert {d.pod: d.node for d in out if isinstance(d, PodBound)} == {
        "default/web-2": bound["default/web-0"]
    }
    engine.state.check_invariants()


def test_a_gangs_members_on_one_host_port_take_a_node_each() -> None:
    engine = Engine()
    spec = GroupSpec(namespace="default", name="job", min_member=3)
    members = [_pod(f"m{i}", ("TCP", "0.0.0.0", 29500)).group("default/job") for i in range(3)]
    nodes = [make_node(n).cpu("8").added() for n in ("a", "b")]
    out = _feed(engine, *nodes, PodGroupSubmitted(group=spec), *(m.submitted() for m in members))
    assert [d for d in out if isinstance(d, PodBound)] == []  # 3 members, 2 nodes: none
    out = _feed(engine, make_node("c").cpu("8").added(), at=1)
    assert sorted(d.node for d in out if isinstance(d, PodBound)) == ["a", "b", "c"]
    engine.state.check_invariants()


def test_a_snapshot_keeps_the_ports_bound() -> None:
    engine = Engine()
    dns = _pod("dns", ("UDP", "10.0.0.1", 53))
    out = _feed(engine, make_node("a").cpu("8").added(), dns.submitted())
    assert [d.pod for d in out if isinstance(d, PodBound)] == ["default/dns"]
    restored = restore(encode_state(engine))
    restored.state.check_invariants()
    assert restored.state.host_ports.keys() == engine.state.host_ports.keys()
    out = _feed(restored, _pod("other-dns", ("UDP", "0.0.0.0", 53)).submitted())
    assert [d.plugins for d in out if isinstance(d, PodUnschedulable)] == [("NodePorts",)]


@st.composite
def _crowd(draw: st.DrawFn) -> list[object]:
    """Two or three roomy nodes and pods that mostly want port 80: conflicts are the
    rule, resources never the reason."""
    events: list[object] = [
        make_node(f"n{i}").cpu("64").added() for i in range(draw(st.integers(2, 3)))
    ]
    for i in range(draw(st.integers(1, 25))):
        if draw(st.integers(0, 3)) == 0 and i > 0:
            events.append(PodSucceeded(pod=f"default/p{draw(st.integers(0, i - 1))}"))
            continue
        pod = make_pod(f"p{i}").cpu("1").priority(draw(st.integers(0, 2)))
        for _ in range(draw(st.integers(0, 2))):
            pod = pod.host_port(
                draw(st.sampled_from([80, 80, 443])),
                draw(st.sampled_from(["TCP", "TCP", "UDP"])),
                draw(st.sampled_from(["0.0.0.0", "10.0.0.1", "10.0.0.2"])),
            )
        events.append(pod.submitted())
    return events


def _run_crowd(events: list[object], *, incremental: bool) -> list[object]:
    engine = Engine()
    for framework in engine.profiles.frameworks.values():
        framework.incremental = incremental
    out: list[object] = []
    for i, event in enumerate(events):
        out += _feed(engine, event, at=i)
        engine.state.check_invariants()
        by_slot: dict[int, list[HostPort]] = {}
        for placed in engine.state.pods.values():
            for port in placed.ports:
                assert _reference(by_slot, (port,), placed.slot), "two pods bind one host port"
            by_slot.setdefault(placed.slot, []).extend(placed.ports)
    return out


@settings(max_examples=120, deadline=None)
@given(_crowd())
def test_no_two_pods_on_a_node_bind_one_port_and_caches_change_nothing(
    events: list[object],
) -> None:
    assert _run_crowd(events, incremental=True) == _run_crowd(events, incremental=False)

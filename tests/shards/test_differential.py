"""Shards are concurrency, not different semantics: one scheduler and 2, 4 or 8 shards
end the same.

Hypothesis generates scenarios whose right outcome does not depend on which node is
chosen: pools of identical nodes, every pod held to one pool and asking for one slot of
its nodes (so any placement leaves the same room), with gangs (their members in one
pool or in several), elastic quotas, priorities (all distinct, so no tie is broken by
node order), dependencies, arrivals, completions and nodes joining over time, under a
drawn scheduler profile: the default (spreading, its pods handed over to shards), a
packing one (``NodeResourcesFit`` with ``MostAllocated`` or
``RequestedToCapacityRatio`` on the cards) or a GPU policy (``GpuPacking``,
``GpuFragmentation``, ``ShoalGpu``), whose pods the coordinator decides on its exact
view; sometimes two profiles, each asked for by some of the pods. Each runs at 1, 2, 4
and 8 shards: a pool is either a label of the scenario's, its nodes spread over the
shards by a hash of their names (at 8 shards a shard holds one node of a pool, or
none), or a sharding pool (``shoal.io/pool``: all its nodes on one shard, most shards
holding none). Every run must end, keep the invariants (no node over-committed, no
quota above its max, no gang short of minMember) and replay exactly, and all must
agree on every pod's end phase and on who was preempted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine.config import SchedulerConfig, parse_config
from engine.model.pools import POOL_LABEL, Sharding
from events.memory import MemoryLog
from events.types import (
    SECOND,
    GroupSpec,
    NodeAdded,
    PodGroupSubmitted,
    PodSpec,
    PodSubmitted,
    QuotaDefined,
    QuotaSpec,
)
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay, replay_routed
from shards.simulate import simulate
from tests.builders import make_node

GPU = "nvidia.com/gpu"
SHARDS = (1, 2, 4, 8)

CARDS = [{"name": GPU, "weight": 1}]
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "MostAllocated": {
        "pluginConfig": [
            {
                "name": "NodeResourcesFit",
                "args": {"scoringStrategy": {"type": "MostAllocated", "resources": CARDS}},
            }
        ]
    },
    "RequestedToCapacityRatio": {
        "pluginConfig": [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": "RequestedToCapacityRatio",
                        "resources": CARDS,
                        "requestedToCapacityRatio": {
                            "shape": [
                                {"utilization": 0, "score": 0},
                                {"utilization": 100, "score": 10},
                            ]
                        },
                    }
                },
            }
        ]
    },
    **{
        policy: {"plugins": {"score": {"disabled": [{"name": "*"}], "enabled": [{"name": policy}]}}}
        for policy in ("GpuPacking", "GpuFragmentation", "ShoalGpu")
    },
}
"""The profiles a scenario is run under: by name, the profile's fields besides its
``schedulerName``."""
SCHEDULERS = ("default-scheduler", "second")
"""The ``schedulerName`` of a scenario's first profile, and of its second if it has one
(some of its pods then ask for it, the others for the first)."""


def scheduler_config(profiles: tuple[str, ...]) -> SchedulerConfig | None:
    """A configuration with the named profiles (none for the default profile alone)."""
    if profiles == ("default",):
        return None
    raw = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {"schedulerName": scheduler, **PROFILES[name]}
            for scheduler, name in zip(SCHEDULERS, profiles, strict=False)
        ],
    }
    return parse_config(raw, "+".join(profiles))


@dataclass(frozen=True)
class Pool:
    name: str
    nodes: int
    cards: int
    """Cards per node."""
    size: int
    """Cards every pod of the pool asks for (a divisor of ``cards``: one slot)."""


@st.composite
def scenarios(draw: Any) -> Scenario:
    profiles: tuple[str, ...] = (draw(st.sampled_from(list(PROFILES))),)
    if draw(st.integers(0, 3)) == 0:  # a second profile, asked for by some of the pods
        profiles += (draw(st.sampled_from(list(PROFILES))),)
    # a pool is a label of ours (its nodes spread over the shards by a hash of their
    # names) or a sharding pool (all its nodes on one shard, the others holding none)
    label = draw(st.sampled_from(["pool", POOL_LABEL]))
    pools = []
    for p in range(draw(st.integers(1, 3))):
        size = draw(st.sampled_from([1, 2, 4]))
        cards = size * draw(st.integers(1, 3))
        pools.append(Pool(f"p{p}", draw(st.integers(1, 4)), cards, size))
    items: list[tuple[int, Any]] = []
    joining = draw(st.integers(0, 3)) == 0  # nodes join over time (none ever leaves)
    for pool in pools:
        for i in range(pool.nodes):
            node = make_node(f"{pool.name}-{i}").cpu("64").memory("256Gi").gpu(pool.cards)
            at = draw(st.integers(0, 40)) if joining else 0
            items.append((at, node.label(label, pool.name).added()))
    namespaces = ["a", "b", "c"]
    for ns in namespaces[: draw(st.integers(0, 3))]:
        minimum = draw(st.integers(0, 6))
        maximum = minimum + draw(st.integers(0, 6))
        quota = QuotaSpec(namespace=ns, name="q", min={GPU: minimum}, max={GPU: maximum})
        items.append((0, QuotaDefined(quota=quota)))
    priorities = draw(st.permutations(list(range(1, 200))))
    next_priority = iter(priorities)
    units = draw(st.integers(1, 10))
    names: list[str] = []
    for u in range(units):
        pool = draw(st.sampled_from(pools))
        ns = draw(st.sampled_from(namespaces))
        at = draw(st.integers(0, 40))
        runtime = draw(st.one_of(st.none(), st.integers(5, 60)))
        priority = next(next_priority) * 10
        scheduler = draw(st.sampled_from(SCHEDULERS[: len(profiles)]))
        depends: tuple[str, ...] = ()
        if names and draw(st.integers(0, 4)) == 0:
            dep = draw(st.sampled_from(names))
            if dep.startswith(f"{ns}/"):
                depends = (dep,)
        base: dict[str, Any] = {
            "requests": {GPU: pool.size, "cpu": 100},
            "node_selector": {label: pool.name},
            "runtime": None if runtime is None else runtime * SECOND,
            "depends_on": depends,
            "scheduler_name": "" if scheduler == SCHEDULERS[0] else scheduler,
        }
        if draw(st.booleans()):
            size = draw(st.integers(2, 5))
            need = draw(st.integers(1, size))
            timeout = draw(st.one_of(st.none(), st.integers(10, 60)))
            group = GroupSpec(
                namespace=ns,
                name=f"g{u}",
                min_member=need,
                timeout=None if timeout is None else timeout * SECOND,
                priority=priority,
            )
            items.append((at, PodGroupSubmitted(group=group)))
            spread = draw(st.integers(0, 2)) == 0  # members held to different pools
            for m in range(size):
                held = draw(st.sampled_from(pools)) if spread else pool
                pod = PodSpec(
                    namespace=ns,
                    name=f"g{u}-{m}",
                    group=group.key,
                    priority=priority + m,
                    **{
                        **base,
                        "requests": {GPU: held.size, "cpu": 100},
                        "node_selector": {label: held.name},
                    },
                )
                items.append((at, PodSubmitted(pod=pod)))
            names.append(group.key)
        else:
            pod = PodSpec(namespace=ns, name=f"p{u}", priority=priority, **base)
            items.append((at, PodSubmitted(pod=pod)))
            names.append(pod.key)
    events = [TimedEvent(t * SECOND, i, e) for i, (t, e) in enumerate(items)]
    events.sort(key=lambda e: (e.time, e.order))
    return Scenario(events=events, config=scheduler_config(profiles))


async def _run(scenario: Scenario, shards: int) -> tuple[dict[str, str], set[str]]:
    log = MemoryLog(shards + 1 if shards > 1 else 1)
    sharding = Sharding(shards=shards) if shards > 1 else None
    result = await simulate(scenario, log, sharding=sharding)
    result.cluster.check_invariants()
    for engine in result.engines:
        engine.state.check_invariants()
        assert list(engine.quotas.check()) == []
    if result.control is not None:
        assert list(result.control.engine.quotas.check()) == []
    parts = [await log.read(p, 0) for p in range(log.partitions)]
    verified = replay_routed(parts, verify=True) if shards > 1 else replay(parts[0], verify=True)
    assert verified.mismatch is None, str(verified.mismatch)
    assert verified.unforwarded == 0
    report = result.report
    for key, group in report.groups.items():
        ran = any(  # a gang that ran keeps its phase while its other members wait
            view.phase == "Succeeded" for pod, view in report.pods.items() if pod.startswith(key)
        )
        if group.phase == "Scheduled" and not ran:
            assert group.scheduled >= group.min_member, (key, group)
    phases = {key: view.phase for key, view in report.pods.items()}
    preempted = {p["pod"] for p in report.preemptions}
    return phases, preempted


@settings(deadline=None)
@given(scenarios(), st.booleans())
def test_one_two_four_and_eight_shards_end_the_same(scenario: Scenario, eight: bool) -> None:
    # 8 shards cost about as much as 1, 2 and 4 together: run on half the examples
    counts = SHARDS if eight else SHARDS[:-1]
    one, *others = (asyncio.run(_run(scenario, shards)) for shards in counts)
    for shards, other in zip(counts[1:], others, strict=True):
        assert other == one, (shards, _diff(one, other), _compact(scenario))
    phases, preempted = one
    event(f"profile: {_profile(scenario)}")
    event(f"shards: {counts}")
    event(f"pods: {', '.join(sorted(set(phases.values())))}")
    event("some preempted" if preempted else "none preempted")


def _profile(scenario: Scenario) -> str:
    """The names :data:`PROFILES` gives the scenario's profiles, joined by ``+``."""
    config = scenario.config
    if config is None or config.source is None:
        return "default"
    return "+".join(
        next(
            name
            for name, fields in PROFILES.items()
            if raw == {"schedulerName": raw["schedulerName"], **fields}
        )
        for raw in config.source["profiles"]
    )


def _diff(a: tuple[dict[str, str], set[str]], b: tuple[dict[str, str], set[str]]) -> dict[str, Any]:
    pods = {
        k: (a[0].get(k), b[0].get(k)) for k in sorted({*a[0], *b[0]}) if a[0].get(k) != b[0].get(k)
    }
    return {"pods": pods, "preempted": sorted(a[1] ^ b[1])}


def _compact(scenario: Scenario) -> list[str]:
    """The scenario, a line per event (what a failure needs to be reproduced)."""
    lines = [f"profile {_profile(scenario)}"]
    for timed in scenario.events:
        event = timed.event
        if isinstance(event, PodSubmitted):
            pod = event.pod
            lines.append(
                f"t={timed.time // SECOND} pod {pod.key} prio={pod.priority} "
                f"gpu={pod.requests.get(GPU)} pool={pod.node_selector} "
                f"group={pod.group} runtime={pod.runtime and pod.runtime // SECOND} "
                f"deps={list(pod.depends_on)} scheduler={pod.scheduler_name or SCHEDULERS[0]}"
            )
        elif isinstance(event, PodGroupSubmitted):
            group = event.group
            lines.append(
                f"t={timed.time // SECOND} group {group.key} min={group.min_member} "
                f"timeout={group.timeout and group.timeout // SECOND} prio={group.priority}"
            )
        elif isinstance(event, NodeAdded):
            node = event.node
            lines.append(
                f"t={timed.time // SECOND} node {node.name} gpu={node.allocatable.get(GPU)} "
                f"labels={node.labels}"
            )
        elif isinstance(event, QuotaDefined):
            lines.append(
                f"quota {event.quota.namespace} min={event.quota.min} max={event.quota.max}"
            )
        else:
            lines.append(str(event)[:120])
    return lines


def _known_preemption_with_flights() -> Scenario:
    """A case the property above found: ``b/p8`` fits a node but must reclaim quota to be
    admitted. Where ``a/p5`` (priority 60) shares the free node, the victims were once
    taken from that node first, so 4 shards (which put it there) evicted ``a/p5`` while
    one shard evicted ``a/g0-0`` (priority 10, on another node). Victims of a short quota
    are now weighed in one order whatever their node: ``a/g0-0`` at any count."""
    items: list[tuple[int, Any]] = []
    for name, pool, cards in (("p0-0", "p0", 4), ("p0-1", "p0", 4), ("p1-0", "p1", 1)):
        node = make_node(name).cpu("64").memory("256Gi").gpu(cards).label("pool", pool)
        items.append((0, node.added()))
    node = make_node("p2-0").cpu("64").memory("256Gi").gpu(1).label("pool", "p2")
    items.append((0, node.added()))
    for ns, low, high in (("a", 1, 3), ("b", 5, 5)):
        quota = QuotaSpec(namespace=ns, name="q", min={GPU: low}, max={GPU: high})
        items.append((0, QuotaDefined(quota=quota)))
    group = GroupSpec(namespace="a", name="g0", min_member=1, timeout=None, priority=10)
    items.append((0, PodGroupSubmitted(group=group)))
    for m in range(2):
        pod = PodSpec(
            namespace="a",
            name=f"g0-{m}",
            group=group.key,
            priority=10 + m,
            requests={GPU: 1, "cpu": 100},
            node_selector={"pool": "p1"},
        )
        items.append((0, PodSubmitted(pod=pod)))
    plain = [
        (0, "a", "p1", 20, ("a/g0",)),
        (0, "b", "p2", 30, ()),
        (0, "a", "p3", 40, ()),
        (0, "a", "p4", 50, ("a/g0",)),
        (0, "a", "p5", 60, ()),
        (0, "a", "p6", 70, ("a/g0",)),
        (0, "c", "p7", 80, ()),
        (1, "b", "p8", 90, ()),
    ]
    for at, ns, name, priority, depends in plain:
        pod = PodSpec(
            namespace=ns,
            name=name,
            priority=priority,
            requests={GPU: 2, "cpu": 100},
            node_selector={"pool": "p0"},
            depends_on=depends,
        )
        items.append((at, PodSubmitted(pod=pod)))
    events = [TimedEvent(t * SECOND, i, e) for i, (t, e) in enumerate(items)]
    return Scenario(events=events)


@pytest.mark.parametrize("profile", ["default", "MostAllocated", "GpuPacking"])
def test_reclaim_chooses_its_victims_whatever_node_the_pods_landed_on(profile: str) -> None:
    scenario = _known_preemption_with_flights()
    scenario.config = scheduler_config((profile,))
    one, *others = (asyncio.run(_run(scenario, shards)) for shards in SHARDS)
    for shards, other in zip(SHARDS[1:], others, strict=True):
        assert other == one, (shards, _diff(one, other))
    assert one[1] == {"a/g0-0"}  # the least valuable pod of the borrowing namespace


def _woken_behind_a_backing_off_pod() -> Scenario:
    """A case the property above found (``HYPOTHESIS_PROFILE=big``): room freed by a
    preemption (``a/p3`` evicts gang ``c/g4``'s two placed members and takes one of
    their two cards) is enough for one pod. ``c/g4-2`` (priority 652) waits out a
    back-off; ``a/p6`` (priority 30) has waited since the start. One scheduler wakes
    both: ``a/p6`` runs at once, and ``c/g4-2`` preempts it when its back-off ends. The
    wake-up once gave the room to ``c/g4-2`` alone, so ``a/p6`` stayed parked; and one
    shard woke once per victim, the coordinator once per node, so 2 shards left
    ``a/p6`` pending where one shard ran it and preempted it."""
    items: list[tuple[int, Any]] = []
    for name in ("p0-0", "p0-1"):
        node = make_node(name).cpu("64").memory("256Gi").gpu(2).label("pool", "p0")
        items.append((0, node.added()))

    def gang(ns: str, name: str, size: int, minimum: int, priority: int, at: int) -> None:
        group = GroupSpec(namespace=ns, name=name, min_member=minimum, priority=priority)
        items.append((at, PodGroupSubmitted(group=group)))
        for m in range(size):
            pod = PodSpec(
                namespace=ns,
                name=f"{name}-{m}",
                group=group.key,
                priority=priority + m,
                requests={GPU: 1, "cpu": 100},
                node_selector={"pool": "p0"},
            )
            items.append((at, PodSubmitted(pod=pod)))

    def plain(name: str, priority: int, at: int) -> None:
        pod = PodSpec(
            namespace="a",
            name=name,
            priority=priority,
            requests={GPU: 1, "cpu": 100},
            node_selector={"pool": "p0"},
        )
        items.append((at, PodSubmitted(pod=pod)))

    gang("a", "g0", 2, 1, 140, 0)
    plain("p6", 30, 0)
    plain("p7", 830, 0)
    plain("p8", 860, 0)
    gang("c", "g4", 3, 2, 650, 32)
    plain("p3", 1160, 33)
    events = [TimedEvent(t * SECOND, i, e) for i, (t, e) in enumerate(items)]
    return Scenario(events=events)


@pytest.mark.parametrize("profile", ["default", "MostAllocated"])
def test_room_freed_wakes_a_parked_pod_beside_one_backing_off(profile: str) -> None:
    scenario = _woken_behind_a_backing_off_pod()
    scenario.config = scheduler_config((profile,))
    one, *others = (asyncio.run(_run(scenario, shards)) for shards in SHARDS)
    for shards, other in zip(SHARDS[1:], others, strict=True):
        assert other == one, (shards, _diff(one, other))
    assert one[0]["a/p6"] == "Failed" and "a/p6" in one[1]  # ran, then was preempted

"""Whole runs: simulated cluster, shard worker, binder, replay."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from engine.engine import Engine
from events.memory import MemoryLog
from events.types import (
    SECOND,
    BindFailed,
    Envelope,
    NodeRemoved,
    PodBound,
    PodFailed,
    PodMigrated,
    PodSucceeded,
    PodUnschedulable,
    is_decision,
)
from shards.binder import Binder
from shards.cluster import SimulatedCluster
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay
from shards.simulate import simulate
from shards.worker import ShardWorker
from tests.builders import make_node, make_pod


def scenario(*items: tuple[float, Any]) -> Scenario:
    events = [TimedEvent(round(t * SECOND), i, e) for i, (t, e) in enumerate(items)]
    events.sort(key=lambda e: (e.time, e.order))
    return Scenario(events=events)


async def test_pods_wait_for_capacity_then_run_in_order() -> None:
    s = scenario(
        (0, make_node("n").cpu("2").added()),
        (0, make_pod("a").cpu("2").runtime(10).submitted()),
        (1, make_pod("b").cpu("2").runtime(10).submitted()),
        (2, make_pod("c").cpu("2").runtime(10).submitted()),
    )
    log = MemoryLog()
    result = await simulate(s, log)
    pods = result.report.pods
    assert all(v.phase == "Succeeded" for v in pods.values())
    assert [pods[k].bound_at for k in ("default/a", "default/b", "default/c")] == [
        0,
        10 * SECOND,
        20 * SECOND,
    ]
    records = await log.read(0, 0)
    assert replay(records, verify=True).mismatch is None


async def test_node_lost_fails_its_pods_and_frees_nothing_twice() -> None:
    s = scenario(
        (0, make_node("a").cpu("2").added()),
        (0, make_pod("p").cpu("1").submitted()),
        (5, NodeRemoved(name="a")),
        (6, make_node("b").cpu("2").added()),
        (6, make_pod("q").cpu("1").submitted()),
    )
    result = await simulate(s, MemoryLog())
    pods = result.report.pods
    assert pods["default/p"].phase == "Failed" and pods["default/p"].reason == "NodeLost"
    assert pods["default/q"].node == "b"
    result.engine.state.check_invariants()


async def test_bind_failure_through_the_log_requeues_the_pod() -> None:
    """A node vanishes between the decision and the bind: the binder's failure is an
    event, the shard un-assumes the pod and places it elsewhere after back-off."""
    log = MemoryLog()
    engine = Engine()
    worker = ShardWorker(engine, log)
    cluster = SimulatedCluster()
    binder = Binder(cluster, log)
    await log.append(
        [
            Envelope(event=make_node("a").cpu("8").added()),
            Envelope(event=make_node("b").cpu("1").added()),
            Envelope(event=make_pod("p").cpu("1").submitted()),
        ]
    )
    await binder.poll(0)
    assert await worker.poll() == 1
    (decision,) = [e.event for e in await log.read(0, 3) if isinstance(e.event, PodBound)]
    assert decision.node == "a"
    # the node is gone in the cluster before its removal reaches the log
    cluster.observe(Envelope(event=NodeRemoved(name="a")))
    await binder.poll(0)
    await log.append([Envelope(event=NodeRemoved(name="a"), time=0)])
    records = await log.read(0, 0)
    failures = [e.event for e in records if isinstance(e.event, BindFailed)]
    assert failures and failures[0].reason == "node a not found"
    await worker.poll()
    assert "default/p" not in engine.state.pods
    await log.append([Envelope(event=make_pod("other").cpu("100m").submitted(), time=2 * SECOND)])
    await worker.poll()
    assert engine.state.pods["default/p"].slot == engine.state.index["b"]
    assert replay(await log.read(0, 0), verify=True).mismatch is None


def test_cluster_rejects_what_does_not_fit() -> None:
    cluster = SimulatedCluster()
    cluster.observe(Envelope(event=make_node("n").cpu("1").added()))
    for name in ("a", "b"):
        cluster.observe(Envelope(event=make_pod(name).cpu("1").runtime(5).submitted()))
    ok = PodBound(pod="default/a", node="n", decision_id="d1", attempt=1)
    assert cluster.bind(ok, 0) == []
    assert cluster.bind(ok, 0) == [], "the same decision twice changes nothing"
    (fail,) = cluster.bind(PodBound(pod="default/b", node="n", decision_id="d2", attempt=1), 0)
    assert isinstance(fail, BindFailed) and "insufficient cpu" in fail.reason
    (fail,) = cluster.bind(PodBound(pod="default/zz", node="n", decision_id="d3", attempt=1), 0)
    assert isinstance(fail, BindFailed) and fail.reason == "pod not found"
    assert cluster.next_time() == 5 * SECOND
    assert cluster.due(5 * SECOND) == [PodSucceeded(pod="default/a", node="n")]
    cluster.check_invariants()


def _swap_cluster() -> SimulatedCluster:
    """Nodes m and n of 2 CPUs, each full: a (2 CPUs) on m, b and c (1 CPU each) on n."""
    cluster = SimulatedCluster()
    for node in ("m", "n"):
        cluster.observe(Envelope(event=make_node(node).cpu("2").added()))
    for name, cpu, node in (("a", "2", "m"), ("b", "1", "n"), ("c", "1", "n")):
        cluster.observe(Envelope(event=make_pod(name).cpu(cpu).submitted()))
        assert (
            cluster.bind(PodBound(pod=f"default/{name}", node=node, decision_id=name, attempt=1), 0)
            == []
        )
    return cluster


SWAP = [
    PodMigrated(pod="default/a", from_node="m", to_node="n", by="x", decision_id="a2"),
    PodMigrated(pod="default/b", from_node="n", to_node="m", by="x", decision_id="b2"),
    PodMigrated(pod="default/c", from_node="n", to_node="m", by="x", decision_id="c2"),
]


def test_a_plan_of_moves_that_swaps_pods_is_carried_out_as_one_step() -> None:
    """a swaps places with b and c: one by one, a meets b and c still on n and fails;
    as a plan, every moving pod stops first."""
    one_by_one = _swap_cluster()
    (fail,) = one_by_one.migrate(SWAP[0], 0)
    assert isinstance(fail, BindFailed) and "insufficient cpu" in fail.reason
    cluster = _swap_cluster()
    assert cluster.migrate_all(SWAP, 0) == []
    assert {k: v[0] for k, v in cluster.running.items()} == {
        "default/a": "n",
        "default/b": "m",
        "default/c": "m",
    }
    assert cluster.migrate_all(SWAP, 0) == [], "the same moves twice change nothing"
    cluster.check_invariants()


def test_a_pod_moved_twice_in_one_pass_ends_where_its_last_move_puts_it() -> None:
    """Consolidation may move a pod and move it again in the same pass: its second move
    is a step of its own, after the first (not refused as already bound)."""
    cluster = SimulatedCluster()
    for node in ("m", "n"):
        cluster.observe(Envelope(event=make_node(node).cpu("2").added()))
    cluster.observe(Envelope(event=make_pod("x").cpu("1").submitted()))
    assert cluster.bind(PodBound(pod="default/x", node="m", decision_id="x1", attempt=1), 0) == []
    moves = [
        PodMigrated(pod="default/x", from_node="m", to_node="n", by="c", decision_id="x2"),
        PodMigrated(pod="default/x", from_node="n", to_node="m", by="c", decision_id="x3"),
    ]
    assert cluster.migrate_all(moves, 0) == []
    assert cluster.running["default/x"] == ("m", "x3")


async def test_the_binder_carries_out_a_plan_and_skips_the_coordinators_copies() -> None:
    """At two shards: the moves in shard 0's partition are one plan; their copies the
    coordinator relays into the control partition are not applied again (a move the
    cluster refused, applied from its copy once room was made, would run the pod where
    no shard knows it)."""
    log = MemoryLog(partitions=3)
    cluster = _swap_cluster()
    binder = Binder(cluster, log, shards=2)
    await log.append([Envelope(event=m, producer="shard-0") for m in SWAP], 0)
    await binder.poll(0)
    assert not [e for e in await log.read(0, 0) if isinstance(e.event, BindFailed)]
    # a refused move (no room on m), then its relayed copy once room was made there
    late = PodMigrated(pod="default/a", from_node="n", to_node="m", by="y", decision_id="a3")
    await log.append([Envelope(event=late, producer="shard-0")], 0)
    await binder.poll(0)
    assert [
        e.event.decision_id for e in await log.read(0, 0) if isinstance(e.event, BindFailed)
    ] == ["a3"]
    assert "default/a" not in cluster.running  # (stopped by its move, started nowhere)
    room = [
        PodMigrated(pod=f"default/{k}", from_node="m", to_node="n", by="z", decision_id=f"{k}3")
        for k in "bc"
    ]
    assert cluster.migrate_all(room, 0) == []  # m is empty now
    await log.append([Envelope(event=late, producer="relay-0", stream="relay")], 2)
    await binder.poll(0)
    assert "default/a" not in cluster.running


async def test_a_move_of_a_plan_across_shards_waits_for_the_room_another_shard_frees() -> None:
    """At two shards a plan swaps a (on m) and b (on n), each node full: shard 0's record
    moves a onto n, shard 1's moves b onto m. The binder reads shard 0's first: a waits
    for its room instead of being refused, and moves once b has left n. A move whose
    room never comes is refused once the clock moves on."""
    log = MemoryLog(partitions=3)
    cluster = SimulatedCluster()
    for name in ("m", "n"):
        cluster.observe(Envelope(event=make_node(name).cpu("2").added()))
    for name, node in (("a", "m"), ("b", "n")):
        cluster.observe(Envelope(event=make_pod(name).cpu("2").submitted()))
        cluster.bind(PodBound(pod=f"default/{name}", node=node, decision_id=name, attempt=1), 0)
    binder = Binder(cluster, log, shards=2)
    rid = "default/w/moves#3"
    to_n = PodMigrated(pod="default/a", from_node="m", to_node="n", by="w", decision_id=f"a@{rid}")
    to_m = PodMigrated(pod="default/b", from_node="n", to_node="m", by="w", decision_id=f"b@{rid}")
    await log.append([Envelope(event=to_n, producer="shard-0")], 0)
    await log.append([Envelope(event=to_m, producer="shard-1")], 1)
    await binder.poll(0)
    assert {k: v[0] for k, v in cluster.running.items()} == {"default/a": "n", "default/b": "m"}
    assert not [e for p in (0, 1) for e in await log.read(p, 0) if isinstance(e.event, BindFailed)]
    # a move whose room never comes: waits while the clock stands, refused after
    back = PodMigrated(pod="default/a", from_node="n", to_node="m", by="v", decision_id=f"a2@{rid}")
    await log.append([Envelope(event=back, producer="shard-0")], 0)
    await binder.poll(0)
    assert not [e for e in await log.read(0, 0) if isinstance(e.event, BindFailed)]
    await binder.poll(SECOND)
    (refusal,) = [e.event for e in await log.read(0, 0) if isinstance(e.event, BindFailed)]
    assert refusal.decision_id == f"a2@{rid}"


@st.composite
def random_scenario(draw: Any) -> Scenario:
    items: list[tuple[float, Any]] = []
    for i in range(draw(st.integers(1, 5))):
        node = make_node(f"n{i}").cpu(draw(st.sampled_from(["2", "4", "8"]))).memory("16Gi")
        if draw(st.booleans()):
            node = node.gpu(draw(st.sampled_from([2, 4, 8])))
        items.append((draw(st.integers(0, 20)), node.added()))
    for i in range(draw(st.integers(0, 25))):
        pod = (
            make_pod(f"p{i}")
            .cpu(draw(st.sampled_from(["250m", "1", "2", "5"])))
            .priority(draw(st.integers(0, 2)))
        )
        if draw(st.integers(0, 3)) == 0:
            pod = pod.gpu(draw(st.integers(1, 4)))
        if draw(st.booleans()):
            pod = pod.runtime(draw(st.integers(1, 30)))
        items.append((draw(st.integers(0, 40)), pod.submitted()))
    if draw(st.integers(0, 3)) == 0:
        items.append((draw(st.integers(0, 40)), NodeRemoved(name="n0")))
    return scenario(*items)


@given(random_scenario())
async def test_random_runs_lose_nothing_and_replay_exactly(s: Scenario) -> None:
    log = MemoryLog()
    result = await simulate(s, log)
    result.cluster.check_invariants()
    result.engine.state.check_invariants()
    records = await log.read(0, 0)
    submitted = {e.event.pod.key for e in s.events if hasattr(e.event, "pod")}
    for key in submitted:
        view = result.report.pods[key]
        assert view.phase in {"Bound", "Pending", "Succeeded", "Failed"}
        if view.phase == "Pending":
            assert view.reason  # every pending pod says why
    bound_twice = [
        key
        for key in submitted
        if sum(1 for e in records if isinstance(e.event, PodBound) and e.event.pod == key)
        > 1
        + sum(
            1 for e in records if isinstance(e.event, BindFailed | PodFailed) and e.event.pod == key
        )
    ]
    assert bound_twice == []
    for env in records:  # every pod told it waits is told what to do
        if isinstance(env.event, PodUnschedulable):
            assert env.event.answer is not None and env.event.answer.next_step, env.event
    verified = replay(records, verify=True)
    assert verified.mismatch is None
    assert verified.verified == sum(
        1 for e in records if is_decision(e.event) and e.producer == "shard-0"
    )

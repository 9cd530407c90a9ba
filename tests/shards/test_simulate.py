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

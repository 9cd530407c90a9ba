"""Properties of runs with an extender, at 1 and 2 shards: no pod is ever bound to a
node the extender's filter rejected, every pod that waits says why, and a one-shard
log replays exactly with the extender's answers alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.model.pools import Sharding
from events.memory import MemoryLog
from events.types import SECOND, PodBound
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay
from shards.simulate import read_all, simulate
from tests.builders import make_node, make_pod
from tests.shards.extender_server import Behaviour, ExtenderServer


@pytest.fixture(scope="module")
def extender() -> Iterator[ExtenderServer]:
    server = ExtenderServer().start()
    try:
        yield server
    finally:
        server.stop()


@st.composite
def runs(draw: Any) -> tuple[Scenario, frozenset[str], int, int]:
    items: list[tuple[int, Any]] = []
    nodes = [f"n{i}" for i in range(draw(st.integers(1, 5)))]
    for name in nodes:
        cpu = draw(st.sampled_from(["2", "4", "8"]))
        items.append((draw(st.integers(0, 5)), make_node(name).cpu(cpu).memory("16Gi").added()))
    for i in range(draw(st.integers(1, 15))):
        pod = make_pod(f"p{i}").cpu(draw(st.sampled_from(["500m", "1", "3"])))
        if draw(st.booleans()):
            pod = pod.runtime(draw(st.integers(1, 20)))
        items.append((draw(st.integers(0, 20)), pod.submitted()))
    accepted = frozenset(draw(st.lists(st.sampled_from(nodes), unique=True)))
    events = [TimedEvent(t * SECOND, i, e) for i, (t, e) in enumerate(items)]
    events.sort(key=lambda e: (e.time, e.order))
    return (
        Scenario(events=events),
        accepted,
        draw(st.sampled_from([1, 2])),
        draw(st.sampled_from([0, 4])),
    )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(runs())
async def test_no_pod_lands_where_the_extender_said_no(
    extender: ExtenderServer, run: tuple[Scenario, frozenset[str], int, int]
) -> None:
    scenario, accepted, shards, every = run
    extender.behaviour = Behaviour(reject=lambda n: "" if n in accepted else "refused")
    config = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "extenders": [{"urlPrefix": extender.url, "filterVerb": "filter"}],
        }
    )
    routed = shards > 1
    log = MemoryLog(shards + 1 if routed else 1)
    result = await simulate(
        scenario,
        log,
        config,
        sharding=Sharding(shards=shards) if routed else None,
        snapshot_every=every,  # (none while an ask is in flight)
    )
    records = await read_all(log)
    placed = [e.event.node for e in records if isinstance(e.event, PodBound)]
    assert set(placed) <= accepted
    for view in result.report.pods.values():
        if view.phase == "Pending":
            assert view.reason
    if not routed:
        verified = replay(records, config, verify=True)
        assert verified.mismatch is None

"""Forgetting under random batch scenarios: with a retention window of a few seconds,
so that pods, gangs and their time-outs are forgotten while others still arrive,
depend on them or reuse their names, every run keeps the invariants, loses no pod,
and replays exactly, snapshots included (what is forgotten is a function of the log)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from engine.config import parse_config
from events.memory import MemoryLog
from events.types import PodSubmitted, SnapshotTaken
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay
from shards.simulate import simulate
from tests.shards.test_batch_properties import batch_scenario

CONFIG = parse_config(
    {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "finishedRetentionSeconds": 3,
    }
)


@st.composite
def forgetful_scenario(draw: Any) -> Scenario:
    """A batch scenario whose pods may name earlier pods of their namespace as
    dependencies, and may come again (same name, same or another uid) later."""
    base = draw(batch_scenario())
    events: list[TimedEvent] = []
    earlier: list[str] = []
    for timed in base.events:
        event = timed.event
        if isinstance(event, PodSubmitted):
            pod = event.pod
            same_ns = [k for k in earlier if k.startswith(pod.namespace + "/")]
            if same_ns and draw(st.integers(0, 3)) == 0:
                pod = replace(pod, depends_on=(draw(st.sampled_from(same_ns)),))
            pod = replace(pod, uid=f"{pod.key}-1")
            events.append(TimedEvent(timed.time, timed.order, PodSubmitted(pod=pod)))
            earlier.append(pod.key)
            if draw(st.integers(0, 4)) == 0:  # told again later, as itself or another pod
                again = replace(pod, uid=draw(st.sampled_from([pod.uid, f"{pod.key}-2"])))
                later = timed.time + draw(st.integers(1, 40)) * 1_000_000_000
                events.append(TimedEvent(later, 10_000 + len(events), PodSubmitted(pod=again)))
        else:
            events.append(timed)
    events.sort(key=lambda e: (e.time, e.order))
    return Scenario(events=events, config=CONFIG)


@settings(max_examples=80, deadline=None)
@given(forgetful_scenario())
async def test_forgetting_keeps_the_invariants_and_replays_exactly(s: Scenario) -> None:
    log = MemoryLog()
    result = await simulate(s, log, snapshot_every=7)
    engine = result.engine
    engine.state.check_invariants()
    result.cluster.check_invariants()
    assert list(engine.quotas.check()) == []
    for key, view in result.report.pods.items():
        assert view.phase in {"Bound", "Pending", "Succeeded", "Failed"}, key
        assert view.phase != "Pending" or view.reason, key
    records = await log.read(0, 0)
    verified = replay(records, verify=True)
    assert verified.mismatch is None, verified.mismatch
    if any(isinstance(e.event, SnapshotTaken) for e in records):
        assert verified.snapshots > 0

"""Invariants of batch semantics over random clusters, gangs, quotas and priorities."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from events.memory import MemoryLog
from events.types import (
    SECOND,
    GroupSpec,
    NodeRemoved,
    PodBound,
    PodGroupSubmitted,
    PodSpec,
    PodSubmitted,
    QuotaDefined,
    QuotaSpec,
    is_decision,
)
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay
from shards.simulate import simulate
from tests.builders import make_node

NAMESPACES = ("team-a", "team-b", "team-c")


@st.composite
def batch_scenario(draw: Any) -> Scenario:
    items: list[tuple[int, Any]] = []
    for i in range(draw(st.integers(1, 4))):
        node = (
            make_node(f"n{i}")
            .cpu(draw(st.sampled_from(["2", "4", "8"])))
            .gpu(draw(st.sampled_from([0, 2, 4])))
        )
        items.append((draw(st.integers(0, 5)), node.added()))
    for ns in NAMESPACES:
        if draw(st.booleans()):
            low = draw(st.integers(0, 4))
            spec = QuotaSpec(
                namespace=ns,
                name="q",
                min={"nvidia.com/gpu": low},
                max={"nvidia.com/gpu": low + draw(st.integers(0, 4))},
            )
            items.append((0, QuotaDefined(quota=spec)))
    groups: list[tuple[str, int]] = []
    for g in range(draw(st.integers(0, 3))):
        ns = draw(st.sampled_from(NAMESPACES))
        minimum = draw(st.integers(1, 4))
        timeout = draw(st.one_of(st.none(), st.integers(5, 40)))
        spec = GroupSpec(
            namespace=ns,
            name=f"g{g}",
            min_member=minimum,
            timeout=None if timeout is None else timeout * SECOND,
        )
        items.append((draw(st.integers(0, 10)), PodGroupSubmitted(group=spec)))
        groups.append((f"{ns}/g{g}", minimum))
    for i in range(draw(st.integers(1, 20))):
        group = (
            draw(st.one_of(st.just(""), st.sampled_from([g for g, _ in groups]))) if groups else ""
        )
        ns = group.split("/")[0] if group else draw(st.sampled_from(NAMESPACES))
        requests = {"cpu": draw(st.sampled_from([500, 1000, 2000]))}
        if draw(st.booleans()):
            requests["nvidia.com/gpu"] = draw(st.integers(1, 2))
        pod = PodSpec(
            namespace=ns,
            name=f"p{i}",
            requests=requests,
            group=group,
            priority=draw(st.sampled_from([0, 10, 100])),
            preemption_policy=draw(st.sampled_from(["PreemptLowerPriority", "Never"])),
            runtime=draw(st.one_of(st.none(), st.integers(1, 30)))
            and draw(st.integers(1, 30)) * SECOND,
        )
        items.append((draw(st.integers(0, 20)), PodSubmitted(pod=pod)))
    if draw(st.integers(0, 4)) == 0:
        items.append((draw(st.integers(5, 30)), NodeRemoved(name="n0")))
    events = [TimedEvent(t * SECOND, i, e) for i, (t, e) in enumerate(items)]
    events.sort(key=lambda e: (e.time, e.order, not isinstance(e.event, PodGroupSubmitted)))
    return Scenario(events=events)


@given(batch_scenario())
async def test_no_partial_gang_no_quota_overrun_no_overcommit_exact_replay(s: Scenario) -> None:
    log = MemoryLog()
    result = await simulate(s, log)
    records = await log.read(0, 0)
    engine = result.engine
    engine.state.check_invariants()
    result.cluster.check_invariants()
    assert list(engine.quotas.check()) == []
    minimum = {
        e.event.group.key: e.event.group.min_member
        for e in s.events
        if isinstance(e.event, PodGroupSubmitted)
    }
    member_of = {
        e.event.pod.key: e.event.pod.group for e in s.events if isinstance(e.event, PodSubmitted)
    }
    # A gang's first bindings come in one pass, at least minMember of them.
    first_pass: dict[str, int] = {}
    counted: dict[str, int] = {}
    for env in records:
        if isinstance(env.event, PodBound):
            group = member_of.get(env.event.pod, "")
            if group in minimum:
                first_pass.setdefault(group, env.causation)
                if env.causation == first_pass[group]:
                    counted[group] = counted.get(group, 0) + 1
    for group, n in counted.items():
        assert n >= minimum[group], f"partial gang {group}: {n} < {minimum[group]}"
    # A group that never reached Scheduled holds nothing.
    for key, group in engine.groups.items():
        if group.phase == "Pending":
            assert not any(m in engine.state.pods for m in group.members), key
    # No pod is lost.
    for key in member_of:
        view = result.report.pods[key]
        assert view.phase in {"Bound", "Pending", "Succeeded", "Failed"}
        assert view.phase != "Pending" or view.reason
    verified = replay(records, verify=True)
    assert verified.mismatch is None
    assert verified.verified == sum(
        1 for e in records if is_decision(e.event) and e.producer == "shard-0"
    )

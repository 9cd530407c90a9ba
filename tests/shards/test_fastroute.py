"""The run router against the fold (hypothesis): whatever the control partition holds
and however it is cut into reads, folding it through :class:`RunRouter` gives the same
outputs, in the same order, at the same times, and leaves the router in the same state,
byte for byte, as ``Control.apply`` record by record."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.model.pools import POOL_LABEL, Sharding
from events.types import (
    ClockTicked,
    Envelope,
    PodDeleted,
    PodSpec,
    PodSubmitted,
    QuotaDefined,
    QuotaSpec,
    ShardSummary,
)
from shards import fastroute
from shards.control import control_state
from shards.fastroute import EXACT, RunRouter, route_kernel
from shards.router import Control
from tests.builders import make_node, make_pod, relayed

pytestmark = pytest.mark.skipif(route_kernel() is None, reason="numba is not available")

BIG = EXACT - 1

small = st.integers(0, 16_000)
large = st.one_of(small, st.sampled_from([1 << 40, BIG // 4, BIG]))


@st.composite
def control_records(draw: st.DrawFn) -> list[Any]:
    """Events for the control partition: nodes, many plain pods (some sharing names,
    some with requests too large for the compiled loop), pods the fold treats otherwise,
    summaries relayed from shards, deletions, quotas, clock ticks."""
    shards = draw(st.integers(1, 4))
    # mostly everyday amounts; in some runs, amounts too large for the compiled loop
    amounts = large if draw(st.integers(0, 5)) == 0 else small
    events: list[Any] = []
    for i in range(draw(st.integers(1, 6))):
        # few sizes: shards often tie, and ties must break the same way
        node = (
            make_node(f"n{i}")
            .cpu(draw(st.sampled_from(["4", "8"])))
            .gpu(draw(st.sampled_from([0, 4])))
        )
        events.append(("in", node.label(POOL_LABEL, f"p{i % shards}").added()))
    for _ in range(draw(st.integers(1, 120))):
        kind = draw(
            st.sampled_from(
                ["pod"] * 12 + ["selector", "gang", "summary", "delete", "quota", "tick"]
            )
        )
        name = f"p{draw(st.integers(0, 60))}"
        if kind == "pod":
            requests = {
                "cpu": draw(amounts),
                "memory": draw(amounts),
                **({"nvidia.com/gpu": draw(st.integers(0, 4))} if draw(st.booleans()) else {}),
                **({"pods": draw(st.integers(0, 3))} if draw(st.booleans()) else {}),
            }
            namespace = draw(st.sampled_from(["a", "b"]))
            spec = PodSpec(namespace=namespace, name=name, requests=requests)
            events.append(("in", PodSubmitted(pod=spec)))
        elif kind == "selector":
            events.append(("in", PodSubmitted(pod=make_pod(name).cpu("1").selector(x="y").spec())))
        elif kind == "gang":
            events.append(("in", PodSubmitted(pod=make_pod(name).cpu("1").member("ns/g").spec())))
        elif kind == "summary":
            shard = draw(st.integers(0, shards - 1))
            summary = ShardSummary(
                shard=shard,
                seen=draw(st.integers(-1, len(events))),
                nodes=1,
                allocatable={},
                used={"cpu": draw(amounts), "nvidia.com/gpu": draw(st.integers(0, 8))},
                largest={"cpu": draw(amounts), "memory": draw(amounts)},
            )
            events.append(("relay", shard, summary))
        elif kind == "delete":
            events.append(("in", PodDeleted(pod=f"a/{name}")))
        elif kind == "quota":
            quota = QuotaSpec(namespace="a", name="q", min={"cpu": 4000}, max={"cpu": 8000})
            events.append(("in", QuotaDefined(quota=quota)))
        else:
            events.append(("in", ClockTicked()))
    return [shards, events]


def _envelopes(events: list[Any]) -> list[Envelope]:
    out = []
    for offset, item in enumerate(events):
        time = 1_000 + offset * 7
        if item[0] == "in":
            out.append(Envelope(event=item[1], time=time, offset=offset))
        else:
            _, shard, event = item
            out.append(relayed(event, shard, offset, time=time))
    return out


def _one_by_one(control: Control, records: list[Envelope]) -> list[Any]:
    """What the fold gives record by record: (offset, time after it, outputs)."""
    out = []
    for env in records:
        outputs = control.apply(env)
        out.append((env.offset, control.now, outputs))
    return out


@given(control_records(), st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(1, 8))
def test_run_router_folds_exactly_like_the_fold(
    drawn: list[Any], cuts: list[int], min_run: int
) -> None:
    shards, events = drawn
    records = _envelopes(events)
    plain = Control(Sharding(shards=shards))
    expected = _one_by_one(plain, records)
    fast = Control(Sharding(shards=shards))
    router = RunRouter(min_run=min_run)
    got = []
    start = 0
    for i in range(len(records)):  # reads of the sizes drawn, over and over
        if start >= len(records):
            break
        size = cuts[i % len(cuts)]
        got += router.fold(fast, records[start : start + size])
        start += size
    assert got == expected
    assert control_state(fast) == control_state(plain)


def test_long_runs_go_through_the_compiled_loop() -> None:
    """A load-shaped run is routed in the loop, not record by record, and a pod whose
    request is too large for exact float arithmetic sends its run back to the fold."""
    control = Control(Sharding(shards=2))
    records = [
        Envelope(
            event=make_node(f"n{i}").cpu("64").label(POOL_LABEL, f"p{i % 2}").added(), offset=i
        )
        for i in range(4)
    ]
    records += [
        Envelope(event=PodSubmitted(pod=make_pod(f"p{i}").cpu("1").spec()), offset=4 + i)
        for i in range(100)
    ]
    router = RunRouter()
    router.fold(control, records)
    # the first pod after the nodes came is the fold's (it slices quotas anew)
    assert router.routed_in_runs == 99
    assert sorted(set(control.pod_shard.values())) == [0, 1]
    huge = PodSpec(namespace="default", name="huge", requests={"cpu": EXACT})
    more = [
        Envelope(event=PodSubmitted(pod=make_pod(f"q{i}").cpu("1").spec()), offset=104 + i)
        for i in range(40)
    ]
    more.append(Envelope(event=PodSubmitted(pod=huge), offset=144))
    router.fold(control, more)
    assert router.routed_in_runs == 99 and "default/huge" in control.pod_shard


def test_forgotten_shapes_are_learnt_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``MAX_SHAPES`` shapes of request the router forgets them; what it routes is
    still the fold's."""
    monkeypatch.setattr(fastroute, "MAX_SHAPES", 3)
    records = [
        Envelope(
            event=make_node(f"n{i}").cpu("64").label(POOL_LABEL, f"p{i % 3}").added(), offset=i
        )
        for i in range(6)
    ]
    for i in range(200):
        spec = PodSpec(namespace="a", name=f"p{i}", requests={"cpu": 100 + i % 7, "memory": i % 3})
        records.append(Envelope(event=PodSubmitted(pod=spec), offset=6 + i, time=i))
    plain = Control(Sharding(shards=3))
    expected = _one_by_one(plain, records)
    fast = Control(Sharding(shards=3))
    router = RunRouter(min_run=4)
    got = []
    for start in range(0, len(records), 37):
        got += router.fold(fast, records[start : start + 37])
    assert got == expected and control_state(fast) == control_state(plain)
    assert router.routed_in_runs > 150

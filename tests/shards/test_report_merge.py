"""The run report of several partitions merged by time: the control partition's record
of a pod's end can come before its shard's record of the bind at the same instant
(:func:`shards.report.merge` puts inputs first). The pod still ends on the node it was
taken from, as at one shard, whichever of the two records comes first."""

from __future__ import annotations

import pytest

from events.types import Envelope, Event, PodBound, PodEvicted, PodPreempted, PodSubmitted
from shards.report import RunReport, merge
from tests.builders import make_pod


def _at(event: Event, time: int, partition: int) -> Envelope:
    return Envelope(event=event, time=time, partition=partition, producer="test")


@pytest.mark.parametrize(
    "end",
    [
        PodPreempted(pod="default/a", node="n3", by="default/b", shard=0),
        PodEvicted(pod="default/a", node="n3", reason="node drained", shard=0),
    ],
    ids=["preempted", "evicted"],
)
@pytest.mark.parametrize("bind_first", [False, True])
def test_a_pod_ended_in_the_instant_it_was_bound_keeps_its_node(
    end: Event, bind_first: bool
) -> None:
    bound = PodBound(pod="default/a", node="n3", decision_id="a#1", attempt=1, shard=0)
    shard = [_at(bound, 5, 0)]
    control = [
        _at(PodSubmitted(pod=make_pod("a").spec()), 0, 1),
        _at(end, 6 if bind_first else 5, 1),
    ]
    report = RunReport(control=1)
    for env in merge([shard, control]):
        report.apply(env)
    view = report.pods["default/a"]
    assert (view.phase, view.node) == ("Failed", "n3")

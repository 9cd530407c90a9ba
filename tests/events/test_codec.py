from __future__ import annotations

from typing import get_args

import pytest

from events.codec import TAGS, DecodeError, decode, decode_json, encode, encode_json, kind_of
from events.remote import KIND_CODES
from events.types import (
    BindFailed,
    ClockTicked,
    Envelope,
    Event,
    NodeAdded,
    NodeRemoved,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    NodeSpec,
    NodeUpdated,
    PodBound,
    PodDeleted,
    PodEvicted,
    PodFailed,
    PodPreempted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    PodUnschedulable,
    PreferredSchedulingTerm,
    SchedulerConfigured,
    Taint,
    Toleration,
    is_decision,
)


def one_of_each() -> list[Event]:
    node = NodeSpec(
        name="n1",
        allocatable={"cpu": 4000, "nvidia.com/gpu": 8},
        labels={"zone": "a"},
        taints=(Taint(key="gpu", value="yes", effect="NoSchedule"),),
        unschedulable=True,
    )
    term = NodeSelectorTerm(
        match_expressions=(NodeSelectorRequirement(key="zone", operator="In", values=("a", "b")),)
    )
    pod = PodSpec(
        namespace="ns",
        name="p",
        uid="u-1",
        requests={"cpu": 500, "memory": 1 << 30},
        priority=10,
        node_selector={"zone": "a"},
        required_affinity=(term,),
        preferred_affinity=(PreferredSchedulingTerm(weight=5, preference=term),),
        tolerations=(Toleration(key="gpu", operator="Exists"),),
        labels={"app": "x"},
        annotations={"a": "b"},
        runtime=5,
    )
    return [
        NodeAdded(node=node),
        NodeUpdated(node=node),
        NodeRemoved(name="n1"),
        PodSubmitted(pod=pod),
        PodDeleted(pod="ns/p"),
        PodSucceeded(pod="ns/p", node="n1"),
        PodFailed(pod="ns/p", node="n1", reason="OOM"),
        ClockTicked(),
        SchedulerConfigured(config='{"kind": "KubeSchedulerConfiguration"}'),
        PodBound(pod="ns/p", node="n1", decision_id="d", attempt=1, shard=2, score=9),
        PodUnschedulable(pod="ns/p", attempt=2, reason="r", rejections={"x": 1}, plugins=("A",)),
        BindFailed(pod="ns/p", node="n1", decision_id="d", reason="gone"),
        PodEvicted(pod="ns/p", node="n1", reason="drain"),
        PodPreempted(pod="ns/p", node="n1", by="ns/q"),
    ]


@pytest.mark.parametrize("event", one_of_each(), ids=lambda e: type(e).__name__)
def test_msgpack_and_json_round_trip(event: Event) -> None:
    envelope = Envelope(event=event, time=5, offset=3, causation=2, event_id="x", producer="p")
    assert decode(encode(envelope)) == envelope
    assert decode_json(encode_json(envelope)) == envelope


def test_tags_are_unique_and_short() -> None:
    tags = [type(e).__struct_config__.tag for e in one_of_each()]
    assert len(set(tags)) == len(tags)
    assert all(isinstance(t, str) and len(t) <= 10 for t in tags)


def test_unknown_fields_are_ignored_for_old_readers() -> None:
    raw = b'{"event": {"type": "node-", "name": "n", "added_later": 1}, "time": 1, "new": true}'
    assert decode_json(raw).event == NodeRemoved(name="n")


def test_missing_new_fields_take_defaults() -> None:
    raw = (
        b'{"event": {"type": "bind", "pod": "a/b", "node": "n", "decision_id": "d", "attempt": 1}}'
    )
    event = decode_json(raw).event
    assert isinstance(event, PodBound) and event.shard == 0 and event.score == 0


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xc1", b"\x93\x01\x02\x03", encode(Envelope(event=ClockTicked()))[:-3]],
    ids=["empty", "reserved-byte", "array", "truncated"],
)
def test_garbage_raises_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(raw)


def test_unknown_tag_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode_json(b'{"event": {"type": "no-such-kind"}}')


def test_decisions_are_the_shard_kinds() -> None:
    kinds = {type(e).__name__ for e in one_of_each() if is_decision(e)}
    assert kinds == {"PodBound", "PodUnschedulable", "PodEvicted", "PodPreempted"}


def test_every_event_kind_has_its_tag_and_one_byte_of_the_log_server() -> None:
    """``kind_of`` answers each type's own tag (looked up once), and the log server has
    a distinct byte for every one of them."""
    kinds = get_args(Event)
    assert set(TAGS) == set(kinds)
    for kind in kinds:
        assert TAGS[kind] == kind.__struct_config__.tag
    assert kind_of(Envelope(event=PodDeleted(pod="ns/a"))) == "pod-"
    assert sorted(KIND_CODES) == sorted(TAGS.values())
    assert sorted(KIND_CODES.values()) == list(range(len(kinds))) and len(kinds) <= 256


def test_no_struct_of_the_schema_is_tracked_by_the_cyclic_collector() -> None:
    """Every struct of ``events.types`` is declared ``gc=False`` (see its docstring): a
    decoded record and everything in it is left alone by the collector, which walked
    each pod's spec at every collection while the pod lived."""
    import gc

    import msgspec

    import events.types

    structs = [
        cls
        for cls in vars(events.types).values()
        if isinstance(cls, type) and issubclass(cls, msgspec.Struct)
    ]
    assert len(structs) > 40
    assert [cls.__name__ for cls in structs if cls.__struct_config__.gc] == []
    for event in one_of_each():
        record = decode(encode(Envelope(event=event, producer="p")))
        assert not gc.is_tracked(record)
        assert not gc.is_tracked(record.event)
        for value in msgspec.structs.asdict(record.event).values():
            if isinstance(value, msgspec.Struct):
                assert not gc.is_tracked(value)

"""A unit is never flown while a flight of it is still recorded (see the docstring of
:mod:`shards.coordinator.handed`): flying it again, alone (``fly``) or in a run
(``fly_run``), is a bug and raises, rather than counting the unit twice in its shard's
pending rows, in-flight count and quota charge."""

from __future__ import annotations

import pytest

from engine.model.groups import TransitionError
from engine.model.pools import POOL_LABEL
from events.types import Envelope
from shards.coordinator.coordinator import Coordinator
from tests.builders import make_node, make_pod
from tests.shards.coordinator_kit import pinned

POOLS = ("pa", "pb")


def _coordinator() -> Coordinator:
    coordinator = Coordinator(pinned(2, pa=0, pb=1))
    offset = 0
    for i in range(4):
        node = make_node(f"n{i}").cpu("8").memory("32Gi").label(POOL_LABEL, POOLS[i % 2])
        coordinator.apply(Envelope(event=node.added(), offset=offset, producer="ingest"))
        offset += 1
    for i in range(3):
        pod = make_pod(f"p{i}").cpu("1").submitted()
        coordinator.apply(Envelope(event=pod, offset=offset, producer="ingest"))
        offset += 1
    return coordinator


@pytest.mark.parametrize("again", ["fly", "fly_run"])
def test_a_unit_flown_again_is_refused(again: str) -> None:
    c = _coordinator()
    pods = [c.engine.pods[f"default/p{i}"] for i in range(3)]
    c.fly_run(pods, [0, 0, 1], ["d0", "d1", "d2"])
    assert c.inflight == [2, 1]
    with pytest.raises(TransitionError, match="default/p0: flown to shard 1 while in flight"):
        if again == "fly":
            c.fly(pods[0].key, 1, [pods[0]])
        else:
            c.fly_run(pods[:2], [1, 1], ["e0", "e1"])
    assert c.flights[pods[1].key].shard == 0


def test_a_unit_landed_may_fly_again() -> None:
    c = _coordinator()
    pods = [c.engine.pods[f"default/p{i}"] for i in range(3)]
    c.fly_run(pods, [0, 0, 1], ["d0", "d1", "d2"])
    c.land(pods[0].key)
    c.fly(pods[0].key, 1, [pods[0]])
    assert c.inflight == [1, 2]
    assert {key: f.shard for key, f in c.flights.items()} == {
        "default/p0": 1,
        "default/p1": 0,
        "default/p2": 1,
    }


def test_flights_are_not_tracked_by_the_cyclic_collector() -> None:
    """One flight per pod handed over: a msgspec struct declared ``gc=False``, as the
    records of ``tests/engine/test_untracked.py``."""
    import gc

    c = _coordinator()
    pods = [c.engine.pods[f"default/p{i}"] for i in range(3)]
    c.fly_run(pods[:2], [0, 1], ["d0", "d1"])
    c.fly(pods[2].key, 0, [pods[2]])
    assert not any(gc.is_tracked(flight) for flight in c.flights.values())

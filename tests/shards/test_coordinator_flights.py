"""A unit flown while a flight of it is still recorded (no path does so today: see the
docstring of :mod:`shards.coordinator.handed`) is counted once: the old flight leaves
its shard's pending rows, in-flight count and quota charge before the new one is
recorded, whether flown alone (``fly``) or in a run (``fly_run``)."""

from __future__ import annotations

import pytest

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


def _counts(c: Coordinator) -> tuple[list[list[list[int]]], list[int], object]:
    usage = {ns: dict(used) for ns, used in c.engine.quotas._usage.items()}
    return c._pending_rows().tolist(), list(c.inflight), usage


@pytest.mark.parametrize("again", ["fly", "fly_run"])
def test_a_unit_flown_again_is_counted_once(again: str) -> None:
    flown, once = _coordinator(), _coordinator()
    for c in (flown, once):
        pods = [c.engine.pods[f"default/p{i}"] for i in range(3)]
        c.fly_run(pods, [0, 0, 1], ["d0", "d1", "d2"])
    pods = [flown.engine.pods[f"default/p{i}"] for i in range(3)]
    if again == "fly":
        flown.fly(pods[0].key, 1, [pods[0]])
    else:
        flown.fly_run(pods[:2], [1, 1], ["e0", "e1"])
    # as if flown to its last shard only
    moved = [once.engine.pods[pod.key] for pod in pods[: 1 if again == "fly" else 2]]
    for pod in moved:
        once.land(pod.key)
    once.fly_run(moved, [1] * len(moved), ["e"] * len(moved))
    assert _counts(flown) == _counts(once)
    assert flown.inflight == ([0, 3] if again == "fly_run" else [1, 2])
    assert {key: f.shard for key, f in flown.flights.items()} == {
        key: f.shard for key, f in once.flights.items()
    }

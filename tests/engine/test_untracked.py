"""The records every process keeps per pod are not tracked by Python's cyclic collector
(msgspec structs declared ``gc=False``): each collection walked them all while the
pods lived (see ``events/types.py`` and :class:`engine.model.pods.PodInfo`)."""

from __future__ import annotations

import gc

from engine.engine import Engine
from events.types import Envelope, NodeAdded, PodSubmitted
from tests.builders import make_node, make_pod


def test_a_placed_pod_s_records_are_not_tracked_by_the_cyclic_collector() -> None:
    engine = Engine()
    engine.apply(Envelope(event=NodeAdded(node=make_node("n0").cpu("4").spec())))
    engine.apply(Envelope(event=PodSubmitted(pod=make_pod("p0").cpu("1").spec())))
    engine.apply(Envelope(event=PodSubmitted(pod=make_pod("p1").cpu("8").spec())))
    engine.schedule()
    info = engine.pods["default/p0"]
    assert not gc.is_tracked(info) and not gc.is_tracked(info.spec)
    placed = engine.state.pods["default/p0"]
    assert not gc.is_tracked(placed)
    waiting = engine.queue._entries["default/p1"]  # (too large: it waits in the queue)
    assert not gc.is_tracked(waiting)

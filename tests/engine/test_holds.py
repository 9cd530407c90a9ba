"""A moved pod's room is held for its replacement (the rescheduler in Kubernetes).

node1 runs podA (4 cards) and web-1 (3 cards, of ReplicaSet web); node2 runs a pod of 5
cards that stays. podC (4 cards) fits nowhere: the rescheduler moves web-1 to node2. In
Kubernetes the move is an eviction (``MigrationEvicted``): when web-1 is gone, its 3
cards on node2 stay held for web's next pod, not for anyone else, until it comes or
the hold runs out.
"""

from __future__ import annotations

import msgspec

from engine.engine import Engine
from events.types import (
    ClockTicked,
    Event,
    MigrationEvicted,
    PodBound,
    PodDeleted,
    PodMigrated,
    PodSpec,
    PodSubmitted,
)
from tests.builders import env, make_node, make_pod


def _owned(spec: PodSpec, owner: str) -> PodSpec:
    return msgspec.structs.replace(spec, owner=owner)


def _run(engine: Engine, events: list[Event], at: int) -> list[Event]:
    for event in events:
        engine.apply(env(event, at))
    out = engine.schedule()
    engine.state.check_invariants()
    return out


def _moved(engine: Engine) -> PodMigrated:
    for name in ("node1", "node2"):
        engine.apply(env(make_node(name).cpu("64").memory("256Gi").gpu(8).added()))
    placed = [
        make_pod("podA").gpu(4).on("node1").submitted(),
        PodSubmitted(pod=_owned(make_pod("web-1").gpu(3).on("node1").spec(), "ReplicaSet/web")),
        PodSubmitted(
            pod=msgspec.structs.replace(
                make_pod("stay").gpu(5).on("node2").spec(),
                annotations={"shoal.io/migratable": "false"},
            )
        ),
    ]
    _run(engine, placed, 0)
    out = _run(engine, [make_pod("podC").gpu(4).submitted()], 1)
    (move,) = [e for e in out if isinstance(e, PodMigrated)]
    assert move.pod == "default/web-1" and move.to_node == "node2"
    bound = {e.pod: e.node for e in out if isinstance(e, PodBound)}
    assert bound == {"default/podC": "node1"}
    return move


def _evicted(engine: Engine, move: PodMigrated, at: int) -> None:
    carried = MigrationEvicted(pod=move.pod, to_node=move.to_node, decision_id=move.decision_id)
    _run(engine, [carried, PodDeleted(pod=move.pod)], at)


def test_the_room_waits_for_the_owners_next_pod() -> None:
    engine = Engine()
    move = _moved(engine)
    _evicted(engine, move, 2)
    # someone else asking for those 3 cards does not get them
    out = _run(engine, [make_pod("other").gpu(3).submitted()], 3)
    assert not [e for e in out if isinstance(e, PodBound)]
    # the replacement does
    replacement = _owned(make_pod("web-2").gpu(3).spec(), "ReplicaSet/web")
    out = _run(engine, [PodSubmitted(pod=replacement)], 4)
    assert {e.pod: e.node for e in out if isinstance(e, PodBound)} == {"default/web-2": "node2"}
    assert not engine.holds


def test_a_hold_runs_out() -> None:
    engine = Engine()
    move = _moved(engine)
    _evicted(engine, move, 2)
    out = _run(engine, [make_pod("other").gpu(3).submitted()], 3)
    assert not [e for e in out if isinstance(e, PodBound)]
    assert engine.next_wakeup() is not None
    out = _run(engine, [ClockTicked()], 2 + 121)  # seconds
    assert {e.pod: e.node for e in out if isinstance(e, PodBound)} == {"default/other": "node2"}
    assert not engine.holds


def test_a_pod_gone_without_being_moved_holds_nothing() -> None:
    """Deleted after it moved in a simulated cluster (no eviction said): nothing held."""
    engine = Engine()
    move = _moved(engine)
    _run(engine, [PodDeleted(pod=move.pod)], 2)
    assert not engine.holds
    out = _run(engine, [make_pod("other").gpu(3).submitted()], 3)
    assert {e.pod: e.node for e in out if isinstance(e, PodBound)} == {"default/other": "node2"}

"""Where a pass's decisions go: the one port between the pass and the engine's place.

A pass decides the same way wherever its engine runs; what differs is what a decision
becomes. An engine that owns its nodes (one shard, or a shard of many) binds and evicts
itself (:class:`Local`). The coordinator of several shards runs the same pass over its
view of every shard: it may hand a unit to a shard that will certainly hold it instead
of deciding the node itself, and what it decides becomes requests to the shards that
own the nodes (``shards.coordinator``). Both sides implement :class:`Dispatch`.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Protocol

from engine.model.pods import PodInfo
from engine.model.state import Ints
from engine.model.statement import Statement
from events.types import PodBound, PodMigrated, PodPreempted, PodUnbound

if TYPE_CHECKING:
    from engine.passes.run import SchedulingPass


Placed = list[tuple[PodInfo, int, int]]
"""(pod, slot, score) of each pod an attempt placed."""


class Route(Enum):
    """What becomes of a unit the queue hands the pass."""

    ATTEMPT = "attempt"
    """Decide it here: filter, score, preempt if need be."""
    HANDED = "handed"
    """Handed to someone who will place it (it left the queue)."""
    WAIT = "wait"
    """Not now: back to the head of the queue, and the pass stops there."""


class Dispatch(Protocol):
    waits: bool
    """Whether units are routed: :meth:`route` is asked before each one and may answer
    :attr:`Route.WAIT` (the pass then looks at the head of the queue before taking it).
    False: the pass attempts every unit itself, and :meth:`route` is never asked."""

    def route(self, p: SchedulingPass, unit: str) -> Route:
        """Before unit ``unit`` (a pod key, or ``@group``) is attempted. May hand it on
        (then it must take it out of the queue and mark it dispatched in the model)."""
        ...

    def commit(self, p: SchedulingPass, statement: Statement | None, placed: Placed) -> bool:
        """Make a successful attempt (a pod, or a whole gang) happen: the evictions
        ``statement`` staged, then ``placed`` (pod, slot, score). With a statement, the
        placements are already assumed in the state by it; without one (a pod that
        simply fits), nothing is staged yet. True: placed; False: only the evictions
        are under way, and the unit waits for them (it must not be queued meanwhile)."""
        ...

    def unbound(self, p: SchedulingPass, event: PodUnbound) -> None:
        """A placement this engine made is taken back (a gang rolled back after a failed
        bind); the state already forgot it."""
        ...

    def rolled_back(self, p: SchedulingPass, group: str, reason: str) -> None:
        """Gang ``group`` was rolled back (Pending again; each placed member was taken
        back first, through :meth:`unbound`). Members of it handed on alone while it ran
        and not answered yet must be let go too, by whoever they were handed to: they
        wait with the gang now. Called once per rollback, after the gang is Pending."""
        ...

    def first(self, p: SchedulingPass) -> list[str]:
        """Units to attempt before the queue, in order (a preemptor whose victims are
        gone: the room they left is its own, as when one scheduler evicts and places in
        one step)."""
        ...

    def slot_owners(self) -> Ints | None:
        """Per slot, the shard that owns its node (negative: none; the array may be
        shorter than the state's slots), or None where this engine owns every node.
        Among equally good topology domains, one owned by fewer shards is preferred."""
        ...


class Local:
    """An engine that owns its nodes: evictions and bindings are its own decisions."""

    waits = False

    def unbound(self, p: SchedulingPass, event: PodUnbound) -> None:
        p.out.append(event)

    def rolled_back(self, p: SchedulingPass, group: str, reason: str) -> None:
        pass  # nothing is handed on from an engine that owns its nodes

    def first(self, p: SchedulingPass) -> list[str]:
        return []

    def route(self, p: SchedulingPass, unit: str) -> Route:
        return Route.ATTEMPT

    def slot_owners(self) -> Ints | None:
        return None

    def commit(self, p: SchedulingPass, statement: Statement | None, placed: Placed) -> bool:
        if statement is None:
            for pod, slot, score in placed:
                bind(p, pod, slot, score)
            return True
        e = p.e
        freed: list[int] = []
        for op in statement.ops:
            if op.kind != "evict":
                continue
            by = op.by or placed[0][0].key
            node = e.state.names[op.slot] or ""
            p.out.append(PodPreempted(pod=op.key, node=node, by=by, shard=e.shard))
            e.count("preempted")
            victim = e.pods.get(op.key)
            group = e.groups.get(victim.spec.group) if victim else None
            e.finish(op.key, "Failed")
            if group is not None:
                group.reason = f"preempted by {by}"
            freed.append(op.slot)
        for key, origin, slot, by in statement.moves():
            migrate(p, key, origin, slot, by)
        statement.commit()
        for pod, slot, score in placed:
            bind(p, pod, slot, score)
        p.freed(freed)
        return True


def migrate(p: SchedulingPass, key: str, origin: int, slot: int, by: str) -> None:
    """Pod ``key``, staged from ``origin`` onto ``slot`` (already assumed there), moves:
    it restarts there under a new decision (``PodMigrated``)."""
    e = p.e
    pod = e.pods[key]
    pod.attempts += 1
    decision_id = f"{key}@{pod.seq}#{pod.attempts}"
    e.place(key, slot, decision_id)
    p.out.append(
        PodMigrated(
            pod=key,
            from_node=e.state.names[origin] or "",
            to_node=e.state.names[slot] or "",
            by=by,
            decision_id=decision_id,
            shard=e.shard,
            devices=e.state.pods[key].devices,
        )
    )
    e.count("migrated")


def bind(p: SchedulingPass, pod: PodInfo, slot: int, score: int) -> None:
    """Place ``pod`` on ``slot`` here and say so (``PodBound``)."""
    e = p.e
    delegated = e.delegated.get(pod.key)
    decision_id = delegated or f"{pod.key}@{pod.seq}#{pod.attempts}"
    e.place(pod.key, slot, decision_id, devices=p.devices.pop(pod.key, None))
    node = e.state.names[slot]
    assert node is not None
    if delegated is not None:
        e.placed_here[pod.key] = node
    p.out.append(
        PodBound(
            pod=pod.key,
            node=node,
            decision_id=decision_id,
            attempt=pod.attempts,
            shard=e.shard,
            score=score,
            devices=e.state.pods[pod.key].devices,
        )
    )
    e.count("bound")
    if pod.spec.group in e.groups:
        e.group_changes[pod.spec.group] = None

"""Where a pass's decisions go: the one port between the pass and the engine's place.

A pass decides the same way wherever its engine runs; what differs is what a decision
becomes. An engine that owns its nodes (one shard, or a shard of many) binds and evicts
itself (:class:`Local`). The coordinator of several shards runs the same pass over its
view of every shard: it may hand a unit to a shard that will certainly hold it instead
of deciding the node itself, and what it decides becomes requests to the shards that
own the nodes (``shards.coordinator``). Both sides implement :class:`Dispatch`.
"""

from __future__ import annotations

from engine.model.pods import PodInfo
from engine.model.state import Ints
from engine.model.statement import Statement
from engine.passes.context import Dispatch, PassContext, Placed, Route
from events.types import PodBound, PodMigrated, PodPreempted, PodUnbound


class Local:
    """An engine that owns its nodes: evictions and bindings are its own decisions."""

    waits = False

    def unbound(self, p: PassContext, event: PodUnbound) -> None:
        p.out.append(event)

    def rolled_back(self, p: PassContext, group: str, reason: str) -> None:
        pass  # nothing is handed on from an engine that owns its nodes

    def first(self, p: PassContext) -> list[str]:
        return []

    def route(self, p: PassContext, unit: str) -> Route:
        return Route.ATTEMPT

    def done(self, p: PassContext) -> None:
        pass  # every decision was carried out as it was made

    def slot_owners(self) -> Ints | None:
        return None

    def commit(self, p: PassContext, statement: Statement | None, placed: Placed) -> bool:
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


def migrate(p: PassContext, key: str, origin: int, slot: int, by: str) -> None:
    """Pod ``key``, staged from ``origin`` onto ``slot`` (already assumed there), moves:
    it restarts there under a new decision (``PodMigrated``)."""
    e = p.e
    pod = e.pods[key]
    pod.attempts += 1
    decision_id = f"{key}@{pod.seq}#{pod.attempts}"
    e.place(key, slot, decision_id, moved=True)
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


def bind(p: PassContext, pod: PodInfo, slot: int, score: int) -> None:
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


__all__ = ["Dispatch", "Local", "Placed", "Route", "bind", "migrate"]

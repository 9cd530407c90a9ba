"""The shard's side of the coordinator's requests, at the start of each pass.

Parts held for the coordinator (:mod:`engine.model.reservations`) are committed (a
``PodBound`` for each pod), released (aborted, broken by a failed bind, or expired:
``PodUnbound`` for what was bound, then ``ReservationReleased``), and what the
coordinator asked to evict is evicted (``PodPreempted``). A pod or gang the coordinator
handed over and this shard cannot place is handed back (``PodHandedBack``). A part
whose every pod runs here already, on the node the request says it moves from, is
moves within this shard (:func:`move_here`).
"""

from __future__ import annotations

from typing import Final

from engine.fold import handed_back, part_closed
from engine.framework.cycle import CycleState
from engine.model.groups import FAILED
from engine.model.reservations import COMMITTED, COMMITTING, HELD, STAGING, Reservation, decision_id
from engine.model.shard import ShardModel
from engine.model.state import held_devices
from engine.model.statement import Statement
from engine.passes.context import PassContext
from engine.passes.dispatch import migrate
from engine.plugins.migration import unpinned
from events.types import (
    PodBound,
    PodHandedBack,
    PodMigrated,
    PodPreempted,
    PodUnbound,
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
)


def settle_reservations(p: PassContext) -> None:
    """Commit what was committed, let go of what was aborted, broken or expired."""
    e = p.e
    for rid in sorted(e.reservations):
        res = e.reservations.get(rid)
        if res is None:
            continue  # (a pod that left for another shard took its own part with it)
        if res.state == COMMITTING:
            commit(p, res)
        if res.ending:
            release(p, res, res.ending)
        elif res.state in (STAGING, HELD) and res.expires_at <= e.now:
            release(p, res, "expired: no commit before the reservation's time-out")


def commit(p: PassContext, res: Reservation) -> None:
    e = p.e
    for key in res.lifted:
        # moved to other shards by the same plan: they run there now, not here
        if key in e.pods and key not in e.state.pods:
            e.finish(key, FAILED)
    res.lifted = {}
    for key in res.pods:
        slot = e.state.pods[key].slot if key in e.state.pods else None
        if key in res.bound or slot is None:
            continue
        node = e.state.names[slot] or ""
        pod = e.pods[key]
        res.bound.add(key)
        if key in res.moves:
            p.out.append(
                PodMigrated(
                    pod=key,
                    from_node=res.moves[key],
                    to_node=node,
                    by=res.moved_by.get(key, res.moved_for),
                    decision_id=decision_id(key, res.rid),
                    shard=e.shard,
                    devices=e.state.pods[key].devices,
                )
            )
            e.count("migrated")
            continue
        p.out.append(
            PodBound(
                pod=key,
                node=node,
                decision_id=decision_id(key, res.rid),
                attempt=pod.attempts,
                shard=e.shard,
                devices=e.state.pods[key].devices,
            )
        )
        e.count("bound")
    res.advance(COMMITTED)


def release(p: PassContext, res: Reservation, reason: str) -> None:
    """Let ``res`` go: unbind what was bound, then forget the part."""
    e = p.e
    for key in res.pods:
        if key in res.bound and key in e.state.pods:
            slot = e.state.pods[key].slot
            p.out.append(
                PodUnbound(
                    pod=key,
                    node=e.state.names[slot] or "",
                    decision_id=decision_id(key, res.rid),
                    reason=f"reservation {res.rid} {reason}",
                    shard=e.shard,
                )
            )
    event = ReservationReleased(rid=res.rid, group=res.group, reason=reason, shard=e.shard)
    part_closed(e, event)
    p.out.append(event)


def evict(p: PassContext, victims: dict[str, str]) -> dict[str, str]:
    """Evict what the coordinator chose to evict (``victims``: pod → the pod it makes
    room for), those still placed here. Returns the victims on their way here: pods of
    a part the coordinator asked this shard to hold, or handed to a node here, before
    it asked for the evictions, not placed yet (the pass evicts them once it has placed
    them)."""
    e = p.e
    coming = {k for request in e.requests.values() for k in request.placements}
    later: dict[str, str] = {}
    for key, by in victims.items():  # (in the order chosen: one scheduler evicts so)
        placed = e.state.pods.get(key)
        if placed is None or key not in e.pods:
            if key in coming or (key in e.pods and (key in e.reserved or key in e.routed_nodes)):
                later[key] = by
            continue
        node = e.state.names[placed.slot] or ""
        p.out.append(PodPreempted(pod=key, node=node, by=by, shard=e.shard))
        e.count("preempted")
        e.finish(key, "Failed")
    p.failed.clear()
    return later


RESOLVABLE: Final = frozenset({"NodeResourcesFit", "ElasticQuota", "Coscheduling"})
"""Rejecting plugins whose verdict changes when capacity frees up."""


def hand_back(
    p: PassContext,
    *,
    pod: str = "",
    group: str = "",
    reason: str,
    plugins: tuple[str, ...] = (),
    decision_id: str = "",
) -> None:
    event = PodHandedBack(
        pod=pod,
        group=group,
        reason=reason,
        shard=p.e.shard,
        resolvable=bool(RESOLVABLE.intersection(plugins)),
        decision_id=decision_id,
    )
    handed_back(p.e, event)
    p.out.append(event)


def moves_within(m: ShardModel, request: ReservationRequested) -> bool:
    """Whether ``request`` asks this shard to move pods it runs to other nodes of its
    own (the coordinator's plan of moves within one shard, when it also moves pods
    across shards or places on another shard): every pod of it runs here, on the node
    it moves from."""
    if not request.moves or set(request.moves) != {spec.key for spec in request.pods}:
        return False
    state = m.state
    for key, node in request.moves.items():
        placed = state.pods.get(key)
        if key not in m.pods or placed is None or state.names[placed.slot] != node:
            return False
    return True


def move_here(p: PassContext, request: ReservationRequested) -> None:
    """Move the pods of ``request`` to the nodes it names (on the GPU cards it names
    where they have room), all or none: each must pass its profile's filters there
    (this shard's own pods; the coordinator checked the rest), then each is a
    ``PodMigrated`` made for ``moved_for`` and the part is
    granted (so the coordinator's claim completes as for moves across shards), or it
    is denied, nothing moved."""
    e = p.e
    statement = Statement(e.state, e.quotas)
    keys = sorted(request.moves)
    moved_by = request.moved_by
    for key in keys:
        statement.lift(key, e.pods[key].spec.namespace, moved_by.get(key, request.moved_for))
    why = ""
    for key in keys:
        node = request.placements.get(key, "")
        slot = e.state.index.get(node)
        pod = unpinned(e.pods[key])
        framework = p.profiles.framework_for(pod)
        if (
            slot is None
            or framework is None
            or not framework.feasible(CycleState(), pod, e.state, local_only=True)[slot]
        ):
            why = f"{key} no longer fits node {node or '?'}"
            break
        cards = e.state.cards_if_free(slot, pod.request, request.devices.get(key))
        statement.land_pod(pod, slot, moved_by.get(key, request.moved_for), cards)
    if why:
        statement.discard()
        p.out.append(
            ReservationDenied(rid=request.rid, group=request.group.key, reason=why, shard=e.shard)
        )
        return
    for key, origin, slot, by in statement.moves():
        migrate(p, key, origin, slot, by)
    statement.commit()
    p.out.append(
        ReservationGranted(
            rid=request.rid,
            group=request.group.key,
            placements={k: e.state.names[e.state.pods[k].slot] or "" for k in keys},
            shard=e.shard,
            devices=held_devices(e.state, keys),
        )
    )

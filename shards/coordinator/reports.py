"""The fold of what shards report, relayed into the control partition.

A shard's summary says where it placed the pods it was handed (folded in bulk:
:meth:`Reports._placed`, :func:`engine.model.bulk.place_all`), and which GPU cards
they hold; a hand-back sends a unit back to the coordinator's queue, decided here the
next time; reservation answers advance a claim (:mod:`shards.coordinator.flights`:
granted → committed, denied or released → aborted); evictions and moves a shard made
are made in the view too.

**Cost per pod placed** (5,000 nodes, one template, 2 shards, a busy 2-core machine):
about 3-4 µs, down from about 10: per pod, its flight taken off and its record in the
view (:meth:`engine.model.state.ClusterState.assume_all`); the node columns change once
per request, priority and node, what the shard has pending once per run of flights
(which share their labels and requests) and report.
"""

from __future__ import annotations

from typing import Any, Final

from engine.engine import Engine
from engine.model.bulk import place_all
from engine.model.changes import ClusterEvent
from engine.model.groups import FAILED, PENDING, SCHEDULED, advance, is_group_unit
from engine.model.reservations import decision_id
from engine.model.state import Request
from engine.passes.consolidate import BY as CONSOLIDATION
from engine.passes.defrag import BY as DEFRAGMENTATION
from events.types import (
    BindFailed,
    Event,
    NodeAdded,
    NodeSpec,
    PodAdopted,
    PodDeleted,
    PodEvicted,
    PodHandedBack,
    PodMigrated,
    PodPreempted,
    PodRejected,
    PodUnbound,
    PoolHandedOver,
    ReservationAborted,
    ReservationCommitted,
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    ShardSummary,
)
from shards.coordinator.flights import (
    ABORTING,
    COMMITTED,
    MOVES,
    PREPARING,
    Claim,
)
from shards.coordinator.handed import Handed

MADE_ON_ITS_OWN: Final = frozenset({CONSOLIDATION, DEFRAGMENTATION})
"""What the moves made with no pod waiting name as made by (``PodMigrated.by``)."""


class Reports(Handed):
    """The fold of the shards' reports (see the module's docstring)."""

    def _report(self, event: Event, shard: int) -> None:
        match event:
            case ShardSummary(placed=placed, nodes=nodes):
                self.shard_nodes[shard] = nodes
                self._placed(placed, shard)
                self._align_devices(event.devices)
            case PodHandedBack(pod=key, group=""):
                self._handed_back(key, shard, event.reason, event.decision_id)
            case ReservationGranted():
                self._granted(event, shard)
            case ReservationDenied() | ReservationReleased():
                self._closed(event, shard)
            case PodMigrated(pod=key):
                # a shard moved a pod to make room: the view moves it too; moved in
                # from another shard's node, that shard forgets it (it runs elsewhere)
                if key in self.engine.pods and key in self.engine.state.pods:
                    self.engine.apply_decision(event)
                    if event.by not in MADE_ON_ITS_OWN:
                        self.moved_since[key] = None
                source = self.routing.node_shard.get(event.from_node)
                if source is not None and source != shard:
                    self.send(source, PodDeleted(pod=key))
                if key in self.evicting:
                    self._victim_gone(key)
            case PodPreempted(pod=key) | PodEvicted(pod=key) | PodRejected(pod=key):
                if key in self.engine.pods:
                    self.engine.finish(key, FAILED, held_for=self.evicting.get(key, ""))
                self._gone(key)
            case PodUnbound(pod=key):
                self._unbound(event)
            case PoolHandedOver():
                self._take_over(event)
            case _:
                pass

    def _placed(self, placed: dict[str, str], shard: int) -> None:
        """Fold a shard's placements, in bulk: each pod is placed in the view (its
        quota, charged while it flew, is its placement's charge), and what the shard
        had pending falls once per distinct request, by how many pods asked for it,
        not once per pod (see :meth:`_uncount`)."""
        engine = self.engine
        index = engine.state.index
        live = engine.pods
        held = engine.state.pods
        flights = self.flights
        decisions = self.decisions
        flying = self.flying_labels()
        # the flights landed, by the identity of their labels and requests (a run's
        # flights share both tuples): [a flight, how many], counted out of ``flying``
        # and of what the shard has pending once per run, not once per pod
        flown: dict[tuple[int, int], list[Any]] = {}
        run: list[tuple[str, int, str]] = []
        directed = self.directed
        for key, node in placed.items():
            if directed and directed.get(key) == shard:
                del directed[key]  # placed in the view when it was decided
                continue
            flight = flights.get(key)
            if flight is None or flight.shard != shard:
                continue  # not handed there (any more)
            slot = index.get(node)
            if slot is not None and key in live and key not in held:
                del flights[key]
                group = (id(flight.labels), id(flight.requests))
                seen = flown.get(group)
                if seen is None:
                    flown[group] = [flight, 1]
                else:
                    seen[1] += 1
                run.append((key, slot, decisions.get(key, key)))
                continue
            if run:
                place_all(engine, run, charged=True)
                run = []
            self.land(key)
            if slot is not None and key in live:
                engine.place(key, slot, decisions.get(key, key))
        if run:
            place_all(engine, run, charged=True)
        pods = 0
        counts: dict[Request, int] = {}
        for flight, count in flown.values():
            self.count_flying(flying, flight, -count)
            pods += count * len(flight.pods)
            for request in flight.requests:
                counts[request] = counts.get(request, 0) + count
        if pods:
            self._uncount(shard, counts, pods)

    def _handed_back(self, key: str, shard: int, reason: str, decision: str = "") -> None:
        engine = self.engine
        self.counters["handbacks"] += 1
        if "@" in decision:  # a part held it there, and its bind failed
            self._left_part(key, decision.split("@", 1)[1])
        if self.directed.get(key) == shard:
            # it no longer fit the node the view chose: the view lets it go as a failed
            # bind (below), and decides it again here after its back-off
            del self.directed[key]
            self.hard[key] = None
        flight = self.flights.get(key)
        if flight is not None and flight.shard == shard:
            if flight.moves:  # its shard found no plan of moves: bounded as a gang's are
                self.moves_refused[key] = self.moves_refused.get(key, 0) + 1
            self.land(key)
            if key in engine.pods:
                self._requeue(key, hard=True)
            return
        # a placed pod whose bind failed: as one shard folds a failed bind
        current = engine.bindings.get(key)
        placed = engine.state.pods.get(key)
        if current is None or placed is None:
            return
        node = engine.state.names[placed.slot] or ""
        self._unclaim(key)
        engine.apply_decision(
            BindFailed(pod=key, node=node, decision_id=decision or current, reason=reason)
        )

    def _align_devices(self, devices: dict[str, tuple[int, ...]]) -> None:
        """Hold, in the view, the GPU cards the shard chose for its pods (the view chose
        its own when it placed them, perhaps others)."""
        state = self.engine.state
        for key, cards in sorted(devices.items()):
            placed = state.pods.get(key)
            if placed is not None and placed.devices != cards:
                state.forget(key)
                state.assume(key, placed.slot, placed.request, placed.priority, placed.ports, cards)

    def _granted(self, event: ReservationGranted, shard: int) -> None:
        claim = self.claims.get(event.rid)
        if claim is None or shard not in claim.open or claim.stage != PREPARING:
            return
        engine = self.engine
        claim.granted[shard] = None
        if not claim.directed:
            # a gang handed over whole: where the shard put it
            self.land(claim.unit)
            for key, node in event.placements.items():
                slot = engine.state.index.get(node)
                if slot is not None and key in engine.pods:
                    engine.place(key, slot, decision_id(key, event.rid))
                    self.claim_of[key] = event.rid
            group = engine.groups.get(claim.unit[1:]) if is_group_unit(claim.unit) else None
            if group is not None and group.phase == PENDING:
                advance(group, SCHEDULED)
                engine.group_changes[group.key] = None
                engine.wake(group.key)
        self._align_devices(event.devices)
        if len(claim.granted) == len(claim.parts):
            if len(claim.parts) > 1:
                for part in sorted(claim.parts):
                    self.send(part, ReservationCommitted(rid=claim.rid))
            claim.advance(COMMITTED)
            self.counters["committed"] += 1

    def _closed(self, event: ReservationDenied | ReservationReleased, shard: int) -> None:
        claim = self.claims.get(event.rid)
        if claim is None or shard not in claim.open:
            return
        del claim.open[shard]
        claim.granted.pop(shard, None)
        if MOVES in claim.rid and isinstance(event, ReservationDenied):
            self.moves_refused[claim.unit] = self.moves_refused.get(claim.unit, 0) + 1
            # the plan will not be carried out whole: its unit is tried again now, not
            # after the nomination's time-out (meanwhile the queue waited behind it)
            self.end_nomination(claim.unit)
        if claim.stage in (PREPARING, COMMITTED):
            self._abort(claim, f"shard {shard}: {event.reason}")
        if not claim.open:
            self._forget_claim(claim)

    def _abort(self, claim: Claim, reason: str) -> None:
        """Abort every open part; take back what the view placed; queue the unit again."""
        engine = self.engine
        claim.advance(ABORTING)
        self.counters["aborted"] += 1
        for shard in sorted(claim.open):
            self.send(shard, ReservationAborted(rid=claim.rid, reason=reason))
        if not claim.directed:
            self.land(claim.unit)  # its quota no longer charged
        for key in claim.pods:
            if self.claim_of.get(key) == claim.rid and key in engine.pods:
                del self.claim_of[key]
                slot = engine.release(key)
                if slot is not None:
                    engine.fire(ClusterEvent.POD_FREED, slot)
        group = engine.groups.get(claim.unit[1:]) if is_group_unit(claim.unit) else None
        if group is not None and group.phase == SCHEDULED:
            engine.pending_again(group, f"pod group {group.key}: {reason}")
            engine.group_changes[group.key] = None
        if group is not None:
            self.recall(group.key, f"pod group {group.key}: {reason}")
        unit = claim.unit
        if group is None and unit in engine.pods:
            unit = engine.unit_of(unit)
        self._requeue(unit, hard=True, backoff=True)

    def _unbound(self, event: PodUnbound) -> None:
        """A shard unbound a pod on its own (its part was let go there): so does the view;
        a gang that falls below minMember by it is Pending again."""
        engine = self.engine
        if engine.bindings.get(event.pod) == event.decision_id:
            self.claim_of.pop(event.pod, None)
            engine.apply_decision(event)
            pod = engine.pods.get(event.pod)
            if pod is not None and pod.spec.group:
                self.recall(pod.spec.group, event.reason)

    def _take_over(self, event: PoolHandedOver) -> None:
        engine = self.engine
        nodes = self.routing.moving.pop(event.pool, None)
        if nodes is None:
            return
        shard = event.to
        for name in nodes:
            slot = engine.state.index.get(name)
            if slot is None:
                continue
            spec = engine.pools.labelled(_spec_of(engine, slot))
            self.routing.own(spec, shard, slot)
            self.send(shard, NodeAdded(node=spec))
        self.ownership_changed()
        for placement in event.placements:
            self.send(shard, PodAdopted(placement=placement))


def _spec_of(engine: Engine, slot: int) -> NodeSpec:
    """The node in ``slot`` of the view, as a spec (its pool moved to another shard)."""
    state = engine.state
    names = state.resources.names
    return NodeSpec(
        name=state.names[slot] or "",
        allocatable={
            names[row]: int(state.alloc[row, slot])
            for row in range(state.alloc.shape[0])
            if state.alloc[row, slot]
        },
        labels=dict(state.node_labels[slot]),
        taints=state.node_taints[slot],
        unschedulable=bool(state.unschedulable[slot]),
        annotations=dict(state.node_annotations[slot]),
    )

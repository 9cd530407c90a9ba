"""The coordinator of several shards: one fold of the control partition, and passes.

**Cost per plain pod** (5,000 nodes, 20,000 pods of ``shoal loadtest``'s mix of 42
shapes, 2 shards; CPU of :meth:`apply` and :meth:`schedule` alone, the records fed in
batches of 1,000 with the shards' placements, no log; a busy 2-core machine, November
2026): about 50 µs, down from about 80-90, split as

- *folding the submission*, about 20 µs: the record's checks
  (:func:`engine.refusals.refused`), its :class:`~engine.model.pods.PodInfo`, the
  queue; per pod, in the engine's fold (the next cost to batch: a bulk submit);
- *handing it over*, about 15-20 µs, down from 45-55: the plain pods at the head of
  the queue go in one step (:func:`~shards.coordinator.batches.hand_batch`),
  the checks made once per kind of pod in the step, the choice of shard one
  vectorised score per kind (:func:`shards.coordinator.choice.run_scores`), what each
  shard has pending and the quota charged once per kind and shard
  (:meth:`Coordinator.fly_run`); left per pod: taking it out of the queue, its
  ``PodRouted`` and decision id, its flight;
- *folding where the shard placed it*, about 11 µs: in bulk per report
  (:meth:`Coordinator._placed`), but each placement is assumed in the view one by one
  (:meth:`engine.model.shard.ShardModel.place`), as the view must hold every pod for
  preemption and reclaim over every node.

Per batch (not per pod): per kind of pod, the count of its feasible nodes per shard
and the shards' sums over them (:meth:`Coordinator.cached`, computed again when
placements changed the view): O(nodes) per kind and batch, about 1 µs per pod at
5,000 nodes and 42 kinds in batches of 1,000, growing with the cluster (shards
publishing their per-kind capacities, or sums kept up to date from the journal of
changed nodes, would make it O(changed nodes); not done yet). The inter-pod rule
check reads only the pods placed since it last looked
(:meth:`engine.model.podtable.PodTable._terms_placed`). What the exact path costs (units
decided here) is in :mod:`shards.coordinator.dispatch`.

With N shards the log has N + 1 partitions: partition ``i`` is shard ``i``'s own, the
last one is the *control* partition. Ingest (and the cluster's own voice: pods that
finished, nodes lost) appends there, and so do the relayed copies of what shards report
(see :mod:`shards.control`). The coordinator folds the control partition into one
engine over the whole cluster (its *view*: every node, every pod, every placement,
quotas counted across all shards), and runs that engine's passes, with the same
profiles, plugins and queue as one shard. Its dispatch (:mod:`shards.coordinator.dispatch`)
hands each unit to a shard that certainly holds it, or decides it here and asks the
shards that own the nodes to carry it out. So what one shard guarantees, N shards
guarantee: one queue orders the cluster, quotas are global, preemption and reclaim
choose among every node, and a gang is placed whole across shards or not at all.

Like a shard, the coordinator is a pure function of its partition: ``apply`` folds a
record (an input: forwarded to the shard that owns it, and folded into the view; or a
shard's report), ``schedule`` runs a pass and returns the records to append (to shard
partitions and to the control partition). A restarted coordinator folds its partition
again, re-running each recorded pass where it ran, and appends only what is missing;
``replay --verify`` does the same and compares.

Why one module of about 800 lines: the fold of every record kind and the pass are one
state machine over the same state (view, flights, claims, evictions); where a concern
stands alone it has its module (dispatch, choice, flights, routing, snapshot).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from engine.config import SchedulerConfig
from engine.engine import Engine
from engine.framework.registry import Registry
from engine.model.bulk import place_all
from engine.model.changes import ClusterEvent
from engine.model.groups import FAILED, PENDING, SCHEDULED, advance, group_unit, is_group_unit
from engine.model.pods import PodInfo
from engine.model.pools import Sharding
from engine.model.reservations import decision_id
from engine.model.state import Bools, Request, request_delta
from engine.refusals import CHECKED, MAX_TIME, refused
from events.types import (
    SECOND,
    BindFailed,
    ClockTicked,
    DisruptionBudgetDeleted,
    DisruptionBudgetSet,
    Envelope,
    Event,
    NodeAdded,
    NodeRemoved,
    NodeSpec,
    NodeUpdated,
    Placement,
    PodAdopted,
    PodBound,
    PodDeleted,
    PodEvicted,
    PodFailed,
    PodHandedBack,
    PodMigrated,
    PodPreempted,
    PodRejected,
    PodSubmitted,
    PodSucceeded,
    PodUnbound,
    PoolHandedOver,
    PoolReassigned,
    PoolReleased,
    ReservationAborted,
    ReservationCommitted,
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    SchedulerConfigured,
    ShardingConfigured,
    ShardSummary,
    SnapshotTaken,
)
from shards import plugins
from shards.coordinator.dispatch import ShardDispatch
from shards.coordinator.flights import (
    ABORTING,
    COMMITTED,
    MOVES,
    PREPARING,
    Claim,
    Flight,
)
from shards.coordinator.routing import NONE, Routing

ROUTER: Final = "router"
"""The producer of the coordinator's records (in every partition)."""
RELAY: Final = "relay"
COORDINATOR: Final = -1
"""``shard`` of the decisions the coordinator makes itself."""

Output = tuple[int, Event]
"""(partition, event) for the worker to append after a pass."""
T = TypeVar("T")


def relay_source(producer: str, shards: int) -> int | None:
    """The shard partition a relayed copy came from (None: not a valid relay)."""
    text = producer.removeprefix(f"{RELAY}-")
    if text == producer or not (text.isascii() and text.isdigit()):
        return None
    source = int(text)
    return source if source < shards else None


class Coordinator:
    """One engine over every shard's nodes; ``apply`` a control record, ``schedule`` a
    pass."""

    def __init__(
        self,
        sharding: Sharding,
        config: SchedulerConfig | None = None,
        registry: Registry | None = None,
    ) -> None:
        """``registry``: the plugins (default: the built-ins and every user plugin
        installed, for the configurations the log records may name any)."""
        if registry is None:
            registry = plugins.installed().registry
        self.sharding = sharding
        self.n = sharding.shards
        self.control = sharding.shards
        """The control partition's number."""
        self.engine = Engine(
            config, shard=COORDINATOR, registry=registry, dispatch=ShardDispatch(self)
        )
        self.engine.sharded(ShardingConfigured(config=sharding.to_json()))
        self.routing = Routing(sharding)
        self.flights: dict[str, Flight] = {}
        """Units handed to a shard, not answered yet (by unit)."""
        self.inflight = [0] * self.n
        """Pods handed to each shard and not answered yet."""
        rows = len(self.engine.state.resources)
        self.pending: npt.NDArray[np.int64] = np.zeros((self.n, 4, rows), dtype=np.int64)
        """Requests handed to each shard and not answered yet, as the shard's columns
        change by them (alloc, used, free and non-zero used; rows by shards)."""
        self.decisions: dict[str, str] = {}
        """Pods handed over → the decision id the shard places them under."""
        self.claims: dict[str, Claim] = {}
        self.claim_of: dict[str, str] = {}
        """Pod → the claim (reservation) it was placed under."""
        self.held_by: dict[str, dict[str, None]] = {}
        """Pod → the claims whose parts hold it on their shards (until it finishes, or
        fails to bind there; an abort does not end it: the shard answers that)."""
        self.nominated: dict[str, tuple[int, dict[str, None]]] = {}
        """Units whose preemption is under way → (since, victims not yet gone)."""
        self.evicting: dict[str, str] = {}
        """Victim → the unit it makes room for."""
        self.hard: dict[str, None] = {}
        """Units a shard handed back: decided here next time, not handed over again."""
        self.ready: list[str] = []
        """Preemptors whose victims are all gone: attempted first at the next pass (the
        room is theirs, as when one scheduler evicts and places in one step)."""
        self.relayed = [-1] * self.n
        """Per shard partition: the offset of the last record relayed into control."""
        self.shard_nodes = [0] * self.n
        """The nodes each shard said it had, in its last summary."""
        self.now = 0
        self.seq = 0
        self.counters = {
            "handed": 0,
            "batches": 0,
            "decided": 0,
            "handbacks": 0,
            "prepared": 0,
            "committed": 0,
            "aborted": 0,
            "evictions": 0,
            "migrations_handed": 0,
            "migrations_across": 0,
        }
        self.moves_refused: dict[str, int] = {}
        """Unit → how many times a shard refused to take in pods moved for it (after
        ``MAX_MOVES_REFUSED``, its plans across shards are not tried again)."""
        """Request → how it changes a shard's columns (a cache, not state)."""
        self._out: list[Output] = []
        self._cache: dict[tuple[object, ...], Any] = {}
        self._cache_at = (-1, -1)

    def __repr__(self) -> str:
        return (
            f"Coordinator(shards={self.n}, pods={len(self.engine.pods)}, "
            f"flights={len(self.flights)}, claims={len(self.claims)})"
        )

    def stats(self) -> dict[str, int]:
        return {**self.counters, "flights": len(self.flights), "claims": len(self.claims)}

    # ------------------------------------------------------------------ helpers

    def send(self, partition: int, event: Event) -> None:
        self._out.append((partition, event))

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    @property
    def reservation_timeout(self) -> int:
        """How long a reservation may hold capacity before it commits: Coscheduling's
        ``permitWaitingTimeSeconds`` where the configuration states it, else the
        sharding's ``reservationTimeoutSeconds``."""
        stated = self.engine.config.reservation_timeout_seconds
        return self.sharding.reservation_timeout if stated is None else stated * SECOND

    def expiry(self) -> int:
        return self.now + self.reservation_timeout

    def fresh(self, since: int) -> bool:
        return self.now < since + self.reservation_timeout

    def flights_under_way(self) -> bool:
        """Handed units not answered (and not so old that their shard is presumed
        gone): the view is short of where they went."""
        return any(self.fresh(f.since) for f in self.flights.values())

    def nominations_under_way(self) -> bool:
        return any(self.fresh(since) for since, _ in self.nominated.values())

    def cached(self, key: tuple[object, ...], compute: Callable[[], T]) -> T:
        """``compute()``, remembered until the view's nodes or placements change."""
        state = self.engine.state
        at = (state.journal_end, state.static_version)
        if at != self._cache_at:
            self._cache.clear()
            self._cache_at = at
        if key not in self._cache:
            self._cache[key] = compute()
        value: T = self._cache[key]
        return value

    def feasible_counts(self, feasible: Bools) -> list[int]:
        """How many of each shard's nodes ``feasible`` marks."""
        top = self.engine.state.high_water
        owner = self.routing.slot_shard[:top]
        picked = owner[feasible[:top] & (owner >= 0)]
        return [int(c) for c in np.bincount(picked, minlength=self.n)[: self.n]]

    def claim(self, claim: Claim) -> None:
        self.claims[claim.rid] = claim
        for pod in claim.pods:
            self.held_by.setdefault(pod, {})[claim.rid] = None

    def fly(self, unit: str, shard: int, pods: list[PodInfo], rid: str = "") -> None:
        """``pods`` (unit ``unit``) were handed to ``shard``; their quota is charged in
        the view until the shard answers."""
        if len(pods) == 1:  # (most flights: a plain pod)
            one = pods[0]
            flight = Flight(
                unit, shard, self.now, (one.key,), (one.request,), (one.spec.namespace,), rid
            )
        else:
            flight = Flight(
                unit,
                shard,
                self.now,
                tuple(pod.key for pod in pods),
                tuple(pod.request for pod in pods),
                tuple(pod.spec.namespace for pod in pods),
                rid,
            )
        self.flights.pop(unit, None)  # (kept in the order made: see next_wakeup)
        self.flights[unit] = flight
        self.engine.dispatched[unit] = str(shard)
        self._pending(flight, +1)

    def fly_run(self, pods: list[PodInfo], shards: list[int], decisions: list[str]) -> None:
        """A run of identical plain pods (one request, one namespace) was handed over,
        ``pods[i]`` to ``shards[i]`` under ``decisions[i]``: one flight each (the
        shard answers per pod), but what each shard has pending and the quota charge
        change once per shard, by how many pods went there (not once per pod)."""
        lead = pods[0]
        request = lead.request
        namespace = lead.spec.namespace
        requests = (request,)
        namespaces = (namespace,)
        now = self.now
        flights = self.flights
        dispatched = self.engine.dispatched
        own = self.decisions
        per_shard = [0] * self.n
        names = [str(shard) for shard in range(self.n)]
        for pod, shard, decision in zip(pods, shards, decisions, strict=True):
            key = pod.key
            flights.pop(key, None)  # (kept in the order made: see next_wakeup)
            flights[key] = Flight(key, shard, now, (key,), requests, namespaces)
            dispatched[key] = names[shard]
            own[key] = decision
            per_shard[shard] += 1
        pending = self._pending_rows()
        delta = request_delta(request, pending.shape[2])
        for shard, count in enumerate(per_shard):
            if count:
                pending[shard] += delta * count
                self.inflight[shard] += count
        self.engine.quotas.add(namespace, request, len(pods))

    def _pending(self, flight: Flight, sign: int, quota: bool = True) -> None:
        """Count ``flight`` in (``sign`` +1) or out of (-1) what its shard has pending,
        and its quota charged (``quota`` False: the charge stays, for a placement)."""
        here = self._pending_rows()[flight.shard]  # (4, rows), contiguous
        quotas = self.engine.quotas
        for request, namespace in zip(flight.requests, flight.namespaces, strict=True):
            delta = request_delta(request, here.shape[1])  # (shared with the columns)
            if sign > 0:
                here += delta
                quotas.add(namespace, request)
            else:
                here -= delta
                if quota:
                    quotas.remove(namespace, request)
        self.inflight[flight.shard] += sign * len(flight.pods)

    def land(self, unit: str, placed: bool = False) -> Flight | None:
        """The shard answered about ``unit`` (or its pods are gone): it is no longer under
        way, and its quota no longer charged (a placement charges it again), unless
        ``placed``: the caller places every pod of it at once and keeps the charge."""
        flight = self.flights.pop(unit, None)
        if flight is None:
            return None
        self.engine.dispatched.pop(unit, None)
        self._pending(flight, -1, quota=not placed)
        return flight

    def nominate(self, unit: str, victims: list[str]) -> None:
        self.nominated[unit] = (self.now, dict.fromkeys(victims))
        for victim in victims:
            self.evicting[victim] = unit
        self.engine.dispatched[unit] = "evicting"
        self.counters["evictions"] += len(victims)

    def wait_for_owner(self, unit: str) -> None:
        """``unit`` was decided onto a node no shard owns now (its pool is moving to
        another shard): it tries again after its back-off."""
        self._requeue(unit, backoff=True)

    def _victim_gone(self, victim: str) -> None:
        unit = self.evicting.pop(victim, None)
        if unit is None or unit not in self.nominated:
            return
        _, waiting = self.nominated[unit]
        waiting.pop(victim, None)
        if not waiting:
            del self.nominated[unit]
            self.engine.dispatched.pop(unit, None)
            self.ready.append(unit)

    def _requeue(self, unit: str, *, hard: bool = False, backoff: bool = False) -> None:
        """``unit`` is the queue's again: settled at the next pass, or (``backoff``:
        what was asked of a shard failed) after its back-off, as a failed bind is."""
        e = self.engine
        e.dispatched.pop(unit, None)
        if hard:
            self.hard[unit] = None
        if is_group_unit(unit):
            group = e.groups.get(unit[1:])
            pods = [e.pods[m] for m in group.members if m in e.pods] if group else []
            if backoff and group is not None and pods and group.phase == PENDING:
                lead = pods[0]
                group.attempts += 1
                e.queue.back_off(
                    unit,
                    lead.priority,
                    group.seq,
                    group.attempts,
                    e.now,
                    e.queue_of(group.namespace),
                )
                return
            e.dirty[unit] = None
        elif unit in e.pods:
            pod = e.pods[unit]
            if backoff and e.unit_of(unit) == unit and unit not in e.state.pods:
                e.queue.back_off(
                    unit,
                    pod.priority,
                    pod.seq,
                    max(pod.attempts, 1),
                    e.now,
                    e.queue_of(pod.spec.namespace),
                )
                return
            e.dirty[unit] = None

    # ------------------------------------------------------------------ fold

    def apply(self, env: Envelope) -> None:
        """Fold one control record."""
        event = env.event
        if isinstance(event, SnapshotTaken) or env.producer == ROUTER:
            return  # its own records: folded when they were made
        if (type(event) in CHECKED or not 0 <= env.time <= MAX_TIME) and (reason := refused(env)):
            self.engine.unfolded.append((env.offset, reason))  # nothing changes or is sent
            return
        self.now = max(self.now, env.time)
        engine = self.engine
        if env.time > engine.now:
            engine.now = env.time
            engine.forget_finished()
        if env.stream == RELAY:
            source = relay_source(env.producer, self.n)
            if source is None or env.causation <= self.relayed[source]:
                return  # not a copy this coordinator made (or one it has seen)
            self.relayed[source] = env.causation
            self._report(event, source)
        else:
            self._input(env)

    def apply_all(self, envelopes: Sequence[Envelope]) -> None:
        """:meth:`apply` for each of ``envelopes`` in order, with the submissions of pods
        at the time reached so far folded in bulk (:meth:`Engine.apply_submitted`, which
        leaves the state the one-by-one fold leaves: replay folds one by one, so
        ``--verify`` checks that too). Each submission's checks
        (:func:`engine.refusals.refused`) are made once per template of pod."""
        run: list[Envelope] = []
        valid: dict[tuple[object, ...], None] = {}
        engine = self.engine
        for env in envelopes:
            event = env.event
            if (
                type(event) is PodSubmitted
                and 0 <= env.time <= engine.now
                and env.time <= self.now
                and env.stream != RELAY
                and env.producer != ROUTER
            ):
                pod = event.pod
                try:
                    checks = (pod.priority, pod.runtime, tuple(pod.requests.items()))
                    known = checks in valid
                except TypeError:
                    checks, known = None, False
                if known or refused(env) is None:
                    if checks is not None:
                        valid[checks] = None
                    run.append(env)
                    continue
            if run:
                engine.apply_submitted(run)
                run = []
            self.apply(env)
        if run:
            engine.apply_submitted(run)

    def _input(self, env: Envelope) -> None:
        engine = self.engine
        event = env.event
        match event:
            case NodeAdded(node=spec) | NodeUpdated(node=spec):
                self._node(engine.pools.labelled(spec), env)
            case NodeRemoved(name=name):
                slot = engine.state.index.get(name)
                shard = self.routing.forget(name, slot)
                engine.apply(env)
                if shard is not None:
                    self.send(shard, event)
            case PodSucceeded(pod=key) | PodFailed(pod=key) | PodDeleted(pod=key):
                holder = self._holder(key)
                self._gone(key)
                engine.apply(env)
                if holder is not None:
                    self.send(holder, event)
            case PodBound():
                self._observed_bound(env, event)
            case PoolReassigned(pool=pool, shard=shard):
                moved = self.routing.reassign(pool, shard)
                if moved is not None:
                    old, nodes = moved
                    for name in nodes:
                        slot = engine.state.index.get(name)
                        if slot is not None:
                            self.routing._set_slot(slot, NONE)
                    self.send(old, PoolReleased(pool=pool, nodes=nodes, to=shard))
            case SchedulerConfigured() | DisruptionBudgetSet() | DisruptionBudgetDeleted():
                # every shard knows the budgets (its plans count against them)
                refused = len(engine.unfolded)
                engine.apply(env)
                if len(engine.unfolded) > refused:
                    return  # a configuration that cannot be run: quarantined, not sent
                for shard in range(self.n):
                    self.send(shard, event)
            case PodRejected() if env.producer == "ingest":
                # refused at admission: the pod never reaches a shard, but the binder
                # of shard 0's partition writes the Event on it
                engine.apply(env)
                self.send(0, event)
            case ShardingConfigured() | ClockTicked():
                pass
            case _:
                # pods, pod groups, quotas: the queue's and the view's (checked in apply)
                engine.apply(env, checked=True)

    def _node(self, spec: NodeSpec, env: Envelope) -> None:
        engine = self.engine
        shard = self.routing.shard_for(spec)
        old = self.routing.node_shard.get(spec.name)
        added = isinstance(env.event, NodeAdded) or old is None
        if old is not None and old != shard:
            # moved to another pool: the old owner loses it, the new one gains it
            self.send(old, NodeRemoved(name=spec.name))
            added = True
        slot = engine.state.add_node(spec)
        engine.fire(ClusterEvent.NODE_ADDED if added else ClusterEvent.NODE_UPDATED, slot)
        self.routing.own(spec, shard, slot)
        self.send(shard, NodeAdded(node=spec) if added else NodeUpdated(node=spec))

    def _holder(self, key: str) -> int | None:
        """The shard that holds pod ``key`` now (placed, handed, or reserved there)."""
        engine = self.engine
        placed = engine.state.pods.get(key)
        if placed is not None:
            shard = int(self.routing.slot_shard[placed.slot])
            return shard if shard >= 0 else None
        pod = engine.pods.get(key)
        unit = engine.unit_of(key) if pod is not None else key
        flight = self.flights.get(key) or self.flights.get(unit)
        return flight.shard if flight is not None else None

    def _forget_claim(self, claim: Claim) -> None:
        """``claim`` is over (every part closed, or none of its pods holds it): forget it,
        and that its pods were held under it (a pod the view rejected meanwhile, its gang
        timed out, is gone from the view and would keep that record for good)."""
        del self.claims[claim.rid]
        for pod in claim.pods:
            held = self.held_by.get(pod)
            if held is not None and claim.rid in held:
                del held[claim.rid]
                if not held:
                    del self.held_by[pod]

    def _unclaim(self, key: str) -> None:
        """``key`` no longer holds its place under its claim; a committed claim none of
        whose pods does is over."""
        rid = self.claim_of.pop(key, None)
        claim = self.claims.get(rid) if rid is not None else None
        if (
            claim is not None
            and claim.stage == COMMITTED
            and not any(self.claim_of.get(pod) == rid for pod in claim.pods)
        ):
            self._forget_claim(claim)

    def _left_part(self, key: str, rid: str | None = None) -> None:
        """Pod ``key`` left the part of claim ``rid`` (None: of every claim) on its
        shard: it finished, or its bind failed. As the shard folds it, a part with no
        pod left is over there (nothing to abort or release, no answer comes)."""
        held = self.held_by.get(key)
        if not held:
            return
        for claim_rid in [rid] if rid is not None else list(held):
            if claim_rid not in held:
                continue
            del held[claim_rid]
            claim = self.claims.get(claim_rid)
            if claim is None:
                continue
            for shard, left in claim.left.items():
                if key in left:
                    del left[key]
                    if not left and shard in claim.open:
                        del claim.open[shard]
                        claim.granted.pop(shard, None)
            if not claim.open:
                self._forget_claim(claim)
        if not held:
            del self.held_by[key]

    def _gone(self, key: str) -> None:
        """Pod ``key`` is finishing (or was deleted): forget what was under way for it.
        (Its claim is forgotten with the last of its pods.)"""
        if key in self.flights:
            self.land(key)
        self.decisions.pop(key, None)
        self.hard.pop(key, None)
        self.moves_refused.pop(key, None)
        self._left_part(key)
        self._unclaim(key)
        if key in self.evicting:
            self._victim_gone(key)

    def _observed_bound(self, env: Envelope, event: PodBound) -> None:
        """A binding seen in the cluster (ours, or another scheduler's): the view places
        the pod there, and the shard that owns the node adopts it as it is."""
        engine = self.engine
        spec = engine.pods[event.pod].spec if event.pod in engine.pods else None
        owner = self.routing.node_shard.get(event.node)
        if spec is None or owner is None or engine.bindings.get(event.pod) == event.decision_id:
            return
        holder = self._holder(event.pod)
        if holder is not None and holder != owner:
            self.send(holder, PodDeleted(pod=event.pod))
        self._gone(event.pod)
        engine.queue.remove(event.pod)
        engine.apply(env)
        placement = Placement(
            pod=spec, node=event.node, decision_id=event.decision_id, devices=event.devices
        )
        self.send(owner, PodAdopted(placement=placement))

    # ------------------------------------------------------------------ reports

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
        dispatched = engine.dispatched
        decisions = self.decisions
        landed: dict[Request, int] = {}
        pods = 0
        run: list[tuple[str, int, str]] = []
        for key, node in placed.items():
            flight = flights.get(key)
            if flight is None or flight.shard != shard:
                continue  # not handed there (any more)
            slot = index.get(node)
            if slot is not None and key in live and key not in held:
                del flights[key]
                dispatched.pop(key, None)
                pods += len(flight.pods)
                for request in flight.requests:
                    landed[request] = landed.get(request, 0) + 1
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
        if pods:
            self._uncount(shard, landed, pods)

    def _uncount(self, shard: int, landed: dict[Request, int], pods: int) -> None:
        """``pods`` pods handed to ``shard`` were placed, asking for ``landed`` (request
        → how many): no longer pending there (their quota charge stays)."""
        here = self._pending_rows()[shard]
        rows = here.shape[1]
        for request, count in landed.items():
            delta = request_delta(request, rows)
            if count == 1:
                here -= delta
            else:
                here -= delta * count
        self.inflight[shard] -= pods

    def _pending_rows(self) -> npt.NDArray[np.int64]:
        """``pending``, grown to the view's resource rows."""
        rows = len(self.engine.state.resources)
        pending = self.pending
        if pending.shape[2] < rows:
            grown = np.zeros((self.n, 4, rows), dtype=np.int64)
            grown[:, :, : pending.shape[2]] = pending
            self.pending = pending = grown
        return pending

    def _handed_back(self, key: str, shard: int, reason: str, decision: str = "") -> None:
        engine = self.engine
        self.counters["handbacks"] += 1
        if "@" in decision:  # a part held it there, and its bind failed
            self._left_part(key, decision.split("@", 1)[1])
        flight = self.flights.get(key)
        if flight is not None and flight.shard == shard:
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
        for placement in event.placements:
            self.send(shard, PodAdopted(placement=placement))

    # ------------------------------------------------------------------ decide

    def schedule(self) -> list[Output]:
        """Run a pass of the view; return what to append (forwarded inputs first, in the
        order they were folded, then the pass's requests and decisions)."""
        self._timeouts()
        moves = self.engine.queue.generation
        for decision in self.engine.schedule():
            if not isinstance(decision, ShardSummary):
                self.send(self.control, decision)
        if not self._out and self.engine.queue.generation != moves:
            # the queue moved (a back-off expired) though nothing was decided (the unit
            # waits for the shards): record that the pass ran, so replay runs it here too
            self.send(self.control, ClockTicked())
        out, self._out = self._out, []
        return out

    def take_back(self, event: PodUnbound) -> None:
        """The view took back ``event.pod`` (its gang rolled back): abort the claim it
        was placed under (the rid is in its decision id), once."""
        self.claim_of.pop(event.pod, None)
        head = f"{event.pod}@"
        if not event.decision_id.startswith(head):
            return
        claim = self.claims.get(event.decision_id[len(head) :])
        if claim is not None:
            self._let_go(claim, event.reason)

    def recall(self, group: str, reason: str) -> None:
        """Gang ``group`` is Pending again (rolled back, or a part of it aborted): its
        members handed to a shard alone while it ran (each under a part of its own),
        not answered yet, are let go there too, as its placed members are: their parts
        are aborted (a shard that has bound one already unbinds it) and each waits with
        the gang, which waits until those shards have let go
        (:meth:`ShardDispatch._still_held`). Left to run, such a member would run the
        gang in part; and once the gang timed out (its pending members rejected) the
        shard would hold a pod the coordinator has forgotten."""
        info = self.engine.groups.get(group)
        if info is None or info.phase != PENDING:
            return
        for member in list(info.members):
            flight = self.flights.get(member)
            if flight is None or not flight.rid:
                continue
            self.land(member)
            claim = self.claims.get(flight.rid)
            if claim is not None:
                self._let_go(claim, reason)

    def _let_go(self, claim: Claim, reason: str) -> None:
        """Abort every open part of ``claim``, once (the shards answer, and the claim is
        forgotten with the last answer)."""
        if claim.stage == ABORTING:
            return
        claim.advance(ABORTING)
        self.counters["aborted"] += 1
        for shard in sorted(claim.open):
            self.send(shard, ReservationAborted(rid=claim.rid, reason=reason))
        if not claim.open:
            self._forget_claim(claim)

    def _timeouts(self) -> None:
        """Claims not granted within the reservation time-out are aborted; a preemption
        whose victims were not all reported gone lets its unit try again."""
        for claim in list(self.claims.values()):
            if claim.stage == PREPARING and not self.fresh(claim.since):
                self._abort(claim, "not every part answered within the reservation time-out")
        for unit, (since, victims) in list(self.nominated.items()):
            if not self.fresh(since):
                del self.nominated[unit]
                self.engine.planned.pop(unit, None)
                for slot in self.engine.held.pop(unit, []):
                    self.engine.fire(ClusterEvent.POD_FREED, slot)
                for victim in victims:
                    self.evicting.pop(victim, None)
                self._requeue(unit)

    def next_wakeup(self) -> int | None:
        """When a pass would act without new records: the view's next back-off or
        group time-out, or a time-out of what the shards were asked."""
        timeout = self.reservation_timeout
        times = [c.since + timeout for c in self.claims.values() if c.stage == PREPARING]
        for flight in self.flights.values():
            # flights are kept in the order they were made, so by ``since``: the first
            # not timed out yet is the next to time out (not a pass over every flight
            # at each poll: thousands are under way under load)
            if flight.since + timeout > self.now:
                times.append(flight.since + timeout)
                break
        times.extend(since + timeout for since, _ in self.nominated.values())
        wakeups = [t for t in times if t > self.now]
        view = self.engine.next_wakeup()
        if view is not None:
            wakeups.append(view)
        return min(wakeups) if wakeups else None


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


__all__ = ["COORDINATOR", "RELAY", "ROUTER", "Coordinator", "Output", "group_unit"]

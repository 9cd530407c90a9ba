"""The fold of the control partition's records: the cluster's inputs and the relays.

Each record is checked (:func:`engine.refusals.refused`; a refused one is only
counted in ``engine.unfolded``), time moves on, and then a relayed copy of a shard's
report goes to :class:`~shards.coordinator.reports.Reports`, while an input (a node,
a pod, a group, a quota, a configuration) is folded into the view and forwarded to
the shard it concerns: a node to the shard its pool is on, a finished pod to the shard
that holds it, a configuration to every shard.

**Cost per pod submitted** (5,000 nodes, one template, 2 shards, a busy 2-core
machine): about 4-6 µs, down from about 15-20, for the submissions of a slice folded
together (:meth:`Inputs.apply_all`): the checks once per template in the slice, each
pod's facts derived once per template (:func:`engine.model.bulk.submit_all`); left per
pod: its ``PodInfo``, its entry in the table of pods and in the queue.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.model.changes import ClusterEvent
from engine.refusals import CHECKED, MAX_TIME, refused
from events.types import (
    ClockTicked,
    DisruptionBudgetDeleted,
    DisruptionBudgetSet,
    Envelope,
    NodeAdded,
    NodeRemoved,
    NodeSpec,
    NodeUpdated,
    Placement,
    PodAdopted,
    PodBound,
    PodDeleted,
    PodFailed,
    PodRejected,
    PodSubmitted,
    PodSucceeded,
    PoolReassigned,
    PoolReleased,
    SchedulerConfigured,
    ShardingConfigured,
    SnapshotTaken,
)
from shards.coordinator.ledger import RELAY, ROUTER, relay_source
from shards.coordinator.reports import Reports
from shards.coordinator.routing import NONE


class Inputs(Reports):
    """The fold of the control partition (see the module's docstring)."""

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
            self.consolidation_due = True
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
        retired = engine.retired
        for env in envelopes:
            event = env.event
            time = env.time
            if (
                type(event) is PodSubmitted
                and 0 <= time <= MAX_TIME
                and env.stream != RELAY
                and env.producer != ROUTER
                and (time <= engine.now or not retired.sweeps(time))
            ):
                pod = event.pod
                try:
                    checks = (pod.priority, pod.runtime, *pod.requests.items())
                    known = checks in valid
                except TypeError:
                    checks, known = None, False
                if known or refused(env) is None:
                    if checks is not None:
                        valid[checks] = None
                    # time moves on as :meth:`apply` moves it (nothing to forget)
                    engine.now = max(engine.now, time)  # (self.now: once per run)
                    run.append(env)
                    continue
            if run:
                self._submit(run)
                run = []
            self.apply(env)
        if run:
            self._submit(run)

    def _submit(self, run: list[Envelope]) -> None:
        self.consolidation_due = True
        self.now = max(self.now, *(env.time for env in run))
        self.engine.apply_submitted(run)
        self.folded_in_bulk += len(run)

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
            case PoolReassigned(pool=pool, shard=shard) if pool in self.routing.moving:
                # its nodes are between two owners: one hand-over at a time
                to = self.routing.pool_shard[pool]
                why = f"pool {pool!r} is still moving to shard {to}: reassign it once it has"
                engine.unfolded.append((env.offset, f"{why} arrived"))
            case PoolReassigned(pool=pool, shard=shard):
                moved = self.routing.reassign(pool, shard)
                if moved is not None:
                    old, nodes = moved
                    for name in nodes:
                        slot = engine.state.index.get(name)
                        if slot is not None:
                            self.routing._set_slot(slot, NONE)
                    self.ownership_changed()
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

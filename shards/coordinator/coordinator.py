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

from engine.config import SchedulerConfig
from engine.framework.registry import Registry
from engine.model.changes import ClusterEvent
from engine.model.groups import group_unit
from engine.model.pools import Sharding
from events.types import (
    ClockTicked,
    PodUnbound,
    ShardSummary,
)
from shards.coordinator.dispatch import ShardDispatch
from shards.coordinator.flights import (
    PREPARING,
)
from shards.coordinator.inputs import Inputs
from shards.coordinator.ledger import COORDINATOR, RELAY, ROUTER, Output, relay_source


class Coordinator(Inputs):
    """One engine over every shard's nodes; ``apply`` a control record (``apply_all``
    a slice), ``schedule`` a pass."""

    def __init__(
        self,
        sharding: Sharding,
        config: SchedulerConfig | None = None,
        registry: Registry | None = None,
    ) -> None:
        """``registry``: the plugins (default: the built-ins and every user plugin
        installed, for the configurations the log records may name any)."""
        super().__init__(sharding, config, registry)
        self.engine.dispatch = ShardDispatch(self)

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


__all__ = [
    "COORDINATOR",
    "RELAY",
    "ROUTER",
    "Coordinator",
    "Output",
    "group_unit",
    "relay_source",
]

"""The coordinator of several shards: one fold of the control partition, and passes.

**Cost per plain pod** (5,000 nodes, 20,000 pods of one template, 2 shards; CPU of the
coordinator's fold and passes alone, the records fed in slices of 1,000 with the
shards' placements, no log, the collector off; a busy 2-core machine, November 2026):
about 18-20 µs, down from about 29 (about 21-23 with the collector, from about 40),
split as

- *folding the submission*, about 4-6 µs, down from 15-20: a slice's submissions are
  folded together (:meth:`~shards.coordinator.inputs.Inputs.apply_all`), checked once
  per template, each pod's facts derived once per template
  (:func:`engine.model.bulk.submit_all`); left per pod: its ``PodInfo``, its entries
  in the table of pods and the queue;
- *handing it over*, about 7 µs: the plain pods at the head of the queue go in one
  step (:func:`~shards.coordinator.batches.hand_batch`), the checks made once per kind
  of pod in the step, the choice of shard one vectorised score per kind, each shard's
  sums per kind kept up to date from the nodes that changed
  (:class:`~shards.coordinator.handover.Sums`), what each shard has pending and the
  quota charged once per kind and shard; left per pod: taking it out of the queue,
  its kind's key, its ``PodRouted`` and decision id, its flight;
- *folding where the shard placed it*, about 4-5 µs, down from 10: in bulk per report
  (:meth:`~shards.coordinator.reports.Reports._placed`), the node columns changed once
  per request and node (:func:`engine.model.bulk.place_all`); left per pod: its
  flight taken off, its record in the view (which must hold every pod, for preemption
  and reclaim over every node).

**Instructions per plain pod** (the same fold and passes, counted by callgrind, which
the machine's load hardly moves: 2,000 nodes, 6,000 pods of one template, 2 shards,
the placements fed back in slices; November 2026): about 118,000, down from about
129,500, by taking per-pod steps out of the bulk folds: submissions queued in one call
per queue's run (:meth:`~engine.model.queue.SchedulingQueue.add_new`) and their shapes
counted once per run (:meth:`~engine.model.shapes.ShapeCounts.add_shapes`); placements
counted by priority once per run, their deltas looked up once per request; one kind's
hand-over built in one pass. Counted again with ``tools/instructions/coordinator.sh``
(its own feed: 2,000 nodes, 6,000 pods, 2 shards; 29 November 2026): about 114,400,
down from about 135,900 that morning, by building the per-pod records in C and leaving
them untracked by the cyclic collector (``PodInfo``, ``PlacedPod``, the queue's
entries, the flights: msgspec structs with ``gc=False``) and counting landed flights
once per run. What is left per pod is its records (its ``PodInfo``, its
queue entry, flight, ``PodRouted`` and decision id, its placement in the view), about
ten dict operations and three object constructions a stage: the target of issue 25
(an eighth of a shard's CPU per pod, about 7 µs) is out of reach while each plain pod
is a record of its own in the queue, the flights and the view; it needs runs of
identical pods kept as one entry (one queue entry, one flight and one routed record
per run and shard, the view's placements folded as counts per node), which changes
the log's records and their replay (not done).

Per batch (not per pod): per kind of pod, the count of its feasible nodes per shard
and each shard's sums over the nodes it may use, both O(nodes changed since the kind
was last handed over): the counts are kept across batches
(:class:`~shards.coordinator.handover.Counted`; until November 2026 they were taken
over every node at each batch), the sums likewise
(:class:`~shards.coordinator.handover.Sums`, all kinds in one product per shard);
the scores of the shards, one vectorised score per kind. At 130,000 nodes the
same run cost about 35 µs per pod, from about 39 (the collector on), before the
counts were kept: what grew was the per-batch count and the collector's passes over a
larger heap.

What is not a plain pod costs far more: a pod an inter-pod rule or a spread constraint
applies to is decided here, on the exact view, after every flight is answered
(:mod:`shards.coordinator.dispatch`); each one ends a batch. With ``loadtest scale
--templates 20`` (two of twenty templates spread over zones: about one pod in ten)
that makes batches of about ten pods and 250-450 µs per pod on the coordinator
(against about 30 with one template), most of it per batch: per kind in the batch
(about six), its checks, counts, sums and scores (about 200-300 µs together), and per
wait the polls, reports and passes until every flight is answered. Keeping the counts
across batches (above) did not change that measurably at 5,000 nodes (the machine's
noise, ±15%, is larger); it removes the O(nodes) part that grows with the cluster. The
batch ends there on purpose: one scheduler decides such a pod after every pod ahead
of it is placed, and the plain pods behind it take resources on the nodes it may
choose, so handing them over first, or deciding several such pods at one wait with
plain pods between them, would not be one scheduler's answer; handing it to a shard
with the other shards' counts per domain would let that shard choose among its own
nodes only. What might change it (not done; its exactness is still to be shown): let
shards publish, per pending shape, their best node's score (issue 25), so that a spread
pod whose selector no pod in flight matches goes, with every shard's counts per
domain, to a shard that certainly holds a node as good as the cluster's best even
once the pods in flight to the other shards are placed, and is decided there
without a wait.

The coordinator is built in layers, one module each, each importing only those below
it: :mod:`~shards.coordinator.ledger` (its state and bookkeeping) <
:mod:`~shards.coordinator.handed` (flights) < :mod:`~shards.coordinator.reports` (the
shards' reports) < :mod:`~shards.coordinator.inputs` (ingest's records) < this module
(the pass, time-outs, wake-ups).

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

The fold of every record kind and the pass are one state machine over one state
(view, flights, claims, evictions): the layers split its methods by what they fold,
not its state, which :class:`~shards.coordinator.ledger.Ledger` holds; where a concern
stands alone it has its module (dispatch, batches, handover, choice, flights, routing,
snapshot).
"""

from __future__ import annotations

from engine.config import SchedulerConfig
from engine.framework.registry import Registry
from engine.model.groups import group_unit
from engine.model.pools import Sharding
from events.types import (
    ClockTicked,
    PodUnbound,
    ShardSummary,
    WorkloadShapes,
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
        self.shapes_told = 0
        """The version of the view's learnt shapes last sent to the shards."""

    def schedule(self) -> list[Output]:
        """Run a pass of the view; return what to append (forwarded inputs first, in the
        order they were folded, then the pass's requests and decisions)."""
        self.issued = [0] * self.n
        self.pass_from = len(self._out)
        self._tell_shapes()
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

    def _tell_shapes(self) -> None:
        """The shapes the view learnt changed: where a profile learns its workload from
        them (a GPU policy), every shard is told, ahead of this pass's requests
        (``WorkloadShapes``; a few records in all: they change at totals that are
        powers of two or multiples of 1,024 pods)."""
        shapes = self.engine.shapes
        if shapes.version == self.shapes_told:
            return
        self.shapes_told = shapes.version
        if not self.engine.profiles.learn_shapes():
            return  # no profile learns from them (no records for them)
        learned = tuple((*shape, n) for shape, n in sorted(shapes.learned.items()))
        for shard in range(self.n):
            self.send(shard, WorkloadShapes(learned=learned))

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
        due = self.due()  # (every entry read only once the earliest timed out)
        first = due.first_claim()
        if first is not None and not self.fresh(first):
            for claim in self.preparing():
                if claim.stage == PREPARING and not self.fresh(claim.since):
                    self._abort(claim, "not every part answered within the reservation time-out")
        first = due.first_nomination()
        if first is None or self.fresh(first):
            return
        for unit, (since, _) in list(self.nominated.items()):
            if not self.fresh(since):
                self.end_nomination(unit)

    def next_wakeup(self) -> int | None:
        """When a pass would act without new records: the view's next back-off or
        group time-out, or a time-out of what the shards were asked."""
        timeout = self.reservation_timeout
        due = self.due()  # (the earliest of each, unless it timed out already)
        times: list[int] = []
        first = due.first_claim()
        if first is not None and first + timeout > self.now:
            times.append(first + timeout)
        elif first is not None:
            times.extend(c.since + timeout for c in self.preparing())
        for flight in self.flights.values():
            # flights are kept in the order they were made, so by ``since``: the first
            # not timed out yet is the next to time out (not a pass over every flight
            # at each poll: thousands are under way under load)
            if flight.since + timeout > self.now:
                times.append(flight.since + timeout)
                break
        first = due.first_nomination()
        if first is not None and first + timeout > self.now:
            times.append(first + timeout)
        elif first is not None:
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

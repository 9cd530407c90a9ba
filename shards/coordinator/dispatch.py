"""The coordinator's dispatch: where each unit of its one queue goes.

The coordinator runs one engine over its view of the whole cluster, with the same
profiles, plugins and queue as one shard; what differs is what becomes of a unit
(:class:`engine.passes.dispatch.Dispatch`):

- **handed to a shard** when one certainly holds it: the shard the profile's scores
  prefer (:mod:`shards.coordinator.choice`), if more of its nodes pass every filter for
  the unit (quota admission included, on the coordinator's view) than there are pods
  handed to it and not yet placed. Each such pod can take at most one of those nodes,
  so one is left for the unit whatever the shard does meanwhile: the shard places it
  with its own engine, on its best node, and reports where. Only profiles whose
  filters look at one node at a time are handed over (all built-in filters do), and
  whose scores the coordinator can summarise per shard (:mod:`shards.coordinator.choice`:
  the built-in ones but the packing scores). A user plugin's filter is honoured either
  way (it is one of the filters counted); a profile with a user plugin at ``preScore``
  or ``score`` (one whose meaning over a shard's sums is unknown), or with a packing
  score (``MostAllocated``, ``RequestedToCapacityRatio``, the GPU policies: the fullest
  node is not where the fullest sums are), has its pods decided here, on the exact
  view, as one scheduler would place them;
- **decided here** otherwise (the unit does not certainly fit, needs preemption or
  reclaim, or a shard handed it back), exactly as one shard would decide it, on an
  exact view: the pass waits until every handed unit is answered, so the view holds
  every placement, then attempts the unit. What it decides becomes requests to the
  shards that own the nodes: a pod of its own is handed to the node chosen
  (``PodRouted`` with the node, placed in the view at once: the shard places it there
  or hands it back, and it is decided again after a back-off), a gang a reservation
  part per shard, on the nodes chosen (prepared and committed whole), or, for a
  preemption, the evictions first; the unit is attempted again once the victims are
  gone, as kube-scheduler does;
- **waits** at the head of the queue while evictions it asked for are under way, while
  a pod of it is still held on a shard under a claim being aborted (a gang rolled back:
  placed elsewhere first, it would run twice), or (for a unit to decide here) while
  handed units are unanswered.

So the order of the queue is one order for the whole cluster, and whatever a shard is
asked to do fits there when it does it. Only what is handed over is placed concurrently.

**Inter-pod rules while pods fly.** A plain pod that is decided here only because an
inter-pod rule or a topology spread constraint applies to it need not wait for every
handed pod to land (:meth:`ShardDispatch._early`): it is attempted on the view at
once, and its claim is made, when two things hold.

- *Its rules count exactly on the view*: no pod under way has a namespace and labels
  one of its own terms or constraints selects (:func:`_selecting`,
  :meth:`Ledger.flying_match`; a pod handed for a plan of moves counts as matching
  anything). A handed pod has no required rule of its own (it would not have been
  handed over), and the placed pods whose rules select this one are in the view; so
  every pod its verdicts depend on is in the view, placed or under a claim, as for
  one scheduler.
- *Its node keeps its room whatever lands there*: the node's free resources cover its
  request plus everything still under way to that node's shard, as if every such pod
  landed on that node (:meth:`ShardDispatch._room_whatever_lands`). So the shard never
  denies the part for want of room, and the pod is placed, as one scheduler would
  place it.

The node is the best on a view that lacks where the pods under way will land (as a
handed pod's node is the best of its shard: the known difference "which node"); the
outcome, placed and within its rules, is one scheduler's. Anything else (it does not
fit, it would evict or move pods, it takes devices, an extender is asked, shards move
pods on their own) undoes the attempt and the pod waits as before. With
``loadtest scale --templates 20`` (about one pod in ten spread over zones) such a pod
no longer ends a pass: the coordinator made about one pass per spread pod, and now a
few per batch of submissions.

Within a batch of hand-overs (:func:`shards.coordinator.batches.hand_batch`), such a
pod does not end the batch either (:class:`_InBatch`): the pods of the batch before it
count as under way for its rules (their namespaces and labels), but not for its room,
because its part goes ahead of the batch's hand-overs in its shard's partition and a
shard takes on what arrives in that order; instead each pod handed to that shard
before it must still fit with one node fewer, which the batch counts (its spare
nodes per shard). So a batch runs past the spread pods in it, and its per-kind checks
are made once for the whole run instead of once per ten pods.

**Preempting in runs.** A run of identical preemptors (consecutive in queue order) is
decided in one pass, evicted with one ``PreemptionRequested`` per shard and placed in
one pass once every victim is gone, each where one at a time would place it:
:mod:`shards.coordinator.wave` says how, when a run ends, and what it costs.

**Handing over in batches.** The plain pods at the head of the queue are handed over
in one step, checked once per kind of pod, each to the shard one by one would give it:
:mod:`shards.coordinator.batches` says how, why, and what it costs per pod handed over;
the checks of a hand-over and the choice of shard are :mod:`shards.coordinator.handover`.

**The directions of issue 25 weighed.** Routing runs in one step: done, generalised to
every plain pod at the head of the queue, since the measured workloads interleave a
few dozen shapes (runs of identical pods average about one there). Shards publishing
per-shape capacities (how many pods they certainly hold, their best score): not done
yet; it would remove the per-batch O(nodes) counts and let more than one pod per
feasible node be in flight, at the price of a new report kind and its replay.
Folding placement reports and submissions in bulk: done (:mod:`engine.model.bulk`:
the node columns change once per request and node, a template's facts are derived
once; what is left per pod is its record in the view). Units that need the whole
cluster (preemption, reclaim, spanning gangs, inter-pod rules, user scores,
extenders) are decided here on the exact view, as before; so are all units of a packing profile
(:mod:`shards.coordinator.choice` says why, and their cost: one scheduling attempt here
and a hand-over to the node chosen, instead of the choice of a shard and the hand-over).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from engine.framework.cycle import CycleState
from engine.framework.runtime import Framework
from engine.model.groups import GroupInfo, is_group_unit
from engine.model.pods import PodInfo
from engine.model.podtable import has_terms, pod_table
from engine.model.state import Ints, held_devices
from engine.model.statement import Statement
from engine.passes.consolidate import BY as CONSOLIDATION
from engine.passes.consolidate import staged_moves
from engine.passes.context import PassContext
from engine.passes.defrag import BY as DEFRAGMENTATION
from engine.passes.defrag import staged_defragmentation
from engine.passes.dispatch import Placed, Route
from engine.passes.extenders import applicable
from engine.passes.gangs import park_gang
from engine.passes.pods import attempt_pod
from engine.plugins.migration import unpinned
from engine.plugins.rescheduler import Rescheduler, moving_on_its_own
from events.types import (
    ClockTicked,
    GroupSpec,
    PodRouted,
    PodSpec,
    PodUnbound,
    PreemptionRequested,
    ReservationRequested,
    is_decision,
)
from shards.coordinator.batches import Handing, hand_batch
from shards.coordinator.flights import (
    ABORTING,
    COMMITTED,
    MAX_MOVES_REFUSED,
    MOVES,
    Claim,
    Flight,
    LabelKey,
)
from shards.coordinator.handover import Checks
from shards.coordinator.ledger import Move, Moving, Output, Selecting
from shards.coordinator.wave import Wave, Waving


class Coordinating(Handing, Waving, Protocol):
    """What the dispatch reads and asks of the coordinator it serves
    (:class:`shards.coordinator.coordinator.Coordinator`, which imports this module);
    what the hand-over of a batch and its checks read of it are
    :class:`shards.coordinator.batches.Handing` and
    :class:`shards.coordinator.handover.Viewing`."""

    decisions: dict[str, str]
    directed: dict[str, int]
    nominated: dict[str, tuple[int, dict[str, None]]]
    claims: dict[str, Claim]
    claim_of: dict[str, str]
    moves_refused: dict[str, int]
    moves_after: dict[str, tuple[str, list[Moving], dict[str, tuple[int, ...]]]]
    ready: list[str]
    now: int
    flights: dict[str, Flight]
    consolidation_due: bool
    decided_since: bool
    moved_since: dict[str, None]
    control: int

    def out_since(self, start: int | None = None) -> list[Output]: ...

    def preparing(self) -> list[Claim]: ...

    def issue(self, shards: Iterable[int]) -> int: ...

    def expiry(self, since: int) -> int: ...

    def fresh(self, since: int) -> bool: ...

    def flights_under_way(self) -> bool: ...

    def nominations_under_way(self) -> bool: ...

    def recall(self, group: str, reason: str) -> None: ...

    def claim(self, claim: Claim) -> None: ...

    def fly(
        self, unit: str, shard: int, pods: list[PodInfo], rid: str = "", *, moves: bool = False
    ) -> None: ...

    def flying_match(self, selectors: list[Selecting], also: Iterable[LabelKey] = ()) -> bool: ...

    def under_way(self, shard: int) -> npt.NDArray[np.int64]: ...

    def nominate(self, unit: str, victims: list[str], shards: Iterable[int]) -> None: ...

    def end_nomination(self, unit: str) -> None: ...

    def wait_for_owner(self, unit: str) -> None: ...

    def wait_for_answers(self, unit: str) -> None: ...

    def take_back(self, event: PodUnbound) -> None: ...


class ShardDispatch:
    waits = True

    def __init__(self, coordinator: Coordinating) -> None:
        self.c = coordinator
        self.checks = Checks(coordinator)
        self.wave = Wave(coordinator, self._hand_to_node)
        self._trial = False
        """An early attempt is under way (:meth:`_early`): :meth:`commit` checks it."""
        self._awaiting = False
        """A unit of this pass waits for answers to claims its plan of moves needs
        (:meth:`_migrations`): the queue behind it waits too, for the next pass, as
        one scheduler decides nothing behind a unit before it. Not state: reset as
        each pass begins (:meth:`first`)."""
        self._spare: list[int] | None = None
        """Within a batch, per shard, how many nodes its hand-overs can spare
        (:func:`shards.coordinator.batches.hand_batch`)."""

    def __repr__(self) -> str:
        return "ShardDispatch()"

    # ------------------------------------------------------------------ route

    def route(self, p: PassContext, unit: str) -> Route:
        c = self.c
        if (wave := self.wave.route(p, unit)) is not None:
            return wave  # a run of identical preemptors is being decided
        if self._awaiting or c.nominations_under_way() or self._still_held(p, unit):
            return Route.WAIT
        if unit not in c.hard and self._hand_over(p, unit):
            return Route.HANDED
        if c.flights_under_way():
            if unit not in c.hard and self._early(p, unit):
                return Route.HANDED  # decided here, placed under a claim
            return Route.WAIT
        c.hard.pop(unit, None)
        c.counters["decided"] += 1
        return Route.ATTEMPT

    def _early(self, p: PassContext, unit: str) -> bool:
        """Decide a plain pod that inter-pod rules or spread constraints keep here while
        pods handed to shards are still under way, instead of waiting for every one of
        them to land: whether it was placed (under a claim, as any unit decided here).
        See "Inter-pod rules while pods fly" in the module's docstring for when and why
        it is exact."""
        c = self.c
        pod = c.engine.pods.get(unit)  # (None for a gang)
        if pod is None or not self._may_decide_early(p, pod) or c.flying_match(_selecting(pod)):
            return False
        p.unit = unit
        return self._try_early(p, pod) is not None

    def _may_decide_early(self, p: PassContext, pod: PodInfo) -> bool:
        """Whether ``pod`` is one :meth:`_early` may try: a plain pod only its rules keep
        here, with nothing that needs the exact view (an extender, a hold) and not the
        pod being explained."""
        e = self.c.engine
        return not (
            pod.spec.group
            or pod.spec.depends_on
            or not self._kept_by_rules(pod)
            or pod.key == p.explain
            or e.config.extenders
            or e.holds
        )

    def _try_early(
        self, p: PassContext, pod: PodInfo, spare: list[int] | None = None
    ) -> int | None:
        """Attempt ``pod`` on the view now (``p.unit`` is it): the shard of the node it
        was placed on, under a claim, or None (the attempt undone). ``spare``: within a
        batch (:class:`_InBatch`), what each shard's hand-overs can spare."""
        c = self.c
        e = c.engine
        self._trial = True
        self._spare = spare
        try:
            attempt_pod(p, pod, trial=True)
        finally:
            self._trial = False
            self._spare = None
        placed = e.state.pods.get(pod.key)
        if placed is not None:
            c.counters["decided"] += 1
            c.counters["early"] += 1
            return int(c.routing.slot_shard[placed.slot])
        # not placed, or only by evicting or moving pods: decided once the view is
        # exact, as before (this attempt undone)
        pod.attempts -= 1
        e.count("attempts", -1)
        return None

    def _kept_by_rules(self, pod: PodInfo) -> bool:
        """Whether ``pod`` would be handed over but for the inter-pod rules or spread
        constraints that apply to it (:meth:`_hand_over`'s checks of its profile)."""
        state = self.c.engine.state
        f = self.c.engine.profiles.framework_for(pod)
        return (
            f is not None
            and f.incremental
            and self.checks.summarised(f)
            and bool(f.conditional)
            and f.cluster_wide(pod, state)
        )

    def _room_whatever_lands(self, placed: Placed) -> bool:
        """Whether an early attempt's node keeps room for its pod whatever the pods
        still flying to that node's shard take there (all of them on that node)."""
        c = self.c
        if len(placed) != 1:
            return False
        pod, slot, _ = placed[0]
        shard = int(c.routing.slot_shard[slot])
        if shard < 0 or (self._spare is not None and self._spare[shard] < 1):
            return False
        pending = c.under_way(shard)
        free = c.engine.state.free
        return all(
            int(free[row, slot]) >= amount + int(pending[row]) for row, amount in pod.request
        )

    def _still_held(self, p: PassContext, unit: str) -> bool:
        """Is a pod of ``unit`` still held on a shard under a claim being aborted (a
        gang rolled back)? Placed again elsewhere before that shard lets it go, it
        would run twice; the shard's answer comes with the next relays. Bounded: not
        past the reservation time-out from the claim's start (a shard that never
        answers does not stop the queue for good)."""
        c = self.c
        for pod in p.unit_pods(unit):
            for rid in c.held_by.get(pod.key, ()):
                claim = c.claims.get(rid)
                if (
                    claim is not None
                    and claim.stage == ABORTING
                    and claim.open
                    and c.fresh(claim.since)
                ):
                    return True
        return False

    def _hand_over(self, p: PassContext, unit: str) -> bool:
        c = self.c
        e = c.engine
        pods = p.unit_pods(unit)
        if not pods:
            return False
        if is_group_unit(unit) and _topology_bound(e.groups.get(unit[1:])):
            return False  # its domain is chosen here, over every shard's nodes
        # (one loop, no generators: this runs for every pod the coordinator routes)
        frameworks: list[Framework | None] = []
        state = e.state
        for pod in pods:
            f = e.profiles.framework_for(pod)
            if f is None or not f.incremental or not self.checks.summarised(f):
                return False
            if f.conditional and f.cluster_wide(pod, state):
                # inter-pod rules apply: decided here, on the whole view (a plain pod
                # maybe before the flights land: _early)
                return False
            frameworks.append(f)
        if e.config.extenders and any(applicable(p, pod) for pod in pods):
            return False  # decided here, with the extenders' answers (a shard asks none)
        # the nodes of each shard that pass every filter for the unit: the same while
        # the view's nodes and placements stand (only what is handed over changes)
        lead = pods[0]
        counts = self.checks.counts(
            ("counts", lead.shape_key, lead.spec.scheduler_name)
            if len(pods) == 1
            else ("counts", *(pod.shape_key for pod in pods), lead.spec.scheduler_name),
            pods,
            frameworks,
        )
        framework = frameworks[0]
        assert framework is not None
        if not (lead.spec.group or lead.spec.depends_on or is_group_unit(unit)):
            # a plain pod: it and the identical pods behind it, in one step
            return self.checks.admitted(pods, frameworks) and hand_batch(
                c, self.checks, framework, lead, counts, _InBatch(self, p)
            )
        shard = self.checks.choose(framework, lead, counts)
        if shard is None or counts[shard] < c.inflight[shard] + len(pods):
            return False
        if not self.checks.admitted(pods, frameworks):
            return False
        running = c.engine.groups.get(lead.spec.group) if lead.spec.group else None
        if is_group_unit(unit) or (running is not None and running.spec is not None):
            # a gang, or a member of one that runs (beyond minMember): held under a
            # reservation, so that if the gang is rolled back the shard lets it go too
            self._hand_gang(unit, pods, shard)
        else:
            self._hand_pod(lead, shard)
        return True

    def _hand_pod(self, pod: PodInfo, shard: int, *, moves: bool = False) -> None:
        """Hand ``pod`` to ``shard``; ``moves``: for a plan of moves there, with the
        disruptions each budget allows, counted over every shard (the shard sees its
        own pods only)."""
        c = self.c
        decision = f"{pod.key}#{c.next_seq()}"
        disruptions, counted = self._counted(pod.key, moves)
        c.send(
            shard,
            PodRouted(
                pod=_own(pod.spec), decision_id=decision, disruptions=disruptions, counted=counted
            ),
        )
        c.fly(pod.key, shard, [pod], moves=moves)
        c.decisions[pod.key] = decision
        c.counters["handed"] += 1

    @staticmethod
    def _directs(unit: str, pod: PodInfo) -> bool:
        """Whether a unit decided here is handed to its node (:meth:`_hand_to_node`)
        rather than held under a claim: a pod of its own (no gang), placed with nothing
        evicted or moved. A gang's members are held whole under a claim."""
        return unit == pod.key and not pod.spec.group

    def _hand_to_node(self, pod: PodInfo, slot: int, devices: tuple[int, ...] | None) -> None:
        """Place ``pod`` on ``slot`` in the view and hand it to the shard that owns the
        node, to be placed there (on the view's GPU cards), or handed back: one record
        each way, where a claim costs a part, its grant and its commit."""
        c = self.c
        e = c.engine
        shard = int(c.routing.slot_shard[slot])
        decision = f"{pod.key}#{c.next_seq()}"
        e.place(pod.key, slot, decision, devices=devices)
        c.send(
            shard,
            PodRouted(
                pod=_own(pod.spec),
                decision_id=decision,
                node=e.state.names[slot] or "",
                devices=e.state.pods[pod.key].devices,
            ),
        )
        c.directed[pod.key] = shard
        c.decisions[pod.key] = decision
        c.counters["directed"] += 1

    def _counted(
        self, key: str, moves: bool
    ) -> tuple[dict[str, int] | None, tuple[int, int] | None]:
        """For a hand-off with a plan of moves (else nothing), what the shard counts
        over its own pods only, counted over every shard: the disruptions each budget
        allows for pod ``key``, and the pods placed and moved (what the view's move
        budget in percent of placed pods measured)."""
        e = self.c.engine
        if not moves:
            return None, None
        return e.disruptions_allowed(key) if e.budgets else None, (e.placed_total, e.moved_total)

    def _hand_gang(
        self, unit: str, pods: list[PodInfo], shard: int, *, moves: bool = False
    ) -> None:
        """Hand gang ``unit`` (its pending ``pods``) whole to ``shard``; ``moves``: for
        a plan of moves there, with the disruptions each budget allows over every
        shard."""
        c = self.c
        key = unit[1:] if is_group_unit(unit) else pods[0].spec.group
        group = c.engine.groups[key]
        assert group.spec is not None
        # a hand-off for moves is named as a part of moves: its refusals are counted,
        # and after MAX_MOVES_REFUSED the unit's plans of moves are not tried again
        rid = f"{key}{MOVES if moves else '#'}{c.next_seq()}"
        part = _part_spec(group.spec, rid, len(pods))
        specs = tuple(_member_spec(pod.spec, part) for pod in pods)
        keys = tuple(pod.key for pod in pods)
        since = c.issue((shard,))
        disruptions, counted = self._counted(pods[0].key, moves)
        c.send(
            shard,
            ReservationRequested(
                rid=rid,
                group=part,
                pods=specs,
                expires_at=c.expiry(since),
                at_once=True,
                disruptions=disruptions,
                counted=counted,
            ),
        )
        c.claim(Claim(rid, unit, {shard: keys}, since, directed=False, open={shard: None}))
        c.fly(unit, shard, pods, rid, moves=moves)
        c.counters["handed"] += 1

    def slot_owners(self) -> Ints | None:
        return self.c.routing.slot_shard

    def first(self, p: PassContext) -> list[str]:
        """The units to attempt before the queue, in order: preemptors whose victims
        are gone, plans that waited for answers (``ready``). Before them, the second
        steps of plans of moves whose first step is done (:meth:`_moves_after`)."""
        self._awaiting = False
        c = self.c
        if c.moves_after:
            self._moves_after()
        ready, c.ready = c.ready, []
        queue = c.engine.queue
        for unit in ready:
            queue.remove(unit)
        return ready

    def done(self, p: PassContext) -> None:
        """A run of preemptors decided this pass is carried out
        (:meth:`shards.coordinator.wave.Wave.flush`); then defragmentation and
        consolidation, where due (:meth:`_move_on_its_own`)."""
        self.wave.flush(p)
        c = self.c
        rescheduler = moving_on_its_own(f.plugins for f in p.profiles.frameworks.values())
        if rescheduler is None:
            return
        if not c.decided_since and any(
            is_decision(event) or isinstance(event, REQUESTS) for _, event in c.out_since()
        ):
            c.decided_since = True
        if c.consolidation_due:
            self._move_on_its_own(p, rescheduler)

    def _move_on_its_own(self, p: PassContext, rescheduler: Rescheduler) -> None:
        """Defragment and consolidate over every shard's nodes, as one engine does after
        its pass (:mod:`engine.passes.defrag`, :mod:`engine.passes.consolidate`; shards
        under a coordinator do neither): once per instant given inputs, when what was
        decided then is all answered (nothing handed, claimed, evicted or moved is
        under way: the view is then the state one engine's pass leaves), the moves one
        engine would make now are found on the view, each on the state the one before
        left, and carried out by the shards that own their nodes as a plan of moves is
        (:meth:`_carry_out`); the queue waits behind them until each moved pod is
        reported on its new node, as one engine makes them before its next pass.

        Why once settled, not in the pass that decided: a pod handed over is not in the
        view until its shard says where it went. A search changes the view's state
        (consolidation's epoch, these flags), so a pass that searched and sends nothing
        records that it ran (``ClockTicked`` in the control partition): replay runs
        the passes that sent something, and must run this one too.

        Cost: nothing per pod; per instant with inputs, one look at what is under way
        (the claims still being prepared) and, once settled, one search as one engine
        makes it. Only where a profile defragments or consolidates."""
        c = self.c
        if not self._settled():
            return
        e = c.engine
        statement = Statement(e.state, e.quotas)
        made: list[Move] = []
        cards: dict[str, tuple[int, ...]] = {}
        if rescheduler.defrag is not None:
            emptied = staged_defragmentation(
                p, rescheduler.defrag, rescheduler.moves_left(), statement
            )
            made += [(key, origin, slot, DEFRAGMENTATION) for key, origin, slot, _ in emptied]
            cards.update((key, devices) for key, _, _, devices in emptied if devices)
        if rescheduler.consolidate:
            decided = c.decided_since or bool(made)
            # (as one engine's pass: no pod moved twice, by a plan or defragmentation)
            before = set(c.moved_since) | {key for key, _, _, _ in made}
            moved = staged_moves(
                p, rescheduler, statement, decided=decided, before=len(made), moved=before
            )
            made += [(key, origin, slot, CONSOLIDATION) for key, origin, slot, _ in moved]
            cards.update((key, devices) for key, _, _, devices in moved if devices)
        statement.discard()
        owner = c.routing.slot_shard
        if any(owner[origin] < 0 or owner[slot] < 0 for _, origin, slot, _ in made):
            made = []  # a node between two owners (its pool is moving): at a later pass
        else:
            c.consolidation_due = c.decided_since = False
            c.moved_since.clear()
        if made:
            self._carry_out(ON_ITS_OWN, ON_ITS_OWN, made, cards)
            c.counters["moved_on_its_own"] += len(made)
        elif not c.out_since(0):
            c.send(c.control, ClockTicked())

    def _settled(self) -> bool:
        """Nothing the coordinator decided or asked for is under way: no hand-over (to a
        node or not), claim being prepared, eviction, plan of moves or run of preemptors. (A claim
        being aborted is not: the view let its pods go already, and what is sent now
        reaches their shard after the abort.)"""
        c = self.c
        return not (
            c.flights
            or c.directed
            or c.nominated
            or c.moves_after
            or c.ready
            or c.engine.planned
            or c.preparing()
        )

    def unbound(self, p: PassContext, event: PodUnbound) -> None:
        """The view rolled back a gang (a member's bind failed): the shards holding its
        parts let them go (and unbind what they bound)."""
        self.c.take_back(event)

    def rolled_back(self, p: PassContext, group: str, reason: str) -> None:
        """The view rolled back ``group``: members handed to shards alone and not
        answered yet are let go there too (:meth:`Coordinator.recall`)."""
        self.c.recall(group, reason)

    # ------------------------------------------------------------------ commit

    def commit(self, p: PassContext, statement: Statement | None, placed: Placed) -> bool:
        c = self.c
        e = c.engine
        unit = p.unit
        if self._trial and (
            statement is not None or unit in p.devices or not self._room_whatever_lands(placed)
        ):
            # an early attempt that evicts, moves, takes devices, or may not find its
            # room left: not now (:meth:`_early` undoes it)
            if statement is not None:
                statement.discard()
            p.devices.pop(unit, None)
            return False
        taken = self.wave.commit(p, statement, placed)
        if taken is not None:
            return taken  # a preemptor of a run: carried out with the run
        slots = [op.slot for op in statement.ops] if statement is not None else []
        slots += [slot for _, slot, _ in placed]
        if any(c.routing.slot_shard[slot] < 0 for slot in slots):
            # a node no shard owns now (its pool is moving): not this time
            if statement is not None:
                statement.discard()
            c.wait_for_owner(unit)
            return False
        moves = statement.moves() if statement is not None else []
        if moves and statement is not None:
            return self._migrations(p, statement, placed, moves)
        if statement is not None and statement.evicted():
            victims: dict[int, dict[str, str]] = {}
            for op in statement.ops:
                if op.kind == "evict":
                    shard = int(c.routing.slot_shard[op.slot])
                    victims.setdefault(shard, {})[op.key] = op.by or unit.lstrip("@")
            cards = held_devices(e.state, [pod.key for pod, _, _ in placed])
            statement.discard()  # the view keeps the victims until their shards evict them
            for shard in sorted(victims):
                c.send(shard, PreemptionRequested(victims=victims[shard]))
            c.nominate(unit, [v for part in victims.values() for v in part], victims)
            if is_group_unit(unit):
                self._plan(unit, placed, cards)
            return False
        if statement is None and len(placed) == 1 and self._directs(unit, placed[0][0]):
            pod, slot, _ = placed[0]
            self._hand_to_node(pod, slot, p.devices.pop(pod.key, None))
            return True
        if statement is not None:
            statement.commit()
        rid = f"{unit.lstrip('@')}#{c.next_seq()}"
        parts: dict[int, list[tuple[PodInfo, str]]] = {}
        for pod, slot, _ in placed:
            shard = int(c.routing.slot_shard[slot])
            node = e.state.names[slot] or ""
            parts.setdefault(shard, []).append((pod, node))
            e.place(pod.key, slot, f"{pod.key}@{rid}", devices=p.devices.pop(pod.key, None))
            c.claim_of[pod.key] = rid
        view = e.state.pods
        lead = placed[0][0]
        group = e.groups.get(lead.spec.group) if is_group_unit(unit) else None
        base = (
            group.spec
            if group is not None and group.spec is not None
            else GroupSpec(namespace=lead.spec.namespace, name=lead.spec.name, min_member=1)
        )
        at_once = len(parts) == 1
        since = c.issue(parts)
        for shard, members in sorted(parts.items()):
            part = _part_spec(base, rid, len(members))
            c.send(
                shard,
                ReservationRequested(
                    rid=rid,
                    group=part,
                    pods=tuple(_member_spec(pod.spec, part) for pod, _ in members),
                    expires_at=c.expiry(since),
                    placements={pod.key: node for pod, node in members},
                    at_once=at_once,
                    plain=not is_group_unit(unit) and not lead.spec.group,
                    # the view's cards (a GPU policy's choice): the shard takes the
                    # same, as one scheduler would, rather than its own best fit
                    devices={
                        pod.key: view[pod.key].devices
                        for pod, _ in members
                        if view[pod.key].devices
                    },
                ),
            )
        c.claim(
            Claim(
                rid,
                unit,
                {shard: tuple(pod.key for pod, _ in members) for shard, members in parts.items()},
                since,
                directed=True,
                open=dict.fromkeys(sorted(parts)),
            )
        )
        c.counters["prepared"] += 1
        return True

    def _migrations(
        self,
        p: PassContext,
        statement: Statement,
        placed: Placed,
        moves: list[tuple[str, int, int, str]],
    ) -> bool:
        """The view found room by moving pods. A plan within one shard is that shard's
        to carry out: the pod is handed to it, and its engine, seeing the same nodes and
        pods, finds the same plan (or hands the pod back). A plan whose every move goes
        to another shard's node is carried out in two steps, as a preemption is: each
        moved pod is held on its new node by a part of its own, committed at once on
        its new shard (``PodMigrated`` there; its old shard is told to forget it), and
        the pod waits, nominated, until every move is done, then is placed again on the
        exact view. A plan that also moves pods within a shard (or moves pods within one
        shard and places the pod or gang on another) is carried out the same way: the
        moves within a shard are a part of their own there, which that shard carries
        out at once as moves of its own pods
        (:func:`engine.passes.reservations.move_here`). A gang is handed whole, or waits
        whole."""
        c = self.c
        shard_of = c.routing.slot_shard
        involved = {int(shard_of[s]) for _, origin, slot, _ in moves for s in (origin, slot)}
        involved |= {int(shard_of[slot]) for _, slot, _ in placed}
        names = c.engine.state.names
        described = ", ".join(
            f"{key} from {names[origin]} to {names[slot]}" for key, origin, slot, _ in moves
        )
        cards = held_devices(c.engine.state, [pod.key for pod, _, _ in placed])
        moved_cards = held_devices(c.engine.state, [key for key, _, _, _ in moves])
        statement.discard()
        lead = placed[0][0]
        gang = is_group_unit(p.unit)
        if c.moves_refused.get(p.unit, 0) >= MAX_MOVES_REFUSED:
            refusal = (
                f"no node fits; moving {described} would make room, but the shards "
                f"refused its plans of moves {MAX_MOVES_REFUSED} times"
            )
            if gang:
                # not placed: the gang waits whole (its members are told why)
                park_gang(p, p.unit[1:], p.unit_pods(p.unit), refusal, ("Rescheduler",))
                return False
            p.unschedulable(lead, refusal, ("Rescheduler",))
            return True
        if any(self._unanswered(key) for key, _, _, _ in moves):
            # a pod the plan moves was placed under a claim its shard has not granted
            # yet (one scheduler would have bound it): moved now, its shard could bind
            # it where it no longer runs; the plan waits for the answer
            c.wait_for_answers(p.unit)
            self._awaiting = True
            return False
        if (
            len(involved) == 1
            and self._lands_alike(
                [key for key, _, _, _ in moves] + [pod.key for pod, _, _ in placed]
            )
            and self._gangs_whole_on(next(iter(involved)))
        ):
            if gang:
                # the members the plan places (minMember at least); the others are
                # ordinary pods from now on, as one scheduler's attempt leaves them
                self._hand_gang(p.unit, [pod for pod, _, _ in placed], involved.pop(), moves=True)
            else:
                self._hand_pod(lead, involved.pop(), moves=True)
            c.counters["migrations_handed"] += 1
            return True
        self._carry_out(lead.key, p.unit, moves, moved_cards)
        if gang:
            self._plan(p.unit, placed, cards)
        c.counters["migrations_across"] += 1
        return False

    def _carry_out(
        self, lead: str, unit: str, moves: list[Move], cards: dict[str, tuple[int, ...]]
    ) -> None:
        """Have the shards make ``moves`` (pod, from slot, to slot, for whom; on the GPU
        ``cards`` the view chose for them, where they have room), made for ``lead`` (a
        pod, or what moves pods on its own: consolidation), while ``unit``
        waits, nominated, until each moved pod is reported on its new node: moves
        within a shard as a part that shard carries out at once, moves across shards as
        parts of their own (see :meth:`_migrations`)."""
        c = self.c
        shard_of = c.routing.slot_shard
        names = c.engine.state.names
        by_shard: dict[tuple[int, bool], list[Move]] = {}
        leaving: dict[int, dict[str, str]] = {}
        for key, origin, slot, by in moves:
            within = bool(shard_of[origin] == shard_of[slot])
            by_shard.setdefault((int(shard_of[slot]), within), []).append((key, origin, slot, by))
            if not within:
                leaving.setdefault(int(shard_of[origin]), {})[key] = names[origin] or ""
        # moves within a shard onto room that pods of the plan leaving it free: the
        # moves across shards first, then these, once those pods are gone
        after = self._second_step(by_shard, leaving, cards)
        now = {k: v for k, v in by_shard.items() if not (after and k[1])}
        if any(within for _, within in now) or not any(s in leaving for s, _ in now):
            for (shard, _), moving in sorted(now.items()):
                self._move_in(lead, unit, shard, moving, cards)
        else:
            # a pod leaves a shard that takes in another pod of the plan: every part is
            # held, the pods leaving it counted gone there, and all committed together
            self._move_together(lead, unit, now, leaving, cards)
        c.nominate(unit, [key for key, _, _, _ in moves], {s for s, _ in by_shard})
        if after:
            c.moves_after[unit] = (lead, after, cards)

    def _second_step(
        self,
        by_shard: dict[tuple[int, bool], list[Move]],
        leaving: dict[int, dict[str, str]],
        cards: dict[str, tuple[int, ...]],
    ) -> list[Moving]:
        """The moves within a shard to make once the plan's moves across shards are
        done (per shard, in order), or none (all in one step). A shard carries out its
        moves within at once (:func:`engine.passes.reservations.move_here`), so it
        cannot count gone a pod of the same plan that leaves it for another shard and
        would refuse a move onto that pod's room (or, finding room elsewhere on the
        node, take other GPU cards than the view chose); one scheduler moves them all
        in one step. So where a shard with moves within also loses pods to another
        shard, the moves across go first and these once the pods that leave are
        reported gone: the same moves, and no unit decided between them (the unit
        stays nominated, and the queue waits behind it). Where a move across lands on
        a node a move within leaves, only if the moves across fit (on the ``cards``
        the view chose) with the pods moving within still in place
        (:meth:`_across_first`); else each would wait for the other, and all go in one
        step, as before."""
        within = [(shard, moving) for (shard, inside), moving in by_shard.items() if inside]
        if not within or not any(shard in leaving for shard, _ in within):
            return []
        vacated = {origin for _, moving in within for _, origin, _, _ in moving}
        landing = {
            slot
            for (_, inside), moving in by_shard.items()
            if not inside
            for _, _, slot, _ in moving
        }
        if vacated & landing and not self._across_first(by_shard, cards):
            return []
        return sorted(within)

    def _across_first(
        self, by_shard: dict[tuple[int, bool], list[Move]], cards: dict[str, tuple[int, ...]]
    ) -> bool:
        """Whether every move across shards of a plan fits where the view put it (its
        profile's filters on that node, its GPU ``cards`` free there) with only the
        pods moving across lifted: the pods moving within a shard still in place."""
        e = self.c.engine
        state = e.state
        across = [move for (_, inside), moving in by_shard.items() if not inside for move in moving]
        statement = Statement(state, e.quotas)
        try:
            for key, _, _, by in across:
                statement.lift(key, e.pods[key].spec.namespace, by)
            for key, _, slot, by in across:
                pod = unpinned(e.pods[key])
                framework = e.profiles.framework_for(pod)
                cycle = CycleState()
                if (
                    framework is None
                    or not framework.run_pre_filters(cycle, pod, state).ok
                    or not framework.feasible_on(cycle, pod, state, slot)
                ):
                    return False
                chosen = cards.get(key)
                if chosen and state.cards_if_free(slot, pod.request, chosen) is None:
                    return False
                statement.land_pod(pod, slot, by, chosen)
            return True
        finally:
            statement.discard()

    def _moves_after(self) -> None:
        """Send the second step of each plan whose first step's pods are all reported
        gone (:meth:`_second_step`); forget those whose plan ended (a part refused, the
        nomination timed out)."""
        c = self.c
        for unit in sorted(c.moves_after):
            lead, later, cards = c.moves_after[unit]
            entry = c.nominated.get(unit)
            if entry is None or (lead != ON_ITS_OWN and lead not in c.engine.pods):
                del c.moves_after[unit]
                if entry is not None:
                    c.end_nomination(unit)
                continue
            second = {key for _, moving in later for key, _, _, _ in moving}
            if any(key not in second for key in entry[1]):
                continue  # (a pod of the first step not reported gone yet)
            del c.moves_after[unit]
            for shard, moving in later:
                self._move_in(lead, unit, shard, moving, cards)

    def _plan(self, unit: str, placed: Placed, cards: dict[str, tuple[int, ...]]) -> None:
        """Remember where gang ``unit``'s attempt put its members (nodes and GPU cards),
        for its attempt once the evictions or moves it waits for are done: one
        scheduler places them there in the same step."""
        e = self.c.engine
        e.planned[unit] = {pod.key: e.state.names[slot] or "" for pod, slot, _ in placed}
        if cards:
            e.planned_cards[unit] = cards

    def _lands_alike(self, keys: list[str]) -> bool:
        """Whether a shard that finds a plan within its own nodes lands the pods of
        ``keys`` (the moved ones, and those they make room for) where the view does:
        none of them has spread constraints or inter-pod terms, and no placed pod has
        terms that would count them. Otherwise their scores read pods on other shards'
        nodes, and the plan is carried out as the view made it (the moves as a part of
        their own, the pods placed once they are done)."""
        e = self.c.engine
        for key in keys:
            pod = e.pods.get(key)
            if pod is None:
                return False
            spec = pod.spec
            if spec.spread_constraints or spec.owner_selector is not None or has_terms(spec):
                return False
        return not pod_table(e.state, e.pods, rows=False).with_terms

    def _gangs_whole_on(self, shard: int) -> bool:
        """Whether every gang with a member running on ``shard``'s nodes runs there whole,
        under one claim: that shard then sees each such gang as one scheduler does, a
        unit moved whole or not at all. A gang placed across shards is held on each as a
        part of its own, which that shard's plan of moves could move alone (one
        scheduler never moves part of a gang), and a gang placed by several claims is
        several parts there: a plan within such a shard is carried out as the view made
        it, not found again by the shard."""
        c = self.c
        e = c.engine
        owner = c.routing.slot_shard
        placed = e.state.pods
        for group in e.groups.values():
            claims: set[str] = set()
            here = elsewhere = False
            for key in group.members:
                where = placed.get(key)
                if where is None:
                    continue
                if int(owner[where.slot]) == shard:
                    here = True
                else:
                    elsewhere = True
                claims.add(c.claim_of.get(key, ""))
            if here and (elsewhere or len(claims) > 1):
                return False
        return True

    def _unanswered(self, key: str) -> bool:
        """Whether placed pod ``key`` is held under a claim not granted yet, or handed to
        its node and not reported placed yet."""
        c = self.c
        if key in c.directed:
            return True
        claim = c.claims.get(c.claim_of.get(key, ""))
        return claim is not None and claim.stage != COMMITTED

    def _move_in(
        self,
        lead: str,
        unit: str,
        shard: int,
        moving: list[Move],
        cards: dict[str, tuple[int, ...]],
    ) -> None:
        """Ask ``shard`` to hold ``moving`` (pod, from slot, to slot, the pod it makes
        room for) on their new nodes (on ``cards``) and commit them at once as moves
        made for ``lead``."""
        c = self.c
        rid = f"{lead}{MOVES}{c.next_seq()}"
        since = c.issue((shard,))
        self._move_part(lead, rid, shard, moving, since, at_once=True, leaving={}, cards=cards)
        keys = tuple(key for key, _, _, _ in moving)
        c.claim(Claim(rid, unit, {shard: keys}, since, directed=True, open={shard: None}))

    def _move_together(
        self,
        lead: str,
        unit: str,
        by_shard: dict[tuple[int, bool], list[Move]],
        leaving: dict[int, dict[str, str]],
        cards: dict[str, tuple[int, ...]],
    ) -> None:
        """Moves across shards, for ``lead``, of which some free room that others need
        on the same shard (``leaving``: per shard, its pods the plan takes elsewhere):
        one claim, a part per shard that takes pods in, each held with its leaving pods
        counted gone, and committed once every part is held (one shard moves them in
        one step)."""
        c = self.c
        rid = f"{lead}{MOVES}{c.next_seq()}"
        shards = sorted(shard for shard, _ in by_shard)
        since = c.issue(shards)
        for (shard, _), moving in sorted(by_shard.items()):
            leaves = leaving.get(shard, {})
            self._move_part(
                lead, rid, shard, moving, since, at_once=False, leaving=leaves, cards=cards
            )
        parts = {shard: tuple(key for key, _, _, _ in by_shard[(shard, False)]) for shard in shards}
        c.claim(Claim(rid, unit, parts, since, directed=True, open=dict.fromkeys(shards)))

    def _move_part(
        self,
        lead: str,
        rid: str,
        shard: int,
        moving: list[Move],
        since: int,
        *,
        at_once: bool,
        leaving: dict[str, str],
        cards: dict[str, tuple[int, ...]],
    ) -> None:
        """Send ``shard`` part ``rid``: hold ``moving`` (pod, from slot, to slot, the pod
        it makes room for) on their new nodes, as moves made for ``lead`` (or, where a
        gang's member needed the move, for that member, as one scheduler says)."""
        c = self.c
        e = c.engine
        names = e.state.names
        pods = [e.pods[key] for key, _, _, _ in moving]
        made_for = e.pods.get(lead)
        namespace = (made_for or pods[0]).spec.namespace
        part = _part_spec(GroupSpec(namespace=namespace, name=rid, min_member=1), rid, len(moving))
        c.send(
            shard,
            ReservationRequested(
                rid=rid,
                group=part,
                # the node a pod named is where it ran, not where it may go (as when
                # one shard moves it)
                pods=tuple(
                    _member_spec(msgspec.structs.replace(pod.spec, node_name=""), part)
                    for pod in pods
                ),
                expires_at=c.expiry(since),
                placements={key: names[slot] or "" for key, _, slot, _ in moving},
                at_once=at_once,
                moves={key: names[origin] or "" for key, origin, _, _ in moving},
                moved_for=lead,
                moved_by={key: by for key, _, _, by in moving if by and by != lead},
                plain=not any(pod.spec.group for pod in pods),
                leaving=leaving,
                devices={key: cards[key] for key, _, _, _ in moving if key in cards},
            ),
        )


class _InBatch:
    """:class:`shards.coordinator.batches.InPlace` for the batches of a pass: a pod only
    its rules keep here is decided as :meth:`ShardDispatch._early` decides it, with
    the pods of the batch before it counted as flying (their namespaces and labels)
    and its node's shard able to spare a node."""

    __slots__ = ("d", "p")

    def __init__(self, dispatch: ShardDispatch, p: PassContext) -> None:
        self.d = dispatch
        self.p = p

    def candidate(self, pod: PodInfo) -> bool:
        return self.d._may_decide_early(self.p, pod)

    def decide(self, pod: PodInfo, ahead: list[LabelKey], spare: list[int]) -> int | None:
        d, p = self.d, self.p
        if d.c.flying_match(_selecting(pod), ahead):
            return None
        unit, p.unit = p.unit, pod.key
        try:
            return d._try_early(p, pod, spare)
        finally:
            p.unit = unit


def _selecting(pod: PodInfo) -> list[Selecting]:
    """Which pods ``pod``'s own inter-pod rules and spread constraints count (every one:
    required and preferred, ``DoNotSchedule`` and ``ScheduleAnyway``; the default
    constraints select with its owner's selector). The placed pods whose rules count
    it are in the view; a pod handed over has no required rule (it would not have been
    handed over), so the pods under way count only through these."""
    spec = pod.spec
    own = (spec.namespace,)
    selecting: list[Selecting] = [(own, c.selector) for c in spec.spread_constraints]
    if not spec.spread_constraints and spec.owner_selector is not None:
        selecting.append((own, spec.owner_selector))
    terms = [
        *spec.pod_affinity,
        *spec.pod_anti_affinity,
        *(w.term for w in spec.pod_affinity_preferred),
        *(w.term for w in spec.pod_anti_affinity_preferred),
    ]
    for term in terms:
        namespaces = None if term.all_namespaces else (term.namespaces or own)
        selecting.append((namespaces, term.selector))
    return selecting


ON_ITS_OWN: Final = "shoal.io/moves"
"""What the moves made with no pod waiting (defragmentation's, consolidation's) are
made for, as a plan's are for its pod: the unit the queue waits behind while the
shards carry them out (each ``PodMigrated`` names its own kind's ``by``)."""
REQUESTS: Final = (PodRouted, ReservationRequested, PreemptionRequested)
"""What the coordinator asks of shards when it decides a unit (a shard's decisions)."""


def _topology_bound(group: GroupInfo | None) -> bool:
    """Whether a gang has a topology constraint: the coordinator chooses its domain on
    its view of every shard (:mod:`engine.passes.topology`), so the parts go to the
    shards that own that domain's nodes; handed whole to one shard, the domain would be
    chosen among that shard's nodes only."""
    spec = group.spec if group is not None else None
    return spec is not None and bool(spec.topology_required or spec.topology_preferred)


def _own(spec: PodSpec) -> PodSpec:
    """``spec`` as its shard places it: a pod of its own (its gang and dependencies are
    the coordinator's to count)."""
    if spec.group or spec.depends_on:
        return msgspec.structs.replace(spec, group="", depends_on=())
    return spec


def _part_spec(spec: GroupSpec, rid: str, members: int) -> GroupSpec:
    """The group a shard holds a part under: named after the reservation (a part is a
    gang of its own there; every one of its pods must be placed)."""
    return GroupSpec(
        namespace=spec.namespace,
        name=rid.split("/", 1)[-1],
        min_member=members,
        priority=spec.priority,
        priority_class=spec.priority_class,
        queue=spec.queue,
        source=spec.source,
        uid=rid,
    )


def _member_spec(spec: PodSpec, part: GroupSpec) -> PodSpec:
    return msgspec.structs.replace(spec, group=part.key, depends_on=())

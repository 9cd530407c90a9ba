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
  shards that own the nodes: a reservation part per shard, on the nodes chosen
  (prepared and committed whole), or, for a preemption, the evictions first; the unit
  is attempted again once the victims are gone, as kube-scheduler does;
- **waits** at the head of the queue while evictions it asked for are under way, while
  a pod of it is still held on a shard under a claim being aborted (a gang rolled back:
  placed elsewhere first, it would run twice), or (for a unit to decide here) while
  handed units are unanswered.

So the order of the queue is one order for the whole cluster, and whatever a shard is
asked to do fits there when it does it. Only what is handed over is placed concurrently.

**Handing over in batches, and why.** The plain pods at the head of the queue are
handed over in one step (:meth:`ShardDispatch._hand_batch`): in queue order, each
while a shard certainly holds it, the batch ending at the first pod that does not
(it waits at the head, as one by one it would) or that cannot be handed over at all
(a gang, a pod an inter-pod rule applies to, one handed back...: the exact path
below). The checks (profile, inter-pod rules, extenders, pre-filters, feasible nodes
per shard) are made once per kind of pod in the batch
(:func:`shards.coordinator.batches.kind_key`: same request, filters, labels and
constraints), not per pod; the choice of shard for the
pods of one kind is one vectorised score of every shard after 0, 1, 2... more pods of
that kind (:func:`shards.coordinator.choice.run_scores`), so a run of identical pods
(one Deployment's, Job's) goes exactly where one by one it would; pods of other kinds
in the same batch are not counted in a kind's scores (each kind spreads on its own;
all are counted in what a shard certainly holds). Batches are made only where no
quota orders the queue (dominant shares and admission change with every charge) and
no extender is asked; otherwise a pod is handed over alone, as before.

**Cost per pod handed over** (the cost model of :mod:`shards.coordinator.coordinator`;
5,000 nodes, 42 shapes, 2 shards, a busy 2-core machine): about 15-20 µs, down from
45-55: per pod, taking it out of the queue and its kind's key (about 4), its choice
(a look-up and a comparison per shard), its ``PodRouted`` and decision id, its flight;
per kind and batch, the checks and the counts (O(nodes), see the coordinator).

**The directions of issue 25 weighed.** Routing runs in one step: done, generalised to
every plain pod at the head of the queue, since the measured workloads interleave a
few dozen shapes (runs of identical pods average about one there). Shards publishing
per-shape capacities (how many pods they certainly hold, their best score): not done
yet; it would remove the per-batch O(nodes) counts and let more than one pod per
feasible node be in flight, at the price of a new report kind and its replay.
Folding placement reports in bulk: done per report already; what is left per pod is
the view assuming each placement. Units that need the whole cluster (preemption,
reclaim, spanning gangs, inter-pod rules, user scores, extenders) are decided here on
the exact view, as before; so are all units of a packing profile
(:mod:`shards.coordinator.choice` says why, and their cost: one scheduling attempt here
and a directed part per pod, instead of the choice and the hand-over).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.framework.runtime import Framework
from engine.model.groups import GroupInfo, is_group_unit
from engine.model.pods import PodInfo
from engine.model.state import Bools, Ints
from engine.model.statement import Statement
from engine.passes.context import PassContext
from engine.passes.dispatch import Placed, Route
from engine.passes.extenders import applicable
from engine.passes.gangs import park_gang
from engine.plugins.registry import builtin_registry
from events.types import (
    Event,
    GroupSpec,
    PodRouted,
    PodSpec,
    PodUnbound,
    PreemptionRequested,
    ReservationRequested,
)
from shards.coordinator.batches import Kind, take
from shards.coordinator.choice import (
    ShardView,
    label_scores,
    run_scores,
    scores,
    shard_columns,
    summarised,
)
from shards.coordinator.flights import ABORTING, MAX_MOVES_REFUSED, MOVES, Claim
from shards.coordinator.routing import Routing

BUILT_IN: Final = frozenset(builtin_registry().names())
"""The plugins whose scores :mod:`shards.coordinator.choice` summarises per shard."""

T = TypeVar("T")


class Coordinating(Protocol):
    """What the dispatch reads and asks of the coordinator it serves
    (:class:`shards.coordinator.coordinator.Coordinator`, which imports this module)."""

    n: int
    engine: Engine
    """The coordinator's view."""
    routing: Routing
    counters: dict[str, int]
    decisions: dict[str, str]
    claims: dict[str, Claim]
    claim_of: dict[str, str]
    held_by: dict[str, dict[str, None]]
    hard: dict[str, None]
    inflight: list[int]
    pending: npt.NDArray[np.int64]
    moves_refused: dict[str, int]
    ready: list[str]
    now: int

    def send(self, partition: int, event: Event) -> None: ...

    def next_seq(self) -> int: ...

    def expiry(self) -> int: ...

    def fresh(self, since: int) -> bool: ...

    def flights_under_way(self) -> bool: ...

    def nominations_under_way(self) -> bool: ...

    def recall(self, group: str, reason: str) -> None: ...

    def cached(self, key: tuple[object, ...], compute: Callable[[], T]) -> T: ...

    def feasible_counts(self, feasible: Bools) -> list[int]: ...

    def claim(self, claim: Claim) -> None: ...

    def fly(self, unit: str, shard: int, pods: list[PodInfo], rid: str = "") -> None: ...

    def fly_run(self, pods: list[PodInfo], shards: list[int], decisions: list[str]) -> None: ...

    def nominate(self, unit: str, victims: list[str]) -> None: ...

    def wait_for_owner(self, unit: str) -> None: ...

    def take_back(self, event: PodUnbound) -> None: ...


class ShardDispatch:
    waits = True

    def __init__(self, coordinator: Coordinating) -> None:
        self.c = coordinator
        self._known: dict[int, tuple[Framework, bool]] = {}
        """Per framework (by id, kept alive here): whether it can be handed over."""

    def __repr__(self) -> str:
        return "ShardDispatch()"

    # ------------------------------------------------------------------ route

    def route(self, p: PassContext, unit: str) -> Route:
        c = self.c
        if c.nominations_under_way() or self._still_held(p, unit):
            return Route.WAIT
        if unit not in c.hard and self._hand_over(p, unit):
            return Route.HANDED
        if c.flights_under_way():
            return Route.WAIT
        c.hard.pop(unit, None)
        c.counters["decided"] += 1
        return Route.ATTEMPT

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
            if f is None or not f.incremental or not self._summarised(f):
                return False
            if f.conditional and f.cluster_wide(pod, state):
                return False  # inter-pod rules apply: decided here, on the whole view
            frameworks.append(f)
        if e.config.extenders and any(applicable(p, pod) for pod in pods):
            return False  # decided here, with the extenders' answers (a shard asks none)
        # the nodes of each shard that pass every filter for the unit: the same while
        # the view's nodes and placements stand (only what is handed over changes)
        lead = pods[0]
        counts = c.cached(
            ("counts", lead.shape_key, lead.spec.scheduler_name)
            if len(pods) == 1
            else ("counts", *(pod.shape_key for pod in pods), lead.spec.scheduler_name),
            lambda: c.feasible_counts(self._feasible(pods, frameworks)),
        )
        framework = frameworks[0]
        assert framework is not None
        if not (lead.spec.group or lead.spec.depends_on or is_group_unit(unit)):
            # a plain pod: it and the identical pods behind it, in one step
            return self._admitted(pods, frameworks) and self._hand_batch(p, framework, lead, counts)
        shard = self._choose(framework, lead, counts)
        if shard is None or counts[shard] < c.inflight[shard] + len(pods):
            return False
        if not self._admitted(pods, frameworks):
            return False
        running = c.engine.groups.get(lead.spec.group) if lead.spec.group else None
        if is_group_unit(unit) or (running is not None and running.spec is not None):
            # a gang, or a member of one that runs (beyond minMember): held under a
            # reservation, so that if the gang is rolled back the shard lets it go too
            self._hand_gang(unit, pods, shard)
        else:
            self._hand_pod(lead, shard)
        return True

    def _summarised(self, framework: Framework) -> bool:
        """Whether every plugin at ``framework``'s preScore and score points is one the
        choice of a shard knows how to summarise (a built-in, and no packing score:
        :func:`shards.coordinator.choice.summarised`)."""
        known = self._known.get(id(framework))
        if known is None or known[0] is not framework:
            plugins = [*framework.pre_scores, *(entry.plugin for entry in framework.scores)]
            known = (
                framework,
                all(p.name in BUILT_IN for p in plugins)
                and all(summarised(entry.plugin) for entry in framework.scores),
            )
            self._known[id(framework)] = known
        return known[1]

    def _feasible(self, pods: list[PodInfo], frameworks: list[Framework | None]) -> Bools:
        e = self.c.engine
        feasible: Bools | None = None
        for pod, framework in zip(pods, frameworks, strict=True):
            assert framework is not None
            mask, _ = framework._shape_feasible(CycleState(), pod, e.state)
            feasible = mask.copy() if feasible is None else feasible & mask
        assert feasible is not None
        return feasible

    def _admitted(self, pods: list[PodInfo], frameworks: list[Framework | None]) -> bool:
        """Every pod passes its profile's pre-filters (quota, minResources) on the
        coordinator's view, counted together (the quota is charged when it is handed
        over, until the shard answers)."""
        e = self.c.engine
        charged: list[PodInfo] = []
        try:
            for pod, framework in zip(pods, frameworks, strict=True):
                assert framework is not None
                if not framework.run_pre_filters(CycleState(), pod, e.state).ok:
                    return False
                if len(pods) > 1:
                    e.quotas.add(pod.spec.namespace, pod.request)
                    charged.append(pod)
            return True
        finally:
            for done in charged:
                e.quotas.remove(done.spec.namespace, done.request)

    def _choose(self, framework: Framework, pod: PodInfo, counts: list[int]) -> int | None:
        c = self.c
        candidates = [s for s in range(c.n) if counts[s] > 0]
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        shards = self._shard_view(framework, pod)
        nodes = shards.refresh(c.pending)
        kernel = framework.kernel
        params = kernel.params(pod.request, nodes) if kernel is not None else None
        if (
            kernel is not None
            and params is not None
            and kernel.worth(0, 0)  # loaded: no numba load for a small simulation
            and kernel.run(
                candidates,
                shards.ones,
                nodes,
                params,
                shards.feasible,
                shards.local,
                shards.masked,
            )
        ):
            # the compiled twin of the local score plugins, on the shards as nodes
            total = shards.local
            if shards.labels is not None:
                total = total + shards.labels
        else:
            total = scores(framework, pod, nodes, shards.labels)
        start = pod.tiebreak % len(candidates)
        order = candidates[start:] + candidates[:start]
        values: list[int] = total.tolist()  # (one conversion, not one per shard)
        return max(order, key=values.__getitem__)

    def _shard_view(self, framework: Framework, pod: PodInfo) -> ShardView:
        """Each shard's sums over the nodes ``pod``'s static filters allow (cached while
        the view's nodes and placements stand)."""
        c = self.c
        e = c.engine

        def view() -> ShardView:
            static = framework.static_feasible(pod, e.state)
            return ShardView(
                shard_columns(e.state, static, c.routing.slot_shard, c.n),
                e.state,
                label_scores(framework, pod, e.state, static, c.routing.slot_shard, c.n),
            )

        return c.cached(("shards", pod.static_key, pod.spec.scheduler_name), view)

    def _kind(self, pod: PodInfo) -> Kind | None:
        """The checks of :meth:`_hand_over` for a plain pod that follows the head of the
        queue, made once per kind of pod in a batch (None: not to be handed over)."""
        c = self.c
        e = c.engine
        framework = e.profiles.framework_for(pod)
        if framework is None or not framework.incremental or not self._summarised(framework):
            return None
        if framework.conditional and framework.cluster_wide(pod, e.state):
            return None
        counts = c.cached(
            ("counts", pod.shape_key, pod.spec.scheduler_name),
            lambda: c.feasible_counts(self._feasible([pod], [framework])),
        )
        if not self._admitted([pod], [framework]):
            return None
        kind = Kind(framework, pod, counts)
        return kind if kind.candidates else None

    def _hand_batch(
        self, p: PassContext, framework: Framework, lead: PodInfo, counts: list[int]
    ) -> bool:
        """Hand ``lead`` and the plain pods behind it over in one step
        (:func:`shards.coordinator.batches.take`), in queue order, each while a shard
        certainly holds it (more of the shard's nodes pass its filters than pods are
        handed there and unanswered). ``lead`` goes
        where :meth:`_choose` puts it; each other pod to the best shard by the scores of
        its kind with the pods of that kind before it in the batch counted pending
        there (one vectorised score per kind: :func:`run_scores`; pods of other kinds
        in the same batch are not counted, so several kinds spread each on its own).
        Pods after the first that does not fit where it would go are queued again as
        they were (same priority and arrival: the same place in the queue); the pass
        then finds that one at the head, as if pods were handed one by one."""
        c = self.c
        e = c.engine
        first = self._choose(framework, lead, counts)
        if first is None or counts[first] < c.inflight[first] + 1:
            return False  # (the queue untouched: nothing moved)
        head = Kind(framework, lead, counts)
        batch = take(c, lead, head, self._kind)
        pending = c.pending
        kinds: dict[int, Kind] = {}
        for _, kind in batch:
            kinds[id(kind)] = kind
        for kind in kinds.values():
            if len(kind.candidates) > 1 and kind.pods > 1:
                view = self._shard_view(kind.framework, kind.lead)
                kind.table = run_scores(kind.framework, kind.lead, view, pending, kind.pods)
        inflight = list(c.inflight)
        shards: list[int] = []
        for index, (pod, kind) in enumerate(batch):
            candidates = kind.candidates
            taken = kind.taken
            table = kind.table
            if index == 0:
                shard = first
            elif table is None:
                shard = candidates[0]
            else:
                start = pod.tiebreak % len(candidates)
                order = candidates[start:] + candidates[:start]
                shard = max(order, key=lambda s: table[s][taken[s]])
            if kind.counts[shard] < inflight[shard] + 1:
                break
            inflight[shard] += 1
            taken[shard] += 1
            shards.append(shard)
        handed = len(shards)
        for pod, _ in batch[handed:]:
            e.queue.add(pod.key, pod.priority, pod.seq, e.queue_of(pod.spec.namespace))
        send = c.send
        by_kind: dict[int, tuple[list[PodInfo], list[int], list[str]]] = {}
        for (pod, kind), shard in zip(batch, shards, strict=False):
            decision = f"{pod.key}#{c.next_seq()}"
            send(shard, PodRouted(pod=pod.spec, decision_id=decision))
            group = by_kind.get(id(kind))
            if group is None:
                group = by_kind[id(kind)] = ([], [], [])
            group[0].append(pod)
            group[1].append(shard)
            group[2].append(decision)
        for kind_pods, kind_shards, decisions in by_kind.values():
            c.fly_run(kind_pods, kind_shards, decisions)
        c.counters["handed"] += handed
        c.counters["batches"] += 1
        return True

    def _hand_pod(self, pod: PodInfo, shard: int, *, moves: bool = False) -> None:
        """Hand ``pod`` to ``shard``; ``moves``: for a plan of moves there, with the
        disruptions each budget allows, counted over every shard (the shard sees its
        own pods only)."""
        c = self.c
        decision = f"{pod.key}#{c.next_seq()}"
        spec = pod.spec
        if spec.group or spec.depends_on:  # the shard places it as a pod of its own
            spec = msgspec.structs.replace(spec, group="", depends_on=())
        disruptions = c.engine.disruptions_allowed(pod.key) if moves and c.engine.budgets else None
        c.send(shard, PodRouted(pod=spec, decision_id=decision, disruptions=disruptions))
        c.fly(pod.key, shard, [pod])
        c.decisions[pod.key] = decision
        c.counters["handed"] += 1

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
        c.send(
            shard,
            ReservationRequested(
                rid=rid,
                group=part,
                pods=specs,
                expires_at=c.expiry(),
                at_once=True,
                disruptions=c.engine.disruptions_allowed(pods[0].key)
                if moves and c.engine.budgets
                else None,
            ),
        )
        c.claim(Claim(rid, unit, {shard: keys}, c.now, directed=False, open={shard: None}))
        c.fly(unit, shard, pods, rid)
        c.counters["handed"] += 1

    def slot_owners(self) -> Ints | None:
        return self.c.routing.slot_shard

    def first(self, p: PassContext) -> list[str]:
        ready, self.c.ready = self.c.ready, []
        for unit in ready:
            self.c.engine.queue.remove(unit)
        return ready

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
            statement.discard()  # the view keeps the victims until their shards evict them
            for shard in sorted(victims):
                c.send(shard, PreemptionRequested(victims=victims[shard]))
            c.nominate(unit, [v for part in victims.values() for v in part])
            if is_group_unit(unit):
                e.planned[unit] = {pod.key: e.state.names[slot] or "" for pod, slot, _ in placed}
            return False
        if statement is not None:
            statement.commit()
        rid = f"{unit.lstrip('@')}#{c.next_seq()}"
        parts: dict[int, list[tuple[PodInfo, str]]] = {}
        for pod, slot, _ in placed:
            shard = int(c.routing.slot_shard[slot])
            node = e.state.names[slot] or ""
            parts.setdefault(shard, []).append((pod, node))
            e.place(pod.key, slot, f"{pod.key}@{rid}")
            c.claim_of[pod.key] = rid
        lead = placed[0][0]
        group = e.groups.get(lead.spec.group) if is_group_unit(unit) else None
        base = (
            group.spec
            if group is not None and group.spec is not None
            else GroupSpec(namespace=lead.spec.namespace, name=lead.spec.name, min_member=1)
        )
        at_once = len(parts) == 1
        for shard, members in sorted(parts.items()):
            part = _part_spec(base, rid, len(members))
            c.send(
                shard,
                ReservationRequested(
                    rid=rid,
                    group=part,
                    pods=tuple(_member_spec(pod.spec, part) for pod, _ in members),
                    expires_at=c.expiry(),
                    placements={pod.key: node for pod, node in members},
                    at_once=at_once,
                ),
            )
        c.claim(
            Claim(
                rid,
                unit,
                {shard: tuple(pod.key for pod, _ in members) for shard, members in parts.items()},
                c.now,
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
        statement.discard()
        lead = placed[0][0]
        gang = is_group_unit(p.unit)
        if c.moves_refused.get(p.unit, 0) >= MAX_MOVES_REFUSED:
            refusal = (
                f"no node fits; moving {described} would make room, but the shards "
                f"refused to take moved pods in {MAX_MOVES_REFUSED} times"
            )
            if gang:
                # not placed: the gang waits whole (its members are told why)
                park_gang(p, p.unit[1:], p.unit_pods(p.unit), refusal, ("Rescheduler",))
                return False
            p.unschedulable(lead, refusal, ("Rescheduler",))
            return True
        if len(involved) == 1:
            if gang:
                self._hand_gang(p.unit, p.unit_pods(p.unit), involved.pop(), moves=True)
            else:
                self._hand_pod(lead, involved.pop(), moves=True)
            c.counters["migrations_handed"] += 1
            return True
        by_shard: dict[tuple[int, bool], list[tuple[str, int, int]]] = {}
        for key, origin, slot, _ in moves:
            within = bool(shard_of[origin] == shard_of[slot])
            by_shard.setdefault((int(shard_of[slot]), within), []).append((key, origin, slot))
        for (shard, _), moving in sorted(by_shard.items()):
            self._move_in(lead, p.unit, shard, moving)
        c.nominate(p.unit, [key for key, _, _, _ in moves])
        c.counters["migrations_across"] += 1
        return False

    def _move_in(
        self, lead: PodInfo, unit: str, shard: int, moving: list[tuple[str, int, int]]
    ) -> None:
        """Ask ``shard`` to hold ``moving`` (pod, from slot, to slot) on their new nodes
        and commit them at once as moves made for ``lead``."""
        c = self.c
        e = c.engine
        names = e.state.names
        rid = f"{lead.key}{MOVES}{c.next_seq()}"
        base = GroupSpec(namespace=lead.spec.namespace, name=lead.spec.name, min_member=1)
        part = _part_spec(base, rid, len(moving))
        pods = [e.pods[key] for key, _, _ in moving]
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
                expires_at=c.expiry(),
                placements={key: names[slot] or "" for key, _, slot in moving},
                at_once=True,
                moves={key: names[origin] or "" for key, origin, _ in moving},
                moved_for=lead.key,
            ),
        )
        keys = tuple(key for key, _, _ in moving)
        c.claim(Claim(rid, unit, {shard: keys}, c.now, directed=True, open={shard: None}))


def _topology_bound(group: GroupInfo | None) -> bool:
    """Whether a gang has a topology constraint: the coordinator chooses its domain on
    its view of every shard (:mod:`engine.passes.topology`), so the parts go to the
    shards that own that domain's nodes; handed whole to one shard, the domain would be
    chosen among that shard's nodes only."""
    spec = group.spec if group is not None else None
    return spec is not None and bool(spec.topology_required or spec.topology_preferred)


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

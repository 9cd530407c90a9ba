"""What a shard knows, and the operations that keep it consistent.

:class:`ShardModel` is the data layer of one engine: the cluster columns, the queue,
the quotas, every live pod and group, finished pods' outcomes, reservations and the
bookkeeping that ties them together. Its methods change that state and keep its
invariants (a placed pod is in the columns, in its quota and in ``bindings``; a
finished pod is in none of them); they decide nothing. The fold (:mod:`engine.fold`)
calls them for each event and the pass steps (:mod:`engine.passes`) for each decision,
so that a decision made and the same decision replayed change the state alike.

The one thing this layer asks of the layers above is :class:`Hints`: which parked pods
a cluster change may help (the plugins know; the model only asks).

Why one module of over 500 lines: it is the one place that keeps a shard's
invariants, and each operation touches several of its parts (columns, queue, quotas,
groups, reservations); split by part, an operation would be cut in two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from engine.model.changes import EVERY, ClusterEvent
from engine.model.disruption import DisruptionBudgets
from engine.model.extenders import ExtenderBook
from engine.model.groups import (
    FAILED,
    PENDING,
    SCHEDULED,
    SUCCEEDED,
    DependencyState,
    GroupInfo,
    NextRuns,
    advance,
    find_cycle,
    group_is_over,
    group_unit,
    hold_for_next_run,
    is_group_unit,
)
from engine.model.holds import HOLD_PREFIX, Hold, hold_until, owner_of
from engine.model.pods import PodInfo, pod_info
from engine.model.pools import Pools
from engine.model.queue import SchedulingQueue
from engine.model.quota import QuotaTable
from engine.model.reservations import COMMITTED, Reservation
from engine.model.retention import (
    RETENTION_SECONDS,
    Deadlines,
    Retired,
    forget_finished,
    next_deadline,
    timed_out,
)
from engine.model.shapes import ShapeCounts
from engine.model.state import ClusterState, Request
from events.types import (
    PodGroupSubmitted,
    PodRouted,
    PodSpec,
    PoolReleased,
    ReservationRequested,
    ShardSummary,
)

NO_PLAN_PLACED: Final = 64
"""Placements after which shapes the rescheduler found no plan for are tried again
(its budget in percent of placed pods may allow more moves by then)."""
QUOTA_PLUGIN: Final = "ElasticQuota"
"""The plugin that admits pods by their namespace's elastic quota: a pod it rejected may
fit once any pod anywhere frees capacity, on no particular node."""


class Hints(Protocol):
    """What the plugins say about a parked pod (implemented by the profiles)."""

    def events_for(self, pod: PodInfo, plugins: tuple[str, ...]) -> frozenset[ClusterEvent]:
        """The cluster changes that may help ``pod``, which ``plugins`` rejected."""
        ...

    def worth_retrying(
        self,
        pod: PodInfo,
        plugins: tuple[str, ...],
        event: ClusterEvent,
        slot: int,
        state: ClusterState,
    ) -> bool:
        """Whether ``event`` on node ``slot`` may let ``pod`` pass ``plugins``."""
        ...

    def room_decides(
        self, pod: PodInfo, plugins: tuple[str, ...], slot: int, state: ClusterState
    ) -> bool | None:
        """Whether free room on node ``slot`` is what decides for ``pod``, which
        ``plugins`` rejected: True when the node passes its static filters and only
        resource fit or static filters rejected it, False when the node fails its static
        filters (room there cannot help), None when another plugin may reject it."""
        ...


class ShardModel:
    """The state of one engine (a shard, or the coordinator's view of every shard)."""

    def __init__(
        self,
        *,
        shard: int = 0,
        initial_backoff_seconds: int = 1,
        max_backoff_seconds: int = 10,
        retention_seconds: int = RETENTION_SECONDS,
    ) -> None:
        self.shard = shard
        self.state = ClusterState()
        self.queue = SchedulingQueue(initial_backoff_seconds, max_backoff_seconds)
        self.quotas = QuotaTable(self.state.resources)
        self.budgets = DisruptionBudgets()
        """Pod disruption budgets (:mod:`engine.model.disruption`)."""
        self.pools = Pools()
        """Pool rules and tenants' exclusive pools (``ShardingConfigured``)."""
        self.pods: dict[str, PodInfo] = {}
        """Live pods: pending, assumed or bound. Finished and deleted pods are dropped."""
        self.groups: dict[str, GroupInfo] = {}
        self.outcomes: dict[str, str] = {}
        """Finished pods: ``Succeeded`` or ``Failed`` (dependencies read it), for the
        retention window (:mod:`engine.model.retention`)."""
        self.retired = Retired(retention_seconds)
        """Finished pods and groups that are over, oldest first: forgotten once over for
        a whole window, unless a live unit depends on them (:meth:`forget_finished`)."""
        self.depending: dict[str, None] = {}
        """Pods and group units that name dependencies (some may be gone: pruned when
        the retired are swept)."""
        self.deadlines = Deadlines()
        """Pending groups' time-outs, soonest first."""
        self.next_runs: NextRuns = {}
        """Groups whose name a PodGroup of another uid claimed while pods of theirs were
        live → that PodGroup and the pods that came for it since: they start once the
        group is over (:func:`group_is_over`), not as members of the run before."""
        self.finished_uids: dict[str, str] = {}
        """Finished pods → the uid of the pod that finished under that name (see
        :meth:`reincarnated`)."""
        self.bindings: dict[str, str] = {}
        """Pod → decision id of its current placement."""
        self.started: dict[str, int] = {}
        """Pod → time it was placed (victims are chosen most recently started first)."""
        self.waiting: dict[str, str] = {}
        """Units held out of the queue (group short of members, dependencies) → why."""
        self.said: dict[str, str] = {}
        """Pod → the waiting reason last emitted for it (emitted once per change)."""
        self.dirty: dict[str, None] = {}
        """Units whose readiness must be settled at the next pass."""
        self.group_changes: dict[str, None] = {}
        """Groups whose status may have changed since it was last reported."""
        self.dependents: dict[str, dict[str, None]] = {}
        """Pod or group → units waiting on it (woken when it changes)."""
        self.placed_priorities: dict[int, int] = {}
        """How many placed pods have each priority (is anything preemptible?)."""
        self.dispatched: dict[str, str] = {}
        """Units handed to another component to place (the coordinator's delegations)
        → where: neither queued nor placed here until it answers."""
        self.now = 0
        self.seen = -1
        """Control offset of the last record the coordinator forwarded here (-1: none; a
        single-shard log has no coordinator)."""
        self.delegated: dict[str, str] = {}
        """Pods the coordinator handed this shard to place → the decision id to use:
        placed at once or handed back, never kept waiting here."""
        self.routed_disruptions: dict[str, dict[str, int]] = {}
        """Delegated pods → the disruptions each budget allows, as the coordinator
        counted them over every shard (``PodRouted.disruptions``)."""
        self.routed_nodes: dict[str, tuple[str, tuple[int, ...]]] = {}
        """Delegated pods → the node (and GPU cards) the coordinator chose for them
        (``PodRouted.node``): placed there or handed back."""
        self.routed_counts: dict[str, tuple[int, int]] = {}
        """Delegated pods → the pods placed and moved over every shard, as the
        coordinator counted them (``PodRouted.counted``): what a move budget in percent
        of placed pods measures for them."""
        self.placed_here: dict[str, str] = {}
        """Delegated pods placed since the last summary → node (what the summary says)."""
        self.migrates = True
        """Whether passes may plan moves of running pods (the rescheduler). The
        coordinator's view plans them too, and has the shards carry them out (see
        ``shards.coordinator.dispatch``)."""
        self.replacing: dict[str, str] = {}
        """Pods moved by evicting them (``MigrationEvicted``) → the move's decision id:
        when one is gone, its room is held for its owner (:mod:`engine.model.holds`)."""
        self.holds: dict[str, list[Hold]] = {}
        """Owner (``ns/KIND/NAME``) → room held for its replacement pods."""
        self.shapes = ShapeCounts()
        """Pod shapes submitted here (what learned target workloads come from)."""
        self.defrag_moves: list[tuple[int, int]] = []
        """(time, node slot) of the defragmentation's moves in the last minute (its
        budget: :mod:`engine.passes.defrag`)."""
        self.placed_total = 0
        self.moved_total = 0
        """Pods placed here in all (a pod placed again after it lost its place counts
        again) and running pods moved here (``PodMigrated``): what a move budget in
        percent of placed pods counts (:mod:`engine.plugins.rescheduler`)."""
        self.released_total = 0
        """Placed pods that left their node (deleted, finished, evicted); a pod moved to
        another node is counted in ``moved_total`` only, whether this engine moved it
        or folds the move (the coordinator's view), so that both count alike."""
        self.no_plan: dict[str, str] = {}
        """Pod shapes (profile and shape, as text) for which the rescheduler found no
        plan → the note its reason carried, valid while ``no_plan_epoch`` holds."""
        self.no_plan_epoch: tuple[int, int, int] = (0, 0, 0)
        """(``released_total``, ``moved_total``, ``placed_total // NO_PLAN_PLACED``)
        when ``no_plan`` was filled: while no pod leaves a node or moves, room only
        shrinks, so a shape that had no plan has none (short of the search's bounds and
        the budget, which grows with placed pods: retried every ``NO_PLAN_PLACED``
        placements)."""
        self.consolidation_epoch: tuple[int, int] = (-1, -1)
        """When consolidation last found no move worth making (``released_total``,
        placements / its retry interval): it looks again once that changes."""
        self.reported_nodes = 0
        """The number of nodes the last summary said this shard had."""
        self.returning: dict[str, tuple[str, str]] = {}
        """Pods the coordinator placed here whose bind failed → (why, the decision that
        failed): the next pass hands them back (the coordinator folds the failed bind
        as one scheduler would)."""
        self.arrived: dict[str, None] = {}
        """Units the coordinator handed this shard or asked it to hold since the last
        pass, in the order it decided them: the pass attempts them first, in that order
        (the coordinator counted on it), before anything else in the queue."""
        self.planned: dict[str, dict[str, str]] = {}
        """Gangs waiting for their victims (the coordinator's view) → the members the
        evictions make room for, each with the node planned for it: the attempt after
        them places those, there first, and the others go back to the queue as ordinary
        pods, as one scheduler's evicting attempt does."""
        self.planned_cards: dict[str, dict[str, tuple[int, ...]]] = {}
        """For a gang of ``planned``: the GPU cards planned for its members that take
        any (those its victims free, as one scheduler's evicting attempt takes them):
        the attempt after the evictions takes them where still free."""
        self.held: dict[str, list[int]] = {}
        """Units → nodes their victims left (the coordinator's view, which sees the
        evictions one by one): parked pods hear of that room only once the unit was
        attempted, as when one scheduler evicts and places in one step."""
        self.evicting: dict[str, str] = {}
        """Pods the coordinator chose to evict here → the pod they make room for: the
        next pass evicts them."""
        self.requests: dict[str, ReservationRequested] = {}
        """Parts the coordinator asked this shard to hold, taken on (or refused) by the
        next pass once it has let go of what it was told to release."""
        self.refused: dict[str, str] = {}
        """Requested parts aborted before they were taken on → why: refused instead."""
        self.reservations: dict[str, Reservation] = {}
        self.reserved: dict[str, str] = {}
        """Pod → the reservation holding it."""
        self.broken: dict[str, str] = {}
        """Scheduled gangs that fell below minMember after a failed bind → why; the
        next pass takes back the rest of the gang."""
        self.last_summary: ShardSummary | None = None
        self.releasing: dict[str, PoolReleased] = {}
        """Pools to hand over at the next pass (their nodes and what runs there)."""
        self.submissions = 0
        self.counters = {
            "attempts": 0,
            "bound": 0,
            "unschedulable": 0,
            "events": 0,
            "preempted": 0,
            "migrated": 0,
        }
        self.hints: Hints | None = None
        """Set by the engine from its profiles; not state (a snapshot leaves it out)."""
        self.extenders = ExtenderBook()
        """Asks to HTTP extenders and their answers (:mod:`engine.model.extenders`)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shard={self.shard}, now={self.now}, {self.state!r})"

    def plan_epoch(self) -> tuple[int, int, int]:
        """What ``no_plan`` is valid for (see ``no_plan_epoch``); a new epoch empties it."""
        epoch = (self.released_total, self.moved_total, self.placed_total // NO_PLAN_PLACED)
        if epoch != self.no_plan_epoch:
            self.no_plan_epoch = epoch
            self.no_plan.clear()
        return epoch

    def count(self, counter: str, n: int = 1) -> None:
        self.counters[counter] = self.counters.get(counter, 0) + n

    # ------------------------------------------------------------------ lookups

    def queue_of(self, namespace: str) -> str:
        """The fair-share queue of a namespace: its own if it has a quota."""
        return namespace if self.quotas.get(namespace) is not None else ""

    def unit_of(self, key: str) -> str:
        """The queue unit of pod ``key``: its group while the group is Pending."""
        pod = self.pods[key]
        group = self.groups.get(pod.spec.group) if pod.spec.group else None
        if pod.spec.group and (group is None or group.phase == PENDING):
            return group_unit(pod.spec.group)
        return key

    def disruptions_allowed(self, for_pod: str) -> dict[str, int] | None:
        """Per disruption budget, how many of its pods may be taken away now for
        ``for_pod`` (moved or evicted): counted here where this engine sees every pod (one
        shard, the coordinator's view); for a pod the coordinator handed a shard, as
        the coordinator counted them; None where not known (a shard under a
        coordinator, for its own defragmentation): no pod a budget picks is taken."""
        if not self.budgets:
            return {}
        given = self.routed_disruptions.get(for_pod)
        if given is not None:
            return given
        if self.seen >= 0:
            return None
        return self.budgets.allowances(self.pods, self.state.pods)

    def delegate(self, event: PodRouted) -> None:
        """The coordinator handed this shard ``event.pod`` to place at once (or hand
        back), with what it counted over every shard and the node it chose, if any."""
        key = event.pod.key
        self.delegated[key] = event.decision_id
        if event.disruptions is not None or event.counted is not None:  # (moves only)
            self.counted_over_shards(key, event.disruptions, event.counted)
        if event.node:
            self.routed_nodes[key] = (event.node, event.devices)
        self.arrived[key] = None

    def counted_over_shards(
        self, key: str, disruptions: dict[str, int] | None, counted: tuple[int, int] | None
    ) -> None:
        """For pod ``key``, handed for a plan of moves: the disruptions each budget
        allows and the pods placed and moved, as the coordinator counted them over
        every shard (None: not sent)."""
        if disruptions is not None:
            self.routed_disruptions[key] = dict(disruptions)
        if counted is not None:
            self.routed_counts[key] = counted

    def forget_routed(self, key: str) -> None:
        """``key`` is no longer a pod the coordinator handed here (placed, finished,
        or gone to another shard)."""
        self.delegated.pop(key, None)
        self.routed_disruptions.pop(key, None)
        self.routed_counts.pop(key, None)
        self.routed_nodes.pop(key, None)

    def move_counts(self, for_pod: str) -> tuple[int, int]:
        """(pods placed, running pods moved) that a move budget in percent of placed
        pods measures for ``for_pod``: as the coordinator counted them over every
        shard for a pod it handed this shard with a plan of moves, else this engine's
        own (``placed_total``, ``moved_total``)."""
        return self.routed_counts.get(for_pod) or (self.placed_total, self.moved_total)

    def preemptible_below(self, priority: int) -> bool:
        """Is any placed pod of lower priority than ``priority``?"""
        return any(p < priority for p in self.placed_priorities)

    def placed_members(self, group: GroupInfo) -> list[str]:
        return [m for m in group.members if m in self.state.pods]

    def dependency_state(self, depends_on: tuple[str, ...]) -> DependencyState:
        details = []
        waiting = ""
        for dep in depends_on:
            group = self.groups.get(dep)
            if group is not None and group.spec is not None:
                state: str = group.phase.value
                if group.phase == SCHEDULED:
                    state = f"Running ({group.succeeded}/{len(group.members)} succeeded)"
            elif dep in self.outcomes:
                state = self.outcomes[dep]
            elif dep in self.pods:
                state = "Running" if dep in self.state.pods else "Pending"
            else:
                state = "not found"
            details.append((dep, state))
            if state == FAILED:
                return DependencyState(False, failed=dep, details=tuple(details))
            if state != SUCCEEDED and not waiting:
                waiting = f"waiting for {dep} to succeed ({state})"
        return DependencyState(not waiting, waiting=waiting, details=tuple(details))

    def dependency_cycle(self, unit: str, acyclic: set[str] | None = None) -> list[str] | None:
        """A cycle of dependencies ``unit`` waits on, so that it never starts, or None:
        names of pods and groups, each waiting for the next, the first again at the end.
        A pod waits for its dependencies and its group's, a member of a Pending group for
        the group, a Pending group for its own and its members' dependencies; only what
        has not started counts (a dependency that runs ends some day). The scenario
        files refuse such cycles (:func:`shards.inputs.groups.dependency_cycle`); pods
        that come through an API server one by one are told here. ``acyclic``: names
        known to reach no cycle, added to (a settling pass shares one set: settling
        only removes edges, so what reached none still reaches none)."""

        def blocking(name: str) -> bool:
            group = self.groups.get(name)
            if group is not None and group.spec is not None:
                return group.phase == PENDING
            return name in self.pods and name not in self.state.pods

        def waits(name: str) -> list[str]:
            if not blocking(name):
                return []
            group = self.groups.get(name)
            if group is not None and group.spec is not None:
                return [d for d in self.depends_on(group_unit(name)) if blocking(d)]
            pod = self.pods[name]
            deps = [d for d in self.depends_on(name) if blocking(d)]
            if pod.spec.group and blocking(pod.spec.group):
                deps.append(pod.spec.group)
            return deps

        return find_cycle(waits, [unit[1:] if is_group_unit(unit) else unit], acyclic)

    def depends_on(self, unit: str) -> tuple[str, ...]:
        if is_group_unit(unit):
            group = self.groups[unit[1:]]
            deps = list(group.spec.depends_on if group.spec else ())
            for member in group.members:
                if member in self.pods:
                    deps.extend(self.pods[member].spec.depends_on)
            return tuple(dict.fromkeys(deps))
        pod = self.pods[unit]
        owner = self.groups.get(pod.spec.group)
        extra = owner.spec.depends_on if owner is not None and owner.spec is not None else ()
        return tuple(dict.fromkeys((*extra, *pod.spec.depends_on)))

    # ------------------------------------------------------------------ names used again

    def reincarnated(self, spec: PodSpec) -> bool:
        """Whether ``spec``, named like a pod that finished, is another pod: Kubernetes
        lets a name be used again once its pod is gone (a StatefulSet's pods always
        are; so is a pod deleted and applied again). It is when it has a uid and the
        pod that finished had another (or finished on another shard). Its name's old
        outcome is forgotten: from now on it is this pod's. A pod without a uid (a
        scenario's) is the same pod, told twice."""
        if not self.another_pod(spec):
            return False
        self.unfinish(spec.key)
        return True

    def gang_member(self, spec: PodSpec) -> bool:
        """Whether ``spec``'s pod is a gang's member here. Not a pod in no group, nor one
        the coordinator placed here under a part of its own (``ReservationRequested.plain``)
        once that part is committed: it moves as one shard would move it, as a pod of
        its own (consolidation, defragmentation)."""
        if not spec.group:
            return False
        group = self.groups.get(spec.group)
        res = self.reservations.get(group.reservation) if group is not None else None
        return res is None or not res.plain or res.state != COMMITTED

    def another_pod(self, spec: PodSpec) -> bool:
        """Whether ``spec`` is another pod than the one that finished under its name
        (the test of :meth:`reincarnated`, which changes nothing)."""
        key = spec.key
        return bool(spec.uid) and key in self.outcomes and self.finished_uids.get(key) != spec.uid

    def renew_group(self, old: GroupInfo) -> GroupInfo:
        """A fresh group under ``old``'s name, which is over (:func:`group_is_over`):
        another PodGroup, or new pods, use the name now; the group waits for its
        PodGroup, as any group whose pods come first."""
        key = old.key
        self.reservations.pop(old.reservation, None)  # a part's, done: its pods ran
        unit = group_unit(key)
        self.queue.remove(unit)
        self.waiting.pop(unit, None)
        self.broken.pop(key, None)
        self.unfinish(key)
        self.retired.discard(unit)
        group = self.groups[key] = GroupInfo(key, seq=self.submissions)
        self.submissions += 1
        self.group_changes[key] = None
        return group

    def start_next_runs(self) -> None:
        """Start the runs waiting for groups that are over now: a fresh group under the
        waiting PodGroup, with the pods that came for it, in their order."""
        for key in sorted(self.next_runs):
            group = self.groups.get(key)
            if group is not None and not group_is_over(group, self.pods):
                continue
            spec, waiting = self.next_runs.pop(key)
            if group is not None:
                self.renew_group(group)
            self.group_submitted(PodGroupSubmitted(group=spec))
            for pod in waiting:
                self.submit(pod)

    # ------------------------------------------------------------------ pods and groups

    def submit(self, spec: PodSpec) -> None:
        key = spec.key
        if key in self.pods:
            return
        if key in self.outcomes:  # (the hot path, a new pod, checks two dicts, no more)
            if not self.another_pod(spec):
                return
            if not (self.next_runs and spec.group in self.next_runs):
                self.reincarnated(spec)
        if spec.group:
            if self.next_runs and hold_for_next_run(self.next_runs, spec) is not None:
                return  # for the group's next run, once this one is over
            over = self.groups.get(spec.group)
            if over is not None and group_is_over(over, self.pods):
                self.renew_group(over)  # before this pod counts as live
        info = pod_info(spec, self.state.resources, self.submissions)
        self.submissions += 1
        self.state.ensure_rows()
        self.pods[key] = info
        self.shapes.add(info)
        if spec.depends_on:
            self.depending[key] = None
        if info.spec.group:
            group = self.groups.get(info.spec.group)
            if group is None:
                group = self.groups[info.spec.group] = GroupInfo(info.spec.group, seq=info.seq)
            group.members[key] = None
            self.dirty[self.unit_of(key)] = None
        elif info.spec.depends_on:
            self.dirty[key] = None
        else:
            self.queue.add(key, info.priority, info.seq, self.queue_of(info.spec.namespace))

    def group_submitted(self, event: PodGroupSubmitted) -> None:
        from engine.model.groups import claim_next_run

        key = event.group.key
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = GroupInfo(key, seq=self.submissions)
            self.submissions += 1
        if group.spec is not None:
            uid = event.group.uid
            if not uid or uid == group.spec.uid:
                return  # the same group told again (or one without an object)
            if not group_is_over(group, self.pods):
                # pods of the group's run still live (or wait): the new PodGroup, and the
                # pods that come for it, wait for that run to be over
                claim_next_run(self.next_runs, event.group)
                return
            group = self.renew_group(group)
        group.spec = event.group
        group.created_at = event.created_at if event.created_at >= 0 else self.now
        self.specified(group)
        self.dirty[group_unit(key)] = None
        self.group_changes[key] = None
        self.wake(key)
        for member in group.members:
            if member in self.pods:  # (a member may be gone: another spec, for those left)
                self.dirty[self.unit_of(member)] = None

    def place(
        self,
        key: str,
        slot: int,
        decision_id: str,
        charged: bool = False,
        devices: tuple[int, ...] | None = None,
        moved: bool = False,
    ) -> None:
        """Assume ``key`` on ``slot`` in state and quota (already staged is fine;
        ``charged``: its quota already counts it; ``devices``: its GPU cards, as
        recorded, else chosen; ``moved``: a running pod moved here, counted as a move,
        not as a placement)."""
        pod = self.pods[key]
        if moved:
            self.moved_total += 1
        elif key not in self.bindings:
            self.placed_total += 1
        if key not in self.state.pods:
            self.state.assume(
                key, slot, pod.request, pod.priority, pod.spec.host_ports, devices or None
            )
            if not charged:
                self.quotas.add(pod.spec.namespace, pod.request)
        if key not in self.bindings:
            self.placed_priorities[pod.priority] = self.placed_priorities.get(pod.priority, 0) + 1
        self.bindings[key] = decision_id
        self.started[key] = self.now
        self.dispatched.pop(key, None)
        if self.queue.waits_for(ClusterEvent.POD_PLACED):
            self.fire(ClusterEvent.POD_PLACED, slot)
        self.wake(key)
        if pod.spec.group:
            self.group_changes[pod.spec.group] = None
            self.wake(pod.spec.group)

    def release(self, key: str, *, moving: bool = False) -> int | None:
        """Forget ``key``'s placement in state and quota; return the slot freed
        (``moving``: it is placed again elsewhere at once, a move, not a release)."""
        pod = self.pods[key]
        if self.bindings.pop(pod.key, None) is not None:
            self.released_total += not moving
            left = self.placed_priorities[pod.priority] - 1
            if left:
                self.placed_priorities[pod.priority] = left
            else:
                del self.placed_priorities[pod.priority]
        self.started.pop(pod.key, None)
        if pod.spec.group:
            self.group_changes[pod.spec.group] = None
        placed = self.state.pods.get(key)
        if placed is None:
            return None
        self.quotas.remove(pod.spec.namespace, placed.request)
        return self.state.forget(key)

    def release_if_placed(self, key: str) -> int | None:
        return self.release(key) if key in self.pods else None

    def wake(self, key: str) -> None:
        """``key`` changed: settle again whatever waits on it. What waits stays
        registered (until ``key`` is forgotten): settling a unit again registers it again,
        and a pass that changes nothing else is not in the log, so replay could not
        register it again."""
        waiting = self.dependents.get(key)
        if waiting:
            self.dirty.update(waiting)

    def finish(self, key: str, outcome: str, *, held_for: str = "") -> None:
        """Pod ``key`` is over (succeeded, failed, deleted, preempted, rejected).
        ``held_for``: it was evicted for that unit, whose room this is: parked pods
        are told only once the unit was attempted (:attr:`freed_later`), as when one
        scheduler evicts and places in one step."""
        if key not in self.pods:
            for _, waiting in self.next_runs.values():  # gone before its run started
                waiting[:] = [p for p in waiting if p.key != key]
            if key not in self.outcomes:
                self.finished_as(key, outcome)  # it ran on another shard: a dependency's fate
                self.wake(key)
            return
        moved = self.replacing.pop(key, None)
        held = self.state.pods.get(key) if moved == self.bindings.get(key) else None
        slot = self.release(key)
        pod = self.pods.pop(key)
        if held is not None and pod.spec.owner:
            self.hold_for(pod, held.slot, held.request, held.priority)
        rid = self.reserved.pop(key, None)  # a finished pod holds no part of a reservation
        self.dispatched.pop(key, None)
        self.forget_routed(key)
        self.returning.pop(key, None)
        self.finished_as(key, outcome)
        if pod.spec.uid:
            self.finished_uids[key] = pod.spec.uid
        self.queue.remove(key)
        self.waiting.pop(key, None)
        self.said.pop(key, None)
        if pod.spec.group in self.groups:
            self.member_finished(self.groups[pod.spec.group], outcome)
        res = self.reservations.get(rid) if rid is not None else None
        if res is not None and not any(k in self.pods for k in res.pods):
            # every pod of the part is over: so is the part (and the group it was held as)
            del self.reservations[res.rid]
            self.drop_group(res.group)
        self.wake(key)
        if slot is not None and held_for:
            self.held.setdefault(held_for, []).append(slot)
        elif slot is not None:
            self.fire(ClusterEvent.POD_FREED, slot)

    def member_finished(self, group: GroupInfo, outcome: str) -> None:
        if outcome == SUCCEEDED:
            group.succeeded += 1
        else:
            group.failed += 1
        if group.phase == SCHEDULED and outcome == FAILED:
            advance(group, FAILED, "a member failed")
        live = [m for m in group.members if m in self.pods]
        if group.phase == SCHEDULED and not live and group.failed == 0:
            advance(group, SUCCEEDED)
        self.dirty[group_unit(group.key)] = None
        self.group_changes[group.key] = None
        self.wake(group.key)
        self.retire_if_over(group)

    def drop(self, key: str) -> None:
        """Forget pending pod ``key`` entirely: another shard has it now."""
        pod = self.pods.get(key)
        if pod is None:
            return
        self.release(key)
        del self.pods[key]
        self.queue.remove(key)
        self.waiting.pop(key, None)
        self.said.pop(key, None)
        self.forget_routed(key)
        self.dispatched.pop(key, None)
        self.reserved.pop(key, None)
        group = self.groups.get(pod.spec.group) if pod.spec.group else None
        if group is not None:
            group.members.pop(key, None)

    def drop_group(self, key: str) -> None:
        group = self.groups.pop(key, None)
        if group is None:
            return
        for member in list(group.members):
            self.drop(member)
        unit = group_unit(key)
        self.queue.remove(unit)
        self.waiting.pop(unit, None)
        self.group_changes.pop(key, None)
        self.broken.pop(key, None)

    # ------------------------------------------------------------------ what is over

    def hold_for(self, pod: PodInfo, slot: int, request: Request, priority: int) -> None:
        """Keep ``pod``'s room on ``slot`` for its owner's next pod (a moved pod, gone)."""
        owner = owner_of(pod.spec.namespace, pod.spec.owner)
        hold = Hold(f"{HOLD_PREFIX}{pod.key}", slot, hold_until(self.now))
        self.state.assume(hold.key, slot, request, priority)
        self.holds.setdefault(owner, []).append(hold)

    def take_hold(self, pod: PodInfo) -> Hold | None:
        """Let go of the oldest room held for ``pod``'s owner; it, or None."""
        if not pod.spec.owner:
            return None
        owner = owner_of(pod.spec.namespace, pod.spec.owner)
        holds = self.holds.get(owner)
        if not holds:
            return None
        hold = holds.pop(0)
        if not holds:
            del self.holds[owner]
        self.state.forget(hold.key)
        self.fire(ClusterEvent.POD_FREED, hold.slot)
        return hold

    def expire_holds(self) -> None:
        """Free the room held past its time for replacements that never came."""
        for owner in sorted(self.holds):
            kept = []
            for hold in self.holds[owner]:
                if hold.until <= self.now:
                    if self.state.forget(hold.key) is not None:
                        self.fire(ClusterEvent.POD_FREED, hold.slot)
                else:
                    kept.append(hold)
            if kept:
                self.holds[owner] = kept
            else:
                del self.holds[owner]

    def next_hold_expiry(self) -> int | None:
        times = [h.until for holds in self.holds.values() for h in holds]
        return min(times) if times else None

    def finished_as(self, key: str, outcome: str) -> None:
        """Pod (or another shard's group) ``key`` is over with ``outcome``; kept for the
        retention window (and while a live unit depends on it)."""
        self.outcomes[key] = outcome
        self.retired.add(key, self.now)

    def unfinish(self, key: str) -> None:
        """Forget ``key``'s outcome: the name is another pod's or group's now."""
        if self.outcomes.pop(key, None) is not None:
            self.retired.discard(key)
        self.finished_uids.pop(key, None)

    def over(self, group: GroupInfo) -> bool:
        """Whether ``group`` is over and nothing holds it: Succeeded or Failed (or never
        declared), none of its pods live, not a part of a reservation."""
        return (
            (group.phase in (SUCCEEDED, FAILED) or group.spec is None)
            and not group.reservation
            and not any(m in self.pods for m in group.members)
        )

    def retire_if_over(self, group: GroupInfo) -> None:
        if self.over(group):
            self.retired.add(group_unit(group.key), self.now)

    def forget_finished(self) -> None:
        """Forget the pods and groups over for a whole retention window that no live
        unit names as a dependency (:func:`engine.model.retention.forget_finished`).
        Run in the fold, whenever log time moves on: a pass that decides nothing is not
        in the log, so what a pass changes replay could not change alike."""
        forget_finished(self)

    # ------------------------------------------------------------------ time-outs

    def specified(self, group: GroupInfo) -> None:
        """``group`` has its spec now: it depends on what it names, and its time-out
        counts."""
        if group.spec is not None and group.spec.depends_on:
            self.depending[group_unit(group.key)] = None
        self.arm(group)

    def arm(self, group: GroupInfo) -> None:
        deadline = group.deadline
        if deadline is not None:
            self.deadlines.arm(deadline, group.seq, group.key)

    def pending_again(self, group: GroupInfo, reason: str) -> None:
        """A Scheduled ``group`` is Pending again (rolled back): its time-out counts
        again, from when it was created (past it, it fails at the next pass)."""
        advance(group, PENDING, reason)
        self.arm(group)

    def timed_out(self) -> list[GroupInfo]:
        """Pending groups past their deadline (:func:`engine.model.retention.timed_out`)."""
        return timed_out(self)

    def next_deadline(self) -> int | None:
        """The soonest time-out after ``now`` of a Pending group."""
        return next_deadline(self)

    # ------------------------------------------------------------------ requeue

    def fire(self, event: ClusterEvent, slot: int) -> None:
        """Requeue parked units that ``event`` on ``slot`` may help (hints per shape)."""
        hints = self.hints
        verdicts: dict[tuple[object, ...], bool] = {}

        def helps(unit: str, plugins: tuple[str, ...]) -> bool:
            if is_group_unit(unit) or QUOTA_PLUGIN in plugins or slot < 0:
                return True
            pod = self.pods[unit]
            if hints is None or self.could_preempt(pod, slot):
                return True
            cache_key = (pod.spec.scheduler_name, pod.shape_key, plugins)
            verdict = verdicts.get(cache_key)
            if verdict is None:
                verdict = hints.worth_retrying(pod, plugins, event, slot, self.state)
                verdicts[cache_key] = verdict
            return verdict

        limit = (
            self._capacity_limit(slot) if event == ClusterEvent.POD_FREED and slot >= 0 else None
        )
        self.queue.on_event(event, self.now, helps, limit)

    def _capacity_limit(self, slot: int) -> Callable[[str, int], int]:
        """How many parked pods of a bucket the freed node ``slot`` can hold: only that
        node changed, so pods beyond its free capacity would fail again. Each bucket
        is measured against the whole room, not what buckets woken before it leave:
        the woken pods are then the same whatever order the rooms of several nodes
        are heard of in (a coordinator hears of the pods that finish on each shard
        in another order than one shard), and none that the room may hold stays
        parked because a bucket ahead of it counted on room its pods then fail to
        use (a GPU share finding no card with room). A bucket whose pods wait out a
        back-off first is woken whole: it is tried later (else a higher-priority pod
        still backing off kept a lower one parked that one scheduler, waking every
        pod the event may help, places meanwhile)."""
        free = self.state.free
        hints = self.hints

        def limit(unit: str, waiting: int) -> int:
            plugins = self.queue.reason_plugins(unit)
            if is_group_unit(unit) or QUOTA_PLUGIN in plugins or not plugins:
                return waiting
            if self.queue.backing_off(unit, self.now):
                return waiting
            pod = self.pods[unit]
            if self.could_preempt(pod, slot):
                return waiting
            decides = True if hints is None else hints.room_decides(pod, plugins, slot, self.state)
            if decides is None:
                return waiting  # it may fail for other reasons: woken whole
            if not decides:
                return 0  # the room is on a node it cannot use
            count = waiting
            for row, amount in pod.request:
                count = min(count, int(free[row, slot]) // amount)
            return count

        return limit

    def could_preempt(self, pod: PodInfo, slot: int) -> bool:
        """Whether ``pod`` might preempt a pod on node ``slot`` (one of lower priority
        runs there): room freed there is worth a retry even if another pod took it."""
        if pod.spec.preemption_policy == "Never":
            return False
        pods = self.pods
        return any(
            key in pods and pods[key].priority < pod.priority for key in self.state.node_pods[slot]
        )

    def events_for(self, pod: PodInfo, plugins: tuple[str, ...]) -> frozenset[ClusterEvent]:
        if self.hints is None:
            return EVERY
        return self.hints.events_for(pod, plugins)

    def park(self, unit: str, pod: PodInfo, plugins: tuple[str, ...], shape: object) -> None:
        """Park ``unit`` (``pod``, or a group led by it) until a change may help."""
        self.queue.park(
            unit,
            pod.priority,
            pod.seq,
            pod.attempts,
            self.now,
            plugins,
            self.events_for(pod, plugins),
            self.queue_of(pod.spec.namespace),
            shape,
        )

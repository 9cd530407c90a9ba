"""The engine of one shard: a pure fold of events plus scheduling passes.

``apply(envelope)`` folds any event (inputs and decisions alike; decisions are applied
idempotently, so replaying its own output changes nothing). ``schedule()`` runs one pass
at the time of the latest event (``engine.passes``): it settles what waits (groups short
of members, dependencies, timeouts), drains the active queue, assumes each placement,
and returns the decisions as events for the caller to append. No clock, no I/O, no
randomness: the same events give the same decisions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.config import SchedulerConfig, default_config, parse_config
from engine.framework.registry import Registry, builtin_registry
from engine.framework.results import Diagnosis
from engine.framework.runtime import Framework
from engine.framework.status import Status
from engine.model.changes import ClusterEvent
from engine.model.groups import (
    FAILED,
    PENDING,
    SCHEDULED,
    SUCCEEDED,
    DependencyState,
    GroupInfo,
    NextRuns,
    claim_next_run,
    group_is_over,
    group_unit,
    hold_for_next_run,
    is_group_unit,
)
from engine.model.pods import PodInfo, pod_info
from engine.model.queue import SchedulingQueue
from engine.model.quota import QuotaTable
from engine.model.state import ClusterState
from engine.reservations import (
    COMMITTED,
    COMMITTING,
    HELD,
    STAGING,
    Reservation,
    decision_id,
)
from events.errors import InputError
from events.types import (
    SECOND,
    BindFailed,
    Envelope,
    Event,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    PodAdopted,
    PodBound,
    PodDeleted,
    PodEvicted,
    PodFailed,
    PodGroupStatusChanged,
    PodGroupSubmitted,
    PodHandedBack,
    PodPreempted,
    PodRecalled,
    PodRejected,
    PodRouted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    PodUnbound,
    PodUnschedulable,
    PoolHandedOver,
    PoolReleased,
    QuotaDefined,
    ReservationAborted,
    ReservationCommitted,
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
    SchedulerConfigured,
    ShardSummary,
)

QUOTA_PLUGIN = "ElasticQuota"


@dataclass(frozen=True, slots=True)
class Explanation:
    """One attempt of the pod under ``--explain``."""

    time: int
    attempt: int
    node: str | None
    status: Status
    diagnosis: Diagnosis | None


class Engine:
    """Scheduling state and logic of one shard."""

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        shard: int = 0,
        registry: Registry | None = None,
    ) -> None:
        self.config = config or default_config()
        self.shard = shard
        registry = registry or builtin_registry()
        self._registry = registry
        self.frameworks = {p.scheduler_name: Framework(p, registry) for p in self.config.profiles}
        self._default = self.frameworks[self.config.profiles[0].scheduler_name]
        self.state = ClusterState()
        self.queue = SchedulingQueue(
            self.config.initial_backoff_seconds, self.config.max_backoff_seconds
        )
        self.quotas = QuotaTable(self.state.resources)
        self.pods: dict[str, PodInfo] = {}
        """Live pods: pending, assumed or bound. Finished and deleted pods are dropped."""
        self.groups: dict[str, GroupInfo] = {}
        self.outcomes: dict[str, str] = {}
        """Finished pods: ``Succeeded`` or ``Failed`` (dependencies read it)."""
        self.next_runs: NextRuns = {}
        """Groups whose name a PodGroup of another uid claimed while pods of theirs were
        live → that PodGroup and the pods that came for it since: they start once the
        group is over (:func:`group_is_over`), not as members of the run before."""
        self.finished_uids: dict[str, str] = {}
        """Finished pods of this shard → the uid of the pod that finished under that name
        (see :meth:`reincarnated`)."""
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
        self.now = 0
        self.seen = -1
        """Control offset of the last record the router forwarded here (-1: none; a
        single-shard log has no router)."""
        self.returnable: dict[str, None] = {}
        """Routed pods this shard may hand back (not yet refused by every shard)."""
        self.answers: dict[str, tuple[str, ...]] = {}
        """Pods kept for good after every shard refused them → those refusals."""
        self.reservations: dict[str, Reservation] = {}
        self.reserved: dict[str, str] = {}
        """Pod → the reservation holding it."""
        self.broken: dict[str, str] = {}
        """Scheduled gangs that fell below minMember after a failed bind → why; the
        next pass takes back the rest of the gang."""
        self.last_summary: ShardSummary | None = None
        self.releasing: dict[str, PoolReleased] = {}
        """Pools to hand over at the next pass (their nodes and what runs there)."""
        self.explain: str | None = None
        self.explanations: list[Explanation] = []
        self._submissions = 0
        self._counters = {
            "attempts": 0,
            "bound": 0,
            "unschedulable": 0,
            "events": 0,
            "preempted": 0,
        }

    def __repr__(self) -> str:
        return f"Engine(shard={self.shard}, now={self.now}, {self.state!r}, {self.queue!r})"

    def stats(self) -> dict[str, int]:
        return {
            **self._counters,
            **self.queue.stats(),
            **self.state.stats(),
            "groups": len(self.groups),
        }

    def count(self, counter: str, n: int = 1) -> None:
        self._counters[counter] += n

    def framework_for(self, pod: PodInfo) -> Framework | None:
        name = pod.spec.scheduler_name
        if not name:
            return self._default
        return self.frameworks.get(name)

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

    # ------------------------------------------------------------------ fold

    def apply(self, envelope: Envelope) -> None:
        """Fold one event. Idempotent for decisions and duplicate submissions."""
        self._counters["events"] += 1
        if envelope.time > self.now:  # noqa: PLR1730 - hot path: no call
            self.now = envelope.time
        if envelope.causation > self.seen and envelope.producer == "router":
            self.seen = envelope.causation
        event = envelope.event
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
            if self.next_runs:
                self._start_next_runs()

    def apply_decision(self, event: Event) -> None:
        """Fold a decision the current pass has just made (as its replay will)."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
            if self.next_runs:
                self._start_next_runs()

    def _configured(self, event: SchedulerConfigured) -> None:
        """A configuration recorded in the log (a service restarted with a new one):
        profiles and back-off follow it; the cluster state stays."""
        if not event.config:
            config = default_config()
        else:
            try:
                config = parse_config(json.loads(event.config), "recorded configuration")
            except (ValueError, InputError):
                return  # replay reports it (``recorded_config``); the fold keeps going
        if config == self.config:
            return
        registry = self._registry
        self.config = config
        self.frameworks = {p.scheduler_name: Framework(p, registry) for p in config.profiles}
        self._default = self.frameworks[config.profiles[0].scheduler_name]
        self.queue.initial_backoff = config.initial_backoff_seconds * SECOND
        self.queue.max_backoff = config.max_backoff_seconds * SECOND

    def _status_seen(self, event: PodGroupStatusChanged) -> None:
        group = self.groups.get(event.group)
        if group is None:
            if event.phase in (SUCCEEDED, FAILED):
                self.outcomes[event.group] = event.phase  # a dependency on another shard
                self.wake(event.group)
            return
        if group.reported is None:
            group.reported = (event.phase, event.scheduled, event.reason)

    # ------------------------------------------------------------------ routing

    def drop(self, key: str) -> None:
        """Forget pending pod ``key`` entirely: it was handed to another shard."""
        pod = self.pods.get(key)
        if pod is None:
            return
        self.release(key)
        del self.pods[key]
        self.queue.remove(key)
        self.waiting.pop(key, None)
        self.said.pop(key, None)
        self.returnable.pop(key, None)
        self.answers.pop(key, None)
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

    def handed_back(self, event: PodHandedBack) -> None:
        if event.group:
            self.drop_group(event.group)
        else:
            self.drop(event.pod)

    def returnable_unit(self, unit: str) -> bool:
        """May this shard hand ``unit`` back to the router?"""
        if not is_group_unit(unit):
            return unit in self.returnable
        group = self.groups.get(unit[1:])
        return (
            group is not None
            and not group.reservation
            and all(m in self.returnable for m in group.members)
            and bool(group.members)
        )

    # ------------------------------------------------------------------ pool hand-over

    def _pool_released(self, event: PoolReleased) -> None:
        self.releasing[event.pool] = event

    def handed_over(self, event: PoolHandedOver) -> None:
        """Forget the pool's nodes and the pods on them (they live on elsewhere)."""
        self.releasing.pop(event.pool, None)
        for placement in event.placements:
            key = placement.pod.key
            pod = self.pods.get(key)
            if pod is not None:
                group = self.groups.get(pod.spec.group) if pod.spec.group else None
                self.drop(key)
                if group is not None:
                    self.group_changes[group.key] = None
        for name in event.nodes:
            if name in self.state.index:
                for key in self.state.remove_node(name):
                    self.drop(key)

    def _adopted(self, event: PodAdopted) -> None:
        """A pod bound on a node this shard has just taken over: placed, as it is."""
        placement = event.placement
        key = placement.pod.key
        slot = self.state.index.get(placement.node)
        if slot is None or key in self.outcomes:
            return
        if key not in self.pods:
            self.submit(placement.pod)
        self.queue.remove(key)
        self.waiting.pop(key, None)
        if self.bindings.get(key) != placement.decision_id:
            self.place(key, slot, placement.decision_id)

    # ------------------------------------------------------------------ reservations

    def _reservation_requested(self, event: ReservationRequested) -> None:
        if event.rid in self.reservations:
            return
        old = self.groups.get(event.group.key)
        if old is not None:
            if not group_is_over(old, self.pods):
                return
            # every pod of the group held here before is gone: the name is the new gang's
            self.reservations.pop(old.reservation, None)
            self.drop_group(old.key)
        keys = tuple(spec.key for spec in event.pods)
        if any(k in self.pods for k in keys) or not all(
            self.another_pod(spec) for spec in event.pods if spec.key in self.outcomes
        ):
            return
        self.reservations[event.rid] = Reservation(
            event.rid, event.group.key, keys, event.expires_at
        )
        group = self.groups[event.group.key] = GroupInfo(
            event.group.key, seq=self._submissions, reservation=event.rid
        )
        self._submissions += 1
        group.spec = event.group
        group.created_at = self.now
        for spec in event.pods:
            self.reserved[spec.key] = event.rid
            self.submit(spec)
        self.dirty[group_unit(event.group.key)] = None

    def granted(self, event: ReservationGranted) -> None:
        res = self.reservations.get(event.rid)
        if res is None or res.state != STAGING:
            return
        for key, node in event.placements.items():
            slot = self.state.index.get(node)
            if key in self.pods and slot is not None:
                self.queue.remove(key)
                self.place(key, slot, decision_id(key, event.rid))
        group = self.groups[res.group]
        group.phase, group.reason = SCHEDULED, ""
        self.queue.remove(group_unit(res.group))
        res.state = HELD

    def _committed(self, event: ReservationCommitted) -> None:
        res = self.reservations.get(event.rid)
        if res is not None and res.state == HELD:
            res.state = COMMITTING

    def _aborted(self, event: ReservationAborted) -> None:
        res = self.reservations.get(event.rid)
        if res is not None and not res.ending:
            res.ending = f"aborted: {event.reason}" if event.reason else "aborted"

    def denied(self, event: ReservationDenied) -> None:
        res = self.reservations.pop(event.rid, None)
        if res is not None:
            self._forget_part(res)

    def released(self, event: ReservationReleased) -> None:
        res = self.reservations.pop(event.rid, None)
        if res is not None:
            self._forget_part(res)

    def _forget_part(self, res: Reservation) -> None:
        freed = [slot for key in res.pods if (slot := self.release_if_placed(key)) is not None]
        self.drop_group(res.group)
        for slot in freed:
            self.fire(ClusterEvent.POD_FREED, slot)

    def release_if_placed(self, key: str) -> int | None:
        return self.release(key) if key in self.pods else None

    def _unbound(self, event: PodUnbound) -> None:
        pod = self.pods.get(event.pod)
        if pod is None or self.bindings.get(event.pod) != event.decision_id:
            return
        slot = self.release(event.pod)
        rid = self.reserved.get(event.pod)
        if rid is not None and rid in self.reservations:
            self.reservations[rid].bound.discard(event.pod)
        elif pod.spec.group in self.groups:
            group = self.groups[pod.spec.group]
            placed = sum(1 for m in group.members if m in self.state.pods)
            if group.phase == SCHEDULED and placed < group.min_member:
                group.phase = PENDING
            self.dirty[self.unit_of(event.pod)] = None
        else:
            self.dirty[event.pod] = None
        if slot is not None:
            self.fire(ClusterEvent.POD_FREED, slot)

    def _node_removed(self, event: NodeRemoved) -> None:
        slot = self.state.index.get(event.name)
        lost = list(self.state.node_pods[slot]) if slot is not None else []
        for key in lost:
            self.release(key)
        self.state.remove_node(event.name)

    def _submit(self, event: PodSubmitted) -> None:
        self.submit(event.pod)

    def _routed(self, event: PodRouted) -> None:
        key = event.pod.key
        if key in self.pods or (key in self.outcomes and not self.another_pod(event.pod)):
            return
        if event.final:
            self.answers[key] = event.answers
        else:
            self.returnable[key] = None
        self.submit(event.pod)

    def _recalled(self, event: PodRecalled) -> None:
        """Another shard has room for a pod this shard kept after every shard refused it:
        try it again now, and hand it back if it still does not fit (a pod placed, or
        one of a gang, stays)."""
        key = event.pod
        pod = self.pods.get(key)
        if pod is None or key not in self.answers or pod.spec.group:
            return
        if key in self.state.pods or key in self.bindings:
            return
        del self.answers[key]
        self.returnable[key] = None
        if key in self.queue:
            self.queue.add(key, pod.priority, pod.seq, self.queue_of(pod.spec.namespace))

    def reincarnated(self, spec: PodSpec) -> bool:
        """Whether ``spec``, named like a pod that finished, is another pod: Kubernetes
        lets a name be used again once its pod is gone (a StatefulSet's pods always
        are; so is a pod deleted and applied again). It is when it has a uid and the
        pod that finished had another (or finished on another shard). Its name's old
        outcome is forgotten: from now on it is this pod's. A pod without a uid (a
        scenario's) is the same pod, told twice."""
        if not self.another_pod(spec):
            return False
        del self.outcomes[spec.key]
        self.finished_uids.pop(spec.key, None)
        return True

    def another_pod(self, spec: PodSpec) -> bool:
        """Whether ``spec`` is another pod than the one that finished under its name
        (the test of :meth:`reincarnated`, which changes nothing)."""
        key = spec.key
        return bool(spec.uid) and key in self.outcomes and self.finished_uids.get(key) != spec.uid

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
        info = pod_info(spec, self.state.resources, self._submissions)
        self._submissions += 1
        self.state.ensure_rows()
        self.pods[key] = info
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
        self.outcomes.pop(key, None)
        group = self.groups[key] = GroupInfo(key, seq=self._submissions)
        self._submissions += 1
        self.group_changes[key] = None
        return group

    def _group_submitted(self, event: PodGroupSubmitted) -> None:
        key = event.group.key
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = GroupInfo(key, seq=self._submissions)
            self._submissions += 1
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
        self.dirty[group_unit(key)] = None
        self.group_changes[key] = None
        self.wake(key)
        for member in group.members:
            if member in self.pods:  # (a member may be gone: another spec, for those left)
                self.dirty[self.unit_of(member)] = None

    def _bound(self, event: PodBound) -> None:
        pod = self.pods.get(event.pod)
        slot = self.state.index.get(event.node)
        if pod is None or slot is None or self.bindings.get(event.pod) == event.decision_id:
            return
        self.queue.remove(event.pod)
        pod.attempts = max(pod.attempts, event.attempt)
        self.place(event.pod, slot, event.decision_id)

    def _bound_seen(self, event: PodBound) -> None:
        rid = self.reserved.get(event.pod)
        if rid is None:
            self._bound(event)
            return
        res = self.reservations.get(rid)
        if res is not None and self.bindings.get(event.pod) == event.decision_id:
            res.bound.add(event.pod)
            if res.state == COMMITTING and len(res.bound) == len(res.pods):
                res.state = COMMITTED

    def place(self, key: str, slot: int, decision_id: str) -> None:
        """Assume ``key`` on ``slot`` in state and quota (already staged is fine)."""
        pod = self.pods[key]
        if key not in self.state.pods:
            self.state.assume(key, slot, pod.request, pod.priority)
            self.quotas.add(pod.spec.namespace, pod.request)
        if key not in self.bindings:
            self.placed_priorities[pod.priority] = self.placed_priorities.get(pod.priority, 0) + 1
        self.bindings[key] = decision_id
        self.started[key] = self.now
        self.wake(key)
        if pod.spec.group:
            self.group_changes[pod.spec.group] = None
            self.wake(pod.spec.group)

    def wake(self, key: str) -> None:
        """``key`` changed: settle again whatever waits on it."""
        waiting = self.dependents.pop(key, None)
        if waiting:
            self.dirty.update(waiting)

    def release(self, key: str) -> int | None:
        """Forget ``key``'s placement in state and quota; return the slot freed."""
        pod = self.pods[key]
        self._unplaced(pod)
        placed = self.state.pods.get(key)
        if placed is None:
            return None
        self.quotas.remove(pod.spec.namespace, placed.request)
        return self.state.forget(key)

    def _unplaced(self, pod: PodInfo) -> None:
        if self.bindings.pop(pod.key, None) is not None:
            left = self.placed_priorities[pod.priority] - 1
            if left:
                self.placed_priorities[pod.priority] = left
            else:
                del self.placed_priorities[pod.priority]
        self.started.pop(pod.key, None)
        if pod.spec.group:
            self.group_changes[pod.spec.group] = None

    def preemptible_below(self, priority: int) -> bool:
        """Is any placed pod of lower priority than ``priority``?"""
        return any(p < priority for p in self.placed_priorities)

    def _unschedulable(self, event: PodUnschedulable) -> None:
        pod = self.pods.get(event.pod)
        if pod is None or event.attempt == 0 or pod.attempts >= event.attempt:
            return
        pod.attempts = event.attempt
        unit = self.unit_of(event.pod)
        framework = self.framework_for(pod)
        events = self.events_for(framework, event.plugins)
        self.queue.park(
            unit,
            pod.priority,
            pod.seq,
            pod.attempts,
            self.now,
            event.plugins,
            events,
            self.queue_of(pod.spec.namespace),
            None if unit != event.pod else pod.shape_key,
        )

    def events_for(
        self, framework: Framework | None, plugins: tuple[str, ...]
    ) -> frozenset[ClusterEvent]:
        if framework is None:
            return frozenset()
        events = framework.events_for(tuple(p for p in plugins if p != QUOTA_PLUGIN))
        if QUOTA_PLUGIN in plugins:
            events |= {ClusterEvent.POD_FREED}
        return frozenset(events)

    def _bind_failed(self, event: BindFailed) -> None:
        pod = self.pods.get(event.pod)
        if pod is None or self.bindings.get(event.pod) != event.decision_id:
            return
        rid = self.reserved.get(event.pod)
        if rid is not None:
            res = self.reservations[rid]
            res.bound.discard(event.pod)
            self.release(event.pod)
            if not res.ending:
                res.ending = f"broken: {event.pod} failed to bind to {event.node}: {event.reason}"
            return
        slot = self.release(event.pod)
        group = self.groups.get(pod.spec.group) if pod.spec.group else None
        if group is not None and group.phase == SCHEDULED:
            placed = sum(1 for m in group.members if m in self.state.pods)
            if placed < group.min_member:
                self.broken[group.key] = (
                    f"{event.pod} failed to bind to {event.node} ({event.reason}), leaving "
                    f"{placed} of minMember {group.min_member} placed"
                )
        if group is not None and group.key in self.broken:
            # the gang goes back to the queue whole at the next pass, this pod with it
            if slot is not None:
                self.fire(ClusterEvent.POD_FREED, slot)
            return
        unit = self.unit_of(event.pod)
        self.queue.back_off(
            unit, pod.priority, pod.seq, pod.attempts, self.now, self.queue_of(pod.spec.namespace)
        )
        if slot is not None:
            self.fire(ClusterEvent.POD_FREED, slot)

    def finish(self, key: str, outcome: str) -> None:
        if key not in self.pods:
            for _, waiting in self.next_runs.values():  # gone before its run started
                waiting[:] = [p for p in waiting if p.key != key]
            if key not in self.outcomes:
                self.outcomes[key] = outcome  # it ran on another shard: a dependency's fate
                self.wake(key)
            return
        slot = self.release(key)
        pod = self.pods.pop(key)
        self.reserved.pop(key, None)  # a finished pod holds no part of any reservation
        self.outcomes[key] = outcome
        if pod.spec.uid:
            self.finished_uids[key] = pod.spec.uid
        self.queue.remove(key)
        self.waiting.pop(key, None)
        self.said.pop(key, None)
        if pod.spec.group in self.groups:
            self._member_finished(self.groups[pod.spec.group], outcome)
        self.wake(key)
        if slot is not None:
            self.fire(ClusterEvent.POD_FREED, slot)

    def _start_next_runs(self) -> None:
        """Start the runs waiting for groups that are over now: a fresh group under the
        waiting PodGroup, with the pods that came for it, in their order."""
        for key in sorted(self.next_runs):
            group = self.groups.get(key)
            if group is not None and not group_is_over(group, self.pods):
                continue
            spec, waiting = self.next_runs.pop(key)
            if group is not None:
                self.renew_group(group)
            self._group_submitted(PodGroupSubmitted(group=spec))
            for pod in waiting:
                self.submit(pod)

    def _member_finished(self, group: GroupInfo, outcome: str) -> None:
        if outcome == SUCCEEDED:
            group.succeeded += 1
        else:
            group.failed += 1
        if group.phase == SCHEDULED and outcome == FAILED:
            group.phase, group.reason = FAILED, "a member failed"
        live = [m for m in group.members if m in self.pods]
        if group.phase == SCHEDULED and not live and group.failed == 0:
            group.phase, group.reason = SUCCEEDED, ""
        self.dirty[group_unit(group.key)] = None
        self.group_changes[group.key] = None
        self.wake(group.key)

    def fire(self, event: ClusterEvent, slot: int) -> None:
        """Requeue parked units that ``event`` on ``slot`` may help (hints per shape)."""
        verdicts: dict[tuple[object, ...], bool] = {}

        def helps(unit: str, plugins: tuple[str, ...]) -> bool:
            if is_group_unit(unit) or QUOTA_PLUGIN in plugins:
                return True
            pod = self.pods[unit]
            framework = self.framework_for(pod)
            if framework is None:
                return False
            cache_key = (id(framework), pod.shape_key, plugins)
            verdict = verdicts.get(cache_key)
            if verdict is None:
                verdict = framework.worth_retrying(pod, plugins, event, slot, self.state)
                verdicts[cache_key] = verdict
            return verdict

        limit = self._capacity_limit(slot) if event == ClusterEvent.POD_FREED else None
        self.queue.on_event(event, self.now, helps, limit)

    def _capacity_limit(self, slot: int) -> Callable[[str, int], int]:
        """How many parked pods of a bucket the freed node ``slot`` can hold: only that
        node changed, so pods beyond its free capacity would fail again."""
        budget: dict[int, int] = {}
        free = self.state.free

        def limit(unit: str, waiting: int) -> int:
            plugins = self.queue.reason_plugins(unit)
            if is_group_unit(unit) or QUOTA_PLUGIN in plugins or not plugins:
                return waiting
            pod = self.pods[unit]
            count = waiting
            for row, amount in pod.request:
                left = budget.setdefault(row, int(free[row, slot]))
                count = min(count, left // amount)
            for row, amount in pod.request:
                budget[row] -= count * amount
            return count

        return limit

    # ------------------------------------------------------------------ dependencies

    def dependency_state(self, depends_on: tuple[str, ...]) -> DependencyState:
        details = []
        waiting = ""
        for dep in depends_on:
            group = self.groups.get(dep)
            if group is not None and group.spec is not None:
                state = group.phase
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

    # ------------------------------------------------------------------ decide

    def next_wakeup(self) -> int | None:
        """Simulated time at which a pass would do something new without new events."""
        times = [t for t in (self.queue.next_wakeup(),) if t is not None]
        for res in self.reservations.values():
            if res.state in (STAGING, HELD):
                times.append(max(res.expires_at, self.now))
        for group in self.groups.values():
            deadline = group.deadline
            if group.phase == PENDING and deadline is not None and deadline > self.now:
                times.append(deadline)
        return min(times) if times else None

    def schedule(self) -> list[Event]:
        """Run one pass at ``self.now``; return the decisions (already applied)."""
        from engine.passes import SchedulingPass

        return SchedulingPass(self).run()


_HANDLERS: dict[type, Callable[[Engine, Any], None]] = {
    PodSubmitted: Engine._submit,
    PodGroupSubmitted: Engine._group_submitted,
    QuotaDefined: lambda e, ev: e.quotas.define(ev.quota),
    PodBound: Engine._bound_seen,
    PodUnschedulable: Engine._unschedulable,
    BindFailed: Engine._bind_failed,
    PodSucceeded: lambda e, ev: e.finish(ev.pod, SUCCEEDED),
    PodDeleted: lambda e, ev: e.finish(ev.pod, FAILED),
    PodFailed: lambda e, ev: e.finish(ev.pod, FAILED),
    PodRejected: lambda e, ev: e.finish(ev.pod, FAILED),
    PodRouted: Engine._routed,
    PodRecalled: Engine._recalled,
    PoolReleased: Engine._pool_released,
    PoolHandedOver: Engine.handed_over,
    PodAdopted: Engine._adopted,
    PodHandedBack: Engine.handed_back,
    PodUnbound: Engine._unbound,
    ReservationRequested: Engine._reservation_requested,
    ReservationGranted: Engine.granted,
    ReservationDenied: Engine.denied,
    ReservationCommitted: Engine._committed,
    ReservationAborted: Engine._aborted,
    ReservationReleased: Engine.released,
    PodEvicted: lambda e, ev: e.finish(ev.pod, FAILED),
    PodPreempted: lambda e, ev: e.finish(ev.pod, FAILED),
    PodGroupStatusChanged: Engine._status_seen,
    NodeAdded: lambda e, ev: e.fire(ClusterEvent.NODE_ADDED, e.state.add_node(ev.node)),
    NodeUpdated: lambda e, ev: e.fire(ClusterEvent.NODE_UPDATED, e.state.update_node(ev.node)),
    NodeRemoved: Engine._node_removed,
    SchedulerConfigured: Engine._configured,
}
"""Event kind → fold. Kinds not listed (ticks, configuration) only advance time."""

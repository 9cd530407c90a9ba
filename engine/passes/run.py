"""One scheduling pass: settle, attempt, report.

1. *Reservations* a shard holds for the coordinator: commit, release, expire.
2. *Timeouts*: Pending groups past their deadline fail; their pending members are
   rejected (:mod:`engine.passes.settle`).
3. *Settle*: units whose readiness may have changed (a member arrived, a dependency
   finished) either join the queue or wait with a reason (emitted once per change:
   :mod:`engine.passes.settle`).
4. *Attempts*: units leave the queue by priority, then fair share (DRF among queues
   that borrow), then arrival. Each goes where the engine's :class:`Dispatch` says: to
   an attempt here (:mod:`engine.passes.pods`, :mod:`engine.passes.gangs`: the
   profile's pre-filters, filters and scores, then its post-filters, preemption,
   if nothing fits), or to someone who places it, or back to the head of the queue.
5. *Report*: groups whose phase or count changed emit their status; a shard of several
   tells the coordinator what it placed.
"""

from __future__ import annotations

from engine.fold import handed_over, take_on, unbound
from engine.framework.profiles import Profiles
from engine.framework.results import Attempt, Verdict
from engine.model.changes import ClusterEvent
from engine.model.groups import (
    PENDING,
    GroupInfo,
    group_unit,
    is_group_unit,
    next_run_reason,
)
from engine.model.pods import PodInfo, pod_info
from engine.model.reservations import COMMITTED
from engine.model.shard import ShardModel
from engine.model.state import held_devices
from engine.passes.answers import compose
from engine.passes.consolidate import consolidate
from engine.passes.context import Dispatch, Route
from engine.passes.defrag import defragment
from engine.passes.explain import Explanation
from engine.passes.gangs import attempt_group
from engine.passes.pods import attempt_pod
from engine.passes.reservations import (
    RESOLVABLE,
    evict,
    hand_back,
    move_here,
    moves_within,
    settle_reservations,
)
from engine.passes.settle import settle, timeouts
from engine.plugins.rescheduler import moving_on_its_own
from events.types import (
    Answer,
    Event,
    Placement,
    PodGroupStatusChanged,
    PodUnbound,
    PodUnschedulable,
    PoolHandedOver,
    ReservationDenied,
    ShardSummary,
)


class SchedulingPass:
    def __init__(
        self,
        model: ShardModel,
        profiles: Profiles,
        dispatch: Dispatch,
        explain: str | None = None,
        explanations: list[Explanation] | None = None,
    ) -> None:
        self.e = model
        self.profiles = profiles
        self.dispatch = dispatch
        self.explain = explain
        self.explanations = explanations if explanations is not None else []
        self.out: list[Event] = []
        self.failed: dict[tuple[object, ...], Attempt] = {}
        """Failures of non-gang attempts by pod shape: within a pass capacity only
        shrinks (until something is evicted), so a shape that failed fails again."""
        self.unmovable: dict[tuple[object, ...], str] = {}
        """Pod shapes (as ``failed``) for which the rescheduler found no plan this pass:
        moves only ever take room, so none is found again until something is freed;
        with the cheapest plan that would need too many moves, said in the reason."""
        self._capacity: dict[str, int] | None = None
        self._answers: dict[tuple[object, ...], Answer] = {}
        """Answers composed this pass, by what decides them (:meth:`answer`)."""
        self.extender_nodes: dict[tuple[object, ...], tuple[str, ...] | None] = {}
        """Per (profile, pod shape, state position): the nodes extenders are asked
        about (:mod:`engine.passes.extenders`)."""
        self.extender_verdicts: dict[tuple[object, ...], Verdict] = {}
        """Per set of answers (shared by the pods asked about together): their verdict,
        which only a node's arrival, departure or change alters."""
        self.unit = ""
        """The unit being attempted."""
        self.devices: dict[str, tuple[int, ...]] = {}
        """Pod → the GPU cards its attempt chose (a score plugin's choice), until bound."""

    def run(self) -> list[Event]:
        e = self.e
        if e.returning:
            for key, (reason, decision) in sorted(e.returning.items()):
                hand_back(self, pod=key, reason=reason, decision_id=decision)
            e.returning = {}
        later: dict[str, str] = {}
        if e.evicting:
            later = evict(self, e.evicting)
            e.evicting = {}
        if e.reservations:
            settle_reservations(self)
        if e.requests:
            self._take_on_requests()
        if e.broken:
            self._take_back_broken()
        if e.releasing:
            self._hand_over_pools()
        timeouts(self)
        if e.holds:
            e.expire_holds()
        settle(self)
        e.queue.flush_backoff(e.now)
        dispatch = self.dispatch
        for ready in dispatch.first(self):
            self.unit = ready
            if is_group_unit(ready):
                if ready[1:] in e.groups and e.groups[ready[1:]].phase == PENDING:
                    attempt_group(self, ready[1:])
            elif ready in e.pods and ready not in e.state.pods:
                attempt_pod(self, e.pods[ready])
            self.freed(e.held.pop(ready, []))
        if e.arrived:
            self._attempt_arrived(later)
        if later:
            evict(self, later)  # the parts asked for before the evictions are placed now
        waits = dispatch.waits
        take = e.queue.peek if waits else e.queue.pop
        placed = e.state.pods
        while (unit := take(self._rank if e.quotas else None)) is not None:
            group = is_group_unit(unit)
            if not group and unit in placed:
                e.queue.remove(unit)  # placed meanwhile (its gang went whole)
                continue
            if not group and unit in e.pods and (owner := e.unit_of(unit)) != unit:
                # queued as a pod while its gang ran; the gang is Pending again, so the
                # gang is the unit: a member alone would run the gang in part
                e.queue.remove(unit)
                e.dirty[owner] = None
                settle(self)
                continue
            if waits:  # (an engine that owns its nodes attempts every unit itself)
                route = dispatch.route(self, unit)
                if route is Route.WAIT:
                    break  # left at the head of the queue: nothing changed
                e.queue.remove(unit)
                if route is not Route.ATTEMPT:
                    continue
            self.unit = unit
            if group:
                attempt_group(self, unit[1:])
            else:
                attempt_pod(self, e.pods[unit])
            if e.dirty:
                settle(self)
        dispatch.done(self)
        if e.migrates and not waits:
            self._defragment()
        self._report_groups()
        if e.next_runs:
            self._explain_next_runs()
        nodes = len(e.state.index)
        if e.placed_here or (e.seen >= 0 and nodes != e.reported_nodes):
            self.out.append(
                ShardSummary(
                    shard=e.shard,
                    seen=e.seen,
                    placed=e.placed_here,
                    nodes=nodes,
                    devices=held_devices(e.state, e.placed_here),
                )
            )
            e.placed_here = {}
            e.reported_nodes = nodes
        return self.out

    def _defragment(self) -> None:
        """Empty nearly-empty GPU machines, and consolidate, if a profile asks for it
        (the first whose ``Rescheduler`` has a ``defragmentation`` budget or
        ``consolidate``). A shard under a coordinator does neither: the coordinator
        does, over every shard's nodes, as one engine does
        (``shards.coordinator.dispatch``), and has the shards carry the moves out."""
        if self.e.seen >= 0:
            return
        plugin = moving_on_its_own(f.plugins for f in self.profiles.frameworks.values())
        if plugin is None:
            return
        if plugin.defrag is not None:
            defragment(self, plugin.defrag, plugin.moves_left())
        if plugin.consolidate:
            consolidate(self, plugin)

    def _attempt_arrived(self, later: dict[str, str]) -> None:
        """What the coordinator handed over or asked to hold since the last pass, in the
        order it decided it (not the queue's: it counted on that order). ``later``:
        victims not placed here yet when their eviction was asked for, each evicted
        as soon as it is placed (taken out of ``later``): the coordinator decided
        what comes after it with it gone."""
        e = self.e
        arrived, e.arrived = e.arrived, {}
        for unit in arrived:
            if later:
                self._evict_placed(later)
            if e.queue.where(unit) != "active":
                continue  # refused, waiting, or placed meanwhile
            e.queue.remove(unit)
            self.unit = unit
            if is_group_unit(unit):
                attempt_group(self, unit[1:])
            elif unit in e.pods and unit not in e.state.pods:
                attempt_pod(self, e.pods[unit])
            if e.dirty:
                settle(self)

    def _evict_placed(self, later: dict[str, str]) -> None:
        """Evict the victims of ``later`` placed here by now (taken out of it)."""
        placed = self.e.state.pods
        now = {key: by for key, by in later.items() if key in placed}
        if now:
            for key in now:
                del later[key]
            evict(self, now)

    def freed(self, slots: list[int]) -> None:
        """Room was freed on ``slots``: parked pods it may help go back to the queue,
        once per node, for the room left there now, however many pods freed it (a
        wake-up per victim woke pods by how many victims a node lost, and a
        coordinator that hears of them together woke fewer)."""
        if slots:
            self.failed.clear()
            self.unmovable.clear()
            for slot in dict.fromkeys(slots):
                self.e.fire(ClusterEvent.POD_FREED, slot)

    def _take_on_requests(self) -> None:
        """Hold the parts the coordinator asked for (tried below, with the queue), or
        say at once why not."""
        e = self.e
        requests, e.requests = e.requests, {}
        for rid, request in requests.items():
            if rid not in e.refused and moves_within(e, request):
                move_here(self, request)
                continue
            why = take_on(e, request)
            if why:
                self.out.append(
                    ReservationDenied(rid=rid, group=request.group.key, reason=why, shard=e.shard)
                )

    def _hand_over_pools(self) -> None:
        """Pools moving to another shard: report what runs on their nodes, forget it."""
        e = self.e
        for pool in sorted(e.releasing):
            release = e.releasing[pool]
            placements = []
            for name in release.nodes:
                slot = e.state.index.get(name)
                if slot is None:
                    continue
                for key in sorted(e.state.node_pods[slot]):
                    rid = e.reserved.get(key)
                    res = e.reservations.get(rid) if rid is not None else None
                    if res is not None and res.state != COMMITTED:
                        # held, not bound: the reservation cannot move; it is let go
                        res.ending = res.ending or f"its pool {pool} moved to another shard"
                        continue
                    if key in e.pods and key in e.bindings:
                        placed = e.state.pods.get(key)
                        placements.append(
                            Placement(
                                pod=e.pods[key].spec,
                                node=name,
                                decision_id=e.bindings[key],
                                devices=placed.devices if placed is not None else (),
                            )
                        )
            event = PoolHandedOver(
                pool=pool,
                nodes=release.nodes,
                placements=tuple(placements),
                to=release.to,
                shard=e.shard,
            )
            handed_over(e, event)
            self.out.append(event)

    def _take_back_broken(self) -> None:
        """Gangs that fell below minMember after a failed bind: unbind the rest and
        schedule the gang again, whole."""
        e = self.e
        for key, reason in sorted(e.broken.items()):
            group = e.groups.get(key)
            if group is None:
                continue
            for member in list(group.members):
                placed = e.state.pods.get(member)
                if placed is None:
                    continue
                event = PodUnbound(
                    pod=member,
                    node=e.state.names[placed.slot] or "",
                    decision_id=e.bindings.get(member, ""),
                    reason=f"gang {key} rolled back: {reason}",
                    shard=e.shard,
                )
                unbound(e, event)
                self.dispatch.unbound(self, event)
            e.pending_again(group, f"rolled back: {reason}")
            self.dispatch.rolled_back(self, key, f"gang {key} rolled back: {reason}")
            e.group_changes[key] = None
            e.dirty[group_unit(key)] = None
        e.broken.clear()

    # ------------------------------------------------------------------ waiting

    def say(self, keys: list[str], reason: str, held: dict[str, PodInfo] | None = None) -> None:
        """Tell why pods wait, once per pod and reason (``held``: pods not among the
        engine's yet, held for a group's next run)."""
        e = self.e
        for key in keys:
            if e.said.get(key) != reason:
                e.said[key] = reason
                pod = e.pods.get(key) or (held or {}).get(key)
                answer = self.answer(pod, reason, (), {}) if pod is not None else None
                self.out.append(
                    PodUnschedulable(
                        pod=key, attempt=0, reason=reason, shard=e.shard, answer=answer
                    )
                )

    def answer(
        self,
        pod: PodInfo,
        reason: str,
        plugins: tuple[str, ...],
        rejections: dict[str, int],
        unit: str | None = None,
    ) -> Answer:
        """The answer for a waiting ``pod`` (:mod:`engine.passes.answers`), composed once
        per pass for pods alike in what decides it."""
        key = (
            reason,
            plugins,
            tuple(sorted(rejections.items())),
            unit,
            pod.shape_key,
            pod.spec.namespace,
            pod.spec.group,
        )
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = compose(self.e, pod, reason, plugins, rejections, unit)
        if answer.kind == "other" and unit is None:  # its next step names the pod itself
            return compose(self.e, pod, reason, plugins, rejections, unit)
        return answer

    def _explain_next_runs(self) -> None:
        """Say why the pods held for a group's next run wait."""
        for key, (_, waiting) in sorted(self.e.next_runs.items()):
            held = {pod.key: pod_info(pod, self.e.state.resources, 0) for pod in waiting}
            self.say(list(held), next_run_reason(key), held)

    def group_priority(self, group: GroupInfo) -> int:
        members = [self.e.pods[m].priority for m in group.members if m in self.e.pods]
        return max([group.spec.priority if group.spec else 0, *members])

    # ------------------------------------------------------------------ fair share

    def _rank(self, queue: str, unit: str, priority: int, seq: int) -> tuple[object, ...]:
        if not queue:
            return (-priority, 0, 0.0, seq, unit)
        e = self.e
        quota = e.quotas.get(queue)
        if quota is None:
            return (-priority, 0, 0.0, seq, unit)
        wanted: dict[str, int] = {}
        for pod in self.unit_pods(unit):
            for name, amount in e.quotas.named(pod.request).items():
                wanted[name] = wanted.get(name, 0) + amount
        if quota.within_min_with(wanted):
            return (-priority, 0, 0.0, seq, unit)
        if self._capacity is None:
            valid = e.state.valid
            self._capacity = {
                e.state.resources.name(row): int(e.state.alloc[row][valid].sum())
                for row in range(e.state.alloc.shape[0])
            }
        return (-priority, 1, e.quotas.dominant_share(queue, self._capacity), seq, unit)

    def unit_pods(self, unit: str) -> list[PodInfo]:
        """The pods a unit would place: a pending group's pending members, or the pod."""
        e = self.e
        if is_group_unit(unit):
            members = e.groups[unit[1:]].members
            return [e.pods[m] for m in members if m in e.pods and m not in e.state.pods]
        return [e.pods[unit]]

    # ------------------------------------------------------------------ outcomes

    def record(self, pod: PodInfo, attempt: Attempt) -> None:
        if pod.key != self.explain:
            return
        e = self.e
        node = e.state.names[attempt.slot] if attempt.slot >= 0 else None
        self.explanations.append(
            Explanation(e.now, pod.attempts, node, attempt.status, attempt.diagnosis)
        )

    def unschedulable(
        self,
        pod: PodInfo,
        reason: str,
        plugins: tuple[str, ...],
        rejections: dict[str, int] | None = None,
        unit: str | None = None,
        answer: Answer | None = None,
    ) -> None:
        """``pod`` found no node: a delegated pod goes back to the coordinator; any other
        says why and waits (``unit`` given: its gang parks, not the pod; ``answer``: the
        gang's, else one is composed for the pod)."""
        e = self.e
        if unit is None and pod.key in e.delegated:
            hand_back(self, pod=pod.key, reason=reason, plugins=plugins)
            return
        e.said.pop(pod.key, None)
        self.out.append(
            PodUnschedulable(
                pod=pod.key,
                attempt=pod.attempts,
                reason=reason,
                rejections=rejections or {},
                plugins=plugins,
                shard=e.shard,
                answer=answer or self.answer(pod, reason, plugins, rejections or {}, unit),
            )
        )
        e.count("unschedulable")
        if unit is None:
            # no rejecting plugin (no node at all yet): any cluster change may help;
            # no profile for the pod: nothing will (events_for gives none)
            e.park(pod.key, pod, plugins, pod.shape_key)

    # ------------------------------------------------------------------ status

    def _report_groups(self) -> None:
        """Report each changed group's status, in the order of their keys: a pass that
        reports nothing (every status as last reported) leaves nothing in the log, so
        replay cannot know it ran, and what the next report says, in what order, must
        not depend on it."""
        e = self.e
        for key in sorted(e.group_changes):
            group = e.groups.get(key)
            if group is None or group.spec is None or group.reservation:
                continue
            placed = len(e.placed_members(group))
            status = (group.phase.value, placed, group.reason)
            if status != group.reported:
                group.reported = status
                self.out.append(
                    PodGroupStatusChanged(
                        group=key,
                        phase=group.phase.value,
                        scheduled=placed,
                        reason=group.reason,
                        shard=e.shard,
                    )
                )
        e.group_changes.clear()


__all__ = ["RESOLVABLE", "SchedulingPass"]

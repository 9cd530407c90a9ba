"""One scheduling pass of the engine: settle, attempt, report.

1. *Timeouts*: Pending groups past their deadline fail; their pending members are
   rejected.
2. *Settle*: units whose readiness may have changed (a member arrived, a dependency
   finished) either join the queue or wait with a reason (emitted once per change).
3. *Attempts*: units leave the queue by priority, then fair share (DRF among queues
   that borrow), then arrival. A pod is admitted by its elastic quota, then filtered
   and scored; a gang places every pending member against staged state and commits
   only if ``minMember`` is reached. What does not fit may preempt (lower priority)
   or reclaim (lent quota). Every attempt is an event.
4. *Report*: groups whose phase or count changed emit their status.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.framework.results import Attempt
from engine.framework.runtime import Framework
from engine.framework.status import Code, Status
from engine.gang_attempt import NO_PROFILE, attempt_group
from engine.model.changes import ClusterEvent
from engine.model.groups import (
    FAILED,
    PENDING,
    SCHEDULED,
    SUCCEEDED,
    GroupInfo,
    group_unit,
    is_group_unit,
    next_run_reason,
)
from engine.model.pods import PodInfo
from engine.model.statement import Statement
from engine.preemption import Plan, VictimInfo, plan
from engine.reservations import COMMITTED, hand_back, settle_reservations, summary
from events.types import (
    SECOND,
    Event,
    Placement,
    PodBound,
    PodGroupStatusChanged,
    PodPreempted,
    PodRejected,
    PodUnbound,
    PodUnschedulable,
    PoolHandedOver,
)

if TYPE_CHECKING:
    from engine.scheduler import Engine


class SchedulingPass:
    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self.out: list[Event] = []
        self.failed: dict[tuple[object, ...], Attempt] = {}
        """Failures of non-gang attempts by pod shape: within a pass capacity only
        shrinks (until something is evicted), so a shape that failed fails again."""
        self._capacity: dict[str, int] | None = None

    def run(self) -> list[Event]:
        e = self.e
        if e.reservations:
            settle_reservations(self)
        if e.broken:
            self._take_back_broken()
        if e.releasing:
            self._hand_over_pools()
        self._timeouts()
        self._settle()
        e.queue.flush_backoff(e.now)
        while (unit := e.queue.pop(self._rank if e.quotas else None)) is not None:
            if is_group_unit(unit):
                self._attempt_group(unit[1:])
            elif unit not in e.state.pods:  # placed meanwhile (its gang went whole)
                self._attempt_pod(e.pods[unit])
            if e.dirty:
                self._settle()
        self._report_groups()
        if e.next_runs:
            self._explain_next_runs()
        if e.seen >= 0:
            current = summary(e)
            if current != e.last_summary:
                e.last_summary = current
                self.out.append(current)
        return self.out

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
                        placements.append(
                            Placement(pod=e.pods[key].spec, node=name, decision_id=e.bindings[key])
                        )
            event = PoolHandedOver(
                pool=pool,
                nodes=release.nodes,
                placements=tuple(placements),
                to=release.to,
                shard=e.shard,
            )
            e.handed_over(event)
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
                e.apply_decision(event)
                self.out.append(event)
            group.phase, group.reason = PENDING, f"rolled back: {reason}"
            e.group_changes[key] = None
            e.dirty[group_unit(key)] = None
        e.broken.clear()

    # ------------------------------------------------------------------ waiting

    def _timeouts(self) -> None:
        e = self.e
        for group in e.groups.values():
            deadline = group.deadline
            if group.phase != PENDING or deadline is None or deadline > e.now:
                continue
            seconds = (group.spec.timeout or 0) / SECOND if group.spec else 0
            last = f": {group.reason}" if group.reason else ""
            self._fail_group(
                group,
                f"pod group {group.key} timed out: fewer than {group.min_member} members "
                f"placed within {seconds:g}s{last}",
            )

    def _fail_group(self, group: GroupInfo, reason: str) -> None:
        e = self.e
        group.phase, group.reason = FAILED, reason
        e.wake(group.key)
        unit = group_unit(group.key)
        e.queue.remove(unit)
        e.waiting.pop(unit, None)
        for member in list(group.members):
            if member in e.pods and member not in e.state.pods:
                self._reject(e.pods[member], reason)
        e.group_changes[group.key] = None

    def _reject(self, pod: PodInfo, reason: str) -> None:
        self.out.append(PodRejected(pod=pod.key, reason=reason, shard=self.e.shard))
        self.e.finish(pod.key, FAILED)

    def _settle(self) -> None:
        e = self.e
        while e.dirty:
            unit = next(iter(e.dirty))
            del e.dirty[unit]
            if is_group_unit(unit):
                self._settle_group(unit)
                continue
            pod = e.pods.get(unit)
            if pod is None or unit in e.state.pods or e.unit_of(unit) != unit:
                continue
            group = e.groups.get(pod.spec.group) if pod.spec.group else None
            if group is not None and group.phase in (FAILED, SUCCEEDED):
                self._reject(pod, f"pod group {group.key} has already {group.phase.lower()}")
                continue
            deps = e.dependency_state(e.depends_on(unit))
            if deps.failed:
                self._reject(pod, f"dependency {deps.failed} failed")
            elif not deps.ok:
                self._hold(unit, [pod], deps.waiting, waits_on=e.depends_on(unit))
            else:
                self._ready(unit, pod.priority, pod.seq, pod.spec.namespace)

    def _settle_group(self, unit: str) -> None:
        e = self.e
        group = e.groups.get(unit[1:])
        if group is None or group.phase != PENDING:
            e.queue.remove(unit)
            e.waiting.pop(unit, None)
            return
        pending = [e.pods[m] for m in group.members if m in e.pods and m not in e.state.pods]
        if not pending:
            e.queue.remove(unit)
            e.waiting.pop(unit, None)
            return
        if group.spec is None:
            self._hold(unit, pending, f"waiting for pod group {group.key}, which does not exist")
            return
        deps = e.dependency_state(e.depends_on(unit))
        if deps.failed:
            self._fail_group(group, f"dependency {deps.failed} failed")
            return
        if not deps.ok:
            self._hold(unit, pending, deps.waiting, waits_on=e.depends_on(unit))
            return
        present = sum(1 for m in group.members if m in e.pods)
        if present < group.min_member:
            self._hold(
                unit,
                pending,
                f"waiting for members of pod group {group.key}: "
                f"{present} of minMember {group.min_member} present",
            )
            return
        self._ready(unit, self.group_priority(group), group.seq, group.namespace)

    def _hold(
        self, unit: str, pods: list[PodInfo], reason: str, waits_on: tuple[str, ...] = ()
    ) -> None:
        e = self.e
        e.queue.remove(unit)
        e.waiting[unit] = reason
        for dep in waits_on:
            e.dependents.setdefault(dep, {})[unit] = None
        if is_group_unit(unit):
            group = e.groups[unit[1:]]
            if group.reason != reason:
                group.reason = reason
                e.group_changes[group.key] = None
        self._say([pod.key for pod in pods], reason)

    def _say(self, keys: list[str], reason: str) -> None:
        """Tell why pods wait, once per pod and reason."""
        e = self.e
        for key in keys:
            if e.said.get(key) != reason:
                e.said[key] = reason
                self.out.append(PodUnschedulable(pod=key, attempt=0, reason=reason, shard=e.shard))

    def _explain_next_runs(self) -> None:
        """Say why the pods held for a group's next run wait."""
        for key, (_, waiting) in sorted(self.e.next_runs.items()):
            self._say([pod.key for pod in waiting], next_run_reason(key))

    def _ready(self, unit: str, priority: int, seq: int, namespace: str) -> None:
        e = self.e
        e.waiting.pop(unit, None)
        if unit not in e.queue:
            e.queue.add(unit, priority, seq, e.queue_of(namespace))

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
        pods = (
            [e.pods[m] for m in e.groups[unit[1:]].members if m in e.pods and m not in e.state.pods]
            if is_group_unit(unit)
            else [e.pods[unit]]
        )
        for pod in pods:
            for row, amount in pod.request:
                name = e.state.resources.name(row)
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

    # ------------------------------------------------------------------ one pod

    def _attempt_pod(self, pod: PodInfo) -> None:
        e = self.e
        pod.attempts += 1
        e.count("attempts")
        framework = e.framework_for(pod)
        if framework is None:
            self.unschedulable(pod, NO_PROFILE.format(pod.spec.scheduler_name), ())
            return
        explain = pod.key == e.explain
        refusal = e.quotas.admit(pod.spec.namespace, pod.request) if e.quotas else None
        attempt: Attempt | None = None
        if refusal is None:
            cache_key = (id(framework), pod.shape_key)
            attempt = None if explain else self.failed.get(cache_key)
            if attempt is None:
                attempt = framework.schedule(pod, e.state, explain=explain)
            if attempt.slot >= 0:
                self.record(pod, attempt)
                self._bind(pod, attempt.slot, attempt.score)
                return
            if attempt.diagnosis is not None and attempt.diagnosis.plugins:
                self.failed[cache_key] = attempt
        resolvable = attempt is None or attempt.status.code != Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        preemptible = refusal is not None or e.preemptible_below(pod.priority)
        if (refusal is None or refusal[1]) and resolvable and preemptible:
            statement = Statement(e.state, e.quotas)
            placed = self.preempt_into(statement, pod, framework, reclaim=refusal is not None)
            if placed is not None:
                self.commit(statement, [(pod, placed)])
                return
            statement.discard()
        if refusal is not None:
            self.record(pod, Attempt(-1, Status(reasons=(refusal[0],))))
            self.unschedulable(pod, refusal[0], ("ElasticQuota",))
            return
        assert attempt is not None
        self.record(pod, attempt)
        diagnosis = attempt.diagnosis
        plugins = tuple(diagnosis.plugins) if diagnosis else ()
        if not plugins and attempt.status.plugin:
            plugins = (attempt.status.plugin,)
        self.unschedulable(
            pod, attempt.status.message(), plugins, diagnosis.rejections() if diagnosis else {}
        )

    def record(self, pod: PodInfo, attempt: Attempt) -> None:
        e = self.e
        if pod.key != e.explain:
            return
        from engine.scheduler import Explanation

        node = e.state.names[attempt.slot] if attempt.slot >= 0 else None
        e.explanations.append(
            Explanation(e.now, pod.attempts, node, attempt.status, attempt.diagnosis)
        )

    def unschedulable(
        self,
        pod: PodInfo,
        reason: str,
        plugins: tuple[str, ...],
        rejections: dict[str, int] | None = None,
        unit: str | None = None,
    ) -> None:
        e = self.e
        if unit is None and pod.key in e.returnable and not pod.spec.group:
            hand_back(self, pod=pod.key, reason=reason, plugins=plugins)
            return
        answers = e.answers.get(pod.key)
        if answers:
            reason = f"{reason}; " + "; ".join(answers)
        e.said.pop(pod.key, None)
        self.out.append(
            PodUnschedulable(
                pod=pod.key,
                attempt=pod.attempts,
                reason=reason,
                rejections=rejections or {},
                plugins=plugins,
                shard=e.shard,
            )
        )
        e.count("unschedulable")
        if unit is None:
            # no rejecting plugin (no node at all yet): any cluster change may help;
            # no profile for the pod: nothing will (events_for gives none)
            events = e.events_for(e.framework_for(pod), plugins)
            e.queue.park(
                pod.key,
                pod.priority,
                pod.seq,
                pod.attempts,
                e.now,
                plugins,
                events,
                e.queue_of(pod.spec.namespace),
                pod.shape_key,
            )

    def _bind(self, pod: PodInfo, slot: int, score: int) -> None:
        e = self.e
        decision_id = f"{pod.key}@{pod.seq}#{pod.attempts}"
        e.place(pod.key, slot, decision_id)
        node = e.state.names[slot]
        assert node is not None
        self.out.append(
            PodBound(
                pod=pod.key,
                node=node,
                decision_id=decision_id,
                attempt=pod.attempts,
                shard=e.shard,
                score=score,
            )
        )
        e.count("bound")
        if pod.spec.group in e.groups:
            e.group_changes[pod.spec.group] = None

    # ------------------------------------------------------------------ preemption

    def preempt_into(
        self,
        statement: Statement,
        pod: PodInfo,
        framework: Framework,
        *,
        reclaim: bool,
        exclude_group: str = "",
    ) -> int | None:
        """Stage the evictions that make room for ``pod`` and its placement; the slot,
        or None (the caller discards the statement)."""
        e = self.e
        if statement.evicted():
            # earlier evictions of this attempt (a gang) may already have made room
            admitted = not e.quotas or e.quotas.admit(pod.spec.namespace, pod.request) is None
            attempt = framework.schedule(pod, e.state) if admitted else None
            if attempt is not None and attempt.slot >= 0:
                statement.assume(
                    pod.key, pod.spec.namespace, attempt.slot, pod.request, pod.priority
                )
                return attempt.slot
        allowed = framework.static_feasible(pod, e.state)

        def info(key: str) -> VictimInfo | None:
            victim = e.pods.get(key)
            if victim is None:
                return None
            spec = victim.spec
            return VictimInfo(
                key, victim.priority, e.started.get(key, 0), spec.namespace, spec.group
            )

        chosen: Plan | None = plan(
            pod,
            e.state,
            allowed,
            info,
            e.quotas,
            reclaim=reclaim,
            exclude_group=exclude_group or pod.spec.group,
            gang_of=self._gang_of,
        )
        if chosen is None:
            return None
        for victim in chosen.victims:
            if victim in e.state.pods:
                statement.evict(victim, e.pods[victim].spec.namespace, by=pod.key)
        if e.quotas and e.quotas.admit(pod.spec.namespace, pod.request) is not None:
            return None
        attempt = framework.schedule(pod, e.state)
        if attempt.slot < 0:
            return None
        statement.assume(pod.key, pod.spec.namespace, attempt.slot, pod.request, pod.priority)
        return attempt.slot

    def _gang_of(self, key: str) -> tuple[str, ...]:
        """The placed members that go down with ``key`` (its gang, if it would drop
        below ``minMember``)."""
        e = self.e
        group = e.groups.get(e.pods[key].spec.group) if key in e.pods else None
        if group is None or group.phase != SCHEDULED:
            return ()
        placed = [m for m in group.members if m in e.state.pods]
        return tuple(placed) if len(placed) - 1 < group.min_member else ()

    def commit(self, statement: Statement, placed: list[tuple[PodInfo, int]]) -> None:
        """Emit the staged evictions, then the placements."""
        e = self.e
        freed: list[int] = []
        for op in statement.ops:
            if op.kind != "evict":
                continue
            by = op.by or placed[0][0].key
            node = e.state.names[op.slot] or ""
            self.out.append(PodPreempted(pod=op.key, node=node, by=by, shard=e.shard))
            e.count("preempted")
            victim = e.pods.get(op.key)
            group = e.groups.get(victim.spec.group) if victim else None
            e.finish(op.key, FAILED)
            if group is not None:
                group.reason = f"preempted by {by}"
            freed.append(op.slot)
        statement.commit()
        for pod, slot in placed:
            self._bind(pod, slot, 0)
        if freed:
            self.failed.clear()
            for slot in freed:
                e.fire(ClusterEvent.POD_FREED, slot)

    # ------------------------------------------------------------------ gangs

    def _attempt_group(self, key: str) -> None:
        attempt_group(self, key)

    # ------------------------------------------------------------------ status

    def _report_groups(self) -> None:
        e = self.e
        for key in list(e.group_changes):
            group = e.groups.get(key)
            if group is None or group.spec is None or group.reservation:
                continue
            placed = sum(1 for m in group.members if m in e.state.pods)
            status = (group.phase, placed, group.reason)
            if status != group.reported:
                group.reported = status
                self.out.append(
                    PodGroupStatusChanged(
                        group=key,
                        phase=group.phase,
                        scheduled=placed,
                        reason=group.reason,
                        shard=e.shard,
                    )
                )
        e.group_changes.clear()

"""The event fold: each event kind changes the data layer (:class:`ShardModel`) one way.

Inputs (nodes, pods, groups, quotas, what the coordinator hands a shard) and decisions
(this engine's own, folded again on replay) go through the same handlers, so that a
decision made and the same decision replayed leave the same state. Handlers are
idempotent: a decision applied twice, or a pod told twice, changes nothing the second
time. Kinds without a handler (ticks, snapshots) only advance time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from engine.model.changes import ClusterEvent
from engine.model.groups import (
    FAILED,
    SCHEDULED,
    SUCCEEDED,
    GroupInfo,
    advance,
    group_is_over,
    group_unit,
    is_group_unit,
)
from engine.model.reservations import COMMITTING, HELD, STAGING, Reservation, decision_id
from engine.model.shard import ShardModel
from events.types import (
    BindFailed,
    DisruptionBudgetDeleted,
    DisruptionBudgetSet,
    ExtenderAnswered,
    MigrationEvicted,
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
    PodMigrated,
    PodPreempted,
    PodRejected,
    PodRouted,
    PodSubmitted,
    PodSucceeded,
    PodUnbound,
    PodUnschedulable,
    PoolHandedOver,
    PoolReleased,
    PreemptionRequested,
    QuotaDefined,
    ReservationAborted,
    ReservationCommitted,
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
    WorkloadShapes,
)


def submitted(m: ShardModel, event: PodSubmitted) -> None:
    m.submit(m.pools.fenced(event.pod))


def routed(m: ShardModel, event: PodRouted) -> None:
    """The coordinator hands this shard a pod to place: at once, or handed back."""
    spec = event.pod
    key = spec.key
    if key in m.pods or (key in m.outcomes and not m.another_pod(spec)):
        return
    m.delegate(event)
    m.submit(spec)


def quota_defined(m: ShardModel, event: QuotaDefined) -> None:
    m.quotas.define(event.quota)
    m.fire(ClusterEvent.QUOTA_CHANGED, -1)


def budget_set(m: ShardModel, event: DisruptionBudgetSet) -> None:
    """A disruption budget set or deleted: it limits moves and evictions from the next
    pass on. It frees no room, so no parked pod is woken (as in kube-scheduler, a pod
    waiting on moves is tried again when pods or nodes change)."""
    m.budgets.set(event.budget)


def budget_deleted(m: ShardModel, event: DisruptionBudgetDeleted) -> None:
    m.budgets.delete(event.budget)


def bound(m: ShardModel, event: PodBound) -> None:
    pod = m.pods.get(event.pod)
    slot = m.state.index.get(event.node)
    if pod is None or slot is None or m.bindings.get(event.pod) == event.decision_id:
        return
    m.queue.remove(event.pod)
    pod.attempts = max(pod.attempts, event.attempt)
    m.place(event.pod, slot, event.decision_id, devices=event.devices)


def migration_evicted(m: ShardModel, event: MigrationEvicted) -> None:
    """The move was carried out by evicting the pod: once it is gone, its room on the
    planned node is held for its replacement (:mod:`engine.model.holds`)."""
    if m.bindings.get(event.pod) == event.decision_id:
        m.replacing[event.pod] = event.decision_id


def migrated(m: ShardModel, event: PodMigrated) -> None:
    """A pod moved to make room (the rescheduler): placed on its new node, restarted."""
    rid = m.reserved.get(event.pod)
    res = m.reservations.get(rid) if rid is not None else None
    if res is not None and event.pod in res.moves:
        # moved here from another shard under a part this shard holds: as a binding
        if m.bindings.get(event.pod) == event.decision_id:
            res.bound.add(event.pod)
        return
    slot = m.state.index.get(event.to_node)
    if event.pod not in m.pods or slot is None or m.bindings.get(event.pod) == event.decision_id:
        return
    m.release(event.pod, moving=True)
    m.place(event.pod, slot, event.decision_id, devices=event.devices, moved=True)


def bound_seen(m: ShardModel, event: PodBound) -> None:
    rid = m.reserved.get(event.pod)
    if rid is None:
        bound(m, event)
        return
    res = m.reservations.get(rid)
    if res is not None and m.bindings.get(event.pod) == event.decision_id:
        res.bound.add(event.pod)


def unschedulable(m: ShardModel, event: PodUnschedulable) -> None:
    pod = m.pods.get(event.pod)
    if pod is None or event.attempt == 0 or pod.attempts >= event.attempt:
        return
    pod.attempts = event.attempt
    unit = m.unit_of(event.pod)
    m.park(unit, pod, event.plugins, None if unit != event.pod else pod.shape_key)


def bind_failed(m: ShardModel, event: BindFailed) -> None:
    pod = m.pods.get(event.pod)
    if pod is None or m.bindings.get(event.pod) != event.decision_id:
        return
    slot = m.release(event.pod)
    rid = m.reserved.get(event.pod)
    if rid is not None or event.pod in m.delegated:
        # the coordinator asked for it: it decides again, as one scheduler folds a failed
        # bind (the pass hands the pod back; a part of a gang keeps its other pods)
        res = m.reservations.get(rid) if rid is not None else None
        if res is not None:
            res.pods = tuple(k for k in res.pods if k != event.pod)
            res.bound.discard(event.pod)
            m.reserved.pop(event.pod, None)
            if not res.pods:  # its last pod: the part is over (and the group it was)
                del m.reservations[res.rid]
                m.groups.pop(res.group, None)
        m.returning[event.pod] = (
            f"{event.pod} failed to bind to {event.node}: {event.reason}",
            event.decision_id,
        )
        if slot is not None:
            m.fire(ClusterEvent.POD_FREED, slot)
        return
    group = m.groups.get(pod.spec.group) if pod.spec.group else None
    if group is not None and group.phase == SCHEDULED:
        placed = len(m.placed_members(group))
        if placed < group.min_member:
            m.broken[group.key] = (
                f"{event.pod} failed to bind to {event.node} ({event.reason}), leaving "
                f"{placed} of minMember {group.min_member} placed"
            )
    if group is not None and group.key in m.broken:
        # the gang goes back to the queue whole at the next pass, this pod with it
        if slot is not None:
            m.fire(ClusterEvent.POD_FREED, slot)
        return
    unit = m.unit_of(event.pod)
    m.queue.back_off(
        unit, pod.priority, pod.seq, pod.attempts, m.now, m.queue_of(pod.spec.namespace)
    )
    if slot is not None:
        m.fire(ClusterEvent.POD_FREED, slot)


def finished(outcome: str) -> Callable[[ShardModel, Any], None]:
    def handler(m: ShardModel, event: Any) -> None:
        m.finish(event.pod, outcome)

    return handler


def status_seen(m: ShardModel, event: PodGroupStatusChanged) -> None:
    group = m.groups.get(event.group)
    if group is None:
        if event.phase in (SUCCEEDED, FAILED):
            m.finished_as(event.group, event.phase)  # a dependency on another shard
            m.wake(event.group)
        return
    if group.reported is None:
        group.reported = (event.phase, event.scheduled, event.reason)


def handed_back(m: ShardModel, event: PodHandedBack) -> None:
    if event.group:
        m.drop_group(event.group)
    else:
        m.drop(event.pod)


# ---------------------------------------------------------------------- pool hand-over


def pool_released(m: ShardModel, event: PoolReleased) -> None:
    m.releasing[event.pool] = event


def handed_over(m: ShardModel, event: PoolHandedOver) -> None:
    """Forget the pool's nodes and the pods on them (they live on elsewhere)."""
    m.releasing.pop(event.pool, None)
    for placement in event.placements:
        key = placement.pod.key
        pod = m.pods.get(key)
        if pod is not None:
            group = m.groups.get(pod.spec.group) if pod.spec.group else None
            m.drop(key)
            if group is not None:
                m.group_changes[group.key] = None
    for name in event.nodes:
        if name in m.state.index:
            for key in m.state.remove_node(name):
                m.drop(key)


def adopted(m: ShardModel, event: PodAdopted) -> None:
    """A pod bound on a node this shard has just taken over: placed, as it is."""
    placement = event.placement
    key = placement.pod.key
    slot = m.state.index.get(placement.node)
    if slot is None or key in m.outcomes:
        return
    if key not in m.pods:
        m.submit(placement.pod)
    m.queue.remove(key)
    m.waiting.pop(key, None)
    if m.bindings.get(key) != placement.decision_id:
        m.place(key, slot, placement.decision_id, devices=placement.devices)


# ---------------------------------------------------------------------- reservations


def reservation_requested(m: ShardModel, event: ReservationRequested) -> None:
    """Kept for the next pass, which lets go of what it was told to release first (an
    aborted part may hold the same pods) and then takes this on or refuses it."""
    if event.rid not in m.reservations:
        m.requests.setdefault(event.rid, event)
        m.arrived[group_unit(event.group.key)] = None


def take_on(m: ShardModel, event: ReservationRequested) -> str:
    """Hold part ``event.rid`` as a gang of its own (its pods submitted, the group due to
    be tried); why not, if it cannot be taken on (empty: taken on)."""
    old = m.groups.get(event.group.key)
    if old is not None:
        if not group_is_over(old, m.pods):
            return f"pod group {event.group.key} is still held here"
        # every pod of the group held here before is gone: the name is the new gang's
        m.reservations.pop(old.reservation, None)
        m.drop_group(old.key)
    keys = tuple(spec.key for spec in event.pods)
    if event.rid in m.refused:
        return m.refused.pop(event.rid)
    held = [k for k in keys if k in m.pods]
    if held:
        return f"{held[0]} is still held here"
    for key in event.moves:
        if key in m.outcomes:
            # moved away from this shard's node before (forgotten here as gone), now
            # moved back: the same pod, running (the coordinator's view says where)
            m.unfinish(key)
    if not all(m.another_pod(spec) for spec in event.pods if spec.key in m.outcomes):
        return "a pod of the part has already finished here"
    m.reservations[event.rid] = Reservation(
        event.rid,
        event.group.key,
        keys,
        event.expires_at,
        placements=dict(event.placements),
        at_once=event.at_once,
        moves=dict(event.moves),
        moved_for=event.moved_for,
        moved_by=dict(event.moved_by),
        plain=event.plain,
        devices=dict(event.devices),
        leaving=dict(event.leaving),
    )
    group = m.groups[event.group.key] = GroupInfo(
        event.group.key, seq=m.submissions, reservation=event.rid
    )
    m.submissions += 1
    group.spec = event.group
    group.created_at = m.now
    m.specified(group)
    for spec in event.pods:
        m.reserved[spec.key] = event.rid
        m.submit(spec)
        m.counted_over_shards(spec.key, event.disruptions, event.counted)
    m.dirty[group_unit(event.group.key)] = None
    return ""


def preemption_requested(m: ShardModel, event: PreemptionRequested) -> None:
    m.evicting.update(event.victims)


def shapes_told(m: ShardModel, event: WorkloadShapes) -> None:
    m.shapes.adopt(
        {(cpu, milli, cards, models): n for cpu, milli, cards, models, n in event.learned}
    )


def granted(m: ShardModel, event: ReservationGranted) -> None:
    res = m.reservations.get(event.rid)
    if res is None or res.state != STAGING:
        return
    for key, node in event.placements.items():
        slot = m.state.index.get(node)
        if key in m.pods and slot is not None:
            m.queue.remove(key)
            m.place(key, slot, decision_id(key, event.rid))
    group = m.groups[res.group]
    advance(group, SCHEDULED)
    m.queue.remove(group_unit(res.group))
    res.advance(HELD)
    if res.at_once:
        res.advance(COMMITTING)


def committed(m: ShardModel, event: ReservationCommitted) -> None:
    res = m.reservations.get(event.rid)
    if res is not None and res.state == HELD:
        res.advance(COMMITTING)


def aborted(m: ShardModel, event: ReservationAborted) -> None:
    reason = f"aborted: {event.reason}" if event.reason else "aborted"
    request = m.requests.get(event.rid)
    if request is not None:
        # not taken on yet: the next pass refuses it instead (the coordinator waits for
        # every part to answer)
        m.requests[event.rid] = msgspec.structs.replace(request, pods=(), placements={})
        m.refused[event.rid] = reason
        return
    res = m.reservations.get(event.rid)
    if res is not None and not res.ending:
        res.ending = reason


def part_closed(m: ShardModel, event: ReservationDenied | ReservationReleased) -> None:
    res = m.reservations.pop(event.rid, None)
    if res is None:
        return
    freed = [slot for key in res.pods if (slot := m.release_if_placed(key)) is not None]
    for key, cards in res.lifted.items():
        # let go: the pods that were to leave for other shards run here again
        pod = m.pods.get(key)
        slot = m.state.index.get(res.leaving.get(key, ""))
        if pod is not None and slot is not None and key not in m.state.pods:
            spec = pod.spec
            m.state.assume(key, slot, pod.request, spec.priority, spec.host_ports, cards or None)
    m.drop_group(res.group)
    for slot in freed:
        m.fire(ClusterEvent.POD_FREED, slot)


def unbound(m: ShardModel, event: PodUnbound) -> None:
    pod = m.pods.get(event.pod)
    if pod is None or m.bindings.get(event.pod) != event.decision_id:
        return
    slot = m.release(event.pod)
    rid = m.reserved.get(event.pod)
    if rid is not None and rid in m.reservations:
        m.reservations[rid].bound.discard(event.pod)
    elif pod.spec.group in m.groups:
        group = m.groups[pod.spec.group]
        placed = len(m.placed_members(group))
        if group.phase == SCHEDULED and placed < group.min_member:
            m.pending_again(group, group.reason)
        m.dirty[m.unit_of(event.pod)] = None
    else:
        m.dirty[event.pod] = None
    if slot is not None:
        m.fire(ClusterEvent.POD_FREED, slot)


# ---------------------------------------------------------------------- nodes


def node_added(m: ShardModel, event: NodeAdded | NodeUpdated) -> None:
    spec = m.pools.labelled(event.node)
    kind = ClusterEvent.NODE_ADDED if isinstance(event, NodeAdded) else ClusterEvent.NODE_UPDATED
    m.fire(kind, m.state.add_node(spec))


def node_removed(m: ShardModel, event: NodeRemoved) -> None:
    slot = m.state.index.get(event.name)
    lost = list(m.state.node_pods[slot]) if slot is not None else []
    for key in lost:
        m.release(key)
    m.state.remove_node(event.name)


def extender_answered(m: ShardModel, event: ExtenderAnswered) -> None:
    """An extender's answer: the unit whose last answer this is goes back to the queue."""
    for unit in m.extenders.answered(event):
        if unit in m.pods or (is_group_unit(unit) and unit[1:] in m.groups):
            m.dirty[unit] = None
    for pod in event.pods:
        if pod not in m.pods:
            m.extenders.forget(pod)  # gone meanwhile: nothing will use the answer


HANDLERS: Final[dict[type, Callable[[ShardModel, Any], None]]] = {
    PodSubmitted: submitted,
    PodGroupSubmitted: ShardModel.group_submitted,
    QuotaDefined: quota_defined,
    DisruptionBudgetSet: budget_set,
    DisruptionBudgetDeleted: budget_deleted,
    PodBound: bound_seen,
    PodMigrated: migrated,
    MigrationEvicted: migration_evicted,
    PodUnschedulable: unschedulable,
    BindFailed: bind_failed,
    PodSucceeded: finished(SUCCEEDED),
    PodDeleted: finished(FAILED),
    PodFailed: finished(FAILED),
    PodRejected: finished(FAILED),
    PodEvicted: finished(FAILED),
    PodPreempted: finished(FAILED),
    PodRouted: routed,
    PoolReleased: pool_released,
    PoolHandedOver: handed_over,
    PodAdopted: adopted,
    PodHandedBack: handed_back,
    PodUnbound: unbound,
    ReservationRequested: reservation_requested,
    PreemptionRequested: preemption_requested,
    WorkloadShapes: shapes_told,
    ReservationGranted: granted,
    ReservationDenied: part_closed,
    ReservationCommitted: committed,
    ReservationAborted: aborted,
    ReservationReleased: part_closed,
    PodGroupStatusChanged: status_seen,
    NodeAdded: node_added,
    NodeUpdated: node_added,
    NodeRemoved: node_removed,
    ExtenderAnswered: extender_answered,
}
"""Event kind → fold. Kinds not listed (ticks, snapshots, configuration: the engine's
own) only advance time."""

"""A gang's attempt: all pending members against staged state, committed or undone whole.

Members are tried in arrival order; if fewer than minMember can be placed, members that
failed may preempt (lower priority, or lent quota), still staged. Only when minMember is
reached does anything leave the statement: evictions first, then the bindings. Members
beyond minMember that did not fit become ordinary pods, retried on their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.model.changes import ClusterEvent
from engine.model.groups import SCHEDULED, GroupInfo, group_unit
from engine.model.pods import PodInfo
from engine.model.statement import Statement
from engine.reservations import hand_back
from events.types import ReservationDenied, ReservationGranted

if TYPE_CHECKING:
    from engine.passes import SchedulingPass
    from engine.scheduler import Engine

NO_PROFILE = "no scheduling profile serves schedulerName {!r}"


def attempt_group(p: SchedulingPass, key: str) -> None:
    """Place a Pending gang: every pending member against staged state, preempting
    if that can reach minMember; commit all or undo all."""
    e = p.e
    group = e.groups[key]
    assert group.spec is not None
    group.attempts += 1
    members = [e.pods[m] for m in group.members if m in e.pods]
    pending = [m for m in members if m.key not in e.state.pods]
    need = group.min_member - (len(members) - len(pending))
    statement = Statement(e.state, e.quotas)
    placed: list[tuple[PodInfo, int]] = []
    failures: dict[str, tuple[str, tuple[str, ...], dict[str, int]]] = {}
    short = short_of_min_resources(e, group)
    for pod in pending:
        pod.attempts += 1
        e.count("attempts")
        framework = e.framework_for(pod)
        if short:
            failures[pod.key] = (short, ("Coscheduling",), {})
            continue
        if framework is None:
            failures[pod.key] = (NO_PROFILE.format(pod.spec.scheduler_name), (), {})
            continue
        refusal = e.quotas.admit(pod.spec.namespace, pod.request) if e.quotas else None
        if refusal is not None:
            failures[pod.key] = (refusal[0], ("ElasticQuota",), {})
            continue
        attempt = framework.schedule(pod, e.state, explain=pod.key == e.explain)
        p.record(pod, attempt)
        if attempt.slot >= 0:
            statement.assume(pod.key, pod.spec.namespace, attempt.slot, pod.request, pod.priority)
            placed.append((pod, attempt.slot))
        else:
            d = attempt.diagnosis
            failures[pod.key] = (
                attempt.status.message(),
                tuple(d.plugins) if d else (),
                d.rejections() if d else {},
            )
    if len(placed) < need and not short and not group.reservation:
        for pod in pending:
            if len(placed) >= need:
                break
            framework = e.framework_for(pod)
            if pod.key not in failures or framework is None:
                continue
            refusal = e.quotas.admit(pod.spec.namespace, pod.request) if e.quotas else None
            if refusal is None and not e.preemptible_below(pod.priority):
                continue
            slot = p.preempt_into(
                statement, pod, framework, reclaim=refusal is not None, exclude_group=key
            )
            if slot is not None:
                placed.append((pod, slot))
                del failures[pod.key]
    if placed and len(placed) >= need and group.reservation:
        statement.commit()
        grant = ReservationGranted(
            rid=group.reservation,
            group=key,
            placements={pod.key: e.state.names[slot] or "" for pod, slot in placed},
            shard=e.shard,
        )
        e.granted(grant)  # already staged in state: records them as held
        p.out.append(grant)
        return
    if placed and len(placed) >= need:
        p.commit(statement, placed)
        group.phase, group.reason = SCHEDULED, ""
        e.group_changes[key] = None
        e.wake(key)
        for pod in pending:
            if pod.key in failures:  # beyond minMember: an ordinary pod from now on
                reason, plugins, rejections = failures[pod.key]
                p.unschedulable(pod, reason, plugins, rejections)
        return
    statement.discard()
    first = next(iter(failures.values()), ("", (), {}))
    reason = (
        f"pod group {key}: {len(placed)} of the {need} members still needed fit; {first[0]}"
    ).rstrip("; ")
    if group.reservation:
        denial = ReservationDenied(rid=group.reservation, group=key, reason=reason, shard=e.shard)
        e.denied(denial)
        p.out.append(denial)
        return
    if e.returnable_unit(group_unit(key)):
        plugins = tuple(dict.fromkeys(name for f in failures.values() for name in f[1]))
        hand_back(p, group=key, reason=reason, plugins=plugins)
        return
    plugins = tuple(dict.fromkeys(name for f in failures.values() for name in f[1]))
    for pod in pending:
        _, _, rejections = failures.get(pod.key, ("", (), {}))
        p.unschedulable(pod, reason, plugins, rejections, unit=group_unit(key))
    group.reason = reason
    e.group_changes[key] = None
    framework = e.framework_for(pending[0]) if pending else None
    events = e.events_for(framework, plugins) if plugins else frozenset(ClusterEvent)
    e.queue.park(
        group_unit(key),
        p.group_priority(group),
        group.seq,
        group.attempts,
        e.now,
        plugins,
        events,
        e.queue_of(group.namespace),
    )


def short_of_min_resources(e: Engine, group: GroupInfo) -> str:
    """minResources as a cheap pre-filter: the cluster's free total must cover it."""
    wanted = group.spec.min_resources if group.spec else {}
    if not wanted:
        return ""
    valid = e.state.valid
    for resource, amount in wanted.items():
        row = e.state.resources.get(resource)
        free = int(e.state.free[row][valid].sum()) if row is not None else 0
        if free < amount:
            return (
                f"pod group {group.key} needs minResources {resource}={amount}, "
                f"the cluster has {free} free"
            )
    return ""

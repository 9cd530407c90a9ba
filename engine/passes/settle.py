"""Steps 2 and 3 of a pass (:mod:`engine.passes.run`): time-outs and settling.

*Time-outs*: Pending groups past their deadline fail; their pending members are rejected.

*Settle*: units whose readiness may have changed (a member arrived, a dependency
finished: marked in ``ShardModel.dirty``) either join the queue or wait with a reason,
said once per change (:meth:`PassContext.say`): a pod of a gang that ran its course is
rejected, as is one whose dependency failed; a gang waits for its PodGroup, its
dependencies and minMember of its members; a unit whose dependencies wait for it is
told the cycle.
"""

from __future__ import annotations

import functools

from engine.model.groups import (
    FAILED,
    PENDING,
    SUCCEEDED,
    GroupInfo,
    advance,
    group_unit,
    is_group_unit,
)
from engine.model.pods import PodInfo
from engine.model.shard import ShardModel
from engine.passes.answers import CYCLE
from engine.passes.context import PassContext
from events.types import SECOND, PodRejected


def timeouts(p: PassContext) -> None:
    for group in p.e.timed_out():
        seconds = (group.spec.timeout or 0) / SECOND if group.spec else 0
        last = f": {group.reason}" if group.reason else ""
        fail_group(
            p,
            group,
            f"pod group {group.key} timed out: fewer than {group.min_member} members "
            f"placed within {seconds:g}s{last}",
        )


def fail_group(p: PassContext, group: GroupInfo, reason: str) -> None:
    e = p.e
    advance(group, FAILED, reason)
    e.wake(group.key)
    unit = group_unit(group.key)
    e.queue.remove(unit)
    e.waiting.pop(unit, None)
    for member in list(group.members):
        if member in e.pods and member not in e.state.pods:
            reject(p, e.pods[member], reason)
    e.group_changes[group.key] = None
    e.retire_if_over(group)


def reject(p: PassContext, pod: PodInfo, reason: str) -> None:
    p.out.append(PodRejected(pod=pod.key, reason=reason, shard=p.e.shard))
    p.e.finish(pod.key, FAILED)


def settle(p: PassContext) -> None:
    """Settle the units something changed for, in arrival order. Not in the order
    they were marked: a pass that settles a unit and decides nothing leaves no
    record, so replay, which runs only the recorded passes, still holds that unit
    (marked earlier) when a later input marks it again, and would settle it, and
    say why it waits, before units the live pass settled first."""
    e = p.e
    acyclic: set[str] = set()  # (names that reach no dependency cycle: see _waiting)
    while e.dirty:
        for unit in sorted(e.dirty, key=functools.partial(_arrival, e)):
            if unit in e.dirty:  # (not settled meanwhile)
                del e.dirty[unit]
                _settle_unit(p, unit, acyclic)


def _arrival(e: ShardModel, unit: str) -> tuple[int, str]:
    info = e.groups.get(unit[1:]) if is_group_unit(unit) else e.pods.get(unit)
    return (-1 if info is None else info.seq, unit)


def _settle_unit(p: PassContext, unit: str, acyclic: set[str]) -> None:
    e = p.e
    if unit in e.dispatched:
        return  # another component places it; it will answer
    if is_group_unit(unit):
        _settle_group(p, unit, acyclic)
        return
    pod = e.pods.get(unit)
    if pod is None or unit in e.state.pods:
        return
    if (owner := e.unit_of(unit)) != unit:  # its gang is Pending: the gang's turn
        if e.queue.where(unit) is not None:
            e.queue.remove(unit)
            e.dirty[owner] = None
        return
    group = e.groups.get(pod.spec.group) if pod.spec.group else None
    if group is not None and group.phase in (FAILED, SUCCEEDED):
        reject(p, pod, f"pod group {group.key} has already {group.phase.lower()}")
        return
    deps = e.dependency_state(e.depends_on(unit))
    if deps.failed:
        reject(p, pod, f"dependency {deps.failed} failed")
    elif not deps.ok:
        _hold(p, unit, [pod], _waiting(e, unit, deps.waiting, acyclic), waits_on=e.depends_on(unit))
    else:
        _ready(e, unit, pod.priority, pod.seq, pod.spec.namespace)


def _settle_group(p: PassContext, unit: str, acyclic: set[str]) -> None:
    e = p.e
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
        _hold(p, unit, pending, f"waiting for pod group {group.key}, which does not exist")
        return
    deps = e.dependency_state(e.depends_on(unit))
    if deps.failed:
        fail_group(p, group, f"dependency {deps.failed} failed")
        return
    if not deps.ok:
        _hold(
            p, unit, pending, _waiting(e, unit, deps.waiting, acyclic), waits_on=e.depends_on(unit)
        )
        return
    present = sum(1 for m in group.members if m in e.pods)
    if present < group.min_member:
        _hold(
            p,
            unit,
            pending,
            f"waiting for members of pod group {group.key}: "
            f"{present} of minMember {group.min_member} present",
        )
        return
    _ready(e, unit, p.group_priority(group), group.seq, group.namespace)


def _waiting(e: ShardModel, unit: str, waiting: str, acyclic: set[str]) -> str:
    """Why ``unit`` waits for its dependencies: ``waiting``, or the cycle among them
    that keeps it waiting for good (:meth:`ShardModel.dependency_cycle`; ``acyclic``,
    shared by one settling, keeps a chain of dependents from being walked once per
    unit of it)."""
    cycle = e.dependency_cycle(unit, acyclic)
    if cycle is None:
        return waiting
    return f"{CYCLE}{' -> '.join(cycle)}"


def _hold(
    p: PassContext, unit: str, pods: list[PodInfo], reason: str, waits_on: tuple[str, ...] = ()
) -> None:
    e = p.e
    e.queue.remove(unit)
    e.waiting[unit] = reason
    for dep in waits_on:
        e.dependents.setdefault(dep, {})[unit] = None
    if is_group_unit(unit):
        group = e.groups[unit[1:]]
        if group.reason != reason:
            group.reason = reason
            e.group_changes[group.key] = None
    p.say([pod.key for pod in pods], reason)


def _ready(e: ShardModel, unit: str, priority: int, seq: int, namespace: str) -> None:
    e.waiting.pop(unit, None)
    if unit not in e.queue:
        e.queue.add(unit, priority, seq, e.queue_of(namespace))

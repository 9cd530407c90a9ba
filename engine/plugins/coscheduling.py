"""Coscheduling: a gang's ``minResources`` must be free before any member is tried
(PreFilter).

The gang itself (all of ``minMember`` placed in one staged step, or none) is the pass's
to do (:mod:`engine.passes.gangs`); this plugin is the cheap check before it, as in
scheduler-plugins' Coscheduling: the free capacity of the whole cluster must cover the
group's ``minResources``, else no member is tried and the group waits for capacity to
free up. It looks once per gang attempt: when the first member is tried, before any
member is staged.
"""

from __future__ import annotations

from typing import Final

from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.framework.status import SUCCESS, Status, unschedulable
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import ClusterState

NAME: Final = "Coscheduling"


class Coscheduling:
    name = NAME
    static = False
    unresolvable = False

    def __init__(self, handle: Handle) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return "Coscheduling()"

    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        key = pod.spec.group
        if not key:
            return SUCCESS
        group = self.handle.groups.get(key)
        if group is None or group.spec is None or not group.spec.min_resources:
            return SUCCESS
        if any(m in state.pods for m in group.members):
            return SUCCESS  # a later member of the same attempt: checked with the first
        wanted = group.spec.min_resources
        reason = short_of(key, wanted, state)
        return unschedulable(reason) if reason else SUCCESS

    def events(self) -> frozenset[ClusterEvent]:
        return frozenset({ClusterEvent.POD_FREED, ClusterEvent.NODE_ADDED})


def short_of(key: str, wanted: dict[str, int], state: ClusterState) -> str:
    """Why the cluster's free capacity does not cover ``wanted`` (empty: it does)."""
    valid = state.valid
    for resource, amount in wanted.items():
        row = state.resources.get(resource)
        free = int(state.free[row][valid].sum()) if row is not None else 0
        if free < amount:
            return (
                f"pod group {key} needs minResources {resource}={amount}, "
                f"the cluster has {free} free"
            )
    return ""

"""NodeUnschedulable: cordoned nodes take no pods unless the pod tolerates the
``node.kubernetes.io/unschedulable:NoSchedule`` taint."""

from __future__ import annotations

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.interfaces import ALL_EVENTS
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState
from engine.plugins.taints import tolerates
from events.types import Taint

UNSCHEDULABLE_TAINT = Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule")
REASON = "node(s) were unschedulable"


class NodeUnschedulable:
    name = "NodeUnschedulable"
    static = True
    unresolvable = True
    local = False

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        if tolerates(pod.spec.tolerations, UNSCHEDULABLE_TAINT):
            return state.valid
        return np.logical_not(state.unschedulable)

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        return {REASON: int(rejected.sum())}

    def events(self) -> frozenset[ClusterEvent]:
        return ALL_EVENTS - {ClusterEvent.POD_FREED}

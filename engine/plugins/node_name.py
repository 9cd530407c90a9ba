"""NodeName: a pod with ``spec.nodeName`` may only run on that node."""

from __future__ import annotations

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.interfaces import ALL_EVENTS
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState

REASON = "node(s) didn't match the requested node name"


class NodeName:
    name = "NodeName"
    static = True
    unresolvable = True
    local = False

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        wanted = pod.spec.node_name
        if not wanted:
            return state.valid
        mask = np.zeros(state.capacity, dtype=np.bool_)
        slot = state.index.get(wanted)
        if slot is not None:
            mask[slot] = True
        return mask

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        return {REASON: int(rejected.sum())}

    def events(self) -> frozenset[ClusterEvent]:
        return ALL_EVENTS - {ClusterEvent.POD_FREED}

"""NodeAffinity: ``nodeSelector`` and required node affinity filter; preferred terms score."""

from __future__ import annotations

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.interfaces import ALL_EVENTS
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState, Ints
from engine.plugins.normalize import default_normalize
from engine.plugins.selector import match_labels, match_term, match_terms

REASON = "node(s) didn't match Pod's node affinity/selector"


class NodeAffinity:
    name = "NodeAffinity"
    static = True
    unresolvable = True
    local = False

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        spec = pod.spec
        mask = match_labels(state, spec.node_selector) if spec.node_selector else state.valid
        if spec.required_affinity is not None:
            mask = mask & match_terms(state, spec.required_affinity)
        return mask

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        return {REASON: int(np.count_nonzero(rejected))}

    def events(self) -> frozenset[ClusterEvent]:
        return ALL_EVENTS - {ClusterEvent.POD_FREED}

    def score(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> Ints | int:
        if not pod.spec.preferred_affinity:
            return 0
        total = np.zeros(state.capacity, dtype=np.int64)
        for pref in pod.spec.preferred_affinity:
            if pref.weight:
                total += pref.weight * match_term(state, pref.preference)
        return total

    def normalize(self, scores: Ints | int, feasible: Bools) -> Ints | int:
        return default_normalize(scores, feasible)

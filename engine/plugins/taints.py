"""TaintToleration: filter on untolerated NoSchedule/NoExecute taints; score nodes by
how few untolerated PreferNoSchedule taints they have."""

from __future__ import annotations

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.interfaces import ALL_EVENTS
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState, Ints
from engine.plugins.normalize import default_normalize
from events.types import Taint, Toleration

HARD_EFFECTS = ("NoSchedule", "NoExecute")


def tolerates_one(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    return toleration.value == taint.value  # "Equal" (the default)


def tolerates(tolerations: tuple[Toleration, ...], taint: Taint) -> bool:
    return any(tolerates_one(t, taint) for t in tolerations)


class TaintToleration:
    name = "TaintToleration"
    static = True
    unresolvable = True
    local = False

    def _untolerated(
        self, pod: PodInfo, state: ClusterState, effects: tuple[str, ...]
    ) -> list[int]:
        return [
            code
            for taint, code in state.taint_codes.items()
            if taint.effect in effects and not tolerates(pod.spec.tolerations, taint)
        ]

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        codes = self._untolerated(pod, state, HARD_EFFECTS)
        if not codes:
            return state.valid
        blocked = np.zeros(state.capacity, dtype=np.bool_)
        for code in codes:
            blocked |= state.taint_rows[code]
        return np.logical_not(blocked)

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        """Like kube-scheduler, name the first untolerated taint (by code) of each
        rejected node; reasons in the order of the first node that gives each. Over
        the columns: one pass per untolerated taint, not one per node."""
        codes = self._untolerated(pod, state, HARD_EFFECTS)
        by_code = {code: taint for taint, code in state.taint_codes.items()}
        left = rejected.copy()
        found: dict[str, tuple[int, int]] = {}  # reason -> (first slot, nodes)
        for code in codes:
            hit = left & state.taint_rows[code]
            count = int(np.count_nonzero(hit))
            if not count:
                continue
            left &= ~hit
            taint = by_code[code]
            label = f"{taint.key}: {taint.value}" if taint.value else taint.key
            reason = f"node(s) had untolerated taint {{{label}}}"
            first, before = found.get(reason, (state.capacity, 0))
            found[reason] = (min(first, int(np.argmax(hit))), before + count)
        ordered = sorted(found.items(), key=lambda item: item[1][0])
        return {reason: count for reason, (_, count) in ordered}

    def events(self) -> frozenset[ClusterEvent]:
        return ALL_EVENTS - {ClusterEvent.POD_FREED}

    def score(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> Ints | int:
        codes = self._untolerated(pod, state, ("PreferNoSchedule",))
        if not codes:
            return 0
        counts = np.zeros(state.capacity, dtype=np.int64)
        for code in codes:
            counts += state.taint_rows[code]
        return counts

    def normalize(self, scores: Ints | int, feasible: Bools) -> Ints | int:
        return default_normalize(scores, feasible, reverse=True)

"""ElasticQuota: a pod is admitted by its namespace's elastic quota (PreFilter).

The rule is CapacityScheduling's (scheduler-plugins), on the resources a quota names:
the namespace stays within its ``max``, and quota'd namespaces together within the sum
of their ``min`` (see :mod:`engine.model.quota`). A refusal is resolvable: the pod may
take back what others borrow (when it is within its own ``min``) or make room among its
namespace's lower-priority pods; ``DefaultPreemption`` decides which
(:mod:`engine.plugins.preemption`). A refused pod is retried when any pod anywhere
frees capacity, or a quota changes.
"""

from __future__ import annotations

from typing import Final

from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.framework.status import SUCCESS, Status, unschedulable
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import ClusterState

NAME: Final = "ElasticQuota"
REFUSAL: Final = "refusal"
"""Cycle key of the :class:`~engine.model.quota.Refusal` (for the PostFilter)."""


class ElasticQuota:
    name = NAME
    static = False
    unresolvable = False

    def __init__(self, handle: Handle) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return "ElasticQuota()"

    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        quotas = self.handle.quotas
        if not quotas:
            return SUCCESS
        refusal = quotas.admit(pod.spec.namespace, pod.request)
        if refusal is None:
            return SUCCESS
        cycle.write(NAME, REFUSAL, refusal)
        return unschedulable(refusal.reason)

    def events(self) -> frozenset[ClusterEvent]:
        return frozenset({ClusterEvent.POD_FREED, ClusterEvent.QUOTA_CHANGED})

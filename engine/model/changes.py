"""The kinds of cluster change the queue and the plugins speak of."""

from __future__ import annotations

from enum import Enum


class ClusterEvent(Enum):
    """Kinds of change that may make a rejected pod schedulable again."""

    NODE_ADDED = "NodeAdded"
    NODE_UPDATED = "NodeUpdated"
    POD_FREED = "PodFreed"
    """A pod released its resources on a node (deleted, finished, bind failed, evicted)."""
    QUOTA_CHANGED = "QuotaChanged"
    """An elastic quota was defined or changed (no node in particular)."""
    POD_PLACED = "PodPlaced"
    """A pod was placed on a node (what inter-pod affinity and spread rules wait for)."""


EVERY = frozenset(ClusterEvent) - {ClusterEvent.POD_PLACED}
"""The changes that may help a pod whatever rejected it. A pod placed elsewhere only
takes room: it helps only rules about other pods, whose plugins name ``POD_PLACED``."""

"""``LeafPod``: keep a gang in the leaf switch with the fewest free nodes that holds it.

Seed 001 (Slurm on Kubernetes): a Slurm cluster performs best inside one leaf pod (the
nodes under one leaf switch), and should take as few leaves as possible, leaving the
leaf topology least fragmented. Its rule, from the plugin's ``PreScore``: with ``m``
the gang's size and ``n`` the number of a leaf's nodes that passed the filters (its
free nodes), ``k = n - m``; the smaller ``k`` the better, and ``k < 0`` (the leaf
cannot hold the gang) only as a last resort.

Here ``m`` is what the gang still needs: its ``minMember`` less the members already
placed (a gang is placed member by member against staged state, so the leaf chosen for
the first member stays the best for the rest: its ``n`` and ``m`` fall together). A pod
of no gang needs 1, so single pods fill the fullest leaf first.

Score of a node in a leaf with ``k >= 0``: ``100 * (k_min + 1) // (k + 1)`` where
``k_min`` is the smallest such ``k`` (the best leaf scores 100); a node in a leaf with
``k < 0``, or in no leaf (no annotation), scores 0. The leaf is a node annotation (or
label), ``shoal.io/leaf`` unless the args name another.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.model.pods import PodInfo
from engine.model.state import ClusterState

ANNOTATION = "shoal.io/leaf"


class LeafPodArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """``pluginConfig`` args of ``LeafPod``."""

    annotation: str = ANNOTATION
    """The node annotation (or, failing that, label) naming the node's leaf."""


class LeafPod:
    """A score only; it reads the gang through the handle."""

    name = "LeafPod"
    Args = LeafPodArgs
    local = False

    def __init__(self, args: LeafPodArgs | None, handle: Handle) -> None:
        self.args = args or LeafPodArgs()
        self.handle = handle
        self._cached: tuple[int, int, int] | None = None
        self._leaves: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)

    def __repr__(self) -> str:
        return f"LeafPod({self.args})"

    def leaves(self, state: ClusterState) -> npt.NDArray[np.int64]:
        """Per slot, a code for its leaf (-1: none); leaves are coded in order of first
        appearance by slot, so the codes are a function of the node events alone."""
        key = (id(state), state.static_version, state.capacity)
        if key != self._cached:
            out = np.full(state.capacity, -1, dtype=np.int64)
            codes: dict[str, int] = {}
            name = self.args.annotation
            for slot in range(state.high_water):
                leaf = state.node_annotations[slot].get(name) or state.node_labels[slot].get(name)
                if leaf:
                    out[slot] = codes.setdefault(leaf, len(codes))
            self._leaves, self._cached = out, key
        return self._leaves

    def needed(self, pod: PodInfo, state: ClusterState) -> int:
        """Members the pod's gang still needs placed, this pod included (1: no gang)."""
        group = self.handle.groups.get(pod.spec.group) if pod.spec.group else None
        if group is None:
            return 1
        placed = sum(1 for key in group.members if key in state.pods and key != pod.key)
        return max(group.min_member - placed, 1)

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Any) -> Any:
        leaves = self.leaves(state)
        out = np.zeros(state.capacity, dtype=np.int64)
        inside = feasible & (leaves >= 0)
        if not inside.any():
            return out
        free = np.bincount(leaves[inside])  # n per leaf
        k = free - self.needed(pod, state)
        if not (k >= 0).any():
            return out
        k_min = int(k[k >= 0].min())
        per_leaf = np.where(k >= 0, 100 * (k_min + 1) // (np.maximum(k, 0) + 1), 0)
        out[inside] = per_leaf[leaves[inside]]
        return out

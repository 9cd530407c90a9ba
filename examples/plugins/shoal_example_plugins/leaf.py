"""``LeafPod``: keep a gang in the leaf switch with the fewest free nodes that holds it.

Seed 001 (Slurm on Kubernetes): a Slurm cluster performs best inside one leaf pod (the
nodes under one leaf switch), and should take as few leaves as possible, leaving the
leaf topology least fragmented. Its rule, from the plugin's ``PreScore``: with ``m``
the gang's size and ``n`` the number of a leaf's nodes that passed the filters (its
free nodes), ``k = n - m``; the smaller ``k`` the better, and ``k < 0`` (the leaf
cannot hold the gang) only as a last resort.

Here ``m`` is the gang's ``minMember`` (1 for a pod of no gang, so single pods fill
the fullest leaf first), and ``n`` counts a leaf's free nodes and those that already
hold a member of the gang: a gang is placed member by member against staged state, and
a leaf's ``k`` must not change as its own members fill it (counting only what is still
free, a second leaf just big enough for the rest would win the later members and split
the gang).

Score of a node in a leaf with ``k >= 0``: ``100 * (r_min + 1) // (r + 1)`` with the
rank ``r = 2k + 1``, or ``2k`` in a leaf that holds members of the gang already (so
that a tie between two leaves does not split the gang), and ``r_min`` the best rank
(that leaf scores 100; without members placed this is ``100 * (k_min + 1) // (k + 1)``).
A node in a leaf with ``k < 0``, or in no leaf (no annotation), scores 0. The leaf is
a node annotation (or label), ``shoal.io/leaf`` unless the args name another.
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

    def gang(self, pod: PodInfo, state: ClusterState) -> tuple[int, list[int]]:
        """The pod's gang size ``m`` (1: no gang) and the slots its placed members hold."""
        group = self.handle.groups.get(pod.spec.group) if pod.spec.group else None
        if group is None:
            return 1, []
        slots = [
            state.pods[key].slot for key in group.members if key in state.pods and key != pod.key
        ]
        return max(group.min_member, 1), slots

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Any) -> Any:
        leaves = self.leaves(state)
        out = np.zeros(state.capacity, dtype=np.int64)
        size, holding = self.gang(pod, state)
        counted = feasible.copy()
        counted[holding] = True
        counted &= leaves >= 0
        if not counted.any():
            return out
        k = np.bincount(leaves[counted]) - size  # n - m per leaf
        fits = k >= 0
        if not fits.any():
            return out
        # ties go to a leaf that holds members already: rank 2k there, 2k + 1 elsewhere
        rank = 2 * np.maximum(k, 0) + 1
        held = leaves[holding]
        rank[held[held >= 0]] -= 1
        best = int(rank[fits].min())
        per_leaf = np.where(fits, 100 * (best + 1) // (rank + 1), 0)
        inside = feasible & (leaves >= 0)
        out[inside] = per_leaf[leaves[inside]]
        return out

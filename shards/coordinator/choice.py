"""Which shard a pod goes to: the profile's own scores, with each shard seen as one node.

The coordinator keeps every node in its view, so it knows, for a pod, which nodes of
each shard pass the profile's filters. To choose between shards it scores each shard as
one node whose capacity and use are the sums over the nodes there that the pod may use,
the pods handed to that shard but not yet reported placed included, with the profile's
own score plugins: ``LeastAllocated`` prefers the emptiest shard,
``BalancedAllocation`` the one whose use stays most even (packing scores are not
summarised: below). Scores
that depend on node labels or taints (preferred affinity, ``PreferNoSchedule``) count
as the best node of the shard has them. The shard then places the pod on its own best
node with the same profile.

A user plugin's score (or pre-score) is not summarised: what it means over a shard's
sums, or at a shard's best node, is unknown (a leaf switch's free nodes, say, may lie
in two shards). A profile with one is never handed over: the coordinator decides its
pods on its exact view (:mod:`shards.coordinator.dispatch`), as one scheduler would.

Nor are the packing scores (:func:`summarised`): ``NodeResourcesFit`` with
``MostAllocated`` or ``RequestedToCapacityRatio``, and the GPU policies (``GpuBestFit``,
``GpuPacking``, ``GpuFragmentation``, ``ShoalGpu``...). Packing is about one node: a
shard whose sums are the fullest may hold only empty nodes, while the fullest single
node, where one scheduler puts the pod, is in another shard; the pod then breaks an
empty node that a whole-node job needed (an 8-card job left pending at 2 and 4 shards
that one shard places). So a profile with a packing score has its units decided on the
coordinator, as one scheduler: the node is chosen on the exact view and the shard that
owns it is asked to hold it (a directed part).

Why not hand such a pod to a shard that holds a node as good as the cluster's best
(each shard's best node score, vectorised over the view, cached per shape)? Because it
is exact only while nothing handed over is unanswered: a pod in flight lands on a node
the view does not know yet, and under packing that node is then the best one for the
next pod (or no longer fits it). So every hand-over would wait for the one before to be
answered, a round trip per pod, at the price of the same scoring over every node that
deciding here costs; deciding here waits for nothing (each decision is in the view at
once). **Cost per pod of such a profile**: one scheduling attempt on the coordinator's
engine (the per-shape caches of one shard: about what a shard spends per pod) and one
directed part (a ``ReservationRequested`` with the node, its claim, the shard's answer),
instead of the choice of shard and the hand-over: measured with ``shoal loadtest
--nodes 5000 --pods 20000 --shards 2`` under ``MostAllocated`` (a busy 2-core machine),
the coordinator's CPU per pod went from about 135 to 230-260 µs, against 125-180 for
the default profile, which is still handed over. Packing profiles are thus as fast as
the coordinator, not N shards: the price of one scheduler's answers. (Next step: a
hand-over naming the node, ``PodRouted`` with the coordinator's choice, would spare the
directed part's protocol and keep the exact answer.)

``LeastAllocated`` and ``BalancedAllocation`` are summarised, but not exactly either: a
shard's sums may hide its emptiest node (one empty and one full node look like two
half-used ones), so a spreading profile's pod may land on another node than one
scheduler's (a "known difference" of the documentation), and a later pod's fate can
depend on it. Deciding those here too would put the default profile, and so every pod,
on the coordinator: measured as above, its CPU per pod went from 125-150 to about
250 µs and pods/s halved, so it is not done.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from engine.framework.cycle import CycleState
from engine.framework.runtime import Framework
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState, Ints, request_delta

NEVER: Final = np.iinfo(np.int64).min // 4

SUMMARISED: Final = frozenset(
    {
        "NodeResourcesBalancedAllocation",
        "TaintToleration",
        "NodeAffinity",
        "InterPodAffinity",
        "PodTopologySpread",
    }
)
"""The built-in scores a shard's sums (or its best node, for labels and taints) stand
for when choosing a shard, besides ``NodeResourcesFit``'s ``LeastAllocated``. Any other
(packing, the GPU policies, a plugin added later) has its units decided on the
coordinator."""


def summarised(plugin: object) -> bool:
    """Whether the choice of a shard may stand in for one scheduler's choice of node by
    ``plugin``'s score (a plugin at ``score``)."""
    name = getattr(plugin, "name", "")
    if name == "NodeResourcesFit":
        return getattr(plugin, "strategy", "") == "LeastAllocated"
    return name in SUMMARISED


class ShardNodes(ClusterState):
    """Each shard as one node: the resource columns of a cluster of ``n`` slots (what
    local score plugins read), built from sums."""

    def __init__(self, state: ClusterState, columns: npt.NDArray[np.int64]) -> None:
        self.resources = state.resources
        self._columns = columns
        self._bind_columns()
        n = columns.shape[2]
        self.valid = np.ones(n, dtype=np.bool_)
        self.unschedulable = np.zeros(n, dtype=np.bool_)

    def __repr__(self) -> str:
        return f"ShardNodes(shards={self._columns.shape[2]})"

    @property
    def capacity(self) -> int:
        return int(self._columns.shape[2])


def shard_columns(
    state: ClusterState, usable: Bools, slot_shard: Ints, shards: int
) -> npt.NDArray[np.int64]:
    """(4, rows, shards): alloc, used, free and non-zero used summed over each shard's
    ``usable`` slots."""
    top = state.high_water
    owner = slot_shard[:top]
    mask = usable[:top] & (owner >= 0)
    columns = state._columns[:, :, :top]
    out = np.zeros((4, columns.shape[1], shards), dtype=np.int64)
    for shard in range(shards):
        picked = mask & (owner == shard)
        if picked.any():
            out[:, :, shard] = columns[:, :, picked].sum(axis=2)
    return out


class ShardView:
    """For one kind of pod (its static filters' verdict, cached while the coordinator's
    view of the nodes stands): each shard's sums over the nodes it may use, and the
    shards as nodes with the requests handed to them and not yet placed counted as
    used, refreshed before each choice (one array addition)."""

    def __init__(
        self, base: npt.NDArray[np.int64], state: ClusterState, labels: Ints | None
    ) -> None:
        self.base = base
        self.nodes = ShardNodes(state, base.copy())
        self.labels = labels
        n = base.shape[2]
        self.ones = np.ones(n, dtype=np.bool_)
        self.local = np.zeros(n, dtype=np.int64)
        self.masked = np.zeros(n, dtype=np.int64)
        self.feasible = np.ones(n, dtype=np.bool_)
        self._pending: npt.NDArray[np.int64] | None = None
        self._operands: tuple[npt.NDArray[np.int64], ...] = ()
        """The views :meth:`refresh` adds, made once per ``pending`` array (it is
        changed in place, and replaced only when the view's rows grow)."""

    def refresh(self, pending: npt.NDArray[np.int64]) -> ShardNodes:
        """The shards as nodes, with ``pending`` (shards, 4, rows: what is handed over
        and not placed, as alloc, used, free and non-zero used change by it) added.
        One array addition per pod routed (its views made once, not per pod)."""
        if pending is not self._pending:
            rows = min(pending.shape[2], self.base.shape[1])
            self._operands = (
                self.base[:, :rows],
                pending[:, :, :rows].transpose(1, 2, 0),
                self.nodes._columns[:, :rows],
            )
            self._pending = pending
        base, extra, out = self._operands
        np.add(base, extra, out=out)
        return self.nodes


def scores(
    framework: Framework, pod: PodInfo, nodes: ShardNodes, label_scores: Ints | None
) -> Ints:
    """Each shard's score for ``pod`` by the profile's score plugins (weighted)."""
    feasible = np.ones(nodes.capacity, dtype=np.bool_)
    cycle = CycleState()
    total = np.zeros(nodes.capacity, dtype=np.int64)
    for entry in framework.scores:
        if not entry.plugin.local:
            continue
        raw = entry.plugin.score(cycle, pod, nodes, feasible)
        total += np.asarray(raw, dtype=np.int64) * entry.weight
    if label_scores is not None:
        total += label_scores
    return total


def label_scores(
    framework: Framework,
    pod: PodInfo,
    state: ClusterState,
    feasible: Bools,
    slot_shard: Ints,
    shards: int,
) -> Ints | None:
    """Per shard, the best weighted score of the plugins that read labels and taints
    (not resources) over its nodes ``feasible`` for the pod; None when they give every
    node the same score (nothing to tell shards apart)."""
    cycle = CycleState()
    total: Ints | None = None
    for entry in framework.scores:
        if entry.plugin.local or getattr(entry.plugin, "cluster_wide", False):
            continue  # (inter-pod scores: the shard's own engine scores its nodes)
        raw = entry.plugin.score(cycle, pod, state, feasible)
        if entry.normalize:
            raw = entry.plugin.normalize(raw, feasible)  # type: ignore[attr-defined]
        if isinstance(raw, int):
            continue
        weighted = raw * entry.weight
        total = weighted if total is None else total + weighted
    if total is None:
        return None
    top = state.high_water
    owner = slot_shard[:top]
    usable = feasible[:top] & (owner >= 0)
    best = np.full(shards, NEVER, dtype=np.int64)
    np.maximum.at(best, owner[usable], total[:top][usable])
    best[best == NEVER] = 0
    return best


def run_scores(
    framework: Framework,
    pod: PodInfo,
    view: ShardView,
    pending: npt.NDArray[np.int64],
    pods: int,
) -> list[list[int]]:
    """For a run of ``pods`` pods identical to ``pod``: ``scores[s][j]``, shard ``s``'s
    score for the next pod once ``j`` more of the run went there (besides ``pending``).
    One vectorised score of N times ``pods`` "nodes" (each shard's sums plus ``j`` requests),
    so that the choice of each pod of the run is a look-up, as the choice of one pod
    after another with their requests counted pending would find it (the local scores
    read only their own column, so scoring the columns together changes nothing)."""
    nodes = view.refresh(pending)
    if pods == 1:
        # the shards as they are (the first column of the wide score below): scored
        # without building it, as most kinds of a batch of mixed pods hold one pod
        return [[score] for score in scores(framework, pod, nodes, view.labels).tolist()]
    current = nodes._columns  # (4, rows, n)
    rows = current.shape[1]
    shards = current.shape[2]
    top = max((row for row, _ in pod.request), default=0) + 1
    delta = request_delta(pod.request, max(rows, top))[:, :rows]
    steps = np.arange(pods, dtype=np.int64)
    columns = current[:, :, :, None] + delta[:, :, None, None] * steps
    wide = ShardNodes(nodes, np.ascontiguousarray(columns.reshape(4, rows, shards * pods)))
    labels = None if view.labels is None else np.repeat(view.labels, pods)
    total = scores(framework, pod, wide, labels)
    table: list[list[int]] = total.reshape(shards, pods).tolist()
    return table

"""``percentageOfNodesToScore``: score only the first K feasible nodes of a scan, as
kube-scheduler does (``pkg/scheduler/schedule_one.go``: ``numFeasibleNodesToFind``,
``findNodesThatPassFilters``).

Off unless the configuration sets it: shoal's promise is the best node of all, and its
filters run over every node at once anyway, so there is no time to save by looking at
fewer. Set, it reproduces kube-scheduler's answers (a pod goes to the best of the nodes
kube-scheduler would have scored, not the best overall), for side-by-side comparison
and for users who rely on the spread it gives.

The rule, for ``n`` nodes (the shard's, live ones; cordoned nodes count, as in
kube-scheduler's snapshot) and a percentage ``p``:

* ``n < 100`` (``minFeasibleNodesToFind``) or ``p >= 100``: every node;
* ``p == 0`` (stated as 0): kube-scheduler's adaptive share, ``50 - n/125`` per cent,
  at least 5 (``minFeasibleNodesPercentageToFind``);
* ``K = max(n * p / 100, 100)`` feasible nodes (integer division);
* a profile with no score plugin and no extender: ``K = 1`` (nothing to compare).

Nodes are scanned in slot order (the order nodes joined the shard), wrapping around,
from a start, and the first ``K`` that pass the filters are scored. The filters still
run over all nodes as numpy masks; the scan is emulated on the mask, so the result is
exactly what a sequential scan would score. kube-scheduler's parallel filter may find
a few more than ``K`` before it stops; shoal takes exactly ``K``.

Where the scan starts differs from kube-scheduler on purpose. kube-scheduler carries
``nextStartNodeIndex`` from one cycle to the next, advanced by the nodes each cycle
looked at; that count is nowhere in the log, so a shard that restarts from a snapshot
and folds its later decisions (rather than re-running their passes) could not know it,
and replay would disagree with the recorded run. shoal starts each pod's scan at
``hash(pod) mod n`` (the stable hash that also breaks score ties): a pure function of
the log, and, like the carried index, it gives every node the same chance of being
examined across pods.

Each shard applies the rule to its own nodes, like one kube-scheduler instance per
shard: ``n`` and ``K`` are counted per shard. The coordinator's placements across shards
(spanning gangs, its preemption), preemption's choice of victims and the rescheduler's
moves look at every node, exactly as before. HTTP extenders are asked about every
feasible node (shoal asks before the attempt); their verdict is applied to the sample,
which gives the nodes kube-scheduler would keep (it asks about the sample only).

Cost: nothing when unset. When set, per attempt: a count over the feasible mask, a
scan of growing windows from the start (a few times K slots where many nodes fit), a
new mask, and the scoring's ``where`` over every slot that the shape caches otherwise
spare (about 150 us more per attempt at 20,000 nodes on one busy core, against some
30 us unset): the filters still see every node, so sampling saves no work in shoal.
The per-shape caches are unaffected: they keep every node's verdict and local score,
and the sample masks them afterwards (the scores that normalise over the feasible set
see the sample only, as in kube-scheduler).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from engine.config import SchedulerConfig
from engine.model.state import Bools, ClusterState, Ints

MIN_FEASIBLE_NODES: Final = 100
"""kube-scheduler's ``minFeasibleNodesToFind``."""
MIN_FEASIBLE_PERCENTAGE: Final = 5
"""kube-scheduler's ``minFeasibleNodesPercentageToFind`` (for the adaptive share)."""


def nodes_to_find(percentage: int, nodes: int) -> int:
    """How many feasible nodes kube-scheduler looks for among ``nodes`` nodes."""
    if nodes < MIN_FEASIBLE_NODES:
        return nodes
    if percentage == 0:
        percentage = max(50 - nodes // 125, MIN_FEASIBLE_PERCENTAGE)
    if percentage >= 100:
        return nodes
    return max(nodes * percentage // 100, MIN_FEASIBLE_NODES)


def per_shard_warnings(config: SchedulerConfig | None, shards: int) -> list[str]:
    """Where more than one shard schedules and a profile samples: a warning that the
    share is taken per shard, of its own nodes (one kube-scheduler takes it of every
    node, from one position carried over all pods), so the nodes scored differ from
    one scheduler's."""
    if config is None or shards < 2:
        return []
    return [
        f"profile {p.scheduler_name!r}: percentageOfNodesToScore "
        f"({p.percentage_of_nodes_to_score}) applies per shard: each of the {shards} "
        "shards scores that share of its own nodes, so the nodes a pod is compared "
        "over differ from one kube-scheduler's"
        for p in config.profiles
        if p.percentage_of_nodes_to_score is not None
    ]


def sample(feasible: Bools, state: ClusterState, find: int, start: int) -> Bools:
    """The first ``find`` feasible slots met scanning the shard's live nodes in slot
    order from the ``start``-th (mod their number), wrapping around; ``feasible``
    itself (not a copy) when that is all of them. ``feasible`` must be live slots only.

    Feasible nodes are looked for in growing windows from the start (most attempts,
    where many nodes fit, read a few times ``find`` slots, not the whole mask)."""
    used = state.high_water
    if np.count_nonzero(feasible[:used]) <= find:
        return feasible
    nodes = len(state.index)
    if nodes == used:  # no slot left empty by a removed node: slot = position
        first = start % nodes
    else:
        first = int(np.flatnonzero(state.valid[:used])[start % nodes])
    taken: list[Ints] = []
    wanted, lo, width = find, first, 4 * find
    while wanted:  # [first, used), then [0, first): there are enough in all
        hi = min(lo + width, used if lo >= first else first)
        hits = np.flatnonzero(feasible[lo:hi])[:wanted] + lo
        taken.append(hits)
        wanted -= hits.size
        lo, width = (0 if hi == used else hi), 2 * width
    out = np.zeros_like(feasible)
    out[np.concatenate(taken)] = True
    return out

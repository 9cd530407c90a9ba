"""Where priority preemption looks: the nodes that evicting lower priorities could free.

A node is a candidate for a pod of priority ``p`` when it passes the pod's other
filters (``allowed``) and, for some priority level below ``p``, evicting every pod of
that level and below leaves room for the pod's resources (its GPU cards aside: the
plan checks them per node) and evicts at least one pod. Candidates are ranked by that
lowest sufficient level (the highest victim priority comes first in kube-scheduler's
choice), then by the number of pods below ``p`` there, then by slot; the plan reads
the first ``MAX_CANDIDATES``.

A wave of identical preemptors (one workload of one priority: the same request, the
same nodes allowed) asks this again after each preemption, when a few nodes changed.
:class:`CandidateCache` keeps, per request and priority, each node's level and count
and the ranked candidates, and brings them up to date from the cluster's journal of
changed nodes (:meth:`ClusterState.changed_since`); anything else that changed (the
levels, the nodes allowed, the cluster's size, a journal too old) computes them whole
again. The answer is the same either way.

Cost: whole, a few array operations per level below ``p`` on the pod's own resource
rows, then a partition of the candidates; from the cache, one comparison of
``allowed`` and per changed node a loop over the levels and a sorted-list update.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from engine.model.pods import PodInfo
from engine.model.resources import PODS
from engine.model.state import Bools, ClusterState, Ints, Request

MAX_CANDIDATES: Final = 64
CHANGED_LIMIT: Final = 4096
"""Changed nodes above which the cache computes the candidates whole."""
ENTRIES: Final = 8
"""Requests (with priorities) the cache keeps."""


@dataclass
class _Entry:
    state: ClusterState
    capacity: int
    position: int
    levels: tuple[int, ...]
    allowed: Bools
    first: Ints
    """Per node: the index of the lowest sufficient level, or ``len(levels)``."""
    count: Ints
    """Per node: the pods below the priority there."""
    ranked: list[tuple[int, int, int]] | None = None
    """(-first, -count, -slot) of every candidate, sorted: the least candidate last, so
    that a wave, which takes the first candidates, deletes near the end of a long list
    (made on first reuse)."""


@dataclass
class CandidateCache:
    """The candidates of recent requests, kept up to date (see the module docstring).
    Only ever an optimisation: :func:`priority_candidates` answers the same without."""

    entries: OrderedDict[tuple[Request, int], _Entry] = field(default_factory=OrderedDict)
    hits: int = 0
    misses: int = 0

    def __repr__(self) -> str:
        return (
            f"CandidateCache(entries={len(self.entries)}, hits={self.hits}, misses={self.misses})"
        )


def priority_candidates(
    pod: PodInfo, state: ClusterState, allowed: Bools, cache: CandidateCache | None = None
) -> list[int]:
    """The first ``MAX_CANDIDATES`` candidate nodes for ``pod`` in their order (see
    the module docstring); ``cache``: kept up to date for the next identical pod."""
    levels = tuple(sorted(level for level in state.used_by_priority if level < pod.priority))
    card_rows = state.cards.rows
    scalar = [(row, amount) for row, amount in pod.request if row not in card_rows]
    key = (pod.request, pod.priority)
    entry = cache.entries.get(key) if cache is not None else None
    if cache is not None and entry is not None:
        changed = state.changed_since(entry.position)
        if (
            entry.state is state
            and entry.capacity == state.capacity
            and entry.levels == levels
            and changed is not None
            and len(changed) <= CHANGED_LIMIT
            and (entry.allowed is allowed or np.array_equal(entry.allowed, allowed))
        ):
            cache.hits += 1
            cache.entries.move_to_end(key)
            return _update(entry, state, scalar, changed)
    first, count = _whole(state, levels, scalar, allowed)
    if cache is not None:
        cache.misses += 1
        # (an array of its own that cannot be written is kept as it is: the next
        # identical preemptor's, the framework's cached one, is then known equal at once)
        frozen = allowed.base is None and not allowed.flags.writeable
        kept = allowed if frozen else allowed.copy()
        cache.entries[key] = _Entry(
            state, state.capacity, state.journal_end, levels, kept, first, count
        )
        cache.entries.move_to_end(key)
        if len(cache.entries) > ENTRIES:
            cache.entries.popitem(last=False)
    slots = np.flatnonzero(first < len(levels))
    return _least(slots, count[slots], first[slots])


def _whole(
    state: ClusterState,
    levels: tuple[int, ...],
    scalar: list[tuple[int, int]],
    allowed: Bools,
) -> tuple[Ints, Ints]:
    """Every node's lowest sufficient level (index) and its pods below, over the
    columns of the pod's own resource rows."""
    # what each node lacks, per resource the pod asks for (free does not change here)
    short = [amount - state.free[row] for row, amount in scalar]
    count = np.zeros(state.capacity, dtype=np.int64)
    evictable = [np.zeros(state.capacity, dtype=np.int64) for _ in scalar]
    first = np.full(state.capacity, len(levels), dtype=np.int64)
    undecided = allowed.copy()
    for index, level in enumerate(levels):
        used = state.used_by_priority[level]
        count += used[PODS]
        for i, (row, _) in enumerate(scalar):
            evictable[i] += used[row]
        fits = undecided & (count > 0)
        for lack, sums in zip(short, evictable, strict=True):
            fits &= sums >= lack
        first[fits] = index
        undecided &= ~fits
    return first, count


def _update(
    entry: _Entry, state: ClusterState, scalar: list[tuple[int, int]], changed: list[int]
) -> list[int]:
    """Bring ``entry`` up to date with the nodes ``changed`` since it was made (each
    recomputed as :func:`_whole` computes it) and read its first candidates."""
    levels = entry.levels
    none = len(levels)
    first, count = entry.first, entry.count
    ranked = entry.ranked
    if ranked is None:
        slots = np.flatnonzero(first < none)
        ranked = sorted(
            zip((-first[slots]).tolist(), (-count[slots]).tolist(), (-slots).tolist(), strict=True)
        )
        entry.ranked = ranked
    by_level = [state.used_by_priority[level] for level in levels]
    free = state.free
    for slot in dict.fromkeys(changed):
        old = (-int(first[slot]), -int(count[slot]), -slot)
        pods = 0
        sums = [0] * len(scalar)
        lack = [amount - int(free[row, slot]) for row, amount in scalar]
        level_at = none
        allowed = bool(entry.allowed[slot])
        for index, used in enumerate(by_level):
            pods += int(used[PODS, slot])
            for i, (row, _) in enumerate(scalar):
                sums[i] += int(used[row, slot])
            if (
                level_at == none
                and allowed
                and pods > 0
                and all(s >= need for s, need in zip(sums, lack, strict=True))
            ):
                level_at = index
        first[slot] = level_at
        count[slot] = pods
        new = (-level_at, -pods, -slot)
        if new == old:
            continue
        if -old[0] < none:
            at = bisect.bisect_left(ranked, old)
            del ranked[at]
        if level_at < none:
            bisect.insort(ranked, new)
    entry.position = state.journal_end
    return [-slot for _, _, slot in reversed(ranked[-MAX_CANDIDATES:])]


def _least(slots: Ints, count: Ints, first: Ints) -> list[int]:
    """The first ``MAX_CANDIDATES`` of ``slots`` by (``first``, ``count``, slot):
    one composite key and a partition where it fits 62 bits (not a sort of every
    candidate: a wave leaves tens of thousands), else a sort."""
    if slots.size <= MAX_CANDIDATES:
        order = np.lexsort((slots, count, first))
        return [int(s) for s in slots[order]]
    span = int(slots.max()) + 1
    counts = int(count.max()) + 1
    if int(first.max()) + 1 > (1 << 62) // (span * counts) or int(count.min()) < 0:
        order = np.lexsort((slots, count, first))
        return [int(s) for s in slots[order][:MAX_CANDIDATES]]
    key = (first * counts + count) * span + slots
    part = np.argpartition(key, MAX_CANDIDATES - 1)[:MAX_CANDIDATES]
    return [int(s) for s in slots[part[np.argsort(key[part])]]]

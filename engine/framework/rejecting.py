"""Which filters reject a pod shape on some node, kept per shape between attempts.

A failed attempt's full diagnosis (:meth:`engine.framework.runtime.Framework.diagnose`)
runs every filter over every node and asks each for its reasons. A pod that goes on to
preempt needs none of the reasons: only which filters rejected a node, first in
profile order (they give the status's code and plugin, and whether the rescheduler may
help). A wave of identical preemptors asks this again after each eviction, with one or
two nodes changed.

So each shape keeps, per slot, the index of the first filter that rejects it (``PASS``
past the last filter: the node passes all; ``GONE``: no node), the same for the static
filters alone, and the number of slots per index. Static verdicts change only with
``static_version`` (labels, taints, nodes added or removed, host ports: then every
entry is dropped); so after k changed nodes the dynamic filters run over those k slots
only (they are local: :attr:`Framework.incremental`), and the counts move by k.

Cost: an attempt whose shape is cached costs the changed slots' dynamic filters plus
O(filters) (up to ``SCALAR`` changed slots through the filters' one-slot forms, in plain
Python: a wave changes one or two per preemptor); otherwise one pass of every filter
over all nodes (no reasons). Memory: 2
bytes per node per shape, for at most ``CACHE_SIZE`` shapes (64 bytes per node).

Used only where no filter that reads other nodes applies to the pod (such a filter is
not local; its verdict passes every node for the others, as the attempt assumes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.framework.cycle import CycleState
from engine.framework.interfaces import FilterPlugin
from engine.model.pods import PodInfo
from engine.model.state import ClusterState

CACHE_SIZE = 32
LIMIT = 512
"""Above this many changed nodes since a shape's entry, recompute it whole."""
SCALAR = 16
"""At most this many changed nodes are refreshed one by one, in plain Python."""

Codes = npt.NDArray[np.int8]


@dataclass(slots=True)
class _Entry:
    position: int
    first: Codes
    static_first: Codes
    counts: npt.NDArray[np.int64]


class Rejecting:
    """Per shape, how many nodes each filter was the first to reject (see the module)."""

    def __init__(self, filters: Sequence[FilterPlugin], local: bool) -> None:
        if len(filters) > 100:
            raise ValueError("too many filters for int8 codes")
        self.filters = list(filters)
        self.local = local
        """Every non-static filter that may run is local: refresh by changed slots."""
        self.passed = len(self.filters)
        self.gone = self.passed + 1
        self._dynamic = [
            (i, f)
            for i, f in enumerate(self.filters)
            if not f.static and getattr(f, "local", False)
        ]
        self._scalar = all(hasattr(f, "filter_one") for _, f in self._dynamic)
        """Every dynamic filter has a one-slot form: a few changed slots are refreshed in
        plain Python (numpy costs more per call than the work)."""
        self._entries: OrderedDict[tuple[object, ...], _Entry] = OrderedDict()
        self._version = -1

    def __repr__(self) -> str:
        return f"Rejecting(filters={len(self.filters)}, shapes={len(self._entries)})"

    def counts(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> npt.NDArray[np.int64]:
        """Per filter index, the nodes it is the first to reject; then the nodes that
        pass all (``passed``) and the slots that hold no node (``gone``). Exactly what
        a full diagnosis's ``rejected`` and ``feasible`` say. Do not modify it."""
        if self._version != state.static_version:
            self._entries.clear()
            self._version = state.static_version
        entry = self._entries.get(pod.shape_key)
        changed = None if entry is None else state.changed_since(entry.position)
        if entry is None or changed is None or len(changed) > LIMIT or not self.local:
            entry = self._whole(cycle, pod, state)
            self._entries[pod.shape_key] = entry
            if len(self._entries) > CACHE_SIZE:
                self._entries.popitem(last=False)
            return entry.counts
        self._entries.move_to_end(pod.shape_key)
        if changed and self._scalar and len(changed) <= SCALAR:
            self._refresh_few(entry, set(changed), pod, state)
        elif changed:
            self._refresh(entry, np.array(sorted(set(changed)), dtype=np.int64), cycle, pod, state)
        entry.position = state.journal_end
        return entry.counts

    def _whole(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> _Entry:
        first = np.full(state.capacity, self.passed, dtype=np.int8)
        first[~state.valid] = self.gone
        static_first = first.copy()
        alive = state.valid.copy()
        static_alive = state.valid.copy()
        for i, f in enumerate(self.filters):
            mask = f.filter(cycle, pod, state)
            first[alive & ~mask] = i
            alive &= mask
            if f.static:
                static_first[static_alive & ~mask] = i
                static_alive &= mask
        counts = np.bincount(first, minlength=self.gone + 1).astype(np.int64)
        return _Entry(state.journal_end, first, static_first, counts)

    def _refresh(
        self,
        entry: _Entry,
        slots: npt.NDArray[np.int64],
        cycle: CycleState,
        pod: PodInfo,
        state: ClusterState,
    ) -> None:
        new = entry.static_first[slots]  # (a copy: fancy indexing)
        if self._dynamic:
            view = state.view(slots)
            for i, f in self._dynamic:
                mask = np.asarray(f.filter(cycle, pod, view), dtype=bool)
                new[~mask & (new > i) & (new < self.gone)] = i
        old = entry.first[slots]
        size = self.gone + 1
        entry.counts -= np.bincount(old, minlength=size)
        entry.counts += np.bincount(new, minlength=size)
        entry.first[slots] = new

    def _refresh_few(
        self, entry: _Entry, slots: set[int], pod: PodInfo, state: ClusterState
    ) -> None:
        """:meth:`_refresh`, a slot at a time through the filters' one-slot forms: a
        slot's code is the least of its static code and the first dynamic filter that
        rejects it."""
        first, static_first, counts = entry.first, entry.static_first, entry.counts
        gone = self.gone
        for slot in slots:
            new = int(static_first[slot])
            if new < gone:
                for i, f in self._dynamic:
                    if i >= new:
                        break
                    if not f.filter_one(pod, state, slot):  # type: ignore[attr-defined]
                        new = i
                        break
            old = int(first[slot])
            if old != new:
                counts[old] -= 1
                counts[new] += 1
                first[slot] = new

"""Whether a shard certainly holds a unit, and which shard: the checks of a hand-over.

:class:`Checks` makes them for :class:`shards.coordinator.dispatch.ShardDispatch` (a
unit at the head of the queue) and :mod:`shards.coordinator.batches` (the plain pods
behind it): whether a profile's scores can be summarised per shard (:meth:`Checks.summarised`),
the nodes that pass every filter for the unit (:meth:`Checks.feasible`, counted per
shard by the coordinator), its pre-filters on the coordinator's view
(:meth:`Checks.admitted`), and the shard its profile's scores prefer
(:meth:`Checks.choose`, on each shard's sums: :mod:`shards.coordinator.choice`). Why a
unit is handed over or decided here: the docstring of :mod:`shards.coordinator.dispatch`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.framework.runtime import Framework
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState
from engine.plugins.registry import builtin_registry
from shards.coordinator.choice import (
    ShardView,
    label_scores,
    scores,
    shard_columns,
    summarised,
)
from shards.coordinator.routing import Routing

BUILT_IN: Final = frozenset(builtin_registry().names())
"""The plugins whose scores :mod:`shards.coordinator.choice` summarises per shard."""

T = TypeVar("T")


class Viewing(Protocol):
    """What the checks read of the coordinator (its view, and what each shard has
    pending)."""

    n: int
    engine: Engine
    """The coordinator's view."""
    routing: Routing
    pending: npt.NDArray[np.int64]

    def cached(self, key: tuple[object, ...], compute: Callable[[], T]) -> T: ...

    def feasible_counts(self, feasible: Bools) -> list[int]: ...


class Checks:
    """The checks of a hand-over on the coordinator's view, and the choice of shard."""

    def __init__(self, coordinator: Viewing) -> None:
        self.c = coordinator
        self._known: dict[int, tuple[Framework, bool]] = {}
        """Per framework (by id, kept alive here): whether it can be handed over."""
        self.sums = Sums()
        self.counted = Counted()

    def __repr__(self) -> str:
        return f"Checks(frameworks={len(self._known)})"

    def summarised(self, framework: Framework) -> bool:
        """Whether every plugin at ``framework``'s preScore and score points is one the
        choice of a shard knows how to summarise (a built-in, and no packing score:
        :func:`shards.coordinator.choice.summarised`)."""
        known = self._known.get(id(framework))
        if known is None or known[0] is not framework:
            plugins = [*framework.pre_scores, *(entry.plugin for entry in framework.scores)]
            known = (
                framework,
                all(p.name in BUILT_IN for p in plugins)
                and all(summarised(entry.plugin) for entry in framework.scores),
            )
            self._known[id(framework)] = known
        return known[1]

    def feasible(
        self, pods: list[PodInfo], frameworks: list[Framework | None], *, copy: bool = True
    ) -> Bools:
        """The nodes that pass every filter for the unit of ``pods``; ``copy=False``: for
        one pod, the framework's own array (read at once, never kept or changed)."""
        e = self.c.engine
        feasible: Bools | None = None
        for pod, framework in zip(pods, frameworks, strict=True):
            assert framework is not None
            mask, _ = framework._shape_feasible(CycleState(), pod, e.state)
            if feasible is None:
                feasible = mask.copy() if copy or len(pods) > 1 else mask
            else:
                feasible = feasible & mask
        assert feasible is not None
        return feasible

    def counts(
        self, key: tuple[object, ...], pods: list[PodInfo], frameworks: list[Framework | None]
    ) -> list[int]:
        """Per shard, how many of its nodes pass every filter for the unit of ``pods``
        (their kind: ``key``), kept across batches and brought up to date from the
        nodes changed since (:class:`Counted`); a pod with host ports (its static
        filters read placements) has them counted again whenever the view changes."""
        c = self.c
        if any(pod.spec.host_ports for pod in pods):
            return c.cached(key, lambda: c.feasible_counts(self.feasible(pods, frameworks)))
        return self.counted.counts(
            key,
            self.feasible(pods, frameworks, copy=False),
            c.engine.state,
            c.routing.slot_shard,
            c.n,
            self.owners(),
        )

    def owners(self) -> object:
        """An object that stays the same while the view's nodes, placements and the
        shards' nodes stand (what ``cached`` remembers is forgotten when a pool changes
        hands: ``Ledger.ownership_changed``): the caches here compare who owns every
        slot once per batch, not once per kind."""
        return self.c.cached(("owners",), object)

    def admitted(self, pods: list[PodInfo], frameworks: list[Framework | None]) -> bool:
        """Every pod passes its profile's pre-filters (quota, minResources) on the
        coordinator's view, counted together (the quota is charged when it is handed
        over, until the shard answers)."""
        e = self.c.engine
        charged: list[PodInfo] = []
        try:
            for pod, framework in zip(pods, frameworks, strict=True):
                assert framework is not None
                if not framework.run_pre_filters(CycleState(), pod, e.state).ok:
                    return False
                if len(pods) > 1:
                    e.quotas.add(pod.spec.namespace, pod.request)
                    charged.append(pod)
            return True
        finally:
            for done in charged:
                e.quotas.remove(done.spec.namespace, done.request)

    def choose(self, framework: Framework, pod: PodInfo, counts: list[int]) -> int | None:
        c = self.c
        candidates = [s for s in range(c.n) if counts[s] > 0]
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        shards = self.shard_view(framework, pod)
        nodes = shards.refresh(c.pending)
        kernel = framework.kernel
        params = kernel.params(pod.request, nodes) if kernel is not None else None
        if (
            kernel is not None
            and params is not None
            and kernel.worth(0, 0)  # loaded: no numba load for a small simulation
            and kernel.run(
                candidates,
                shards.ones,
                nodes,
                params,
                shards.feasible,
                shards.local,
                shards.masked,
            )
        ):
            # the compiled twin of the local score plugins, on the shards as nodes
            total = shards.local
            if shards.labels is not None:
                total = total + shards.labels
        else:
            total = scores(framework, pod, nodes, shards.labels)
        start = pod.tiebreak % len(candidates)
        order = candidates[start:] + candidates[:start]
        values: list[int] = total.tolist()  # (one conversion, not one per shard)
        return max(order, key=values.__getitem__)

    def shard_view(self, framework: Framework, pod: PodInfo) -> ShardView:
        """Each shard's sums over the nodes ``pod``'s static filters allow: kept per
        kind of pod while the view's nodes stand, brought up to date with the nodes
        placements changed since (:class:`Sums`), not summed again over every node. A
        pod with host ports (its static filters read placements) has them summed
        again whenever the view's placements change."""
        c = self.c
        e = c.engine

        def view(static: Bools | None = None) -> ShardView:
            if static is None:
                static = framework.static_feasible(pod, e.state)
            return ShardView(
                shard_columns(e.state, static, c.routing.slot_shard, c.n),
                e.state,
                label_scores(framework, pod, e.state, static, c.routing.slot_shard, c.n),
            )

        key = ("shards", pod.static_key, pod.spec.scheduler_name)
        if pod.spec.host_ports:
            return c.cached(key, view)
        self.sums.sync(e.state, c.routing.slot_shard, self.owners())
        found = self.sums.views.get(key)
        if found is None:
            static = framework.static_feasible(pod, e.state)
            found = self.sums.keep(key, view(static), static)
        return found


class Sums:
    """Per kind of pod, each shard's sums over the nodes its static filters allow
    (a :class:`ShardView`'s ``base``), kept up to date from the view's journal of
    changed nodes: at each :meth:`sync`, the columns of the nodes changed since, less
    what they were then (a copy of the columns, kept for it), are added to each kind's
    sums, per shard. Integer sums: the same as summing every node again.

    **Cost**: O(nodes changed, times kinds) per sync, instead of O(nodes, times resources) per
    kind each time placements change (at 130,000 nodes, about 30 ms per kind and batch
    of hand-overs). Everything is summed again when a node is added, removed or
    changed, when a shard's nodes change hands, or when the journal no longer reaches
    back to the last sync."""

    def __init__(self) -> None:
        self.views: dict[tuple[object, ...], ShardView] = {}
        self.masks: dict[tuple[object, ...], Bools] = {}
        self._mirror: npt.NDArray[np.int64] | None = None
        self._owner: npt.NDArray[np.int64] | None = None
        self._at = -1
        self._version: tuple[int, int, int] = (-1, -1, -1)
        self._token: object = None

    def __repr__(self) -> str:
        return f"Sums(kinds={len(self.views)})"

    def keep(self, key: tuple[object, ...], view: ShardView, static: Bools) -> ShardView:
        self.views[key] = view
        self.masks[key] = static.copy()
        return view

    def sync(
        self, state: ClusterState, slot_shard: npt.NDArray[np.int64], token: object = None
    ) -> None:
        """Bring every kind's sums up to date with ``state`` (or forget them all).
        ``token``: the same object as at the last call while the shards' nodes are
        known not to have changed hands (:meth:`Checks.owners`), sparing the
        comparison of the owners of every slot."""
        columns = state._columns
        top = state.high_water
        version = (state.static_version, top, columns.shape[1])
        owner = slot_shard[:top]
        if (
            version != self._version
            or self._mirror is None
            or self._owner is None
            or (
                (token is None or token is not self._token)
                and not np.array_equal(owner, self._owner)
            )
        ):
            self._restart(state, owner, version)
            return
        self._token = token
        changed = state.changed_since(self._at)
        if changed is None:
            self._restart(state, owner, version)
            return
        self._at = state.journal_end
        if not changed:
            return
        slots = np.unique(np.asarray(changed, dtype=np.int64))
        slots = slots[slots < top]
        now = columns[:, :, slots]
        diff = now - self._mirror[:, :, slots]
        self._mirror[:, :, slots] = now
        if not self.views:
            return
        moved = diff.any(axis=(0, 1))
        if not moved.any():
            return
        slots, diff = slots[moved], diff[:, :, moved]
        whose = owner[slots]
        # every kind at once (one product per shard), not a few array operations per
        # kind and shard: with twenty kinds and batches of ten pods (issue 25's mixed
        # templates) the loop over kinds was most of a sync
        views = list(self.views.values())
        picked = np.stack([self.masks[key][slots] for key in self.views])  # (kinds, changed)
        flat = diff.reshape(-1, diff.shape[2])  # (4 * rows, changed)
        for shard in np.unique(whose[whose >= 0]).tolist():
            mine = picked & (whose == shard)
            hit = mine.any(axis=1)
            if not hit.any():
                continue
            added = mine.astype(np.int64) @ flat.T  # (kinds, 4 * rows): exact integers
            for k in np.flatnonzero(hit).tolist():
                views[k].base[:, :, shard] += added[k].reshape(diff.shape[0], diff.shape[1])

    def _restart(
        self, state: ClusterState, owner: npt.NDArray[np.int64], version: tuple[int, int, int]
    ) -> None:
        self.views.clear()
        self.masks.clear()
        self._mirror = state._columns[:, :, : state.high_water].copy()
        self._owner = owner.copy()
        self._at = state.journal_end
        self._version = version
        self._token = None


COUNTED_LIMIT: Final = 4096
"""Nodes changed since a kind was last counted beyond which it is counted again whole."""
COUNTED_SCALAR: Final = 48
"""Nodes changed up to which they are counted again one by one (fewer array operations
than the vectorised update, for the few nodes a batch of ten pods changes)."""


class _Count:
    __slots__ = ("at", "counts", "mask")

    def __init__(self, at: int, mask: Bools, counts: npt.NDArray[np.int64]) -> None:
        self.at = at
        self.mask = mask
        self.counts = counts


class Counted:
    """Per kind of pod, each shard's count of the nodes that pass every filter for it,
    kept across batches of hand-overs and brought up to date from the view's journal
    of changed nodes.

    **Why** (issue 25, the coordinator with mixed templates): a pod that a spread
    constraint or an inter-pod rule applies to is decided on the coordinator; where
    that cannot be done in its place in a batch (:func:`shards.coordinator.batches.hand_batch`)
    it ends the batch, and each batch counted every kind's feasible nodes again over
    every node (a copy of the mask and a count over all slots, per kind and batch).
    The count is kept instead, and only the nodes changed since it was taken are
    counted again (their verdict before, kept here, against now).

    **Exactness**: a kind's verdict on a node changes only when the node is journaled
    as changed or the static facts change (the premise of the framework's own shape
    cache, ``Framework._shape_feasible``, which gives the verdict here); the count is
    taken again whole when the static facts, the slots in use or the shards' nodes
    change, or the journal no longer reaches back. Integer counts: the same as counting
    every node again (``tests/shards/test_coordinator_counts.py``).

    **Cost**: O(nodes changed since the kind was last counted) per kind and batch,
    instead of O(nodes)."""

    def __init__(self) -> None:
        self._kinds: dict[tuple[object, ...], _Count] = {}
        self.scalar = COUNTED_SCALAR
        """Nodes changed up to which they are counted again one by one."""
        self._owner: npt.NDArray[np.int64] | None = None
        self._version: tuple[int, int] = (-1, -1)
        self._token: object = None

    def __repr__(self) -> str:
        return f"Counted(kinds={len(self._kinds)})"

    def counts(
        self,
        key: tuple[object, ...],
        feasible: Bools,
        state: ClusterState,
        slot_shard: npt.NDArray[np.int64],
        shards: int,
        token: object = None,
    ) -> list[int]:
        """Per shard, its nodes ``feasible`` marks (the verdict for kind ``key`` now);
        ``token`` as for :meth:`Sums.sync`."""
        top = state.high_water
        owner = slot_shard[:top]
        version = (state.static_version, top)
        if (
            version != self._version
            or self._owner is None
            or self._owner.shape != owner.shape
            or (
                (token is None or token is not self._token)
                and not np.array_equal(owner, self._owner)
            )
        ):
            self._kinds.clear()
            self._owner = owner.copy()
            self._version = version
        self._token = token
        kept = self._kinds.get(key)
        changed = None if kept is None else state.changed_since(kept.at)
        if kept is None or changed is None or len(changed) > COUNTED_LIMIT:
            mask = feasible[:top].copy()
            picked = owner[mask & (owner >= 0)]
            counts = np.bincount(picked, minlength=shards)[:shards].astype(np.int64)
            self._kinds[key] = _Count(state.journal_end, mask, counts)
            return [int(c) for c in counts]
        kept.at = state.journal_end
        if changed and len(changed) <= self.scalar:
            counts, mask = kept.counts, kept.mask
            for slot in set(changed):
                if slot < top:
                    verdict = bool(feasible[slot])
                    if verdict != mask[slot]:
                        mask[slot] = verdict
                        shard = int(owner[slot])
                        if shard >= 0:
                            counts[shard] += 1 if verdict else -1
        elif changed:
            # the verdicts that flipped, then those slots once each (a batch's journal
            # holds each slot as often as pods landed there; sorting all of it was
            # most of this)
            slots = np.asarray(changed, dtype=np.int64)
            slots = slots[slots < top]
            flipped = feasible[slots] != kept.mask[slots]
            if flipped.any():
                slots = np.unique(slots[flipped])
                now = feasible[slots]
                kept.mask[slots] = now
                whose = owner[slots]
                mine = whose >= 0
                np.add.at(kept.counts, whose[mine], np.where(now[mine], 1, -1))
        return [int(c) for c in kept.counts]

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
from engine.model.state import Bools
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


class Checks:
    """The checks of a hand-over on the coordinator's view, and the choice of shard."""

    def __init__(self, coordinator: Viewing) -> None:
        self.c = coordinator
        self._known: dict[int, tuple[Framework, bool]] = {}
        """Per framework (by id, kept alive here): whether it can be handed over."""

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

    def feasible(self, pods: list[PodInfo], frameworks: list[Framework | None]) -> Bools:
        e = self.c.engine
        feasible: Bools | None = None
        for pod, framework in zip(pods, frameworks, strict=True):
            assert framework is not None
            mask, _ = framework._shape_feasible(CycleState(), pod, e.state)
            feasible = mask.copy() if feasible is None else feasible & mask
        assert feasible is not None
        return feasible

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
        """Each shard's sums over the nodes ``pod``'s static filters allow (cached while
        the view's nodes and placements stand)."""
        c = self.c
        e = c.engine

        def view() -> ShardView:
            static = framework.static_feasible(pod, e.state)
            return ShardView(
                shard_columns(e.state, static, c.routing.slot_shard, c.n),
                e.state,
                label_scores(framework, pod, e.state, static, c.routing.slot_shard, c.n),
            )

        return c.cached(("shards", pod.static_key, pod.spec.scheduler_name), view)

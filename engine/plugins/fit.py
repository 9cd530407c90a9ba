"""NodeResourcesFit and NodeResourcesBalancedAllocation.

The filter is one comparison per requested resource over all nodes. Scoring follows
kube-scheduler (``pkg/scheduler/framework/plugins/noderesources``) to the integer:
cpu and memory are scored with their *non-zero* requests (100m and 200Mi for a pod that
asks for none), other resources with their actual requests; a resource a node does not
have is left out of that node's weighted mean, and so is an extended resource (such as
``nvidia.com/gpu``) the pod does not request, on every node (a cpu-only pod is not
drawn to, or kept off, GPU nodes by their cards).

Args (``pluginConfig`` of ``NodeResourcesFit``), as in ``NodeResourcesFitArgs``::

    scoringStrategy:
      type: LeastAllocated | MostAllocated | RequestedToCapacityRatio
      resources: [{name: cpu, weight: 1}, {name: memory, weight: 1}]
      requestedToCapacityRatio:
        shape: [{utilization: 0, score: 0}, {utilization: 100, score: 10}]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.framework.cycle import CycleState
from engine.model.changes import EVERY, ClusterEvent
from engine.model.devices import GPU
from engine.model.pods import PodInfo
from engine.model.resources import PODS
from engine.model.state import Bools, ClusterState, Ints, Request, scored_request
from engine.plugins.normalize import MAX_NODE_SCORE
from events.errors import InputError

STRATEGIES = ("LeastAllocated", "MostAllocated", "RequestedToCapacityRatio")
MAX_UTILIZATION = 100
MAX_CUSTOM_SCORE = 10


@dataclass(frozen=True, slots=True)
class ResourceWeight:
    name: str
    weight: int


DEFAULT_RESOURCES = (ResourceWeight("cpu", 1), ResourceWeight("memory", 1))


def parse_resources(args: Mapping[str, Any], where: str) -> tuple[ResourceWeight, ...]:
    raw = args.get("resources")
    if raw is None:
        return DEFAULT_RESOURCES
    if not isinstance(raw, list) or not raw:
        raise InputError(
            "must be a non-empty list of {name, weight}", location=f"{where}.resources"
        )
    out: list[ResourceWeight] = []
    for i, item in enumerate(raw):
        loc = f"{where}.resources[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise InputError("needs a resource name", location=loc)
        weight = item.get("weight", 1)
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            raise InputError(f"weight must be an integer 1..100, got {weight!r}", location=loc)
        out.append(ResourceWeight(item["name"], weight))
    return tuple(out)


def _div_trunc(num: Ints, den: Ints | int) -> Ints:
    """Integer division truncating toward zero, as Go does."""
    q: Ints = np.abs(num) // np.abs(den)
    return np.where((num < 0) != (np.asarray(den) < 0), -q, q)


def broken_linear(points: list[tuple[int, int]], p: Ints) -> Ints:
    """kube-scheduler's ``BuildBrokenLinearFunction`` over an array of utilisations."""
    out = np.full_like(p, points[-1][1])
    done = np.zeros(p.shape, dtype=np.bool_)
    for i, (util, score) in enumerate(points):
        here = ~done & (p <= util)
        if i == 0:
            out[here] = score
        else:
            u0, s0 = points[i - 1]
            out[here] = s0 + _div_trunc((score - s0) * (p[here] - u0), util - u0)
        done |= here
    return out


class NodeResourcesFit:
    name = "NodeResourcesFit"
    static = False
    unresolvable = False
    local = True

    def __init__(
        self, args: Mapping[str, Any] | None = None, where: str = "NodeResourcesFit"
    ) -> None:
        args = args or {}
        strategy = args.get("scoringStrategy") or {}
        if not isinstance(strategy, dict):
            raise InputError("must be a mapping", location=f"{where}.scoringStrategy")
        loc = f"{where}.scoringStrategy"
        self.strategy = strategy.get("type", "LeastAllocated")
        if self.strategy not in STRATEGIES:
            raise InputError(
                f"unknown type {self.strategy!r} (one of {', '.join(STRATEGIES)})", location=loc
            )
        self.resources = parse_resources(strategy, loc)
        self._prep = _Preparation(self.resources)
        self.shape: list[tuple[int, int]] = []
        if self.strategy == "RequestedToCapacityRatio":
            self.shape = self._parse_shape(strategy.get("requestedToCapacityRatio"), loc)

    @staticmethod
    def _parse_shape(raw: Any, where: str) -> list[tuple[int, int]]:
        loc = f"{where}.requestedToCapacityRatio.shape"
        shape = raw.get("shape") if isinstance(raw, dict) else None
        if not isinstance(shape, list) or not shape:
            raise InputError("needs a non-empty list of {utilization, score}", location=loc)
        points: list[tuple[int, int]] = []
        for i, point in enumerate(shape):
            util = point.get("utilization") if isinstance(point, dict) else None
            score = point.get("score") if isinstance(point, dict) else None
            if not isinstance(util, int) or not 0 <= util <= MAX_UTILIZATION:
                raise InputError("utilization must be an integer 0..100", location=f"{loc}[{i}]")
            if not isinstance(score, int) or not 0 <= score <= MAX_CUSTOM_SCORE:
                raise InputError("score must be an integer 0..10", location=f"{loc}[{i}]")
            if points and util <= points[-1][0]:
                raise InputError("utilization values must increase", location=f"{loc}[{i}]")
            points.append((util, score * (MAX_NODE_SCORE // MAX_CUSTOM_SCORE)))
        return points

    def __repr__(self) -> str:
        return f"NodeResourcesFit(strategy={self.strategy}, resources={self.resources})"

    # ------------------------------------------------------------------ filter

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        free = state.free
        mask: Bools | None = None
        for row, amount in pod.request:
            ok = free[row] >= amount
            mask = ok if mask is None else mask & ok
        return state.valid if mask is None else mask

    def filter_one(self, pod: PodInfo, state: ClusterState, slot: int) -> bool:
        """:meth:`filter` for one slot, in plain Python (the incremental path refreshes
        one or two nodes per attempt, where numpy's per-call cost dominates)."""
        free = state.free
        return all(free[row, slot] >= amount for row, amount in pod.request)

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        counts: dict[str, int] = {}
        card_rows = state.cards.rows
        gpu_short: Bools | None = None
        if card_rows:
            gpu_row = state.resources.get(GPU)
            amount = dict(pod.request).get(gpu_row, 0) if gpu_row is not None else 0
            if gpu_row is not None and amount:
                gpu_short = state.free[gpu_row] < amount
        for row, amount in pod.request:
            short_at = rejected & (state.free[row] < amount)
            if row in card_rows and gpu_short is not None:
                short_at &= ~gpu_short  # said once, as kube-scheduler says it
            short = int(short_at.sum())
            if short:
                label = (
                    "Too many pods" if row == PODS else f"Insufficient {state.resources.name(row)}"
                )
                counts[label] = short
        return counts

    def events(self) -> frozenset[ClusterEvent]:
        return EVERY

    def worth_retrying(
        self, pod: PodInfo, event: ClusterEvent, slot: int, state: ClusterState
    ) -> bool:
        return state.fits(pod.request, slot)

    # ------------------------------------------------------------------ score

    def score_one(self, pod: PodInfo, state: ClusterState, slot: int) -> int:
        """:meth:`score` for one slot: the same integers, without numpy's per-call cost
        (the common LeastAllocated case; anything else goes through :meth:`score`)."""
        prep = self._prep.get(pod.request, state, scored=True)
        if prep is None:
            return 0
        if self.strategy == "LeastAllocated":
            rows, weights, wanted, total = self._prep.scalar(pod.request, state, prep)
            alloc, nonzero = state.alloc, state.nonzero_used
            acc = 0
            for row, weight, want in zip(rows, weights, wanted, strict=True):
                capacity = int(alloc[row, slot])
                if capacity <= 0:
                    break
                acc += weight * max(
                    (capacity - int(nonzero[row, slot]) - want) * MAX_NODE_SCORE // capacity, 0
                )
            else:
                return acc // total
        return _one(self.score(CycleState(), pod, state.view(np.array([slot])), _ONE))

    def score(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> Ints | int:
        prep = self._prep.get(pod.request, state, scored=True)
        if prep is None:
            return 0
        rows, weights, wanted, total_weight = prep
        alloc = state.alloc[rows]
        requested = state.nonzero_used[rows] + wanted
        has = alloc > 0
        safe = np.maximum(alloc, 1)
        if self.strategy == "LeastAllocated" and has.all():
            # Every node has every scored resource (the usual case): the same integers
            # as the general path below, in fewer array operations. A request above
            # capacity makes the numerator negative, hence the clamp at 0.
            least = np.maximum((alloc - requested) * MAX_NODE_SCORE // safe, 0)
            fast: Ints = (weights.T @ least)[0] // total_weight
            return fast
        if self.strategy == "LeastAllocated":
            s = np.where(requested > alloc, 0, (alloc - requested) * MAX_NODE_SCORE // safe)
        elif self.strategy == "MostAllocated":
            s = np.minimum(requested, alloc) * MAX_NODE_SCORE // safe
        else:
            util = np.where(requested > alloc, MAX_UTILIZATION, requested * MAX_UTILIZATION // safe)
            s = broken_linear(self.shape, util)
            has &= s > 0
        w = weights * has
        num = (s * w).sum(axis=0)
        den = w.sum(axis=0)
        if self.strategy == "RequestedToCapacityRatio":
            # Go: int64(math.Round(float64(nodeScore) / float64(weightSum)))
            return np.where(den > 0, np.floor(num / np.maximum(den, 1) + 0.5), 0).astype(np.int64)
        out: Ints = num // np.maximum(den, 1)
        return out


Rows = slice | Ints
Prepared = tuple[Rows, Ints, Ints, int]


def _scalar(name: str) -> bool:
    """Whether kube-scheduler scores ``name`` only for pods that request it
    (``IsScalarResourceName``: extended resources such as ``nvidia.com/gpu``, huge pages,
    attachable volumes, prefixed native ones; not cpu, memory or ephemeral storage)."""
    return "/" in name or name.startswith(("hugepages-", "attachable-volumes-"))


class _Preparation:
    """Per request shape: the rows of the configured resources that exist (a slice when
    contiguous, so indexing is a view), their weights and the pod's amounts, as columns.
    Cached: a scorer runs for every attempt and must not redo this."""

    def __init__(self, resources: tuple[ResourceWeight, ...]) -> None:
        self.resources = resources
        self._cache: dict[tuple[object, ...], Prepared | None] = {}
        self._scalar: dict[tuple[object, ...], tuple[list[int], list[int], list[int], int]] = {}

    def scalar(
        self, request: Request, state: ClusterState, prep: Prepared
    ) -> tuple[list[int], list[int], list[int], int]:
        """``prep`` as plain lists (rows, weights, wanted amounts) and the weight sum."""
        key = (request, len(state.resources))
        found = self._scalar.get(key)
        if found is None:
            if len(self._scalar) > 4096:
                self._scalar.clear()
            rows, weights, wanted, total = prep
            row_list = (
                list(range(rows.start, rows.stop))
                if isinstance(rows, slice)
                else [int(r) for r in rows]
            )
            found = (
                row_list,
                [int(w) for w in weights[:, 0]],
                [int(w) for w in wanted[:, 0]],
                total,
            )
            self._scalar[key] = found
        return found

    def get(self, request: Request, state: ClusterState, *, scored: bool) -> Prepared | None:
        known = len(state.resources)
        key = (request, known, scored)
        cached = self._cache.get(key, False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        if len(self._cache) > 4096:
            self._cache.clear()
        rows: list[int] = []
        weights: list[int] = []
        wanted = dict(scored_request(request) if scored else request)
        for spec in self.resources:
            row = state.resources.get(spec.name)
            if row is not None and (wanted.get(row, 0) or not _scalar(spec.name)):
                rows.append(row)
                weights.append(spec.weight)
        result: Prepared | None = None
        if rows:
            index: Rows = np.array(rows, dtype=np.int64)
            if rows == list(range(rows[0], rows[0] + len(rows))):
                index = slice(rows[0], rows[0] + len(rows))
            result = (
                index,
                np.array(weights, dtype=np.int64).reshape(-1, 1),
                np.array([[wanted.get(r, 0)] for r in rows], dtype=np.int64),
                sum(weights),
            )
        self._cache[key] = result
        return result


class NodeResourcesBalancedAllocation:
    """Prefers nodes whose resources are used in equal proportions after placement."""

    name = "NodeResourcesBalancedAllocation"
    local = True

    def __init__(
        self, args: Mapping[str, Any] | None = None, where: str = "NodeResourcesBalancedAllocation"
    ) -> None:
        self.resources = parse_resources(args or {}, where)
        self._prep = _Preparation(self.resources)

    def score_one(self, pod: PodInfo, state: ClusterState, slot: int) -> int:
        """:meth:`score` for one slot, the same integers (two resources, both present on
        the node: the common case; anything else goes through :meth:`score`)."""
        prep = self._prep.get(pod.request, state, scored=False)
        if prep is None:
            return MAX_NODE_SCORE
        rows, _, wanted, _ = self._prep.scalar(pod.request, state, prep)
        if len(rows) == 2:
            alloc, used = state.alloc, state.used
            a0, a1 = int(alloc[rows[0], slot]), int(alloc[rows[1], slot])
            if a0 > 0 and a1 > 0:
                f0 = min((int(used[rows[0], slot]) + wanted[0]) / a0, 1.0)
                f1 = min((int(used[rows[1], slot]) + wanted[1]) / a1, 1.0)
                return int((1.0 - abs((f0 - f1) / 2)) * MAX_NODE_SCORE)
        return _one(self.score(CycleState(), pod, state.view(np.array([slot])), _ONE))

    def score(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> Ints | int:
        prep = self._prep.get(pod.request, state, scored=False)
        if prep is None:
            return MAX_NODE_SCORE
        rows, _, wanted, _ = prep
        alloc = state.alloc[rows]
        used = state.used[rows] + wanted
        has = alloc > 0
        if used.shape[0] == 2 and has.all():
            f = np.minimum(used / alloc, 1.0)
            two: Ints = ((1.0 - np.abs((f[0] - f[1]) / 2)) * MAX_NODE_SCORE).astype(np.int64)
            return two
        fractions = np.minimum(used / np.maximum(alloc, 1), 1.0) * has
        n = has.sum(axis=0)
        if fractions.shape[0] == 2:
            # kube-scheduler's shortcut for two resources, kept for bit-identical scores.
            std = np.where(n == 2, np.abs((fractions[0] - fractions[1]) / 2), 0.0)
        else:
            count = np.maximum(n, 1)
            mean = fractions.sum(axis=0) / count
            var = (((fractions - mean) ** 2) * has).sum(axis=0) / count
            std = np.where(n > 1, np.sqrt(var), 0.0)
        out: Ints = ((1.0 - std) * MAX_NODE_SCORE).astype(np.int64)
        return out


_ONE: Bools = np.ones(1, dtype=np.bool_)


def _one(scores: Ints | int) -> int:
    return scores if isinstance(scores, int) else int(scores[0])

"""Runs of plain pods routed in one compiled loop, with the same outcome as the fold.

Under load, the control partition is mostly long runs of pods the router treats alike:
no gang, no node name, selector, affinity or dependency, no tenant pools. For each,
:meth:`shards.router.Control.apply` scores every shard in Python (a few microseconds a
pod, most of the coordinator's time). :class:`RunRouter` folds the same records and,
for a run of such pods, scores them in one numba loop over small arrays instead, then
does the fold's bookkeeping for each pod in order.

The compiled loop does the same integer and floating-point operations as
``Control._score`` and ``Control.choose``, in the same order, on int64 values; it is
used only when every value it sees (capacities, usage, requests and their sum over the
run) is below 2**53, where converting an int64 to a float is exact, so every comparison
and division gives what Python's gives. The router's state after a run, its outputs and
their order are those of folding the run record by record (a property test compares
them, state bytes included); replay folds record by record, and ``replay --verify``
checks the two agree.

Short runs, numba missing or ``SHOAL_NO_JIT`` set: records are folded one by one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine import kernels
from events.types import Envelope, PodRouted, PodSpec, PodSubmitted
from shards.router import RELAY, ROUTER, Control, Output, _request

MAX_SHAPES = 4096
"""Shapes of request remembered; past it they are forgotten and learnt again."""
MIN_RUN = 32
"""The shortest run worth the compiled loop (and worth loading numba for)."""
EXACT = 1 << 53
"""Integers below this convert to floats exactly."""

Folded = tuple[int, int, list[Output]]
"""A control record's offset, the fold's time after it, its outputs."""
RouteRun = Callable[..., None]


def _compile() -> RouteRun | None:
    if not kernels.available():
        return None

    def route_run(
        alloc: np.ndarray,
        used: np.ndarray,
        inflight: np.ndarray,
        largest: np.ndarray,
        summarized: np.ndarray,
        rows: np.ndarray,
        amounts: np.ndarray,
        lengths: np.ndarray,
        chosen: np.ndarray,
    ) -> None:  # pragma: no cover - compiled; its twin is Control.choose
        shards = alloc.shape[0]
        for i in range(rows.shape[0]):
            best = 0
            best_fits = False
            best_worst = -2.0
            for s in range(shards):
                fits = True
                worst = 1.0
                for k in range(lengths[i]):
                    r = rows[i, k]
                    amount = amounts[i, k]
                    a = alloc[s, r]
                    free = a - used[s, r] - inflight[s, r]
                    if free < amount or (summarized[s] and largest[s, r] < amount):
                        fits = False
                    if a <= 0:
                        worst = 0.0
                    elif free < worst * a:
                        worst = free / a
                if (fits and not best_fits) or (fits == best_fits and worst > best_worst):
                    best = s
                    best_fits = fits
                    best_worst = worst
            chosen[i] = best
            for k in range(lengths[i]):
                inflight[best, rows[i, k]] += amounts[i, k]

    return kernels.jit(route_run)


@functools.cache
def route_kernel() -> RouteRun | None:
    """The compiled loop, or None. Compiled (or loaded from numba's cache on disk) on
    the first call in a process, which then runs it once on empty arrays, so that the
    first run of pods does not pay for it."""
    kernel = _compile()
    if kernel is not None:
        table = np.zeros((1, 0), dtype=np.int64)
        rows = np.zeros((0, 0), dtype=np.int64)
        none = np.zeros(0, dtype=np.int64)
        kernel(table, table, table, table, np.zeros(1, dtype=np.bool_), rows, rows, none, none)
    return kernel


def warm_up() -> None:
    """Load the compiled loop now (a coordinator that will route for long), rather than
    at the first run of pods long enough to need it."""
    route_kernel()


class RunRouter:
    """Folds control records like ``Control.apply``, runs of plain pods at once.

    It keeps no state of the fold's (only a cache of request shapes), so a coordinator
    may use it or not from one poll to the next."""

    def __init__(self, min_run: int = MIN_RUN) -> None:
        self.min_run = min_run
        self.routed_in_runs = 0
        self._names: dict[str, int] = {}
        """Resource → its row in the arrays the loop takes (grows; never reordered)."""
        self._shapes: dict[tuple[tuple[str, int], ...], _Shape] = {}
        """A pod's ``requests`` items → its shape (a few in any workload)."""
        self._width = 0
        self._rows = np.zeros((0, 0), dtype=np.int64)
        self._amounts = np.zeros((0, 0), dtype=np.int64)
        self._lengths = np.zeros(0, dtype=np.int64)
        self._totals: list[int] = []

    def fold(self, control: Control, records: Sequence[Envelope]) -> list[Folded]:
        out: list[Folded] = []
        run: list[tuple[Envelope, PodSpec, str]] = []
        keys: set[str] = set()
        ready = control.routes_by_capacity()
        for env in records:
            plain = _plain(control, env, keys) if ready else None
            if plain is not None:
                run.append((env, *plain))
                keys.add(plain[1])
                continue
            if run:
                self._flush(control, run, out)
                run, keys = [], set()
            out.append((env.offset, *_apply(control, env)))
            ready = control.routes_by_capacity()  # the record may have changed it
        if run:
            self._flush(control, run, out)
        return out

    def _flush(
        self, control: Control, run: list[tuple[Envelope, PodSpec, str]], out: list[Folded]
    ) -> None:
        kernel = route_kernel() if len(run) >= self.min_run else None
        chosen = self._choose(control, run, kernel) if kernel is not None else None
        if chosen is None:
            for env, _, _ in run:
                out.append((env.offset, *_apply(control, env)))
            return
        requests, shards_of = chosen
        final = control.n <= 1
        now = control.now
        pods, pod_shard, states = control.pods, control.pod_shard, control.shards
        for (env, spec, key), request, shard in zip(run, requests, shards_of, strict=True):
            now = max(now, env.time)
            pods[key] = spec
            pod_shard[key] = shard
            states[shard].charge(env.offset, request)  # the totals the loop arrived at
            routed = PodRouted(pod=spec, hops=0, final=final, answers=())
            out.append((env.offset, now, [(shard, routed)]))
        control.now = now
        control._out = out[-1][2]  # as the fold leaves it: the last record's outputs
        self.routed_in_runs += len(run)

    def _choose(
        self, control: Control, run: list[tuple[Envelope, PodSpec, str]], kernel: RouteRun
    ) -> tuple[list[dict[str, int]], list[int]] | None:
        """Each pod's request and shard; None if a value is too large for the loop to be
        exact."""
        names = self._names
        states = control.shards
        for state in states:
            for table in (state.alloc, state.used, state.inflight, state.largest):
                for name in table:
                    if name not in names:
                        names[name] = len(names)
        shapes = self._shapes
        if len(shapes) >= MAX_SHAPES:
            shapes.clear()  # learnt again: indices restart, so the arrays are rebuilt
            self._totals = []
        ids = []
        requests = []
        for _, spec, _ in run:
            shape = shapes.get(tuple(spec.requests.items()))
            if shape is None:
                shape = self._shape(spec)
            ids.append(shape.index)
            requests.append(dict(shape.request))  # each pod its own, as the fold's
        if len(self._totals) != len(shapes) or self._rows.shape[1] < self._width:
            self._pack_shapes()
        totals = self._totals
        total = sum(totals[i] for i in set(ids)) * len(run)  # a bound on the run's sum
        n = len(states)
        tables = np.zeros((4, n, len(names)), dtype=np.int64)
        for s, state in enumerate(states):
            for t, table in enumerate((state.alloc, state.used, state.inflight, state.largest)):
                row = tables[t, s]
                for name, value in table.items():
                    if not -EXACT < value < EXACT:
                        return None
                    row[names[name]] = value
        # free = alloc - used - inflight stays exact as a float while under 2**53
        if total >= EXACT or 3 * int(np.abs(tables).max(initial=0)) + total >= EXACT:
            return None
        which = np.array(ids, dtype=np.int64)
        rows, amounts, lengths = self._rows[which], self._amounts[which], self._lengths[which]
        summarized = np.array([state.summarized for state in states], dtype=np.bool_)
        chosen = np.zeros(len(run), dtype=np.int64)
        alloc, used, inflight, largest = tables
        kernel(alloc, used, inflight, largest, summarized, rows, amounts, lengths, chosen)
        return requests, chosen.tolist()

    def _shape(self, spec: PodSpec) -> _Shape:
        """A new shape of request: its dict as ``_request`` builds it, its resources'
        rows and amounts in that dict's order."""
        request = _request(spec)
        names = self._names
        for name in request:
            if name not in names:
                names[name] = len(names)
        shape = _Shape(
            index=len(self._shapes),
            request=request,
            rows=tuple(names[name] for name in request),
            amounts=tuple(request.values()),
        )
        self._shapes[tuple(spec.requests.items())] = shape
        self._width = max(self._width, len(request))
        return shape

    def _pack_shapes(self) -> None:
        """The shapes' rows, amounts and lengths as arrays, and their totals (index:
        the shape's); a shape with an amount too large for the loop totals ``EXACT``."""
        shapes = sorted(self._shapes.values(), key=lambda shape: shape.index)
        count, width = len(shapes), self._width
        self._rows = np.zeros((count, width), dtype=np.int64)
        self._amounts = np.zeros((count, width), dtype=np.int64)
        self._lengths = np.zeros(count, dtype=np.int64)
        self._totals = []
        for shape in shapes:
            length = len(shape.rows)
            self._rows[shape.index, :length] = shape.rows
            self._lengths[shape.index] = length
            if all(0 <= amount < EXACT for amount in shape.amounts):
                self._amounts[shape.index, :length] = shape.amounts
                self._totals.append(sum(shape.amounts))
            else:
                self._totals.append(EXACT)  # never run in the loop


@dataclass(frozen=True, slots=True)
class _Shape:
    index: int
    request: dict[str, int]
    rows: tuple[int, ...]
    amounts: tuple[int, ...]


def _plain(control: Control, env: Envelope, keys: set[str]) -> tuple[PodSpec, str] | None:
    """The pod and its key, if ``env`` submits one the fold would route on its first
    hop to any shard, by capacity alone, with nothing else to do (when the router
    :meth:`~shards.router.Control.routes_by_capacity`); ``keys``: the run's so far."""
    event = env.event
    if type(event) is not PodSubmitted or env.producer == ROUTER or env.stream == RELAY:
        return None
    spec = event.pod
    if spec.group or spec.node_name or spec.node_selector or spec.required_affinity:
        return None
    if spec.depends_on:
        return None
    key = spec.key
    if key in keys or key in control.pods or key in control.outcomes or key in control.tried:
        return None
    namespace = spec.namespace
    if namespace in control.quotas and namespace not in control.quota_slices:
        return None  # its first pod slices the quota: left to the fold
    return spec, key


def _apply(control: Control, env: Envelope) -> tuple[int, list[Output]]:
    outputs = control.apply(env)
    return control.now, outputs

"""Compiled refresh of a pod shape's cached verdicts for the resource plugins.

Between two attempts of pods of one shape, a few nodes change (the pods placed
meanwhile). The framework refreshes the shape's cached filter verdict and local scores
on those nodes only (see ``Framework._shape_feasible``). With the default plugins, that
refresh is some forty numpy operations on arrays of a few dozen elements, and numpy's
cost per call, not the arithmetic, is most of a pod's scheduling time. This module does
the same refresh for ``NodeResourcesFit`` (filter; ``LeastAllocated`` or
``MostAllocated`` score) and ``NodeResourcesBalancedAllocation`` (two resources) in one
compiled loop (numba), slot by slot, with the same integer and floating-point
operations in the same order as the numpy code in :mod:`engine.plugins.fit`, so the
results are bit for bit the same. Property tests compare the two paths decision by
decision. Where the shape's scores carry a best-node index (large shards), the same
loop, given the index's arrays, keeps the index's block maxima in step as it writes
(:meth:`engine.framework.best.BestIndex.follows`; the block whose last maximum fell is
read again once, at the end).

Any other plugin, strategy or resource count keeps the numpy path. So does everything
when numba is missing or the edge turned it off (:func:`configure`; the command line
reads ``SHOAL_NO_JIT``: the engine reads no environment).

Loading numba and the compiled code costs about 0.7 s (from numba's cache), so it
happens only when a refresh first needs it (more nodes changed than the plain-Python
path handles well), or at start in processes that schedule for long (:func:`warm_up`):
a small simulation never pays for it. Loading it also installs the compiled column
update of ``ClusterState.assume`` and ``forget`` (:func:`engine.model.state.use_compiled_columns`)
and the best-node index's refresh and selection (:func:`engine.framework.best.use_compiled`).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.framework import best
from engine.model.state import Bools, ClusterState, Ints, Request, use_compiled_columns
from engine.plugins.fit import NodeResourcesBalancedAllocation, NodeResourcesFit
from engine.plugins.normalize import MAX_NODE_SCORE

NONE, LEAST, MOST = 0, 1, 2
"""``fit_mode``: no Fit score (the plugin does not score, or scores no resource here)."""

Refresh = Callable[..., None]
_EMPTY = np.zeros(0, dtype=np.int64)


_settings = {"jit": True}


def configure(*, jit: bool = True, cache_dir: str | None = None) -> None:
    """Set by the edge before the first engine is built: whether the compiled refresh
    may be used, and where numba caches what it compiles (None: numba's default, beside
    this module or in ``$NUMBA_CACHE_DIR``)."""
    _settings["jit"] = jit
    if cache_dir is not None and jit and importlib.util.find_spec("numba") is not None:
        import numba

        numba.config.CACHE_DIR = cache_dir  # type: ignore[attr-defined]


def available() -> bool:
    """Whether the compiled refresh may be used (numba installed, not turned off)."""
    return _settings["jit"] and importlib.util.find_spec("numba") is not None


def _compile() -> Refresh | None:
    """The compiled refresh; given a best-node index's ``blocks``, ``counts`` and
    ``shift`` too, it keeps the index in step. Left out, numba compiles a version
    without them (defaults: numba's dispatch costs per argument passed, and less
    than a compiled wrapper's call)."""
    if not available():
        return None
    _register_helpers()

    def refresh(
        slots: Ints,
        static: Bools,
        columns: Ints,
        p: Ints,
        feasible: Bools,
        local: Ints,
        masked: Ints,
        blocks: Ints | None = None,
        counts: Ints | None = None,
        shift: int = 0,
    ) -> None:  # pragma: no cover - compiled; its twin is engine.plugins.fit
        alloc, used, free, nonzero = columns[0], columns[1], columns[2], columns[3]
        fit_mode, fit_weight, bal_weight = p[0], p[1], p[2]
        n_req, n_fit, n_bal = p[3], p[4], p[5]
        req = 6  # rows, then amounts
        fit = req + 2 * n_req  # rows, weights, wanted amounts
        bal = fit + 3 * n_fit  # rows, wanted amounts
        for i in range(slots.shape[0]):
            s = slots[i]
            ok = static[s]
            if ok:
                for j in range(n_req):
                    if free[p[req + j], s] < p[req + n_req + j]:
                        ok = False
                        break
            feasible[s] = ok
            total = 0
            if fit_mode != NONE:
                num = 0
                den = 0
                for j in range(n_fit):
                    row = p[fit + j]
                    a = alloc[row, s]
                    if a <= 0:
                        continue
                    r = nonzero[row, s] + p[fit + 2 * n_fit + j]
                    if fit_mode == LEAST:
                        v = 0 if r > a else (a - r) * MAX_NODE_SCORE // a
                    else:
                        v = (r if r < a else a) * MAX_NODE_SCORE // a
                    weight = p[fit + n_fit + j]
                    num += v * weight
                    den += weight
                total += (num // max(den, 1)) * fit_weight
            if bal_weight != 0:
                if n_bal == 0:
                    total += MAX_NODE_SCORE * bal_weight
                else:
                    r0, r1 = p[bal], p[bal + 1]
                    a0 = alloc[r0, s]
                    a1 = alloc[r1, s]
                    if a0 > 0 and a1 > 0:
                        f0 = (used[r0, s] + p[bal + 2]) / a0
                        f1 = (used[r1, s] + p[bal + 3]) / a1
                        f0 = f0 if f0 < 1.0 else 1.0
                        f1 = f1 if f1 < 1.0 else 1.0
                        total += int((1.0 - abs((f0 - f1) / 2)) * MAX_NODE_SCORE) * bal_weight
                    else:
                        total += MAX_NODE_SCORE * bal_weight
            local[s] = total
            new = total if ok else -1
            old = masked[s]
            masked[s] = new
            if blocks is not None and counts is not None:  # (numba prunes it if left out)
                # the block maxima as BestIndex's refresh keeps them, write by write
                b = s >> shift
                blocks[b], counts[b] = best.follow(blocks[b], counts[b], old, new)
        if blocks is not None and counts is not None:  # those whose maximum fell, again
            for i in range(slots.shape[0]):
                b = slots[i] >> shift
                if blocks[b] == best.PENDING:
                    blocks[b], counts[b] = best.block_top(masked, b, shift)

    return jit(refresh)


def jit(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` compiled by numba (which must be :func:`available`), cached on disk
    where it can be; compiled at its first call."""
    import numba

    try:
        compiled: Callable[..., Any] = numba.njit(cache=True, nogil=True)(function)
    except RuntimeError:  # no writable cache directory: compile in every process
        compiled = numba.njit(cache=False, nogil=True)(function)
    return compiled


@functools.cache
def _register_helpers() -> None:
    """Let the compiled refreshes call the best-node index's block helpers
    (:func:`engine.framework.best.follow` and :func:`~engine.framework.best.block_top`,
    plain functions there, which the engine imports without numba): numba compiles
    them into each compiled caller. Once per process, before the first compile.

    numba's cache on disk knows a compiled function by its own file only: after a change
    to these helpers, touch this file (or remove its cached ``*.nbi``/``*.nbc``) so that
    the refreshes here are compiled again (an installed release replaces both files)."""
    from numba.extending import register_jitable

    register_jitable(best.follow)
    register_jitable(best.block_top)


def warm_up() -> None:
    """Load the compiled refresh now rather than at the first refresh that needs it."""
    refresh_kernel()


_LOADED = [False]
"""Whether :func:`refresh_kernel` was called (and compiled, or found it cannot be)."""


def loaded() -> bool:
    """Whether the refresh is loaded (asked for every pod: a flag, not ``cache_info``)."""
    return _LOADED[0]


@functools.cache
def refresh_kernel() -> Refresh | None:
    """The compiled refresh, or None. Compiled (or loaded from numba's cache on disk)
    on the first call in a process, which then runs it once on empty arrays, so that
    the first attempt does not pay for it."""
    refresh = _compile()
    if refresh is not None:
        flags = np.zeros(0, dtype=bool)
        params = np.zeros(6, dtype=np.int64)
        columns = np.zeros((4, 1, 0), dtype=np.int64)
        refresh(_EMPTY, flags, columns, params, flags, _EMPTY, _EMPTY)
        refresh(_EMPTY, flags, columns, params, flags, _EMPTY, _EMPTY, _EMPTY, _EMPTY, 0)
        add = jit(_add_column)
        delta = np.zeros((4, 1), dtype=np.int64)
        for writeable in (True, False):  # placed pods' deltas are read-only; padded not
            delta.flags.writeable = writeable
            add(np.zeros((4, 1, 1), dtype=np.int64), np.zeros((1, 1), dtype=np.int64), 0, delta, 1)
        use_compiled_columns(add)
        best.use_compiled(index_kernel())
    _LOADED[0] = True
    return refresh


@functools.cache
def index_kernel() -> best.RefreshSelect | None:
    """The best-node index's compiled refresh and selection
    (:func:`engine.framework.best.refresh_select`), or None; loaded and run once as
    :func:`refresh_kernel` is."""
    if not available():
        return None
    _register_helpers()
    select: best.RefreshSelect = jit(best.refresh_select)
    one = np.zeros(1, dtype=np.int64)
    select(one, one.copy(), one.copy(), _EMPTY, _EMPTY, True, 1, 0, 0)
    return select


def _add_column(
    columns: Ints, by_priority: Ints, slot: int, delta: Ints, sign: int
) -> None:  # pragma: no cover - compiled; its twin is ClusterState.assume's numpy
    for k in range(delta.shape[0]):
        for r in range(delta.shape[1]):
            columns[k, r, slot] += sign * delta[k, r]
    for r in range(delta.shape[1]):
        by_priority[r, slot] += sign * delta[1, r]


Params = Ints
"""A shape's arguments, packed: modes and weights, counts, then the rows and amounts."""


class ResourceKernel:
    """The compiled refresh for one profile: which of its plugins it stands in for and,
    per request and resource count, the arguments it takes (built once)."""

    def __init__(
        self,
        fit: NodeResourcesFit,
        fit_weight: int,
        balanced: NodeResourcesBalancedAllocation | None,
        balanced_weight: int,
    ) -> None:
        self.fit = fit
        self.fit_weight = fit_weight
        self.balanced = balanced
        self.balanced_weight = balanced_weight
        self._params: dict[tuple[Request, int], Params | None] = {}

    @classmethod
    def for_plugins(
        cls, dynamic_filters: list[Any], local_scores: list[tuple[Any, int]]
    ) -> ResourceKernel | None:
        """The kernel for a profile whose only dynamic filter is ``NodeResourcesFit`` and
        whose local scores are Fit (``LeastAllocated``/``MostAllocated``) and
        BalancedAllocation, at most once each; None for any other profile."""
        if not available() or len(dynamic_filters) != 1:
            return None
        fit = dynamic_filters[0]
        if type(fit) is not NodeResourcesFit:
            return None
        fit_weight, balanced, balanced_weight = 0, None, 0
        for plugin, weight in local_scores:
            if plugin is fit and fit.strategy in ("LeastAllocated", "MostAllocated"):
                if fit_weight:
                    return None
                fit_weight = weight
            elif type(plugin) is NodeResourcesBalancedAllocation and balanced is None:
                balanced, balanced_weight = plugin, weight
            else:
                return None
        return cls(fit, fit_weight, balanced, balanced_weight)

    @staticmethod
    def worth(changed: int, scalar_limit: int) -> bool:
        """Refresh ``changed`` nodes with the kernel? Yes once it is loaded; before,
        only for more than the plain-Python path refreshes well (``scalar_limit``)."""
        return changed > scalar_limit or loaded()

    def params(self, request: Request, state: ClusterState) -> Params | None:
        """The per-shape arguments, or None when this shape needs the numpy path
        (BalancedAllocation over other than two resources)."""
        key = (request, len(state.resources))
        if key in self._params:
            return self._params[key]
        if len(self._params) > 4096:
            self._params.clear()
        found = self._build(request, state)
        self._params[key] = found
        return found

    def _build(self, request: Request, state: ClusterState) -> Params | None:
        fit_mode = NONE
        fit_rows: list[int] = []
        fit_weights: list[int] = []
        fit_wanted: list[int] = []
        if self.fit_weight:
            prep = self.fit._prep.get(request, state, scored=True)
            if prep is not None:
                fit_rows, fit_weights, fit_wanted, _ = self.fit._prep.scalar(request, state, prep)
                fit_mode = LEAST if self.fit.strategy == "LeastAllocated" else MOST
        bal_rows: list[int] = []
        bal_wanted: list[int] = []
        if self.balanced is not None:
            prep = self.balanced._prep.get(request, state, scored=False)
            if prep is not None:
                bal_rows, _, bal_wanted, _ = self.balanced._prep.scalar(request, state, prep)
                if len(bal_rows) != 2:
                    return None
        packed = [
            *(fit_mode, self.fit_weight, self.balanced_weight),
            *(len(request), len(fit_rows), len(bal_rows)),
            *(row for row, _ in request),
            *(amount for _, amount in request),
            *fit_rows,
            *fit_weights,
            *fit_wanted,
            *bal_rows,
            *bal_wanted,
        ]
        return np.array(packed, dtype=np.int64)

    def run(
        self,
        slots: list[int] | Ints,
        static: Bools,
        state: ClusterState,
        params: Params,
        feasible: Bools,
        local: Ints,
        masked: Ints,
        index: best.BestIndex | None = None,
    ) -> bool:
        """Refresh ``feasible``, ``local`` and ``masked`` at ``slots``; False (nothing
        done) if the kernel cannot be compiled here. ``index``: a best-node index over
        ``masked`` that :meth:`~engine.framework.best.BestIndex.follows` these writes:
        its block maxima are kept in step as the slots are written (instead of being
        told the slots and their old values, and refreshed at the next selection)."""
        refresh = refresh_kernel()
        if refresh is None:
            return False
        at = np.asarray(slots, dtype=np.int64)
        if index is None:
            refresh(at, static, state._columns, params, feasible, local, masked)
        else:
            refresh(
                at,
                static,
                state._columns,
                params,
                feasible,
                local,
                masked,
                index.blocks,
                index.counts,
                index.shift,
            )
        return True

"""Fragmentation gradient descent (FGD), the base of shoal's own GPU policy.

**GpuFragmentation** (FGD, Weng et al., ATC'23): place a pod on the node, and a sharing
pod on the card, where the node's fragmentation ``F_n`` against the target workload
(:mod:`engine.plugins.gpu.fragment`) grows least. The card goes to the framework through
``choose_cards`` (least ΔF, then least free milli, then lowest index). ``F_n`` before
placement is kept per slot and refreshed only where the journal says a node changed;
``ΔF`` per pod shape likewise (:class:`CachedScore`). Both are computed by one compiled
loop over the changed nodes (:mod:`engine.plugins.gpu.compiled`) where numba may be used,
else by the numpy functions of :mod:`engine.plugins.gpu.fragment`: the same integers.

Score (arg ``resolution``): ``simulator`` (default) is the published simulator's
``int(100 * sigmoid(-ΔF / 1000))``, ΔF in milli-GPU at the workload's probabilities,
evaluated with integer thresholds (so exact and the same everywhere); ``exact`` is
``bound - ΔF`` in the workload's integer weights (every difference counts). Ties go to
the smallest node name (``tieBreak``, see :mod:`engine.plugins.gpu.baselines`). On
the default workload the simulator's resolution leaves 5.0% of GPU unallocated and the
exact one 5.9%: ΔF differences of a few milli-GPU are noise against the workload's
uncertainty, and the coarse score lets the name order consolidate pods.

ShoalGpu (:mod:`engine.plugins.gpu.shoal`) builds on this class.

Args (``pluginConfig``; ShoalGpu takes the same)::

    targetWorkload: [...]   # see engine.plugins.gpu.workload; absent: learned
    coverage: 0.95          # learned workloads: shapes kept
    resolution: simulator   # or exact
    tieBreak: name          # or none

A learned workload counts the shapes of the pods the plugin scores (each pod once) and
is rebuilt when the count reaches a power of two, then every 1,024 pods: deterministic
from the log, as replay needs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.model.devices import WHOLE
from engine.model.pods import PodInfo
from engine.model.resources import CPU, MEMORY
from engine.model.state import Bools, ClusterState, Ints
from engine.plugins.gpu.cache import CachedScore, Entry, check_args, parse_tie_break
from engine.plugins.gpu.compiled import PARAMS, REFRESH, SHARE, WHOLE_CARDS, Kernel, kernel
from engine.plugins.gpu.fragment import (
    Resolved,
    after_whole,
    fragmentation,
    fragmentation_after_share,
    largest_room,
    model_codes,
    node_memory,
    node_states,
    resolve,
)
from engine.plugins.gpu.workload import (
    Shape,
    TargetWorkload,
    parse_coverage,
    parse_workload,
    pod_shape,
)
from events.errors import InputError

_ARGS: Final = frozenset({"targetWorkload", "coverage", "resolution", "tieBreak"})
RESOLUTIONS: Final = ("simulator", "exact")
LEVELS: Final = 100
_RELEARN_EVERY: Final = 1024
_NO_PARAMS: Final = np.zeros(PARAMS, dtype=np.int64)
_EMPTY: Final = np.zeros(0, dtype=np.int64)


def pod_memory(pod: PodInfo) -> int:
    """Bytes of memory ``pod`` asks for."""
    for row, amount in pod.request:
        if row == MEMORY:
            return amount
    return 0


def _view_of(pod: PodInfo) -> tuple[int, int, int, int, int]:
    """The compiled kernel's view of ``pod``: its mode (SHARE for one shared card, else
    WHOLE_CARDS), cpu, memory, milli-GPU per card and cards (0 and 0 without a GPU).
    :meth:`GpuFragmentation.key`, ``_request`` and ``pod_mode`` all read it here."""
    pod_cpu = pod_mem = 0
    for row, amount in pod.request:
        if row == CPU:
            pod_cpu = amount
        elif row == MEMORY:
            pod_mem = amount
    gpu = pod.gpu
    if gpu is None:
        return WHOLE_CARDS, pod_cpu, pod_mem, 0, 0
    mode = SHARE if not gpu.whole and gpu.cards == 1 else WHOLE_CARDS
    return mode, pod_cpu, pod_mem, gpu.need.milli, gpu.cards


class GpuFragmentation(CachedScore):
    name = "GpuFragmentation"
    counts_memory = False
    """Count the target shapes' memory (where given) as a fit condition, like cpu."""

    def __init__(self, args: Mapping[str, Any], where: str, handle: Handle | None = None) -> None:
        super().__init__()
        self.handle = handle
        """The engine whose submitted pod shapes a learned workload comes from (None:
        the pods this plugin scores, for a plugin used alone)."""
        self._learned_version = -1
        """The version of the engine's shape counts the workload was learnt from (apart
        from :class:`CachedScore`'s ``_version``, the state's ``static_version``)."""
        check_args(args, _ARGS, where)
        self.tie_break = parse_tie_break(args, where)
        resolution = args.get("resolution", "simulator")
        if resolution not in RESOLUTIONS:
            raise InputError(
                f"must be one of {', '.join(RESOLUTIONS)}, got {resolution!r}",
                location=f"{where}.resolution",
            )
        self.exact = resolution == "exact"
        self._thresholds = np.zeros(0, dtype=np.int64)
        raw = args.get("targetWorkload")
        self.given = None if raw is None else parse_workload(raw, f"{where}.targetWorkload")
        if raw is not None and "coverage" in args:
            raise InputError("applies to learned workloads only", location=f"{where}.coverage")
        self.coverage = parse_coverage(args.get("coverage"), f"{where}.coverage")
        self.workload = self.given or TargetWorkload((), ())
        self._seen: dict[str, None] = {}
        self._counts: dict[Shape, int] = {}
        self._shapes: Resolved | None = None
        self._frag = np.zeros(0, dtype=np.int64)
        self._tally = np.zeros((0, 0), dtype=np.int64)
        """Per slot, the compiled kernel's card counts and small-card sums per level, kept
        with ``_frag`` (:mod:`engine.plugins.gpu.compiled`)."""
        self._models = np.zeros(0, dtype=np.int64)
        self._position = 0
        self._kernel: Kernel | None = None
        """The compiled scoring (None: the numpy path), loaded at the first score."""
        self._pending = _EMPTY
        """Slots whose F the next kernel call refreshes first."""
        self._memory_aware = False
        self._mark = _EMPTY
        """Per slot, the kernel call that last did it (:meth:`update`: a slot the
        journal lists twice is done once)."""
        self._stamp = 0
        self._keyed: PodInfo | None = None
        self._key: tuple[Any, ...] = ()
        self._view = (WHOLE_CARDS, 0, 0, 0, 0)
        """Of the pod :meth:`key` saw last: the kernel's mode, its cpu, memory,
        milli-GPU per card and cards."""

    def __repr__(self) -> str:
        source = "given" if self.given is not None else f"learned from {len(self._seen)} pods"
        return f"{type(self).__name__}(shapes={len(self.workload.shapes)}, {source})"

    # ------------------------------------------------------------------ the workload

    @property
    def learns_shapes(self) -> bool:
        """Whether its workload is learnt from the engine's shapes (none was given)."""
        return self.given is None

    def weights(self, workload: TargetWorkload) -> TargetWorkload:
        """The weights the gradient uses (FGD: the workload's own)."""
        return workload

    def _learn(self, pod: PodInfo) -> None:
        if self.given is not None:
            return
        if self.handle is not None:
            self._relearn()
            return
        if pod.key in self._seen:
            return
        self._seen[pod.key] = None
        shape = pod_shape(pod)
        self._counts[shape] = self._counts.get(shape, 0) + 1
        seen = len(self._seen)
        if (seen & (seen - 1)) == 0 or seen % _RELEARN_EVERY == 0:
            self.workload = TargetWorkload.from_counts(self._counts, self.coverage)
            self._state = None  # every cached score is against the old workload

    def _relearn(self) -> None:
        """The workload from the engine's counts (its state: a replay, or a restore from a
        snapshot, learns what the run learnt), re-derived when their copy changes. Asked
        before scoring a pod, and before judging nodes for a move (:meth:`potential`,
        :meth:`largest_room`): a shard of several may consolidate after a pass that
        scored no pod (the coordinator's parts name their nodes), and judged its nodes
        against the workload it knew before the coordinator told it the new one, where
        one shard, having scored the pass's pods, judges them against the new."""
        if self.given is not None or self.handle is None:
            return
        counts = self.handle.shapes
        if counts.version != self._learned_version:
            self._learned_version = counts.version
            learned = {Shape(*key): count for key, count in counts.learned.items()}
            self.workload = TargetWorkload.from_counts(learned, self.coverage)
            self._state = None  # every cached score is against the old workload

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools) -> Ints:
        self._learn(pod)
        return super().score(cycle, pod, state, feasible)

    # ------------------------------------------------------------------ per-node caches

    def key(self, pod: PodInfo) -> tuple[Any, ...]:
        if pod is self._keyed:  # asked again for the card of the pod just scored
            return self._key
        # the kernel's view of the request, whose cpu and memory the shape key shares
        view = self._view = _view_of(pod)
        _, pod_cpu, pod_mem, _, _ = view
        gpu = pod.gpu
        key: tuple[Any, ...] = (pod_cpu,) if gpu is None else (pod_cpu, gpu.cards, gpu.need)
        if self.counts_memory:
            key = (*key, pod_mem)
        self._keyed, self._key = pod, key
        return key

    def _memory(self, state: ClusterState, slots: Ints) -> Ints | None:
        """Free memory of ``slots`` where the workload counts memory (else None)."""
        assert self._shapes is not None
        return node_memory(state, slots) if self._shapes.memory_aware else None

    def reset(self, state: ClusterState) -> None:
        self._shapes = resolve(self.weights(self.workload), state, self.counts_memory)
        # int(100 * sigmoid(x)) >= k  <=>  x >= logit(k / 100), x = -ΔF / (Σw * 1000)
        total = int(self._shapes.weight.sum())
        self._thresholds = np.array(
            [math.ceil(math.log(k / (LEVELS - k)) * total * WHOLE) for k in range(1, LEVELS)],
            dtype=np.int64,
        )
        self._models = model_codes(state)
        slots = np.arange(state.capacity, dtype=np.int64)
        self._kernel = kernel()
        self._pending = _EMPTY
        self._memory_aware = self._shapes.memory_aware
        self._mark = np.zeros(state.capacity, dtype=np.int64)
        self._stamp = 0
        if self._kernel is not None:
            self._frag = np.zeros(state.capacity, dtype=np.int64)
            self._tally = np.zeros((state.capacity, 2 * len(self._shapes.levels)), dtype=np.int64)
            self.compiled(state, slots, REFRESH)
        else:
            cpu, free = node_states(state, slots)
            self._frag = fragmentation(
                self._shapes, cpu, free, self._models, self._memory(state, slots)
            )
        self._position = state.journal_end

    def prepare(self, state: ClusterState) -> None:
        changed = state.changed_since(self._position)
        if changed is None:
            self.reset(state)
            return
        if changed and self._kernel is not None:
            # refreshed by the next kernel call, before it scores (one call per pod)
            pending = np.array(changed, dtype=np.int64)
            if self._pending.size:
                pending = np.concatenate([self._pending, pending])
            self._pending = pending
        elif changed:
            assert self._shapes is not None
            slots = np.unique(np.array(changed, dtype=np.int64))
            cpu, free = node_states(state, slots)
            self._frag[slots] = fragmentation(
                self._shapes, cpu, free, self._models[slots], self._memory(state, slots)
            )
        self._position = state.journal_end

    def node_fragmentation(self, state: ClusterState) -> Ints:
        """F_n of every slot now (weights as :meth:`weights` gives them)."""
        self._sync(state)
        self.prepare(state)
        if self._pending.size:
            self.compiled(state, _EMPTY, REFRESH)
        return self._frag

    def potential(self, state: ClusterState, slots: Ints) -> Ints:
        """F_n of ``slots`` now: what a move is judged by (the rescheduler's plans;
        :class:`~engine.framework.interfaces.PotentialPlugin`)."""
        self._relearn()
        frag: Ints = self.node_fragmentation(state)[slots]
        return frag

    def largest_room(self, state: ClusterState, slots: Ints) -> Ints:
        """Per slot of ``slots``, how many pods of the target workload's largest GPU
        shape could start on it now (:func:`~engine.plugins.gpu.fragment.largest_room`):
        what consolidation keeps (:mod:`engine.passes.consolidate`)."""
        self._relearn()
        self._sync(state)  # the shapes resolved against this state and workload
        assert self._shapes is not None
        cpu, free = node_states(state, slots)
        return largest_room(
            self._shapes, cpu, free, self._models[slots], self._memory(state, slots)
        )

    # ------------------------------------------------------------------ scores

    def deltas(self, pod: PodInfo, state: ClusterState, slots: Ints) -> tuple[Ints, Ints, Ints]:
        """ΔF of ``pod`` on each of ``slots`` (its best card for a share), that card
        (-1: whole cards or none) and the node's idle GPU after it."""
        shapes = self._shapes
        assert shapes is not None
        cpu, free = node_states(state, slots)
        models = self._models[slots]
        before = self._frag[slots]
        pod_cpu = pod_shape(pod).cpu
        memory = self._memory(state, slots)
        if memory is not None:
            memory = memory - pod_memory(pod)
        gpu = pod.gpu
        if gpu is not None and not gpu.whole and gpu.cards == 1:
            milli = gpu.need.milli
            width = free.shape[1]
            after = fragmentation_after_share(shapes, cpu, free, models, pod_cpu, milli, memory)
            possible = free >= milli
            delta = after - before[:, None]
            remainder = self.remainder_change(free, milli)
            if remainder is not None:
                delta = delta + remainder
            # least ΔF, then the card with least free milli, then the lowest index
            order = (delta * (WHOLE + 1) + free) * 64 + np.arange(width)[None, :]
            order = np.where(possible.reshape(-1, width), order, np.iinfo(np.int64).max)
            card = order.argmin(axis=1)
            rows = np.arange(slots.shape[0])
            ok = possible.reshape(-1, width)[rows, card]
            best = np.where(ok, delta[rows, card], 0)
            idle = free.sum(axis=1) - milli
            return best, np.where(ok, card, -1), idle
        cpu_a, free_a = after_whole(cpu, free, pod_cpu, gpu)
        after = fragmentation(shapes, cpu_a, free_a, models, memory)
        return after - before, np.full(slots.shape[0], -1, dtype=np.int64), free_a.sum(axis=1)

    def remainder_change(self, free: Ints, milli: int) -> Ints | None:
        """A term added to the ΔF of a share of ``milli`` per card of ``free`` (K, W)
        before its card is chosen (ShoalGpu's card remainders; FGD: none)."""
        return None

    def update(
        self, pod: PodInfo, state: ClusterState, entry: Entry, changed: list[int] | None
    ) -> None:
        """With the compiled kernel: one call refreshes F where the journal says,
        scores ``changed`` (each once) and writes the tie-broken scores and cards into
        ``entry`` (what :meth:`CachedScore.update` does with numpy around
        :meth:`evaluate`: the same integers)."""
        run = self._kernel
        if run is None:
            super().update(pod, state, entry, changed)
            return
        # (prepare and compiled, inlined: this runs once per pod scored)
        end = state.journal_end
        if changed is None:
            slots: Ints = np.arange(state.high_water, dtype=np.int64)
        else:
            slots = np.array(changed, dtype=np.int64)
        refresh = self._pending
        if self._position != end:
            # the slots changed since the last call: the tail of ``changed`` where that
            # reaches back so far (one conversion, not two), else the journal's
            since = self._position - (end - slots.shape[0])
            if changed is not None and not refresh.size and since >= 0:
                refresh = slots[since:]
            else:
                fresh = state.changed_since(self._position)
                if fresh is None:
                    self.reset(state)
                    refresh = self._pending
                elif refresh.size:
                    refresh = np.concatenate([refresh, np.array(fresh, dtype=np.int64)])
                else:
                    refresh = np.array(fresh, dtype=np.int64)
        self._position = end
        self._pending = _EMPTY
        self._stamp += 2
        params, pressure = self.terms(pod)
        quantise = not self.exact
        if pod is not self._keyed:
            self.key(pod)
        mode, pod_cpu, pod_mem, milli, cards = self._view
        self._run(
            mode,
            refresh,
            slots,
            state,
            (pod_cpu, pod_mem if self._memory_aware else 0, milli, cards),
            params,
            pressure,
            quantise,
            (
                entry.scores,
                entry.cards,
                self._mark,
                self._stamp,
                0 if quantise else self.offset(),
                state.capacity + 1 if self.tie_break else 0,
            ),
        )

    def _request(self, pod: PodInfo | None) -> tuple[int, int, int, int]:
        """The kernel's view of ``pod``'s request: cpu, memory (0 unless memory-aware),
        milli-GPU per card and cards (all 0 for no pod)."""
        if pod is None:
            return 0, 0, 0, 0
        _, pod_cpu, pod_mem, milli, cards = _view_of(pod)
        return pod_cpu, pod_mem if self._memory_aware else 0, milli, cards

    def _run(
        self,
        mode: int,
        refresh: Ints,
        slots: Ints,
        state: ClusterState,
        request: tuple[int, int, int, int],
        params: Ints | None,
        pressure: Ints | None,
        quantise: bool,
        out: tuple[Ints, Ints, Ints, int, int, int],
    ) -> None:
        """One call of the compiled kernel over ``slots`` (after ``refresh``), its
        outputs and their form given by ``out`` (a shape's cache by slot, or two arrays by
        position)."""
        run = self._kernel
        shapes = self._shapes
        assert run is not None and shapes is not None
        free = state.free
        run(
            mode,
            refresh,
            slots,
            free[CPU],
            free[MEMORY],
            state.cards.free,
            self._models,
            self._frag,
            self._tally,
            shapes.cpu,
            shapes.levels,
            shapes.level,
            shapes.cards,
            shapes.weight,
            shapes.allowed,
            shapes.gpu,
            shapes.memory,
            self._memory_aware,
            *request,
            _NO_PARAMS if params is None else params,
            _NO_PARAMS if pressure is None else pressure,
            self._thresholds,
            quantise,
            *out,
            self.rank,
        )

    def terms(self, pod: PodInfo) -> tuple[Ints | None, Ints | None]:
        """The kernel's ``params`` and ``pressure`` for ``pod`` (FGD: none)."""
        return None, None

    def offset(self) -> int:
        """The exact resolution's score is ``offset - ΔF`` (never negative)."""
        assert self._shapes is not None
        return self._shapes.bound

    def compiled(
        self,
        state: ClusterState,
        slots: Ints,
        mode: int,
        pod: PodInfo | None = None,
        params: Ints | None = None,
        pressure: Ints | None = None,
        quantise: bool = False,
    ) -> tuple[Ints, Ints]:
        """:meth:`deltas` (ΔF and card; with ShoalGpu's terms where ``params`` turns
        them on) or, for ``mode`` REFRESH, F into the per-slot cache, by the compiled
        kernel (:mod:`engine.plugins.gpu.compiled`), which must be available. The
        slots :meth:`prepare` left pending are refreshed first, in the same call. With
        ``quantise``, :meth:`quantised` of ΔF rather than ΔF (:meth:`update` calls
        the kernel itself, with the scores written by slot into a shape's cache)."""
        delta = np.empty(slots.shape[0], dtype=np.int64)  # the kernel writes every entry
        card = np.empty(slots.shape[0], dtype=np.int64)
        refresh, self._pending = self._pending, _EMPTY
        # outputs by position, not into a cache by slot
        out = (delta, card, _EMPTY, 0, 0, 0)
        self._run(mode, refresh, slots, state, self._request(pod), params, pressure, quantise, out)
        return delta, card

    def pod_mode(self, pod: PodInfo) -> int:
        """The kernel's mode for ``pod``: SHARE for one shared card, else WHOLE_CARDS."""
        return _view_of(pod)[0]

    def quantised(self, delta: Ints) -> Ints:
        """The simulator's score of a change ``delta``: ``int(100 * sigmoid(-ΔF / 1000))``
        with ΔF in milli-GPU at the workload's probabilities, as integer thresholds."""
        return np.searchsorted(self._thresholds, -delta, side="right").astype(np.int64)

    def evaluate(self, pod: PodInfo, state: ClusterState, slots: Ints) -> tuple[Ints, Ints]:
        assert self._shapes is not None
        if self._kernel is not None:
            mode = self.pod_mode(pod)
            delta, card = self.compiled(state, slots, mode, pod, quantise=not self.exact)
            if not self.exact:
                return delta, card
        else:
            delta, card, _ = self.deltas(pod, state, slots)
        if self.exact:
            return self._shapes.bound - delta, card
        return self.quantised(delta), card

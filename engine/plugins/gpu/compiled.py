"""The compiled scoring of the fragmentation policies (FGD and ShoalGpu), slot by slot.

Between two attempts of pods of one shape a few dozen nodes change, and scoring them
with the numpy code of :mod:`engine.plugins.gpu.fragment` (and ShoalGpu's stranded and
pressure terms) is some sixty numpy operations on arrays of a few dozen rows: numpy's
cost per call, not the arithmetic, was most of a pod's time (ShoalGpu placed under half
the pods per second GpuBestFit does). :func:`kernel` does the same per slot in one
compiled loop (numba): the node's fragmentation ``F`` (the refresh after a placement),
or the pod's ``ΔF`` on it, the card a sharing pod takes there (the same order key as
:meth:`GpuFragmentation.deltas`: least ΔF, then least free milli, then lowest index),
the node's idle GPU after it and, for ShoalGpu, its stranded-GPU and model-pressure
terms and the change of its card-remainder cost (a table by free milli in ``params``,
added to a share's ΔF on each card before the card is chosen). Everything is int64
with the same operations as the numpy twin (floor division, arithmetic shifts), so the
results are the same integers; property tests compare the two paths, score by score
and placement by placement.

Cost per scored pod: one call, no numpy operation around it (the policy's score, its
tie-break by node name and the card are written straight into the shape's cached rows
by slot, each slot once however often the journal names it), and per slot of the
changed nodes: ``levels`` for the card counts (``tally``: per node and level, the cards
that hold it and the free milli of the others, counted over the cards, ``levels x
cards``, only where F is refreshed after a placement), then ``shapes`` per distinct
free value among the cards that hold a sharing pod (cards equally free give the same
F, and the lowest index among them wins the tie; a machine of idle cards is one
variant, not eight). On the trace's ``default`` (1,213 nodes, 35 shapes, 13 levels, 8
cards) a pod rescores about 20 nodes, and about 200 of its 10,800 pods rescore all of
them (a shape new, or not scored for more than ``REFRESH_LIMIT`` changes).

The numpy twin stays the path when numba is missing or the edge turned the compiled
code off (:func:`engine.plugins.kernels.configure`). Compiled (or loaded from numba's
disk cache) at the first score of a process that uses a fragmentation policy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

import numpy as np

from engine.model.devices import WHOLE
from engine.model.state import Bools, Ints
from engine.plugins.kernels import available, jit

REFRESH: Final = 0
"""``mode``: write each slot's F into ``frag`` (no pod)."""
WHOLE_CARDS: Final = 1
"""``mode``: a pod of whole cards (or none) takes the lowest-index idle cards."""
SHARE: Final = 2
"""``mode``: a pod sharing one card; every card that holds it is tried."""

P_STRANDED, P_GPU_SUM, P_CPU_SUM, P_MIB_SUM, P_TOTAL, P_MILLI, P_REMAINDER = range(7)
"""Indices of ``params``: ShoalGpu's terms on (1) or off (0), the GPU shapes' weighted
sums of milli-GPU, cpu and MiB, the workload's total weight, the pod's milli-GPU, and
the card-remainder term on (1) or off (0)."""
PARAMS: Final = 7
"""``params``' fixed part. With the remainder term on, ``params[PARAMS + r]`` follows
it, ``r`` = 0..WHOLE: the cost of a card left with ``r`` free milli
(:func:`engine.plugins.gpu.shoal.remainder_cost`)."""
_MIB_SHIFT: Final = 20
_PERMILLE: Final = 1000
_INT64_MAX: Final = np.iinfo(np.int64).max

Kernel = Callable[..., None]


def _run(
    mode: int,
    refresh: Ints,
    slots: Ints,
    cpu: Ints,
    memory: Ints,
    cards: Ints,
    models: Ints,
    frag: Ints,
    tally: Ints,
    s_cpu: Ints,
    s_levels: Ints,
    s_level: Ints,
    s_cards: Ints,
    s_weight: Ints,
    s_allowed: Bools,
    s_gpu: Bools,
    s_memory: Ints,
    use_memory: bool,
    pod_cpu: int,
    pod_memory: int,
    milli: int,
    n_cards: int,
    params: Ints,
    pressure: Ints,
    thresholds: Ints,
    quantise: bool,
    out_delta: Ints,
    out_card: Ints,
    mark: Ints,
    stamp: int,
    offset: int,
    tie: int,
    rank: Ints,
) -> None:  # pragma: no cover - compiled; its twin is fgd.deltas and shoal.evaluate
    """First F of the slots ``refresh`` into ``frag``, then per slot ``slots[i]``
    (state columns indexed by slot: free ``cpu`` and ``memory``, ``cards`` free milli
    per card (-1 absent), model ``models``, F before ``frag`` and its card counts
    ``tally``, both written by REFRESH) by ``mode``: see the
    module docstring. ``pod_memory`` is 0 where memory is not counted. Writes
    ``frag[s]`` (REFRESH) or ``out_delta[i]`` (ΔF, or with ``quantise`` the
    simulator's score of it against ``thresholds``) and ``out_card[i]``.

    With ``mark`` (one entry per slot; empty: off) the outputs are the policy's whole
    score, written by slot into a shape's cached rows: ``out_delta[s]`` is the quantised
    ΔF (``quantise``) or ``offset - ΔF``, then with ``tie`` (> 0) ``score * tie +
    rank[s]``; ``out_card[s]`` the card. A slot listed twice is done once (``mark[s]``
    set to ``stamp`` for ``refresh``, ``stamp + 1`` for ``slots``)."""
    width = cards.shape[1]
    shapes = s_weight.shape[0]
    levels = s_levels.shape[0]
    by_slot = mark.shape[0] > 0
    row = np.zeros(width, dtype=np.int64)
    count = np.zeros(levels, dtype=np.int64)
    small = np.zeros(levels, dtype=np.int64)
    count_w = np.zeros(levels, dtype=np.int64)
    small_w = np.zeros(levels, dtype=np.int64)
    fitting = np.zeros(shapes, dtype=np.int64)
    first = refresh.shape[0]
    for x in range(first + slots.shape[0]):
        if x < first:
            md = REFRESH
            i = 0
            s = refresh[x]
            if by_slot:
                if mark[s] == stamp:
                    continue
                mark[s] = stamp
        else:
            md = mode
            i = x - first
            s = slots[i]
            if by_slot:
                if mark[s] == stamp + 1:
                    continue
                mark[s] = stamp + 1
        total = 0
        for c in range(width):
            v = cards[s, c]
            v = max(v, 0)
            row[c] = v
            total += v
        column = models[s] + 1
        cpu_s = cpu[s]
        mem_s = memory[s]
        if md == REFRESH:
            cpu_a = cpu_s
            mem_a = mem_s
            variants = 1
        else:
            cpu_a = cpu_s - pod_cpu
            mem_a = mem_s - pod_memory
            variants = width if md == SHARE else 1
        idle_a = total
        taken = 0
        if md == WHOLE_CARDS:
            for c in range(width):
                if taken < n_cards and row[c] >= WHOLE:
                    row[c] -= WHOLE
                    taken += 1
            idle_a = total - taken * WHOLE
        elif md == SHARE:
            idle_a = total - milli
        # per level (a distinct per-card milli of the shapes): the cards that hold it
        # and the free milli of those that do not; counted when F is refreshed and kept
        # in ``tally`` (the node's cards as they are now), from which a pod's whole
        # cards (idle cards going to 0 free) take one count per card at levels above 0
        if md == REFRESH:
            for j in range(levels):
                need = s_levels[j]
                n = 0
                rest = 0
                for c in range(width):
                    if row[c] >= need:
                        n += 1
                    else:
                        rest += row[c]
                count[j] = n
                small[j] = rest
                tally[s, j] = n
                tally[s, levels + j] = rest
        else:
            for j in range(levels):
                n = tally[s, j]
                if taken > 0 and s_levels[j] > 0:
                    n -= taken
                count[j] = n
                small[j] = tally[s, levels + j]
        # per shape, what does not depend on the card a share takes: the shapes that
        # may fit (the others' fragment is the whole idle GPU) and their weight
        fits = 0
        rest_weight = 0
        for m in range(shapes):
            if (
                s_gpu[m]
                and s_allowed[m, column]
                and cpu_a >= s_cpu[m]
                and (not use_memory or mem_a >= s_memory[m])
            ):
                fitting[fits] = m
                fits += 1
            else:
                rest_weight += s_weight[m]
        best = _INT64_MAX
        card = -1
        delta = 0
        left = 0
        for w in range(variants):
            held = row[w] if md == SHARE else 0
            if md == SHARE:
                if held < milli:
                    continue
                # a card as free as a lower one gives the same F, and loses the tie
                seen = False
                for v in range(w):
                    if row[v] == held:
                        seen = True
                        break
                if seen:
                    continue
                # card w goes from ``held`` to ``left`` free milli
                left = held - milli
                for j in range(levels):
                    need = s_levels[j]
                    n = count[j]
                    rest = small[j]
                    if held >= need:
                        n -= 1
                    else:
                        rest -= held
                    if left >= need:
                        n += 1
                    else:
                        rest += left
                    count_w[j] = n
                    small_w[j] = rest
            else:
                for j in range(levels):
                    count_w[j] = count[j]
                    small_w[j] = small[j]
            f = rest_weight * idle_a
            for k in range(fits):
                m = fitting[k]
                j = s_level[m]
                if count_w[j] >= s_cards[m]:
                    f += s_weight[m] * small_w[j]
                else:
                    f += s_weight[m] * idle_a
            if md == SHARE:
                d = f - frag[s]
                if params[P_REMAINDER] != 0:
                    d += params[PARAMS + left] - params[PARAMS + held]
                order = (d * (WHOLE + 1) + held) * 64 + w
                if order < best:
                    best = order
                    card = w
                    delta = d
            elif md == REFRESH:
                frag[s] = f
            else:
                delta = f - frag[s]
        if md == REFRESH:
            continue
        if params[P_STRANDED] != 0:
            # stranded GPU after minus before (twin: shoal.stranded), then the pressure
            gpu_sum = params[P_GPU_SUM]
            cpu_sum = params[P_CPU_SUM]
            mib_sum = params[P_MIB_SUM]
            change = 0
            for k in range(2):
                sign = 1 if k == 0 else -1
                idle_x = total if k == 1 else (idle_a if idle_a > 0 else 0)
                cpu_x = cpu_s if k == 1 else cpu_a
                mem_x = mem_s if k == 1 else mem_a
                strand = 0
                if gpu_sum != 0:
                    if cpu_sum != 0:
                        v = (idle_x * cpu_sum - cpu_x * gpu_sum) // cpu_sum
                        strand = max(strand, v)
                    if mib_sum != 0:
                        v = (idle_x * mib_sum - (mem_x >> _MIB_SHIFT) * gpu_sum) // mib_sum
                        strand = max(strand, v)
                change += sign * strand
            weight = params[P_TOTAL]
            delta += weight * change
            delta += weight * params[P_MILLI] * pressure[column] // _PERMILLE
        if quantise:
            # np.searchsorted(thresholds, -delta, side="right"): how many are <= -delta
            low = 0
            high = thresholds.shape[0]
            while low < high:
                mid = (low + high) // 2
                if thresholds[mid] <= -delta:
                    low = mid + 1
                else:
                    high = mid
            delta = low
        if by_slot:
            score = delta if quantise else offset - delta
            if tie > 0:
                score = score * tie + rank[s]
            out_delta[s] = score
            out_card[s] = card
        else:
            out_delta[i] = delta
            out_card[i] = card


@functools.cache
def _compile() -> Kernel:
    """Compile (or load from numba's cache) and run once on empty arrays, so that the
    first score does not pay for it."""
    run = jit(_run)
    ints = np.zeros(0, dtype=np.int64)
    flags = np.zeros(0, dtype=np.bool_)
    params = np.zeros(PARAMS, dtype=np.int64)
    table = np.zeros((0, 0), dtype=np.int64)
    run(REFRESH, ints, ints, ints, ints, table, ints, ints, table, ints, ints, ints, ints, ints,
        np.zeros((0, 0), dtype=np.bool_), flags, ints, False, 0, 0, 0, 0, params, params,
        ints, False, ints, ints, ints, 0, 0, 0, ints)  # fmt: skip
    return run


def kernel() -> Kernel | None:
    """The compiled scoring, or None where it may not be used (see the module)."""
    if not available():
        return None
    return _compile()

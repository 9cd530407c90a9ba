"""ShoalGpu: shoal's own GPU placement policy, FGD's gradient plus what FGD leaves out.

FGD (:mod:`engine.plugins.gpu.fgd`) asks of each node only "which shapes of the target
workload still fit here now". On the Alibaba trace most of the GPU it leaves idle is lost
otherwise: single-card and sharing pods fail because every node with a free card has run
out of cpu or memory, and model-restricted pods fail because pods that could have run
anywhere took their models' cards. ShoalGpu scores a pod on a node by the change of

    F_n + W * S_n + W * milli * pressure(model_n) / 1000 + R_n

(W: the workload's total weight, so every term is in FGD's units of weighted milli-GPU):

* ``F_n``: FGD's fragmentation, with memory counted like cpu where the target workload
  gives the shapes' memory (a shape does not fit a node short of its memory).
* ``S_n``, **stranded GPU**: the node's idle milli-GPU that its free cpu (or memory)
  cannot feed at the workload's average cpu (memory) per GPU,
  ``max(0, G - C * gpu/cpu, G - M * gpu/memory)`` with the ratios of the GPU shapes'
  weighted sums. A pod that eats the cpu its node's idle cards need pays for them;
  cpu-only pods go to the nodes with cpu to spare per idle GPU.
* **model pressure**, charged per milli-GPU the pod takes on a node of model ``c``: the
  share of ``c``'s cards that the workload's model-restricted shapes are expected to
  need when the cluster's capacity has arrived, each restricted shape's GPU demand spread
  over its allowed models in proportion to their cards, capped at 1 (1000 permille).
  A pod that may run anywhere then keeps off the models restricted pods depend on.
* ``R_n``, **card remainders**: per card, ``16 * W`` per milli of its free GPU that
  the workload's one-card pods are expected to leave idle when they fill it in
  proportion to their weights (:func:`remainder_cost`). FGD's gradient sees a card
  left with 300 free as a fragment for every shape above 300 and one left with 120
  barely worse, so on ``default`` it put a 230 share beside a 650 (120 left, which
  hardly anything fills) rather than beside a 470 (300 left, which a 230 fills to
  70), and a 320 then beside a 470 (210 left) rather than beside the 650 (30 left).
  Charged to the share's card choice and to the node's score alike; a pod of whole
  cards gives up the same cost on every node (that of each idle card it takes), so its
  score leaves the term out. The sizes
  are those of the target workload (given, or learnt from the pods seen), never of
  pods still to come. On ``default`` (no moves) it takes the unallocated GPU at 100%
  arrival from 4.18% to about 3.9%.

The added terms depend on one node's state and on the node set (the pressure is
computed when the nodes or the workload change), so the per-shape cached scores of
:class:`~engine.plugins.gpu.cache.CachedScore` stay valid. Everything is integer (the
pressure an exact fraction floored to permille), so replay reproduces every decision.
Quantised (``resolution: simulator``) as FGD's score; ties go to the smallest node name.
Same args as GpuFragmentation; a target workload with ``memory`` per shape turns the
memory terms on (a learned workload has none, and then only cpu counts).

The look-ahead is the workload distribution only, never pods that have not arrived.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Final

import numpy as np

from engine.framework.handle import Handle
from engine.model.devices import WHOLE
from engine.model.pods import PodInfo
from engine.model.resources import CPU, MEMORY
from engine.model.state import ClusterState, Ints
from engine.plugins.gpu.compiled import (
    P_CPU_SUM,
    P_GPU_SUM,
    P_MIB_SUM,
    P_MILLI,
    P_REMAINDER,
    P_STRANDED,
    P_TOTAL,
    PARAMS,
)
from engine.plugins.gpu.fgd import GpuFragmentation, pod_memory
from engine.plugins.gpu.fragment import Resolved
from engine.plugins.gpu.workload import pod_shape

PERMILLE: Final = 1000
_MIB_SHIFT: Final = 20
"""Memory is compared in MiB, so products with milli-GPU sums stay within int64."""
FILL_PERMILLE: Final = 30
""":func:`remainder_cost`: a card whose room fits one-card sizes of at least 3% of the
one-card shapes' weight is taken to be filled; with less, in proportion (at weight 16,
2% gave 3.93 / 3.91 on ``default`` and 12.72 on gpushare100, 4% 3.94 / 3.97 and 11.84)."""
REMAINDER_WEIGHT: Final = 16
"""Milli-GPU of FGD's units (at the workload's probabilities) per milli a card is
expected to leave idle. ``default``, seeds 42 and 43, no moves (gpushare100 and
gpuspec33, seed 42, beside): 8 gave 3.88 / 3.93 (12.16, 5.85), 16 3.89 / 3.92 (12.10,
5.86), 24 3.89 / 3.89 (12.17, 6.03); without the term 4.18 / 4.20 (13.00, 5.68)."""


def strand_sums(shapes: Resolved) -> tuple[int, int, int]:
    """The GPU shapes' weighted sums of milli-GPU, cpu and memory (MiB)."""
    gpu = shapes.gpu
    weight = shapes.weight[gpu]
    gpu_sum = int((weight * shapes.milli[gpu] * shapes.cards[gpu]).sum())
    cpu_sum = int((weight * shapes.cpu[gpu]).sum())
    mib_sum = int((weight * (shapes.memory[gpu] >> _MIB_SHIFT)).sum())
    return gpu_sum, cpu_sum, mib_sum


def stranded(shapes: Resolved, idle: Ints, cpu: Ints, memory: Ints) -> Ints:
    """Per node, the idle milli-GPU its free ``cpu`` (and ``memory``, where the shapes
    give memory) cannot feed at the GPU shapes' weighted cpu (memory) per milli-GPU."""
    gpu_sum, cpu_sum, mib_sum = strand_sums(shapes)
    out: Ints = np.zeros(idle.shape[0], dtype=np.int64)
    if not gpu_sum:
        return out
    if cpu_sum:
        out = np.maximum(out, (idle * cpu_sum - cpu * gpu_sum) // cpu_sum)
    if mib_sum:
        out = np.maximum(out, (idle * mib_sum - (memory >> _MIB_SHIFT) * gpu_sum) // mib_sum)
    return out


def model_pressure(shapes: Resolved, models: Ints, cards: Ints) -> Ints:
    """Per model column (``shapes.allowed``'s: column 0 no model, c + 1 model code c),
    the permille of its cards the restricted shapes are expected to need once the
    cluster's capacity has arrived (capped at 1000). ``models``/``cards``: per slot."""
    columns = shapes.allowed.shape[1]
    capacity = np.zeros(columns, dtype=np.int64)
    np.add.at(capacity, models + 1, cards * WHOLE)
    demand = shapes.weight * shapes.milli * shapes.cards
    total_demand = int(demand.sum())
    out = np.zeros(columns, dtype=np.int64)
    restricted = shapes.gpu & ~shapes.allowed.all(axis=1)
    if not total_demand or not restricted.any():
        return out
    total_capacity = int(capacity.sum())
    share = [Fraction(0)] * columns
    for m in np.flatnonzero(restricted):
        allowed = np.flatnonzero(shapes.allowed[m] & (capacity > 0))
        reach = int(capacity[allowed].sum())
        for code in allowed.tolist():
            # demand spread by cards: each allowed card carries demand / reach
            share[code] += Fraction(int(demand[m]), reach)
    for column in range(columns):
        need = share[column] * total_capacity * PERMILLE / total_demand
        out[column] = min(PERMILLE, int(need))
    return out


def remainder_cost(shapes: Resolved) -> Ints:
    """Per free milli ``r`` = 0..WHOLE a card is left with, what ShoalGpu charges for
    it: ``REMAINDER_WEIGHT * W * L(r)`` (floored), ``L(r)`` the milli expected to stay
    idle on the card when the workload's one-card pods (shares and whole cards, any
    model) fill it in proportion to their weights, each fill leaving ``L(r - s)``;
    where only a little of their weight is small enough to fit (``mass(r)`` below
    ``FILL_PERMILLE`` of it all) the card may stay as it is, with that chance::

        L(0) = 0;  L(r) = (1 - f) * r + f * sum_{s <= r} w_s * L(r - s) / mass(r)
        f = min(1, mass(r) / (FILL_PERMILLE / 1000 * sum_s w_s))

    In fixed point (micro-GPU, floor divisions), so every machine and replay agrees."""
    total = int(shapes.weight.sum())
    if not total:
        return np.zeros(WHOLE + 1, dtype=np.int64)
    one = shapes.gpu & (shapes.cards == 1)
    by_size: dict[int, int] = {}
    for m in np.flatnonzero(one).tolist():
        size = int(shapes.milli[m])
        by_size[size] = by_size.get(size, 0) + int(shapes.weight[m])
    return _expected_idle(tuple(sorted(by_size.items())), total)


def _expected_idle(sizes: tuple[tuple[int, int], ...], total: int) -> Ints:
    """:func:`remainder_cost`'s row for one-card ``sizes`` ((milli, weight), ascending)."""
    out = np.zeros(WHOLE + 1, dtype=np.int64)
    mass_all = sum(weight for _, weight in sizes)
    if not mass_all:
        out[:] = REMAINDER_WEIGHT * total * np.arange(WHOLE + 1)
        return out
    scale = 1000  # micro-GPU per milli
    full = mass_all * FILL_PERMILLE  # f = min(1, mass * 1000 / full)
    idle = [0] * (WHOLE + 1)
    for r in range(1, WHOLE + 1):
        mass = spread = 0
        for size, weight in sizes:
            if size > r:
                break
            mass += weight
            spread += weight * idle[r - size]
        fill = min(mass * PERMILLE, full)
        idle[r] = ((full - fill) * r * scale + fill * (spread // mass if mass else 0)) // full
    for r in range(WHOLE + 1):
        out[r] = REMAINDER_WEIGHT * total * idle[r] // scale
    return out


class ShoalGpu(GpuFragmentation):
    name = "ShoalGpu"
    counts_memory = True

    def __init__(self, args: Mapping[str, Any], where: str, handle: Handle | None = None) -> None:
        super().__init__(args, where, handle)
        self._pressure = np.zeros(0, dtype=np.int64)
        self._params = np.zeros(PARAMS, dtype=np.int64)
        """The compiled kernel's ShoalGpu terms (:mod:`engine.plugins.gpu.compiled`)."""
        self._remainder = np.zeros(WHOLE + 1, dtype=np.int64)
        """:func:`remainder_cost` of the workload: per free milli a card is left with."""

    def reset(self, state: ClusterState) -> None:
        super().reset(state)
        shapes = self._shapes
        assert shapes is not None
        slots = np.arange(state.capacity, dtype=np.int64)
        self._pressure = model_pressure(shapes, self._models, state.cards.count[slots])
        params = np.zeros(PARAMS, dtype=np.int64)
        params[P_STRANDED] = 1
        params[P_GPU_SUM], params[P_CPU_SUM], params[P_MIB_SUM] = strand_sums(shapes)
        params[P_TOTAL] = int(shapes.weight.sum())
        self._remainder = remainder_cost(shapes)
        params[P_REMAINDER] = int(self._remainder.any())
        self._params = np.concatenate([params, self._remainder])

    def stats(self) -> dict[str, int]:
        return {**super().stats(), "pressured_models": int((self._pressure > 0).sum())}

    def potential(self, state: ClusterState, slots: Ints) -> Ints:
        """What ShoalGpu's score charges, summed over what runs on ``slots``: ``F_n + W *
        S_n + W * (milli-GPU in use) * pressure(model_n) / 1000`` (so the change of its
        sum over the nodes a plan touches is the sum of the score's deltas)."""
        frag = super().potential(state, slots)  # (brings the caches up to date first)
        shapes = self._shapes
        assert shapes is not None
        total = int(shapes.weight.sum())
        free = np.maximum(state.cards.free[slots], 0)
        idle = free.sum(axis=1)
        used = state.cards.count[slots] * WHOLE - idle
        strand = stranded(shapes, idle, state.free[CPU, slots], state.free[MEMORY, slots])
        pressure = self._pressure[self._models[slots] + 1]
        remainder = self._remainder[free].sum(axis=1)
        out: Ints = frag + total * strand + total * used * pressure // PERMILLE + remainder
        return out

    def terms(self, pod: PodInfo) -> tuple[Ints | None, Ints | None]:
        self._params[P_MILLI] = _milli(pod)
        return self._params, self._pressure

    def offset(self) -> int:
        # |ΔF| <= bound, the stranded and pressure terms are each at most W * the
        # node's milli-GPU, and the remainder term at most the dearest remainder
        assert self._shapes is not None
        return 3 * self._shapes.bound + int(self._remainder.max())

    def evaluate(self, pod: PodInfo, state: ClusterState, slots: Ints) -> tuple[Ints, Ints]:
        shapes = self._shapes
        assert shapes is not None
        milli = _milli(pod)
        if self._kernel is not None:
            self._params[P_MILLI] = milli
            mode = self.pod_mode(pod)
            quantise = not self.exact
            delta, card = self.compiled(
                state, slots, mode, pod, self._params, self._pressure, quantise
            )
            if quantise:
                return delta, card
        else:
            delta, card = self._numpy_deltas(pod, state, slots, milli)
        if self.exact:
            return self.offset() - delta, card
        return self.quantised(delta), card

    def remainder_change(self, free: Ints, milli: int) -> Ints | None:
        """The remainder term of a share of ``milli`` on each card of ``free`` (K, W):
        the change of :func:`remainder_cost` (entries for cards without room are
        meaningless)."""
        if not self._params[P_REMAINDER]:
            return None
        cost = self._remainder
        change: Ints = cost[np.maximum(free - milli, 0)] - cost[free]
        return change

    def _numpy_deltas(
        self, pod: PodInfo, state: ClusterState, slots: Ints, milli: int
    ) -> tuple[Ints, Ints]:
        """The compiled kernel's twin: ΔF plus the stranded and pressure terms."""
        shapes = self._shapes
        assert shapes is not None
        delta, card, idle = self.deltas(pod, state, slots)
        cpu = state.free[CPU, slots]
        memory = state.free[MEMORY, slots]
        before = stranded(shapes, np.maximum(state.cards.free[slots], 0).sum(axis=1), cpu, memory)
        after = stranded(
            shapes,
            np.maximum(idle, 0),
            cpu - pod_shape(pod).cpu,
            memory - (pod_memory(pod) if shapes.memory_aware else 0),
        )
        pressure = self._pressure[self._models[slots] + 1]
        total = int(shapes.weight.sum())
        delta = delta + total * (after - before) + total * milli * pressure // PERMILLE
        return delta, card


def _milli(pod: PodInfo) -> int:
    """The milli-GPU ``pod`` takes in all."""
    gpu = pod.gpu
    return 0 if gpu is None else gpu.cards * (WHOLE if gpu.whole else gpu.need.milli)

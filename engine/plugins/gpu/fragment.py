"""Fragmentation of nodes against a target workload, vectorised (FGD's definition).

For a node with free cpu ``c`` and free milli-GPU per card ``g_1..g_k`` (idle GPU
``G = sum g_i``), the fragment for one shape ``m`` of the target workload is

* all of ``G`` if ``m`` asks for no GPU, if ``m``'s models exclude the node's model, or
  if ``m`` does not fit (``c`` below its cpu, or fewer than its cards with at least its
  per-card milli free);
* otherwise the sum of the ``g_i`` that are smaller than ``m``'s per-card milli.

ShoalGpu also counts memory as FGD counts cpu (``m`` does not fit a node with less free
memory than ``m``'s): pass ``memory`` (free bytes per node) and resolve the workload with
``memory=True``; without them memory is ignored, as FGD defines it.

``F = sum_m w_m * fragment(m)`` with the workload's integer weights ``w_m``
(proportional to the probabilities p_m, so the node that FGD prefers is the same; and
exact integers, so every machine and every replay agrees). All functions take K node
*states* at once (rows of arrays), so a caller evaluates hypothetical states (a pod
placed on this card or that one) in one call; nothing here reads a ``ClusterState``
apart from :func:`resolve` and :func:`node_states`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.model.devices import MODEL_LABEL, WHOLE, GpuRequest
from engine.model.resources import CPU, MEMORY
from engine.model.state import Bools, ClusterState, Ints
from engine.plugins.gpu.workload import TargetWorkload


@dataclass(frozen=True, slots=True)
class Resolved:
    """A target workload as arrays, its models resolved to one state's label codes."""

    cpu: Ints
    milli: Ints
    cards: Ints
    weight: Ints
    allowed: Bools
    """(shapes, models + 1): may shape m run on model code c (column c + 1; column 0 is
    a node without a model label)?"""
    gpu: Bools
    """Shapes that ask for GPU."""
    bound: int
    """An upper bound of ``|F|`` (and of a change of it) on the state's nodes."""
    memory: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Each shape's memory in bytes (all 0: memory not considered)."""
    levels: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """The distinct per-card milli of the shapes (what card counts depend on)."""
    level: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Each shape's index in ``levels``."""
    largest: int = -1
    """The largest GPU shape (most milli-GPU in all; of those, the one of most weight,
    the most frequent; the first of equals); -1: no shape asks for GPU."""

    def __post_init__(self) -> None:
        if self.level.shape[0] != self.milli.shape[0]:
            levels, level = np.unique(self.milli, return_inverse=True)
            object.__setattr__(self, "levels", levels.astype(np.int64))
            object.__setattr__(self, "level", level.reshape(-1).astype(np.int64))
        if self.memory.shape[0] != self.milli.shape[0]:
            object.__setattr__(self, "memory", np.zeros_like(self.milli))
        if self.gpu.any():
            size = np.where(self.gpu, self.milli * self.cards, -1)
            order = np.lexsort((-np.arange(size.shape[0]), self.weight, size))
            object.__setattr__(self, "largest", int(order[-1]))

    @property
    def memory_aware(self) -> bool:
        return bool(self.memory.any())


def resolve(workload: TargetWorkload, state: ClusterState, memory: bool = False) -> Resolved:
    """``workload`` as arrays against ``state``'s model label codes (with the shapes'
    memory if ``memory``)."""
    codes = state.label_values.get(MODEL_LABEL, {})
    shapes = workload.shapes
    allowed = np.ones((len(shapes), len(codes) + 1), dtype=np.bool_)
    for i, shape in enumerate(shapes):
        if shape.models:
            allowed[i] = False
            for model in shape.models:
                code = codes.get(model)
                if code is not None:
                    allowed[i, code + 1] = True
    milli = np.array([s.milli for s in shapes], dtype=np.int64)
    return Resolved(
        cpu=np.array([s.cpu for s in shapes], dtype=np.int64),
        milli=milli,
        cards=np.array([s.cards for s in shapes], dtype=np.int64),
        weight=np.array(workload.weights, dtype=np.int64),
        allowed=allowed,
        gpu=milli > 0,
        bound=sum(workload.weights) * max(state.cards.width, 1) * WHOLE,
        memory=np.array([s.memory if memory else 0 for s in shapes], dtype=np.int64),
    )


def model_codes(state: ClusterState) -> Ints:
    """Each slot's GPU model code (-1: no model label)."""
    column = state.label_columns.get(MODEL_LABEL)
    if column is None:
        return np.full(state.capacity, -1, dtype=np.int64)
    return column.astype(np.int64)


def node_states(state: ClusterState, slots: Ints) -> tuple[Ints, Ints]:
    """Free cpu and free milli-GPU per card (0 for absent cards) of ``slots``."""
    return state.free[CPU, slots], np.maximum(state.cards.free[slots], 0)


def node_memory(state: ClusterState, slots: Ints) -> Ints:
    """Free memory (bytes) of ``slots``."""
    out: Ints = state.free[MEMORY, slots]
    return out


def fragmentation(
    shapes: Resolved, cpu: Ints, free: Ints, model: Ints, memory: Ints | None = None
) -> Ints:
    """F of K node states: ``cpu`` (K,), ``free`` (K, W) milli per card (absent cards 0),
    ``model`` (K,) codes and free ``memory`` (K,; None: not considered)."""
    if free.shape[1] == 0 or not shapes.weight.size:
        return np.zeros(cpu.shape[0], dtype=np.int64)
    total = free.sum(axis=1)
    enough = free[:, None, :] >= shapes.levels[None, :, None]  # (K, levels, W)
    count = enough.sum(axis=2)[:, shapes.level]
    small = np.where(enough, 0, free[:, None, :]).sum(axis=2)[:, shapes.level]
    fits = (
        (count >= shapes.cards[None, :])
        & (cpu[:, None] >= shapes.cpu[None, :])
        & shapes.allowed[:, model + 1].T
        & shapes.gpu[None, :]
    )
    if memory is not None and shapes.memory_aware:
        fits &= memory[:, None] >= shapes.memory[None, :]
    frag = np.where(fits, small, total[:, None])
    out: Ints = frag @ shapes.weight
    return out


def largest_room(
    shapes: Resolved, cpu: Ints, free: Ints, model: Ints, memory: Ints | None = None
) -> Ints:
    """Per node state (arguments as :func:`fragmentation`'s), how many pods of the
    workload's largest GPU shape (:attr:`Resolved.largest`) it could start now,
    together: a share of ``m`` milli fits ``g // m`` times on a card with ``g`` free, a
    pod of ``k`` whole cards once per ``k`` free cards; cpu (and memory, where the
    shapes give it) bound the count as well. All 0 for a workload without GPU shapes."""
    m = shapes.largest
    if free.shape[1] == 0 or m < 0:
        return np.zeros(cpu.shape[0], dtype=np.int64)
    milli, cards = int(shapes.milli[m]), int(shapes.cards[m])
    if cards == 1:
        room = (free // milli).sum(axis=1)
    else:
        room = (free >= milli).sum(axis=1) // cards
    need_cpu = int(shapes.cpu[m])
    if need_cpu > 0:
        room = np.minimum(room, np.maximum(cpu, 0) // need_cpu)
    if memory is not None and shapes.memory_aware and shapes.memory[m] > 0:
        room = np.minimum(room, np.maximum(memory, 0) // int(shapes.memory[m]))
    out: Ints = np.where(shapes.allowed[m, model + 1], room, 0).astype(np.int64)
    return out


def after_whole(cpu: Ints, free: Ints, pod_cpu: int, gpu: GpuRequest | None) -> tuple[Ints, Ints]:
    """States after a pod of ``pod_cpu`` and whole cards (or none) lands on each row:
    the lowest-index idle cards are taken (as :meth:`Cards.choose` takes them)."""
    if gpu is None or gpu.cards == 0:
        return cpu - pod_cpu, free
    idle = free >= WHOLE
    take = idle & (np.cumsum(idle, axis=1) <= gpu.cards)
    return cpu - pod_cpu, free - WHOLE * take


def fragmentation_after_share(
    shapes: Resolved,
    cpu: Ints,
    free: Ints,
    model: Ints,
    pod_cpu: int,
    milli: int,
    memory: Ints | None = None,
) -> Ints:
    """F of each state after a pod of ``pod_cpu`` and ``milli`` of one card lands on card
    w of row k: (K, W), from each row's per-shape counts and small-card sums, changed
    only by the one card that changes (K x M x W work rather than K x W x M x W).
    Entries for cards that do not hold ``milli`` are meaningless. ``memory``: each
    row's free memory after the pod (None: not considered)."""
    k, width = free.shape
    if width == 0 or not shapes.weight.size:
        return np.zeros((k, width), dtype=np.int64)
    need = shapes.levels[None, :, None]
    card = free[:, None, :]  # (K, 1, W)
    enough = card >= need  # (K, levels, W)
    count = enough.sum(axis=2)
    small = np.where(enough, 0, card).sum(axis=2)
    taken = card - milli
    still = taken >= need
    count_after = (count[:, :, None] - enough + still)[:, shapes.level]  # (K, M, W)
    small_after = (small[:, :, None] - np.where(enough, 0, card) + np.where(still, 0, taken))[
        :, shapes.level
    ]
    total_after = free.sum(axis=1) - milli
    fits = (
        (count_after >= shapes.cards[None, :, None])
        & ((cpu - pod_cpu)[:, None] >= shapes.cpu[None, :])[:, :, None]
        & (shapes.allowed[:, model + 1].T & shapes.gpu[None, :])[:, :, None]
    )
    if memory is not None and shapes.memory_aware:
        fits &= (memory[:, None] >= shapes.memory[None, :])[:, :, None]
    frag = np.where(fits, small_after, total_after[:, None, None])
    out: Ints = np.einsum("kmw,m->kw", frag, shapes.weight)
    return out

"""The pod shapes an engine has seen: what fragmentation-aware policies learn their
target workload from (:mod:`engine.plugins.gpu.workload`), kept as engine state so that
a replay, from the start or from a snapshot, learns exactly what the run learnt.

A shape is ``(cpu milli, milli-GPU per card (1000: whole cards; 0: none), cards, GPU
models its required node affinity allows (empty: any))``. ``learned`` is a copy of the
counts taken when the total reaches a power of two or a multiple of ``EVERY``: a policy
re-derives its workload when ``version`` changes, not at every pod.
"""

from __future__ import annotations

from typing import Final

from engine.model.devices import MODEL_LABEL, WHOLE
from engine.model.pods import PodInfo
from engine.model.resources import CPU
from events.types import NodeSelectorTerm

ShapeKey = tuple[int, int, int, tuple[str, ...]]
EVERY: Final = 1024


def models_of(terms: tuple[NodeSelectorTerm, ...] | None) -> tuple[str, ...]:
    """The GPU models a pod's required node affinity allows (``In`` on the model label,
    over all terms); empty: any model."""
    if not terms:
        return ()
    out: set[str] = set()
    for term in terms:
        allowed: set[str] | None = None
        for req in term.match_expressions:
            if req.key == MODEL_LABEL and req.operator == "In":
                values = set(req.values)
                allowed = values if allowed is None else allowed & values
        if allowed is None:
            return ()  # a term that allows any model
        out |= allowed
    return tuple(sorted(out))


def shape_of(pod: PodInfo) -> ShapeKey:
    """The shape of ``pod``: its cpu request, GPU cards and models."""
    cpu = 0
    for row, amount in pod.request:
        if row == CPU:
            cpu = amount
    gpu = pod.gpu
    if gpu is None:
        return (cpu, 0, 0, ())
    milli = WHOLE if gpu.whole else gpu.need.milli
    return (cpu, milli, gpu.cards, models_of(pod.spec.required_affinity))


class ShapeCounts:
    """How many pods of each shape were submitted, and the copy policies learn from."""

    def __init__(self) -> None:
        self.counts: dict[ShapeKey, int] = {}
        self.total = 0
        self.learned: dict[ShapeKey, int] = {}
        self.version = 0
        self.told = False
        """Whether ``learned`` is what another engine learnt (a shard's, from the
        coordinator: :meth:`adopt`), which this one's own counting no longer changes."""

    def adopt(self, learned: dict[ShapeKey, int]) -> None:
        """Take ``learned`` as the shapes learnt (the coordinator's, over every pod)."""
        self.told = True
        self.learned = learned
        self.version += 1

    def __repr__(self) -> str:
        return f"ShapeCounts(shapes={len(self.counts)}, total={self.total})"

    def add(self, pod: PodInfo) -> None:
        self.add_shape(shape_of(pod))

    def add_shapes(self, shape: ShapeKey, count: int) -> None:
        """:meth:`add_shape` ``count`` times: the counts are taken (``learned``) at the
        same totals, with the same counts, as one by one; one step per such total
        crossed, not per pod."""
        counts = self.counts
        while count > 0:
            total = self.total
            # the next total at which the counts are taken: a power of two or a
            # multiple of EVERY, whichever comes first
            power = 1 << total.bit_length()
            step = min(count, power - total, EVERY - total % EVERY)
            counts[shape] = counts.get(shape, 0) + step
            self.total = total = total + step
            count -= step
            self._learn_at(total)

    def add_shape(self, shape: ShapeKey) -> None:
        """Count a pod of ``shape`` (derived once for pods of one template)."""
        self.counts[shape] = self.counts.get(shape, 0) + 1
        self.total += 1
        self._learn_at(self.total)

    def _learn_at(self, total: int) -> None:
        """Take the counts as learnt at a power of two or a multiple of ``EVERY`` (not
        once told another engine's)."""
        if (total & (total - 1) == 0 or total % EVERY == 0) and not self.told:
            self.learned = dict(self.counts)
            self.version += 1

"""The target workload of fragmentation-aware policies: the pod shapes expected next.

FGD (Weng et al., USENIX ATC'23) measures a node's fragmentation against a *target
workload* M: pod shapes with probabilities. A shape is ``(cpu milli, milli-GPU per card,
cards, GPU models)``; a CPU-only shape has ``milli == 0`` and ``cards == 0``; an empty
model list means any model. M is made of the most frequent shapes of a pod population
until they cover ``coverage`` (95%) of its pods, their frequencies renormalised.

Weights are integers (a shape's count, or its probability in millionths when given as
args), so fragmentation sums are exact integers: the same on every machine and in replay.

Given in a profile's ``pluginConfig`` (FGD, Shoal)::

    args:
      targetWorkload:          # absent: learned from the pods submitted to the engine
        - {cpu: 4000, gpuMilli: 500, gpus: 1, weight: 30}
        - {cpu: 8000, gpuMilli: 1000, gpus: 8, models: [G2, G3], weight: 5}
        - {cpu: 2000, weight: 10}            # CPU only
        - {cpu: 4000, memory: 17179869184, gpuMilli: 1000, gpus: 1, weight: 8}
      coverage: 0.95           # learned workloads only
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from engine.model.devices import WHOLE
from engine.model.pods import PodInfo
from engine.model.shapes import shape_of
from events.errors import InputError

COVERAGE: Final = 0.95
MAX_WEIGHT: Final = 10**6
_ARG_FIELDS: Final = frozenset({"cpu", "memory", "gpuMilli", "gpus", "models", "weight"})


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """One pod shape of a target workload (what fragmentation is measured against)."""

    cpu: int
    milli: int
    """milli-GPU per card (1000: whole cards); 0: no GPU."""
    cards: int
    models: tuple[str, ...] = ()
    """GPU models (``nvidia.com/gpu.product``) the shape accepts; empty: any."""
    memory: int = 0
    """Bytes of memory a typical pod of the shape asks for (0: memory not considered).
    Only given workloads have it; FGD ignores it, ShoalGpu counts it like cpu."""


def pod_shape(pod: PodInfo) -> Shape:
    """The shape of ``pod``: its cpu request, GPU cards and models."""
    return Shape(*shape_of(pod))


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    """Shapes and their integer weights (proportional to probabilities)."""

    shapes: tuple[Shape, ...]
    weights: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.weights)

    def probabilities(self) -> list[float]:
        total = self.total
        return [w / total for w in self.weights] if total else []

    @classmethod
    def from_counts(cls, counts: Mapping[Shape, int], coverage: float = COVERAGE) -> TargetWorkload:
        """The most frequent shapes until they cover ``coverage`` of all counted pods
        (ties: the smaller shape first, so the choice is deterministic)."""
        total = sum(counts.values())
        chosen: list[tuple[Shape, int]] = []
        covered = 0
        for shape, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            if total and covered >= coverage * total:
                break
            chosen.append((shape, count))
            covered += count
        return cls(tuple(s for s, _ in chosen), tuple(c for _, c in chosen))

    @classmethod
    def of_shapes(cls, shapes: Iterable[Shape], coverage: float = COVERAGE) -> TargetWorkload:
        counts: dict[Shape, int] = {}
        for shape in shapes:
            counts[shape] = counts.get(shape, 0) + 1
        return cls.from_counts(counts, coverage)

    def to_args(self) -> list[dict[str, Any]]:
        """The workload as ``targetWorkload`` args (round trip of :func:`parse_workload`)."""
        out: list[dict[str, Any]] = []
        for shape, weight in zip(self.shapes, self.weights, strict=True):
            item: dict[str, Any] = {"cpu": shape.cpu, "weight": weight}
            if shape.cards:
                item["gpuMilli"] = shape.milli
                item["gpus"] = shape.cards
            if shape.models:
                item["models"] = list(shape.models)
            if shape.memory:
                item["memory"] = shape.memory
            out.append(item)
        return out


def _int(raw: Mapping[str, Any], name: str, low: int, high: int, default: int, where: str) -> int:
    value = raw.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InputError(
            f"must be an integer {low}..{high}, got {value!r}", location=f"{where}.{name}"
        )
    return value


def parse_workload(raw: Any, where: str) -> TargetWorkload:
    """``targetWorkload`` args: a non-empty list of shapes with positive weights."""
    if not isinstance(raw, list) or not raw:
        raise InputError("must be a non-empty list of shapes", location=where)
    counts: dict[Shape, int] = {}
    for i, item in enumerate(raw):
        loc = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise InputError(
                "must be a mapping {cpu, memory, gpuMilli, gpus, models, weight}", location=loc
            )
        unknown = set(item) - _ARG_FIELDS
        if unknown:
            raise InputError(f"unknown field {sorted(unknown)[0]!r}", location=loc)
        cpu = _int(item, "cpu", 0, 2**40, 0, loc)
        memory = _int(item, "memory", 0, 2**60, 0, loc)
        gpus = _int(item, "gpus", 0, 64, 1 if "gpuMilli" in item else 0, loc)
        milli = _int(item, "gpuMilli", 0 if not gpus else 1, WHOLE, WHOLE if gpus else 0, loc)
        if gpus > 1 and milli != WHOLE:
            raise InputError("several cards are whole cards: gpuMilli must be 1000", location=loc)
        if milli and not gpus:
            raise InputError("gpuMilli needs gpus >= 1", location=loc)
        weight = _int(item, "weight", 1, MAX_WEIGHT, 1, loc)
        models = item.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
            raise InputError("must be a list of GPU model names", location=f"{loc}.models")
        if models and not gpus:
            raise InputError("models apply to GPU shapes only", location=f"{loc}.models")
        shape = Shape(cpu, milli, gpus, tuple(sorted(set(models))), memory)
        counts[shape] = counts.get(shape, 0) + weight
    shapes = tuple(counts)
    return TargetWorkload(shapes, tuple(counts[s] for s in shapes))


def parse_coverage(raw: Any, where: str) -> float:
    if raw is None:
        return COVERAGE
    if not isinstance(raw, int | float) or isinstance(raw, bool) or not 0 < raw <= 1:
        raise InputError(f"must be a number in (0, 1], got {raw!r}", location=where)
    return float(raw)

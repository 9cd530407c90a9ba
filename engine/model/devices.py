"""GPU requests: whole cards and shares of one card, in every convention users run.

A pod asks for GPUs in one of four ways, all mapped onto one internal request,
:class:`GpuRequest`: *how many cards*, and on each of them *a share of its compute*
(milli-cards, 1000 = the whole card) and *a share of its memory* (per mille of the
card's memory, or an absolute amount in MiB converted per node).

============================  ==========================================================
convention                    resources in the pod's requests (or limits)
============================  ==========================================================
whole cards (device plugin)   ``nvidia.com/gpu: N`` alone: N whole cards
shoal                         ``nvidia.com/gpu: 1`` (optional) and
                              ``shoal.io/gpu-milli: M``: M/1000 of one card's compute
                              (the Alibaba trace's ``gpu_milli``); M = 1000 is a whole card
HAMi                          ``nvidia.com/gpu: N`` vGPUs, each on its own card, with
                              ``nvidia.com/gpucores: P`` (percent of the card's compute,
                              default 0: no compute reserved) and ``nvidia.com/gpumem: MiB``
                              or ``nvidia.com/gpumem-percentage: P`` (default: the whole
                              memory, as HAMi does); gpucores 100 with the whole memory is
                              a whole card
Koordinator                   ``koordinator.sh/gpu-core: P`` (percent; a multiple of 100
                              above 100: P/100 whole cards) with
                              ``koordinator.sh/gpu-memory-ratio: P`` or
                              ``koordinator.sh/gpu-memory: BYTES`` (default: the ratio
                              equal to gpu-core); ``koordinator.sh/gpu: P`` is the
                              shorthand for both at P percent
============================  ==========================================================

Mixing conventions in one pod is refused (the request would mean two things). The names
of the sharing resources are never scalar requests: a node does not advertise them, the
card table (:mod:`engine.model.cards`) accounts for them. ``nvidia.com/gpu`` stays a
scalar request for whole-card pods only (a node's ``nvidia.com/gpu`` counts whole cards).

**In quotas** every request that takes a card counts (:func:`quota_milli`; the rule of
:mod:`engine.model.quota`), in milli-cards so that a share can count a part of a card:
a whole card (device plugin, shoal ``gpu-milli: 1000``, Koordinator ``gpu-core: 100``)
and a HAMi vGPU, whatever its ``gpucores`` and ``gpumem``, count 1000 each, as
CapacityScheduling counts the requested ``nvidia.com/gpu`` (a HAMi vGPU holds a card
for its pod; a namespace allowed 2 cards does not hold 4 through ``gpucores: 99``); a
milli-card share (``shoal.io/gpu-milli: M``, Koordinator ``gpu-core: P`` below 100)
counts M (10·P) milli-cards, or its share of the card's memory where that is larger
(Koordinator's ``gpu-memory-ratio``; a memory in bytes is not a share of a known card
and does not count). So a quota's ``nvidia.com/gpu: 2`` admits two whole cards, two
HAMi vGPUs, or four 500m shares. HAMi shares are told apart from milli-card shares by
:attr:`CardNeed.vgpu` (their need rows differ: a row counts the cards of one need).

A GPU model is not part of the request: it is a node label (``nvidia.com/gpu.product``,
as NVIDIA's GPU feature discovery sets it) that node affinity selects, as users already
write it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

GPU: Final = "nvidia.com/gpu"
SHOAL_MILLI: Final = "shoal.io/gpu-milli"
HAMI_CORES: Final = "nvidia.com/gpucores"
HAMI_MEMORY: Final = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENT: Final = "nvidia.com/gpumem-percentage"
KOORD_CORE: Final = "koordinator.sh/gpu-core"
KOORD_RATIO: Final = "koordinator.sh/gpu-memory-ratio"
KOORD_MEMORY: Final = "koordinator.sh/gpu-memory"
KOORD_GPU: Final = "koordinator.sh/gpu"
SHARE_RESOURCES: Final = frozenset(
    {
        SHOAL_MILLI,
        HAMI_CORES,
        HAMI_MEMORY,
        HAMI_MEMORY_PERCENT,
        KOORD_CORE,
        KOORD_RATIO,
        KOORD_MEMORY,
        KOORD_GPU,
    }
)
"""Resources that describe a share of a card: accounted on cards, never as scalars."""
GPU_RESOURCES: Final = SHARE_RESOURCES | {GPU}
"""Every request name :func:`gpu_request` reads: a pod that names none asks for no GPU."""
MODEL_LABEL: Final = "nvidia.com/gpu.product"
MEMORY_LABEL: Final = "nvidia.com/gpu.memory"
"""Node label with one card's memory in MiB (GPU feature discovery sets it)."""
CARDS_LABEL: Final = "shoal.io/gpu-cards"
"""Node label overriding the number of cards (when ``nvidia.com/gpu`` counts vGPUs)."""
WHOLE: Final = 1000
"""Milli-cards (and per mille of memory) in one card."""
MAX_CARDS: Final = 64
MAX_NODE_CARDS: Final = 1024
"""The most cards one node may have: the card table has a column per card of the
largest node (2 int64 per node and card), so a node stating 200,000 would cost
gigabytes. Input beyond it is refused; a log record beyond it is quarantined."""
MIB: Final = 1 << 20

SHOAL: Final = "shoal"
NVIDIA: Final = "nvidia"
HAMI: Final = "hami"
KOORDINATOR: Final = "koordinator"


class GpuRequestError(ValueError):
    """A GPU request that means nothing (mixed conventions, out-of-range shares)."""

    def __init__(self, message: str, resource: str) -> None:
        super().__init__(message)
        self.resource = resource


@dataclass(frozen=True, slots=True, order=True)
class CardNeed:
    """What one card must have free to take one card of a request."""

    milli: int
    """Compute, in milli-cards."""
    memory: int
    """Memory, per mille of the card's."""
    memory_mib: int = 0
    """Memory in MiB (0: none named; then ``memory`` applies)."""
    vgpu: bool = False
    """A HAMi vGPU: counts as a whole card in quotas (see the module docstring)."""

    @property
    def whole(self) -> bool:
        return self.milli == WHOLE and self.memory == WHOLE and not self.memory_mib

    def label(self) -> str:
        """How the need reads in a rejection ("Insufficient nvidia.com/gpu: ...")."""
        if self.whole:
            return f"{GPU}: whole cards"
        parts = [f"{self.milli}m compute"]
        if self.memory_mib:
            parts.append(f"{self.memory_mib}Mi memory")
        elif self.memory:
            parts.append(f"{self.memory / 10:g}% memory")
        vgpu = " (HAMi vGPU)" if self.vgpu else ""
        return f"{GPU}: cards with {' and '.join(parts)} free{vgpu}"


WHOLE_CARD: Final = CardNeed(WHOLE, WHOLE)


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """``cards`` cards, each with ``need`` free; ``convention`` says where the
    assignment is written for the device plugin (see :mod:`shards.kube.devices`)."""

    cards: int
    need: CardNeed
    convention: str

    @property
    def whole(self) -> bool:
        return self.need.whole

    def memory_on(self, card_mib: int) -> int:
        """Per mille of a card of ``card_mib`` MiB this request takes (rounded up)."""
        if not self.need.memory_mib:
            return self.need.memory
        return -(-self.need.memory_mib * WHOLE // card_mib) if card_mib > 0 else WHOLE


def _percent(requests: Mapping[str, int], name: str, high: int = 100) -> int | None:
    value = requests.get(name)
    if value is None:
        return None
    if not 0 <= value <= high:
        raise GpuRequestError(f"{name} must be 0..{high} (percent), got {value}", name)
    return value


def gpu_request(requests: Mapping[str, int]) -> GpuRequest | None:
    """The GPU request of a pod's summed ``requests`` (canonical units: extended
    resources in units, ``koordinator.sh/gpu-memory`` in bytes); None for no GPU."""
    if requests.keys().isdisjoint(GPU_RESOURCES):
        # most pods ask for no GPU: one set test instead of building three (this ran
        # for every pod in every shard and took 5-7% of a shard's time)
        return None
    named = {name for name in SHARE_RESOURCES if name in requests}
    gpus = requests.get(GPU, 0)
    if gpus < 0:
        raise GpuRequestError(f"{GPU} must not be negative", GPU)
    if gpus > MAX_CARDS:
        raise GpuRequestError(f"{GPU} asks for {gpus} cards; at most {MAX_CARDS} per pod", GPU)
    koordinator = {KOORD_CORE, KOORD_RATIO, KOORD_MEMORY, KOORD_GPU} & named
    hami = {HAMI_CORES, HAMI_MEMORY, HAMI_MEMORY_PERCENT} & named
    shoal = {SHOAL_MILLI} & named
    if sum(map(bool, (koordinator, hami, shoal))) > 1:
        mixed = sorted(named)
        raise GpuRequestError(f"mixes GPU sharing conventions ({', '.join(mixed)})", mixed[0])
    if shoal:
        return _shoal(requests, gpus)
    if hami:
        return _hami(requests, gpus)
    if koordinator:
        return _koordinator(requests, gpus)
    if gpus == 0:
        return None
    return GpuRequest(gpus, WHOLE_CARD, NVIDIA)


def _shoal(requests: Mapping[str, int], gpus: int) -> GpuRequest:
    milli = requests[SHOAL_MILLI]
    if not 1 <= milli <= WHOLE:
        raise GpuRequestError(f"{SHOAL_MILLI} must be 1..1000 (one card), got {milli}", SHOAL_MILLI)
    if gpus > 1:
        raise GpuRequestError(
            f"{SHOAL_MILLI} is a share of one card; with {GPU}: {gpus} ask for whole cards",
            SHOAL_MILLI,
        )
    if milli == WHOLE:
        return GpuRequest(1, WHOLE_CARD, SHOAL)
    return GpuRequest(1, CardNeed(milli, 0), SHOAL)


def _hami(requests: Mapping[str, int], gpus: int) -> GpuRequest:
    cards = gpus or 1
    cores = _percent(requests, HAMI_CORES) or 0
    percent = _percent(requests, HAMI_MEMORY_PERCENT)
    mib = requests.get(HAMI_MEMORY)
    if mib is not None and percent is not None:
        raise GpuRequestError(
            f"names both {HAMI_MEMORY} and {HAMI_MEMORY_PERCENT}; keep one", HAMI_MEMORY
        )
    if mib is not None:
        if mib <= 0:
            raise GpuRequestError(f"{HAMI_MEMORY} must be a positive number of MiB", HAMI_MEMORY)
        return GpuRequest(cards, CardNeed(cores * 10, 0, mib, vgpu=True), HAMI)
    memory = WHOLE if percent is None else percent * 10
    if cores * 10 == WHOLE and memory == WHOLE:
        return GpuRequest(cards, WHOLE_CARD, HAMI)
    return GpuRequest(cards, CardNeed(cores * 10, memory, vgpu=True), HAMI)


def _koordinator(requests: Mapping[str, int], gpus: int) -> GpuRequest:
    shorthand = requests.get(KOORD_GPU)
    core = requests.get(KOORD_CORE, shorthand)
    ratio = requests.get(KOORD_RATIO, shorthand)
    memory_bytes = requests.get(KOORD_MEMORY)
    if core is None:
        raise GpuRequestError(
            f"{KOORD_CORE} is needed with the other koordinator.sh/gpu-* resources", KOORD_CORE
        )
    if core <= 0 or (core > 100 and core % 100):
        raise GpuRequestError(
            f"{KOORD_CORE} must be 1..100, or a multiple of 100 for whole cards, got {core}",
            KOORD_CORE,
        )
    if ratio is not None and memory_bytes is not None:
        raise GpuRequestError(f"names both {KOORD_RATIO} and {KOORD_MEMORY}; keep one", KOORD_RATIO)
    if gpus and core >= 100 and gpus != core // 100:
        raise GpuRequestError(
            f"{GPU}: {gpus} disagrees with {KOORD_CORE}: {core} ({core // 100} cards)", GPU
        )
    if core >= 100:
        if ratio is not None and ratio != core:
            raise GpuRequestError(
                f"{KOORD_RATIO} must equal {KOORD_CORE} for whole cards", KOORD_RATIO
            )
        return GpuRequest(core // 100, WHOLE_CARD, KOORDINATOR)
    if memory_bytes is not None:
        if memory_bytes <= 0:
            raise GpuRequestError(f"{KOORD_MEMORY} must be positive", KOORD_MEMORY)
        return GpuRequest(1, CardNeed(core * 10, 0, -(-memory_bytes // MIB)), KOORDINATOR)
    if ratio is not None and not 0 <= ratio <= 100:
        raise GpuRequestError(f"{KOORD_RATIO} must be 0..100 (percent), got {ratio}", KOORD_RATIO)
    return GpuRequest(1, CardNeed(core * 10, (core if ratio is None else ratio) * 10), KOORDINATOR)


def quota_milli(need: CardNeed, cards: int) -> int:
    """Milli-cards that ``cards`` cards of ``need`` count in quotas (see the module
    docstring): 1000 per whole card or HAMi vGPU; a milli-card share its compute, or
    its share of the card's memory where that is larger."""
    if need.whole or need.vgpu:
        return cards * WHOLE
    return cards * min(max(need.milli, need.memory), WHOLE)


def node_cards(allocatable: Mapping[str, int], labels: Mapping[str, str]) -> tuple[int, int]:
    """A node's card count (``nvidia.com/gpu``, or the ``shoal.io/gpu-cards`` label where
    that resource counts something else) and one card's memory in MiB (the
    ``nvidia.com/gpu.memory`` label; 0: unknown), as the engine, the simulated cluster
    and the binder read them."""
    count = max(allocatable.get(GPU, 0), 0)
    label = labels.get(CARDS_LABEL, "")
    if label.isdigit() and int(label) <= MAX_NODE_CARDS:
        count = int(label)
    memory = labels.get(MEMORY_LABEL, "")
    return count, int(memory) if memory.isdigit() else 0


def scalar_requests(requests: Mapping[str, int], gpu: GpuRequest | None) -> dict[str, int]:
    """``requests`` as scalar rows: sharing resources left to the card table, and
    ``nvidia.com/gpu`` kept only for whole cards."""
    if gpu is None and not SHARE_RESOURCES.intersection(requests):
        return dict(requests)
    out = {k: v for k, v in requests.items() if k not in SHARE_RESOURCES}
    if gpu is not None:
        if gpu.whole:
            out[GPU] = gpu.cards
        else:
            out.pop(GPU, None)
    return out

"""The baseline GPU placement policies of the FGD paper, and seed 001's m - n rule.

Each is a score plugin; the formulas are those of the paper's simulator
(hkust-adsl/kubernetes-scheduler-simulator, ``pkg/simulator/plugin``), on its 0..100
integer scale and with its constants (``MaxSpecCpu`` 128,000 milli-cpu, ``MaxSpecGpu``
8,000 milli-GPU), in exact integer arithmetic. Per node: ``c`` free cpu, ``G`` idle
milli-GPU (the sum over its cards), ``g_i`` free milli of card i. Per pod: ``c'`` cpu,
``G'`` milli-GPU in all (cards x per-card milli). A sharing pod takes the best-fit card
(the state's default choice) under all of them.

============== ==========================================================================
plugin         score (higher wins)
============== ==========================================================================
GpuBestFit     ``100 - 100·(½(c - c')/128000 + ½(G - G')/8000)``, floored at 0
GpuDotProduct  ``100 - 100·½(c·c'/128000² + G·G'/8000²)`` (merged GPU dimension)
GpuPacking     all cards idle: ``max(33 - idle cards, idle cards)``; the pod needs idle
               cards on a used node: ``max(50 - idle cards taken, 33)``; it shares a used
               card: ``max(100 - ⌊g·100/1000⌋/10, 50)`` with ``g`` that card's free milli.
               CPU-only pods: 0
GpuClustering  ``⌊25·(8000 - G)/8000⌋`` plus 75 (the node holds only pods of the pod's
               kind: sharing, or k whole cards), 50 (that kind among others), 25 (no GPU
               pod yet) or 0 (only other kinds). CPU-only pods: 0
GpuRandom      a hash of (seed, pod name, node slot): the best node is uniformly random
               and the same in every replay (``seed`` arg, default 0); a sharing pod's
               card is drawn from the same stream among those that hold it
GpuMMinusN     seed 001: m idle cards, n asked: ``100 - (m - n)``; a share of ``u`` milli
               on its card with ``f`` free: ``100 - ⌊(f - u)/10⌋``; CPU-only: ``100 - m``
============== ==========================================================================

**Ties.** The simulator's scheduler takes, among nodes of equal score, the one with the
smallest name (its ``selectHost`` was changed so for reproducibility); with scores this
coarse that rule is half the policy (GpuPacking and GpuClustering leave 3 points more
GPU idle under a random tie-break). So each of these plugins (arg ``tieBreak``, default
``name``) returns ``score * (slots + 1) + rank``, ``rank`` being the node's place in
name order (the smallest name highest): the same order as the 0..100 score, equal
scores to the smallest name. ``tieBreak: none`` returns the 0..100 score and leaves ties
to the framework's rotation by pod.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from engine.framework.cycle import CycleState
from engine.model.devices import WHOLE
from engine.model.pods import PodInfo
from engine.model.resources import CPU
from engine.model.state import Bools, ClusterState, Ints
from engine.plugins.gpu.cache import CachedScore, best_fit_card, check_args, parse_tie_break
from events.errors import InputError

MAX_SPEC_CPU: Final = 128_000
MAX_SPEC_GPU: Final = 8_000
MAX_SCORE: Final = 100
TAGS: Final = 65
"""GPU kinds of GpuClustering: 0 sharing, k (1..64) k whole cards."""


def _request(pod: PodInfo) -> tuple[int, int, int, int]:
    """cpu, cards, per-card milli (0: no GPU) and total milli-GPU of ``pod``."""
    cpu = 0
    for row, amount in pod.request:
        if row == CPU:
            cpu = amount
    gpu = pod.gpu
    if gpu is None:
        return cpu, 0, 0, 0
    milli = WHOLE if gpu.whole else gpu.need.milli
    return cpu, gpu.cards, milli, gpu.cards * milli


def _nodes(state: ClusterState, slots: Ints) -> tuple[Ints, Ints, Ints]:
    """Free cpu, free milli per card (absent cards 0) and idle GPU of ``slots``."""
    free = np.maximum(state.cards.free[slots], 0)
    return state.free[CPU, slots], free, free.sum(axis=1)


def _no_card(slots: Ints) -> Ints:
    return np.full(slots.shape[0], -1, dtype=np.int64)


class Baseline(CachedScore):
    """A baseline's args: ``tieBreak`` only."""

    def __init__(self, args: Mapping[str, Any] | None = None, where: str = "") -> None:
        super().__init__()
        args = args or {}
        check_args(args, frozenset({"tieBreak"}), where)
        self.tie_break = parse_tie_break(args, where)


class GpuBestFit(Baseline):
    name = "GpuBestFit"

    def evaluate(self, pod: PodInfo, state: ClusterState, slots: Ints) -> tuple[Ints, Ints]:
        cpu, _, _, total = _request(pod)
        c, _, g = _nodes(state, slots)
        # ½(c - c')/128000 + ½(G - G')/8000 = ((c - c') + 16(G - G')) / 256000
        spare = (c - cpu) + 16 * (g - total)
        score = (MAX_SCORE * 2 * MAX_SPEC_CPU - MAX_SCORE * spare) // (2 * MAX_SPEC_CPU)
        return np.maximum(score, 0), _no_card(slots)


class GpuDotProduct(Baseline):
    name = "GpuDotProduct"

    def evaluate(self, pod: PodInfo, state: ClusterState, slots: Ints) -> tuple[Ints, Ints]:
        cpu, _, _, total = _request(pod)
        c, _, g = _nodes(state, slots)
        # c·c'/128000² + G·G'/8000² = (c·c' + 256·G·G') / 128000²
        scale = MAX_SPEC_CPU * MAX_SPEC_CPU
        dot = c * cpu + 256 * g * total
        score = (MAX_SCORE * scale - (MAX_SCORE // 2) * dot) // scale
        return np.maximum(score, 0), _no_card(slots)


class GpuPacking(Baseline):
    name = "GpuPacking"

    def evaluate(self, pod: PodInfo, state: ClusterState, slots: Ints) -> tuple[Ints, Ints]:
        _, cards, milli, _ = _request(pod)
        none = _no_card(slots)
        if not cards:
            return np.zeros(slots.shape[0], dtype=np.int64), none
        _, free, _ = _nodes(state, slots)
        count = state.cards.count[slots]
        idle = (free >= WHOLE).sum(axis=1)
        all_idle = np.maximum(MAX_SCORE // 3 - idle, idle)
        if milli < WHOLE:
            _, left = best_fit_card(free, milli)
            shared = np.maximum(MAX_SCORE - (left * 100 // WHOLE) // 10, MAX_SCORE // 2)
            used = np.where(left >= WHOLE, MAX_SCORE // 2 - 1, shared)
        else:
            used = np.full(slots.shape[0], max(MAX_SCORE // 2 - cards, MAX_SCORE // 3))
        return np.where(idle == count, all_idle, used), none


def _tag(cards: int, milli: int) -> int:
    return 0 if milli < WHOLE else cards


class GpuClustering(Baseline):
    name = "GpuClustering"

    def __init__(self, args: Mapping[str, Any] | None = None, where: str = "") -> None:
        super().__init__(args, where)
        self._tags = np.zeros((0, TAGS), dtype=np.int64)
        self._position = 0

    def reset(self, state: ClusterState) -> None:
        self._tags = np.zeros((state.capacity, TAGS), dtype=np.int64)
        self._count(state, range(state.high_water))
        self._position = state.journal_end

    def prepare(self, state: ClusterState) -> None:
        changed = state.changed_since(self._position)
        if changed is None:
            self.reset(state)
            return
        self._count(state, sorted(set(changed)))
        self._position = state.journal_end

    def _count(self, state: ClusterState, slots: Any) -> None:
        for slot in slots:
            row = self._tags[slot]
            row[:] = 0
            for key in state.node_pods[slot]:
                gpu = state.pods[key].gpu
                if gpu is not None:
                    row[_tag(gpu.cards, WHOLE if gpu.whole else gpu.need.milli)] += 1

    def evaluate(self, pod: PodInfo, state: ClusterState, slots: Ints) -> tuple[Ints, Ints]:
        _, cards, milli, _ = _request(pod)
        none = _no_card(slots)
        if not cards:
            return np.zeros(slots.shape[0], dtype=np.int64), none
        _, _, g = _nodes(state, slots)
        tags = self._tags[slots]
        kinds = (tags > 0).sum(axis=1)
        has = tags[:, _tag(cards, milli)] > 0
        base = (MAX_SCORE // 4) * (MAX_SPEC_GPU - g) // MAX_SPEC_GPU
        bonus = np.where(has, np.where(kinds == 1, 75, 50), np.where(kinds == 0, 25, 0))
        return base + bonus, none


class GpuMMinusN(Baseline):
    name = "GpuMMinusN"

    def evaluate(self, pod: PodInfo, state: ClusterState, slots: Ints) -> tuple[Ints, Ints]:
        _, cards, milli, _ = _request(pod)
        _, free, _ = _nodes(state, slots)
        if cards and milli < WHOLE:
            _, left = best_fit_card(free, milli)
            score = MAX_SCORE - (left - milli) // 10
        else:
            idle = (free >= WHOLE).sum(axis=1)
            score = MAX_SCORE - (idle - cards)
        return np.clip(score, 0, MAX_SCORE), _no_card(slots)


U64 = npt.NDArray[np.uint64]


def mix64(values: U64) -> U64:
    """splitmix64's finaliser, element-wise (wrapping uint64 arithmetic)."""
    z = values
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: U64 = z ^ (z >> np.uint64(31))
    return out


class GpuRandom:
    """A uniformly random feasible node, from a seeded deterministic stream."""

    name = "GpuRandom"
    local = False

    def __init__(self, args: Mapping[str, Any], where: str) -> None:
        unknown = set(args) - {"seed"}
        if unknown:
            raise InputError(f"unknown arg {sorted(unknown)[0]!r}", location=where)
        seed = args.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise InputError(
                f"must be an integer 0..2^63-1, got {seed!r}", location=f"{where}.seed"
            )
        self.seed = seed

    def __repr__(self) -> str:
        return f"GpuRandom(seed={self.seed})"

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools) -> Ints:
        base = (self.seed * 0x9E3779B97F4A7C15 + zlib.crc32(pod.key.encode())) & 0xFFFFFFFFFFFFFFFF
        with np.errstate(over="ignore"):
            slots = np.arange(state.capacity, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            mixed = mix64(slots + np.uint64(base))
        out: Ints = (mixed >> np.uint64(2)).astype(np.int64)
        return out

    def choose_cards(self, pod: PodInfo, state: ClusterState, slot: int) -> tuple[int, ...] | None:
        """A sharing pod's card: one of those that hold it, drawn from the same stream
        (the simulator's ``gpuSelMethod: random``); whole cards: the default."""
        gpu = pod.gpu
        if gpu is None or gpu.whole or gpu.cards != 1:
            return None
        fits = np.flatnonzero(state.cards.free[slot] >= gpu.need.milli)
        if not fits.size:
            return None
        key = (self.seed * 0x9E3779B97F4A7C15 + zlib.crc32(pod.key.encode()) + 1) & (2**64 - 1)
        draw = int(mix64(np.array([key], dtype=np.uint64))[0])
        return (int(fits[draw % fits.size]),)

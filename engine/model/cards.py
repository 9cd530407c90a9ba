"""The GPU cards of every node, one row per node slot and one column per card.

Per card: its free compute in milli-cards (``free``; 1000 = idle) and its free memory
per mille (``memory``); a card that does not exist is ``-1`` in both, so no request
(always at least 1) fits it and ``max(free, 0)`` sums idle GPU. Per node: how many
cards it has (``count``, from ``nvidia.com/gpu`` or the ``shoal.io/gpu-cards`` label)
and one card's memory in MiB (``mib``, from ``nvidia.com/gpu.memory``; 0 = unknown,
then requests in MiB fit nowhere there).

**How filters see cards.** Every distinct :class:`~engine.model.devices.CardNeed`
(what one card must have free: whole, or ``500m`` compute, or ``8000Mi`` memory...) gets
a resource row of its own, named by :meth:`CardNeed.label`, whose *free* value on a node
is the number of its cards that satisfy the need (``alloc`` the number of cards, ``used``
the rest). A pod asking for N cards of a need requests N of that row. The resource fit
filter, its compiled refresh, the per-shape caches and the slot views then judge cards
exactly, with no plugin of their own: "a 2-card pod on two half-free cards" is 0 cards
satisfying "whole" there. These rows are *derived*: the state rewrites them from the
card columns whenever a node's cards change (:meth:`Cards.counts`); pods' resource
deltas never touch them.

Which cards a pod takes on its node (:meth:`Cards.choose`) is deterministic: whole
cards lowest index first; a share on the busiest card that still holds it (best fit,
then lowest index), so idle cards stay whole. The choice is recorded in ``PodBound``
and replayed as recorded.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from engine.model.devices import WHOLE, CardNeed, GpuRequest

Ints = npt.NDArray[np.int64]
ABSENT: Final = -1


class Cards:
    """Card columns of a :class:`~engine.model.state.ClusterState` (copied with it)."""

    def __init__(self, capacity: int) -> None:
        self.free: Ints = np.full((capacity, 0), ABSENT, dtype=np.int64)
        self.memory: Ints = np.full((capacity, 0), ABSENT, dtype=np.int64)
        self.count: Ints = np.zeros(capacity, dtype=np.int64)
        self.mib: Ints = np.zeros(capacity, dtype=np.int64)
        self.rows: dict[int, CardNeed] = {}
        """Resource row → the need whose satisfying cards it counts."""
        self._needs: tuple[Ints, Ints, Ints, Ints] | None = None
        """``rows`` as arrays (rows, milli, memory, MiB), built on first use."""

    def __repr__(self) -> str:
        return f"Cards(width={self.width}, needs={len(self.rows)})"

    @property
    def width(self) -> int:
        return int(self.free.shape[1])

    def copy(self) -> Cards:
        new = Cards.__new__(Cards)
        new.free = self.free.copy()
        new.memory = self.memory.copy()
        new.count = self.count.copy()
        new.mib = self.mib.copy()
        new.rows = dict(self.rows)
        new._needs = self._needs
        return new

    def grow(self, capacity: int) -> None:
        old = self.count.shape[0]
        extra = capacity - old
        self.free = np.vstack([self.free, np.full((extra, self.width), ABSENT, dtype=np.int64)])
        self.memory = np.vstack([self.memory, np.full((extra, self.width), ABSENT, dtype=np.int64)])
        self.count = np.concatenate([self.count, np.zeros(extra, dtype=np.int64)])
        self.mib = np.concatenate([self.mib, np.zeros(extra, dtype=np.int64)])

    def _widen(self, width: int) -> None:
        extra = width - self.width
        if extra <= 0:
            return
        pad = np.full((self.free.shape[0], extra), ABSENT, dtype=np.int64)
        self.free = np.hstack([self.free, pad])
        self.memory = np.hstack([self.memory, pad.copy()])

    def set_node(self, slot: int, count: int, mib: int) -> None:
        """Give ``slot`` ``count`` idle cards of ``mib`` MiB (pods are re-applied by
        the caller)."""
        self._widen(count)
        self.free[slot] = ABSENT
        self.memory[slot] = ABSENT
        self.free[slot, :count] = WHOLE
        self.memory[slot, :count] = WHOLE
        self.count[slot] = count
        self.mib[slot] = mib

    def clear(self, slot: int) -> None:
        self.set_node(slot, 0, 0)

    # ------------------------------------------------------------------ needs

    def add_row(self, row: int, need: CardNeed) -> None:
        self.rows[row] = need
        self._needs = None

    def _arrays(self) -> tuple[Ints, Ints, Ints, Ints]:
        needs = self._needs
        if needs is None:
            items = sorted(self.rows.items())
            needs = (
                np.array([r for r, _ in items], dtype=np.int64),
                np.array([n.milli for _, n in items], dtype=np.int64),
                np.array([n.memory for _, n in items], dtype=np.int64),
                np.array([n.memory_mib for _, n in items], dtype=np.int64),
            )
            self._needs = needs
        return needs

    def counts(self, slots: Ints | slice) -> tuple[Ints, Ints]:
        """The need rows, and per row and slot of ``slots`` how many cards satisfy it."""
        rows, milli, memory, mib = self._arrays()
        free = self.free[slots][None, :, :]
        mem = self.memory[slots][None, :, :]
        ok = (free >= milli[:, None, None]) & (mem >= memory[:, None, None])
        if mib.any():
            card_mib = self.mib[slots][None, :, None]
            ok &= (mib[:, None, None] == 0) | (
                (card_mib > 0) & (mem * card_mib >= mib[:, None, None] * WHOLE)
            )
        counts: Ints = ok.sum(axis=2)
        return rows, counts

    # ------------------------------------------------------------------ pods

    def fits(self, slot: int, gpu: GpuRequest) -> bool:
        return len(self._candidates(slot, gpu)) >= gpu.cards

    def fits_after(
        self, slot: int, gpu: GpuRequest, released: list[tuple[tuple[int, ...], GpuRequest]]
    ) -> bool:
        """Whether ``gpu`` fits ``slot`` once the pods holding ``released`` (their cards
        and requests) are gone (what preemption asks of a set of victims)."""
        free, mem = self.free[slot].copy(), self.memory[slot].copy()
        mib = int(self.mib[slot])
        count = int(self.count[slot])
        for devices, held in released:
            for card in devices:
                if card < count:
                    free[card] += held.need.milli
                    mem[card] += held.memory_on(mib)
        return len(self._candidates(slot, gpu, free, mem)) >= gpu.cards

    def _candidates(
        self, slot: int, gpu: GpuRequest, free: Ints | None = None, mem: Ints | None = None
    ) -> list[int]:
        need = gpu.need
        if free is None or mem is None:
            free, mem = self.free[slot], self.memory[slot]
        ok = (free >= need.milli) & (mem >= gpu.memory_on(int(self.mib[slot])))
        if need.memory_mib and self.mib[slot] <= 0:
            ok[:] = False
        return [int(c) for c in np.flatnonzero(ok)]

    def free_for(self, slot: int, gpu: GpuRequest, devices: tuple[int, ...]) -> bool:
        """Whether ``devices`` are ``gpu.cards`` distinct cards of ``slot`` each with room
        for ``gpu`` now (cards another engine chose, taken only if so)."""
        return len(set(devices)) == gpu.cards == len(devices) and set(devices) <= set(
            self._candidates(slot, gpu)
        )

    def choose(self, slot: int, gpu: GpuRequest) -> tuple[int, ...]:
        """The cards ``gpu`` takes on ``slot``: whole cards lowest index first, shares
        best fit (least free compute, then memory, then index). When not enough cards
        satisfy the need (a pod adopted from the cluster as it runs), the cards with the
        most room are charged anyway, so what runs is counted."""
        candidates = self._candidates(slot, gpu)
        free, mem = self.free[slot], self.memory[slot]
        if len(candidates) < gpu.cards:
            existing = list(range(int(self.count[slot])))
            existing.sort(key=lambda c: (-int(free[c]), -int(mem[c]), c))
            return tuple(sorted(existing[: gpu.cards]))
        if gpu.whole:
            return tuple(candidates[: gpu.cards])
        candidates.sort(key=lambda c: (int(free[c]), int(mem[c]), c))
        return tuple(sorted(candidates[: gpu.cards]))

    def take(self, slot: int, devices: tuple[int, ...], gpu: GpuRequest, sign: int) -> None:
        """Charge (``sign`` 1) or release (-1) ``gpu`` on ``devices`` of ``slot``; cards
        that no longer exist (the node shrank) are skipped."""
        milli = gpu.need.milli
        memory = gpu.memory_on(int(self.mib[slot]))
        count = int(self.count[slot])
        for card in devices:
            if card < count:
                self.free[slot, card] -= sign * milli
                self.memory[slot, card] -= sign * memory

    def idle(self) -> Ints:
        """Idle milli-GPU per slot (the sum of its cards' free compute)."""
        out: Ints = np.maximum(self.free, 0).sum(axis=1)
        return out

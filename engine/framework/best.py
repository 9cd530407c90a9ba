"""The best node of a pod shape without a pass over every node: a block index over the
shape's cached scores.

:func:`engine.framework.results.select` takes the highest score and, among equals, the
first slot at or after the pod's rotation (wrapping around). Done over the whole score
array, that is two ``argmax`` passes over every node per attempt (a megabyte read at
130,000 nodes), the one part of a plain pod's attempt that grows with the cluster once
its shape's scores are cached. Between two attempts of one shape only a
few nodes change (the pods placed meanwhile), and the framework already refreshes the
shape's cached scores on those nodes only (``Framework._local_feasible``).

:class:`BestIndex` keeps, beside a shape's cached ``masked`` scores (``-1``: the node
does not fit), the maximum of each block of :data:`BLOCK` slots. An attempt then

* refreshes the maxima of the blocks holding the slots changed since the last attempt,
  from each slot's old and new value and how many slots of the block hold its maximum
  (a block is read again only when the last slot holding its maximum fell);
* takes the top score over the block maxima (``nodes / BLOCK`` of them);
* finds the first slot holding it at or after the rotation: in the rotation's own
  block from the rotation on, else in the first later block whose maximum is the top,
  else (wrapping) in the first block that holds it.

Cost per attempt: ``O(changed + BLOCK + nodes / BLOCK)`` element operations, in half a
dozen numpy calls, against ``O(nodes)`` for the full scan; the answer is the full
scan's, slot for slot (property test: ``tests/engine/test_best_index.py``). Memory: two
``int64`` per block per cached shape (``16 / BLOCK`` bytes per node per shape).

Below ``Limits.min_nodes`` slots the full scan is as cheap as the index's calls, so
the framework keeps it there (tests lower the threshold to compare the two). The
framework keeps one index per shape on its cached scores, and one on each of the
shape's scores under a shared spread mask (``Framework._derived``); any attempt with
something pod-specific on top (extenders, a sample, scores that normalise over the
feasible nodes, more than one filter that reads other nodes) takes the full scan.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from engine.model.state import Bools, Ints

BLOCK: Final = 256
"""Slots per block (a power of two)."""
_SHIFT: Final = BLOCK.bit_length() - 1
_FULL_REFRESH: Final = 64
"""Above this many changed slots (or one per ``BLOCK`` slots, if more), take every
block maximum again at once (cheaper than one by one from there)."""


class Limits:
    """Where the framework uses the index (module-level so tests may lower it)."""

    min_nodes = 8192
    """Slots in use from which an attempt selects through the index."""


class BestIndex:
    """Block maxima of one ``masked`` score array (see the module's docstring)."""

    __slots__ = ("blocks", "counts", "dirty", "limit", "scores", "stale")

    def __init__(self, scores: Ints) -> None:
        self.scores = scores
        """The array indexed (the shape's own ``masked``, refreshed in place)."""
        self.dirty: dict[int, int] = {}
        """Slots written since the block maxima were last brought up to date, each with
        the value it held then."""
        self.stale = False
        """More slots were written than are worth refreshing one at a time."""
        self.limit = max(_FULL_REFRESH, scores.shape[0] >> _SHIFT)
        self.blocks, self.counts = _block_max(scores)
        """Per block: its maximum, and how many of its slots hold it."""

    def __repr__(self) -> str:
        return f"BestIndex(slots={self.scores.shape[0]}, dirty={len(self.dirty)})"

    def touch(self, slots: list[int]) -> None:
        """``slots`` of the scores are about to be rewritten (call before writing: the
        values they hold now are what the block maxima were taken over)."""
        if self.stale:
            return
        dirty = self.dirty
        if len(dirty) + len(slots) > self.limit:
            self.stale = True
            dirty.clear()
            return
        scores = self.scores
        for slot in slots:
            if slot not in dirty:
                dirty[slot] = scores.item(slot)

    def _refresh(self) -> None:
        """Bring the block maxima up to date from each changed slot's old and new
        value: a new maximum, one more or one fewer slot at it; a block is taken again
        only when no slot holds its maximum any more."""
        if self.stale:
            self.blocks, self.counts = _block_max(self.scores)
            self.stale = False
            self.dirty.clear()
            return
        dirty = self.dirty
        if not dirty:
            return
        scores, blocks, counts = self.scores, self.blocks, self.counts
        again: set[int] = set()
        for slot, old in dirty.items():
            b = slot >> _SHIFT
            new = scores.item(slot)
            if new == old:
                continue
            top = blocks.item(b)
            if new > top:
                blocks[b], counts[b] = new, 1
            elif new == top:
                counts[b] += 1
            elif old == top:
                counts[b] -= 1
                if not counts[b]:
                    again.add(b)
        for b in again:
            lo = b << _SHIFT
            block = scores[lo : lo + BLOCK]
            top = block.item(int(block.argmax()))  # (argmax: no reduction machinery)
            blocks[b], counts[b] = top, np.count_nonzero(block == top)
        dirty.clear()

    def select(self, used: int, tiebreak: int) -> int:
        """What :func:`engine.framework.results.select` returns for the same scores
        (``used``: slots in use; ``tiebreak``: the pod's rotation)."""
        self._refresh()
        scores = self.scores
        nblocks = ((used - 1) >> _SHIFT) + 1
        blocks = self.blocks[:nblocks]
        # (argmax, not max: no reduction machinery, and it names the first block
        # holding the top, which answers at once when that block is after the rotation's)
        b = int(blocks.argmax())
        top = blocks.item(b)
        start = tiebreak % used
        first = start >> _SHIFT
        if b > first:  # no block up to the rotation's holds the top
            return _first_in(scores, b, used)
        # the rotation's own block, from the rotation on (argmax: the first at the max)
        own = scores[start : min((first + 1) << _SHIFT, used)]
        j = int(own.argmax())
        if own.item(j) == top:
            return start + j
        # the first later block holding the top
        later = blocks[first + 1 :]
        if later.size:
            j = int(later.argmax())
            if later.item(j) == top:
                return _first_in(scores, first + 1 + j, used)
        # wrapping: the first block that holds the top (the rotation's own: before it)
        if b == first:
            lo = first << _SHIFT
            return lo + int(scores[lo:start].argmax())
        return _first_in(scores, b, used)


def _first_in(scores: Ints, block: int, used: int) -> int:
    lo = block << _SHIFT
    return lo + int(scores[lo : min(lo + BLOCK, used)].argmax())


def _block_max(scores: Ints) -> tuple[Ints, Ints]:
    size = scores.shape[0]
    full = size >> _SHIFT
    n = full + (1 if size & (BLOCK - 1) else 0)
    tops = np.empty(n, dtype=np.int64)
    counts = np.empty(n, dtype=np.int64)
    if full:
        body = scores[: full << _SHIFT].reshape(full, BLOCK)
        tops[:full] = body.max(axis=1)
        counts[:full] = np.count_nonzero(body == tops[:full, None], axis=1)
    if n > full:
        tail = scores[full << _SHIFT :]
        tops[full] = tail.max()
        counts[full] = np.count_nonzero(tail == tops[full])
    return tops, counts


class MaskedScores:
    """A shape's scores under a shared, read-only filter mask (a spread constraint's
    verdict, :mod:`engine.plugins.spread_cache`): ``where(mask, scores, -1)``, kept in
    step with the shape's scores slot by slot while the filter returns the same mask
    (the framework keeps a few per shape), with its own best-node index."""

    __slots__ = ("best", "mask", "masked", "slots")

    def __init__(self, mask: Bools, scores: Ints) -> None:
        self.mask = mask
        self.masked: Ints = np.where(mask, scores, -1)
        self.slots: list[int] | None = []
        """Slots of the shape's scores rewritten since ``masked`` was (None: too many
        to follow; the owner builds a new one)."""
        self.best: BestIndex | None = None

    def __repr__(self) -> str:
        return f"MaskedScores(slots={self.masked.shape[0]})"

    def touch(self, slots: list[int], limit: int) -> None:
        """The shape's scores at ``slots`` are about to be rewritten."""
        if self.slots is None:
            return
        if len(self.slots) + len(slots) > limit:
            self.slots = None
            return
        self.slots.extend(slots)
        if self.best is not None:
            self.best.touch(slots)

    def sync(self, scores: Ints) -> None:
        """Take the rewritten slots of the shape's ``scores`` (now up to date)."""
        if self.slots:
            slots = np.array(self.slots, dtype=np.int64)
            self.masked[slots] = np.where(self.mask[slots], scores[slots], -1)
            self.slots.clear()

    def index(self) -> BestIndex:
        if self.best is None:
            self.best = BestIndex(self.masked)
        return self.best

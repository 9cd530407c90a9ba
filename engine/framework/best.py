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
  from each slot's old value (read as the framework tells the index, before it
  writes) and new one, and how many slots of the block hold its maximum (a block is
  read again only when the last slot holding its maximum fell; every block, when
  more changed than that is worth);
* takes the top score over the block maxima (``nodes / BLOCK`` of them);
* finds the first slot holding it at or after the rotation: in the rotation's own
  block from the rotation on, else in the first later block whose maximum is the top,
  else (wrapping) in the first block that holds it.

Cost per attempt: ``O(changed + BLOCK + nodes / BLOCK)`` element operations, against
``O(nodes)`` for the full scan; the answer is the full scan's, slot for slot (property
test: ``tests/engine/test_best_index.py``). With numba loaded (:mod:`engine.plugins.kernels`
installs :func:`refresh_select` through :func:`use_compiled`) the refresh and the
selection are one compiled call (at 130,000 nodes and twenty templates, on a busy
2-core machine: about 15 µs per pod for telling and selecting, against 32 µs with a
Python loop over the changed slots); without, that Python loop and half a dozen numpy
calls. Where the compiled resource refresh rewrites a shape's scores (the default
profile's), it keeps the block maxima in step as it writes (:meth:`BestIndex.follows`),
so nothing is told and the selection has no slot to refresh. Memory: two ``int64`` per
block per cached shape (``16 / BLOCK`` bytes per node per shape).

Below ``Limits.min_nodes`` slots the full scan is as cheap as the index's calls, so
the framework keeps it there (tests lower the threshold to compare the two). The
framework keeps one index per shape on its cached scores, and one on each of the
shape's scores under a shared spread mask (``Framework._derived``); any attempt with
something pod-specific on top (extenders, a sample, scores that normalise over the
feasible nodes, more than one filter that reads other nodes) takes the full scan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np

from engine.model.state import Bools, Ints

BLOCK: Final = 256
"""Slots per block (a power of two)."""
_SHIFT: Final = BLOCK.bit_length() - 1
_COMPILED_SHIFT: Final = 4
"""With the compiled refresh: up to one changed slot per ``1 << _COMPILED_SHIFT``."""
_FULL_REFRESH: Final = 64
"""Above this many changed slots (or one per ``BLOCK`` slots, if more), take every
block maximum again at once (cheaper than block by block from there)."""

RefreshSelect = Callable[[Ints, Ints, Ints, Ints, Ints, bool, int, int, int], int]
""":func:`refresh_select`'s signature (compiled, as :func:`use_compiled` installs it)."""
_compiled: list[RefreshSelect] = []
_NO_SLOTS: Final = np.zeros(0, dtype=np.int64)


def use_compiled(refresh: RefreshSelect | None) -> None:
    """Let every index refresh its block maxima and select in one compiled call
    (:func:`refresh_select`, compiled by numba); :mod:`engine.plugins.kernels`
    installs it when it loads numba. None: numpy (the same answers)."""
    _compiled.clear()
    if refresh is not None:
        _compiled.append(refresh)


def compiled() -> RefreshSelect | None:
    return _compiled[0] if _compiled else None


class Limits:
    """Where the framework uses the index (module-level so tests may lower it)."""

    min_nodes = 8192
    """Slots in use from which an attempt selects through the index."""


class BestIndex:
    """Block maxima of one ``masked`` score array (see the module's docstring)."""

    __slots__ = (
        "blocks",
        "changed",
        "counts",
        "limit",
        "limit_compiled",
        "olds",
        "scores",
        "shift",
        "stale",
        "written",
    )

    def __init__(self, scores: Ints) -> None:
        self.scores = scores
        """The array indexed (the shape's own ``masked``, refreshed in place)."""
        self.changed: list[Ints] = []
        self.olds: list[Ints] = []
        """Slots written since the block maxima were last brought up to date, each
        batch with the values its slots held before (a slot may recur: its first
        value is the one the maxima were taken over)."""
        self.written = 0
        self.stale = True
        """More slots were written than are worth refreshing one at a time (and at
        first: the maxima are taken at the first selection)."""
        self.limit = max(_FULL_REFRESH, scores.shape[0] >> _SHIFT)
        self.limit_compiled = max(_FULL_REFRESH, scores.shape[0] >> _COMPILED_SHIFT)
        """With the compiled refresh a slot costs some nanoseconds, not a Python loop's
        microsecond: it follows more of them before taking every block again."""
        self.shift = _SHIFT
        """Slots per block, as a power of two (as built)."""
        n = (scores.shape[0] + BLOCK - 1) >> _SHIFT
        self.blocks: Ints = np.empty(n, dtype=np.int64)
        self.counts: Ints = np.empty(n, dtype=np.int64)
        """Per block: its maximum, and how many of its slots hold it (up to date but
        for the slots written since, unless ``stale``)."""

    def __repr__(self) -> str:
        return f"BestIndex(slots={self.scores.shape[0]}, written={self.written})"

    def touch(self, slots: list[int]) -> None:
        """``slots`` of the scores are about to be rewritten (call before writing: the
        values they hold now are what the block maxima were taken over)."""
        if self.stale:
            return
        self.written += len(slots)
        if self.written > (self.limit if not _compiled else self.limit_compiled):
            self.stale = True
            self.changed.clear()
            self.olds.clear()
            return
        at = np.array(slots, dtype=np.int64)
        self.changed.append(at)
        self.olds.append(self.scores[at])

    def follows(self, count: int) -> bool:
        """Whether a writer of ``count`` slots of the scores may keep the block maxima
        in step as it writes (the compiled resource refresh,
        :meth:`engine.plugins.kernels.ResourceKernel.run`): they are up to date (not
        stale, nothing told since the last selection), the index refreshes compiled,
        and ``count`` is within what is worth following (beyond, :meth:`told` marks
        the index stale)."""
        return (
            not self.stale
            and not self.changed
            and bool(_compiled)
            and self.written + count <= self.limit_compiled
        )

    def told(self, slots: Ints, olds: Ints) -> None:
        """:meth:`touch` with the slots as an array and the values they hold now,
        read by the caller (who is about to write them)."""
        if self.stale:
            return
        self.written += slots.shape[0]
        if self.written > (self.limit if not _compiled else self.limit_compiled):
            self.stale = True
            self.changed.clear()
            self.olds.clear()
            return
        self.changed.append(slots)
        self.olds.append(olds)

    def select(self, used: int, tiebreak: int) -> int:
        """What :func:`engine.framework.results.select` returns for the same scores
        (``used``: slots in use; ``tiebreak``: the pod's rotation)."""
        changed, olds = self.changed, self.olds
        if len(changed) > 1:
            slots, old = np.concatenate(changed), np.concatenate(olds)
        elif changed:
            slots, old = changed[0], olds[0]
        else:
            slots = old = _NO_SLOTS
        changed.clear()
        olds.clear()
        self.written = 0
        stale, self.stale = self.stale, False
        refresh = compiled()
        if refresh is not None:
            return refresh(
                self.scores, self.blocks, self.counts, slots, old, stale, used, tiebreak, _SHIFT
            )
        if stale:
            self.blocks[:], self.counts[:] = _block_max(self.scores)
        elif slots.size:
            self._refresh(slots.tolist(), old.tolist())
        return self._select(used, tiebreak)

    def _refresh(self, slots: list[int], olds: list[int]) -> None:
        """Bring the block maxima up to date from each changed slot's old and new
        value: a new maximum, one more or one fewer slot at it; a block is taken again
        only when no slot holds its maximum any more (numpy)."""
        scores, blocks, counts = self.scores, self.blocks, self.counts
        again: set[int] = set()
        seen: set[int] = set()
        for slot, old in zip(slots, olds, strict=True):
            if slot in seen:
                continue  # the first value written over is the one the maxima knew
            seen.add(slot)
            b = slot >> _SHIFT
            new = scores.item(slot)
            if new == old or b in again:
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

    def _select(self, used: int, tiebreak: int) -> int:
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


_PENDING: Final = -(1 << 62)
"""A block maximum no score takes: marks the blocks to take again."""
PENDING: Final = _PENDING


def follow(top: int, count: int, old: int, new: int) -> tuple[int, int]:
    """A block's maximum ``top`` and how many of its slots hold it (``count``), after
    one of its slots went from ``old`` to ``new``: a new maximum, one more or one fewer
    slot at it; :data:`PENDING` when no slot holds it any more (:func:`block_top` takes
    it again), and left so while pending. Scalars only, for numba
    (:func:`refresh_select`, and :mod:`engine.plugins.kernels`, which registers it to be
    compiled into them); its twin is :meth:`BestIndex._refresh`."""
    if new == old or top == _PENDING:
        return top, count
    if new > top:
        return new, 1
    if new == top:
        return top, count + 1
    if old == top:
        count -= 1
        if count == 0:
            return _PENDING, count
    return top, count


def block_top(scores: Ints, b: int, shift: int) -> tuple[int, int]:
    """Block ``b``'s maximum in ``scores`` (blocks of ``1 << shift`` slots, the last
    one maybe shorter) and how many of its slots hold it; for numba, as :func:`follow`."""
    lo = b << shift
    hi = min(lo + (1 << shift), scores.shape[0])
    top = scores[lo]
    count = 1
    for s in range(lo + 1, hi):
        if scores[s] > top:
            top = scores[s]
            count = 1
        elif scores[s] == top:
            count += 1
    return top, count


def refresh_select(
    scores: Ints,
    blocks: Ints,
    counts: Ints,
    slots: Ints,
    olds: Ints,
    stale: bool,
    used: int,
    tiebreak: int,
    shift: int,
) -> int:  # pragma: no cover - compiled; its twin is BestIndex._refresh and _select
    """:meth:`BestIndex.select` in one loop, for numba: bring the block maxima up to
    date from each written slot's old value (``olds``: the first one written over, where
    a slot recurs) and new one (every block, if ``stale``), then select as
    :func:`engine.framework.results.select` does, reading only the block maxima, the
    rotation's own block and the first block holding the top."""
    width = 1 << shift
    if stale:
        for b in range(blocks.shape[0]):
            blocks[b] = _PENDING
    else:
        order = np.argsort(slots, kind="mergesort")  # a recurring slot: its first first
        last = -1
        for k in range(order.shape[0]):
            s = slots[order[k]]
            if s == last:
                continue
            last = s
            b = s >> shift
            blocks[b], counts[b] = follow(blocks[b], counts[b], olds[order[k]], scores[s])
    for i in range(blocks.shape[0] if stale else slots.shape[0]):
        b = i if stale else slots[i] >> shift
        if blocks[b] == _PENDING:  # taken again
            blocks[b], counts[b] = block_top(scores, b, shift)
    nblocks = ((used - 1) >> shift) + 1
    top = blocks[0]
    for b in range(1, nblocks):
        top = max(top, blocks[b])
    start = tiebreak % used
    first = start >> shift
    # the rotation's own block, from the rotation on
    for s in range(start, min((first + 1) << shift, used)):
        if scores[s] == top:
            return s
    # the first later block holding the top; then, wrapping, the first from the start
    # (the rotation's own block: before the rotation)
    for turn in range(2):
        lo_b = first + 1 if turn == 0 else 0
        hi_b = nblocks if turn == 0 else first + 1
        for b in range(lo_b, hi_b):
            if blocks[b] != top:
                continue
            lo = b << shift
            hi = start if b == first else min(lo + width, used)
            for s in range(lo, hi):
                if scores[s] == top:
                    return s
    return start  # not reached: some slot in use holds the top


class MaskedScores:
    """A shape's scores under a shared, read-only filter mask (a spread constraint's
    verdict, :mod:`engine.plugins.spread_cache`): ``where(mask, scores, -1)``, kept in
    step with the shape's scores slot by slot while the filter returns the same mask
    (the framework keeps a few per shape), with its own best-node index."""

    __slots__ = ("best", "feasible", "mask", "masked", "slots")

    def __init__(self, mask: Bools, scores: Ints) -> None:
        self.mask = mask
        self.masked: Ints = np.where(mask, scores, -1)
        self.feasible: Bools | None = None
        """The shape's verdict under the mask, once asked for (:meth:`verdict`), kept
        in step as ``masked`` is: callers must not modify it."""
        self.slots: list[int] | None = []
        """Slots of the shape's scores rewritten since ``masked`` was (None: too many
        to follow; the owner builds a new one)."""
        self.best: BestIndex | None = None

    def __repr__(self) -> str:
        return f"MaskedScores(slots={self.masked.shape[0]})"

    def touch(self, slots: list[int], limit: int) -> None:
        """The shape's scores at ``slots`` are about to be rewritten (``masked`` and
        its index learn of it at the next :meth:`sync`: a shape keeps several of these,
        and only the one its pod's mask names is read)."""
        if self.slots is None:
            return
        if len(self.slots) + len(slots) > limit:
            self.slots = None
            return
        self.slots.extend(slots)

    def sync(self, scores: Ints, feasible: Bools) -> None:
        """Take the rewritten slots of the shape's ``scores`` and verdict ``feasible``
        (both now up to date)."""
        if self.slots:
            slots = np.array(self.slots, dtype=np.int64)
            if self.best is not None:
                self.best.told(slots, self.masked[slots])
            mask = self.mask[slots]
            self.masked[slots] = np.where(mask, scores[slots], -1)
            if self.feasible is not None:
                self.feasible[slots] = mask & feasible[slots]
            self.slots.clear()

    def verdict(self, feasible: Bools) -> Bools:
        """``mask & feasible`` (the shape's verdict, up to date: :meth:`sync` first),
        kept from then on slot by slot."""
        if self.feasible is None:
            self.feasible = self.mask & feasible
        return self.feasible

    def index(self) -> BestIndex:
        if self.best is None:
            self.best = BestIndex(self.masked)
        return self.best

"""What the GPU placement policies share: per pod shape, a score (and a chosen card) per
node slot, kept between attempts and refreshed only on the nodes that changed.

A policy's score for a node depends on the pod's cpu and GPU request and on that node's
free cpu and cards (and labels), never on other nodes; so pods of one shape are an
equivalence class, and after a placement only the slots in the state's change journal
(:meth:`ClusterState.changed_since`) are evaluated again, all of them in one vectorised
call. A change of labels or of the node set (``static_version``), another state object
(a staged copy) or a journal that forgot the position recompute the shape whole.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.model.pods import PodInfo
from engine.model.resources import CPU
from engine.model.state import Bools, ClusterState, Ints
from events.errors import InputError

SHAPES: Final = 256
"""Pod shapes kept per plugin (least recently used dropped)."""
REFRESH_LIMIT: Final = 2048
"""Above this many journal entries since a shape was scored, score it whole."""


def shape_key(pod: PodInfo) -> tuple[Any, ...]:
    """What a policy's score depends on: cpu and the GPU request (not memory)."""
    cpu = 0
    for row, amount in pod.request:
        if row == CPU:
            cpu = amount
    gpu = pod.gpu
    return (cpu,) if gpu is None else (cpu, gpu.cards, gpu.need)


@dataclass(slots=True)
class Entry:
    """One pod shape's cached scores and cards, by slot, as of journal ``position``."""

    position: int
    scores: Ints
    cards: Ints


class CachedScore:
    """Base of the GPU policies: subclasses define :meth:`evaluate` (and may refresh
    per-node caches of their own in :meth:`prepare`)."""

    name = ""
    local = False
    tie_break = True
    """Break equal scores by node name (the smallest first), as FGD's simulator does;
    the score returned is then ``score * (slots + 1) + rank``."""

    def __init__(self) -> None:
        self._state: ClusterState | None = None
        self._version = -1
        self._capacity = -1
        self._entries: OrderedDict[tuple[Any, ...], Entry] = OrderedDict()
        self.counters = {"full": 0, "refreshed": 0, "reused": 0}
        self.rank = np.zeros(0, dtype=np.int64)
        """Per slot, the node's place in name order, the first name highest (1..n; 0
        for slots without a node): the tie-break of FGD's simulator, which takes the
        node with the smallest name among equal scores."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shapes={len(self._entries)})"

    def stats(self) -> dict[str, int]:
        return {"shapes": len(self._entries), **self.counters}

    def key(self, pod: PodInfo) -> tuple[Any, ...]:
        return shape_key(pod)

    def _sync(self, state: ClusterState) -> bool:
        """Drop everything when the state is another one or its nodes changed."""
        if (
            state is not self._state
            or state.static_version != self._version
            or state.capacity != self._capacity
        ):
            self._state = state
            self._version = state.static_version
            self._capacity = state.capacity
            self._entries.clear()
            self.rank = name_rank(state)
            self.reset(state)
            return True
        return False

    def reset(self, state: ClusterState) -> None:
        """The nodes changed (or the state is new): drop per-node caches."""

    def prepare(self, state: ClusterState) -> None:
        """Before :meth:`evaluate`: bring per-node caches up to date."""

    def evaluate(self, pod: PodInfo, state: ClusterState, slots: Ints) -> tuple[Ints, Ints]:
        """Scores of ``pod`` on ``slots`` (higher is better, never negative) and, per
        slot, the card a sharing pod would take there (-1: the default choice)."""
        raise NotImplementedError

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools) -> Ints:
        self._sync(state)
        key = self.key(pod)
        entry = self._entries.get(key)
        end = state.journal_end
        changed = None
        if entry is not None and entry.position <= end:
            changed = state.changed_since(entry.position)
        if entry is None or changed is None or len(changed) > REFRESH_LIMIT:
            capacity = state.capacity
            entry = Entry(
                end, np.zeros(capacity, dtype=np.int64), np.full(capacity, -1, dtype=np.int64)
            )
            self._entries[key] = entry
            if len(self._entries) > SHAPES:
                self._entries.popitem(last=False)
            self.counters["full"] += 1
            if state.high_water:
                self.update(pod, state, entry, None)
        else:
            self._entries.move_to_end(key)
            self.counters["refreshed" if changed else "reused"] += 1
            if changed:
                self.update(pod, state, entry, changed)
        entry.position = end
        return entry.scores

    def update(
        self, pod: PodInfo, state: ClusterState, entry: Entry, changed: list[int] | None
    ) -> None:
        """Score ``pod``'s shape again into ``entry`` on the slots ``changed`` (journal
        entries, repeats allowed; None: every slot): :meth:`prepare`, :meth:`evaluate`
        and the tie-break. A subclass may do the same in one step of its own."""
        if changed is None:
            slots: Ints = np.arange(state.high_water, dtype=np.int64)
        else:
            slots = np.array(sorted(set(changed)), dtype=np.int64)
        self.prepare(state)
        scores, cards = self.evaluate(pod, state, slots)
        if self.tie_break:
            scores = scores * (state.capacity + 1) + self.rank[slots]
        entry.scores[slots] = scores
        entry.cards[slots] = cards

    def choose_cards(self, pod: PodInfo, state: ClusterState, slot: int) -> tuple[int, ...] | None:
        """The card this policy chose for a sharing pod on ``slot`` when it scored it."""
        gpu = pod.gpu
        if gpu is None or gpu.whole or gpu.cards != 1:
            return None
        entry = self._entries.get(self.key(pod))
        if entry is None or slot >= entry.cards.shape[0]:
            return None
        card = int(entry.cards[slot])
        return (card,) if card >= 0 else None


TIE_BREAKS: Final = ("name", "none")


def parse_tie_break(args: Mapping[str, Any], where: str) -> bool:
    """The ``tieBreak`` arg: ``name`` (default: equal scores go to the smallest node
    name, as in FGD's simulator) or ``none`` (the framework's rotation by pod)."""
    raw = args.get("tieBreak", "name")
    if raw not in TIE_BREAKS:
        raise InputError(
            f"must be one of {', '.join(TIE_BREAKS)}, got {raw!r}", location=f"{where}.tieBreak"
        )
    return bool(raw == "name")


def check_args(args: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    unknown = set(args) - known
    if unknown:
        raise InputError(f"unknown arg {sorted(unknown)[0]!r}", location=where)


def name_rank(state: ClusterState) -> Ints:
    """See :attr:`CachedScore.rank`."""
    rank = np.zeros(state.capacity, dtype=np.int64)
    named = sorted((name, slot) for slot, name in enumerate(state.names) if name is not None)
    for place, (_, slot) in enumerate(named):
        rank[slot] = len(named) - place
    return rank


def best_fit_card(free: Ints, milli: int) -> tuple[Ints, Ints]:
    """Per row of ``free`` (milli per card, absent cards 0): the card with the least free
    milli that still holds ``milli`` (lowest index among equals; -1: none), and its free."""
    fits = free >= milli
    masked = np.where(fits, free, np.iinfo(np.int64).max)
    card = masked.argmin(axis=1)
    rows = np.arange(free.shape[0])
    ok = fits[rows, card]
    return np.where(ok, card, -1), np.where(ok, free[rows, card], 0)

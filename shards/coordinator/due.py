"""The earliest time-outs of what the coordinator asked of the shards, without a pass
over all of it.

Each poll asks when the coordinator must act next (:meth:`Coordinator.next_wakeup`)
and each pass whether anything timed out (``_timeouts``): the claims still preparing
and the preemptions whose victims are not all gone, each timed out a reservation
time-out after it began (its ``since``). A wave of preemptions keeps thousands of both
under way at once (every member of a run is nominated, and each placement is a claim
of its own), and a pass over every one of them at every poll grows with the wave
twice over. Here each is kept in a heap by ``since`` as it begins, and what has ended
since (a claim committed, aborted or forgotten; a nomination whose victims are gone,
or timed out) is dropped as it reaches the top: the earliest still under way is the
top, read in O(1) amortised. The callers read every entry only when the earliest has
timed out (the same answers as the pass over all of them, which they then make).

Not state: made again from the ledger's ``claims`` and ``nominated`` (after a restore,
from the restored ones).
"""

from __future__ import annotations

import heapq

from shards.coordinator.flights import PREPARING, Claim

Nomination = tuple[int, dict[str, None]]
"""(since, victims not yet gone), as :attr:`Ledger.nominated` keeps it."""


class Due:
    """The earliest ``since`` of the preparing ``claims`` and of the ``nominated``
    units (the dictionaries it was made from, which the ledger keeps)."""

    def __init__(self, claims: dict[str, Claim], nominated: dict[str, Nomination]) -> None:
        self.claims = claims
        self.nominated = nominated
        self._claims: list[tuple[int, int, Claim]] = []
        self._nominations: list[tuple[int, int, str, Nomination]] = []
        self._order = 0
        for claim in claims.values():
            self.claimed(claim)
        for unit, entry in nominated.items():
            self.nominating(unit, entry)

    def __repr__(self) -> str:
        return f"Due(claims={len(self._claims)}, nominations={len(self._nominations)})"

    def claimed(self, claim: Claim) -> None:
        """``claim`` was made (kept while it is in ``claims`` and preparing)."""
        if claim.stage == PREPARING:
            self._order += 1
            heapq.heappush(self._claims, (claim.since, self._order, claim))

    def nominating(self, unit: str, entry: Nomination) -> None:
        """``unit`` was nominated (kept while ``nominated`` holds this very ``entry``)."""
        self._order += 1
        heapq.heappush(self._nominations, (entry[0], self._order, unit, entry))

    def first_claim(self) -> int | None:
        """The earliest ``since`` of a claim still preparing (None: none is)."""
        heap = self._claims
        claims = self.claims
        while heap:
            since, _, claim = heap[0]
            # (a claim never goes back to preparing; one made again is pushed again)
            if claim.stage == PREPARING and claims.get(claim.rid) is claim:
                return since
            heapq.heappop(heap)
        return None

    def first_nomination(self) -> int | None:
        """The earliest ``since`` of a unit still nominated (None: none is)."""
        heap = self._nominations
        nominated = self.nominated
        while heap:
            since, _, unit, entry = heap[0]
            if nominated.get(unit) is entry:
                return since
            heapq.heappop(heap)
        return None

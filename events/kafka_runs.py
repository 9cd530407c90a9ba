"""The runs of records a Kafka log appended itself, per partition (``events.kafka``).

A log knows what it appended: the offsets each append got, the kinds of its records and
the term they carry (``events.fence``: ``(FENCE, EPOCH)``, or none). So a reader of the
same log need not fetch them to judge their terms (what they do to the terms is known:
the term is the highest of its fence, unless the partition already holds a higher one
for it), and a reader that wants other kinds passes over them without fetching them
(the coordinator, relaying shards' reports, passes over the pods it routed to them).

Pure bookkeeping, no I/O: the log decides when a run may be passed over.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

OWN_RUNS = 1024
"""Runs remembered per partition (older ones are read, as any other record)."""


class Appended(NamedTuple):
    """What one append stored: its ``offsets``, and the kinds (record keys) and terms
    (``(FENCE, EPOCH)``; None: a record with no term) of its records, gathered as they
    were encoded."""

    offsets: list[int]
    kinds: frozenset[bytes]
    terms: frozenset[tuple[str, int] | None]


@dataclass(frozen=True, slots=True)
class Run:
    """Offsets ``[start, end)``, every one a record this log appended (consecutive
    offsets of appends that returned), holding records of ``kinds`` only, all of
    ``term`` (none: no term)."""

    start: int
    end: int
    kinds: frozenset[bytes]
    term: tuple[str, int] | None


class OwnRuns:
    """The last ``keep`` runs per partition, in offset order."""

    def __init__(self, keep: int = OWN_RUNS) -> None:
        self.keep = keep
        self._runs: dict[int, deque[Run]] = {}

    def add(
        self,
        partition: int,
        offsets: Sequence[int],
        kinds: frozenset[bytes],
        term: tuple[str, int] | None,
    ) -> None:
        """Note an append's ``offsets`` (ascending), joined to the run before where
        they follow it with the same term."""
        runs = self._runs.setdefault(partition, deque(maxlen=self.keep))
        for start, end in _stretches(offsets):
            last = runs[-1] if runs else None
            if last is not None and start < last.end:
                runs.clear()  # offsets going back: another log's numbering; forget it all
                last = None
            if last is not None and last.end == start and last.term == term:
                runs[-1] = Run(last.start, end, last.kinds | kinds, term)
            else:
                runs.append(Run(start, end, kinds, term))

    def drop_before(self, partition: int, offset: int) -> None:
        """Forget the runs that end at or before ``offset``."""
        runs = self._runs.get(partition)
        while runs and runs[0].end <= offset:
            runs.popleft()

    def at(self, partition: int, offset: int) -> Run | None:
        """The run that holds ``offset``, if any."""
        for run in self._runs.get(partition, ()):
            if run.start > offset:
                return None
            if offset < run.end:
                return run
        return None

    def next_without(self, partition: int, offset: int, kinds: frozenset[bytes]) -> int | None:
        """Where the first run that starts after ``offset`` and holds none of ``kinds``
        starts, if any."""
        for run in self._runs.get(partition, ()):
            if run.start > offset and not run.kinds & kinds:
                return run.start
        return None


def _stretches(offsets: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each stretch of consecutive ``offsets`` (ascending): one for
    an append of one record batch (no loop per record then)."""
    if not offsets:
        return []
    if offsets[-1] - offsets[0] == len(offsets) - 1:
        return [(offsets[0], offsets[-1] + 1)]
    out = [(offsets[0], offsets[0] + 1)]
    for offset in offsets[1:]:
        if out[-1][1] == offset:
            out[-1] = (out[-1][0], offset + 1)
        else:
            out.append((offset, offset + 1))
    return out

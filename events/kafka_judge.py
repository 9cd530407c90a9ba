"""Fencing on the read side of the Kafka log (``events.kafka``), as the second line
behind its transactions: which records a reader drops.

A record a leader appended carries its term in a header (``shoal-term``:
``FENCE:EPOCH``, ``events.kafka_records``), and a reader drops (sees a
``RecordFenced`` in place of) a record whose epoch is below one its partition already
holds for that fence. The judgement is a function of the partition's order, kept per
partition as reads go (headers only; a read from further on first scans the records
before it, undecoded; the records a log appended itself it judges from what it
appended, unfetched: ``events.kafka_runs``), so every reader and replay drop the same
records. It finds nothing to drop where terms write in transactions; it is what fences
a broker without transactions (``transactions=false``) and what replays logs written
before.

Pure bookkeeping, no I/O: the log hands it the records it fetched, in offset order,
and the appends it made.
"""

from __future__ import annotations

from typing import Any

from events.kafka_records import TERM_HEADER
from events.kafka_runs import Appended, OwnRuns, Run

PARSED_TERMS = 1024
"""Distinct term headers a judge keeps parsed (a writer that makes up many only empties
the cache, it does not grow it)."""


class TermJudge:
    """The terms of one log's partitions, judged in offset order."""

    def __init__(self) -> None:
        self.judged: dict[int, int] = {}
        """Per partition, the offset up to which its records' terms are judged."""
        self.terms: dict[int, dict[str, int]] = {}
        """Per partition, the highest epoch seen per fence (up to ``judged``)."""
        self.dropped: dict[int, dict[int, int]] = {}
        """Per partition, the offsets of records fenced, and the epoch that fenced each."""
        self.own = OwnRuns()
        """Per partition, the runs of records the log appended: judged without
        fetching them, and passed over by a ``read_kinds`` of other kinds."""
        self._parsed: dict[bytes, tuple[str, int]] = {}
        """Term headers seen, parsed (at most ``PARSED_TERMS``: emptied when full)."""

    def __repr__(self) -> str:
        return f"TermJudge(judged={self.judged})"

    def appended(self, partition: int, appended: Appended) -> None:
        """Note the records of an append that returned as a run of the log's own, if
        they share one term (or none)."""
        if len(appended.terms) == 1:
            (term,) = appended.terms
            self.own.add(partition, appended.offsets, appended.kinds, term)

    def record(self, partition: int, record: Any) -> int:
        """The epoch that fences ``record`` (0: it stands), judged in offset order."""
        at = record.offset
        if at < self.judged.get(partition, 0):
            return self.dropped.get(partition, {}).get(at, 0)
        # (offsets between are no records: transaction markers, aborted transactions)
        self.judged[partition] = at + 1
        term = None
        for key, value in record.headers or ():  # (a plain loop: this runs per record)
            if key == TERM_HEADER:
                term = bytes(value)
                break
        if term is None:
            return 0
        parsed = self._parsed.get(term)
        if parsed is None:  # the records of a term share its header: parsed once
            if len(self._parsed) >= PARSED_TERMS:
                self._parsed.clear()
            fence, _, text = term.decode(errors="replace").rpartition(":")
            parsed = self._parsed[term] = (fence, int(text) if text.isdigit() else 0)
        stale = self._admit(partition, *parsed)
        if stale:
            self.dropped.setdefault(partition, {})[at] = stale
        return stale

    def own_run(self, partition: int, run: Run) -> bool:
        """Judge ``run``, records of the log's own from where judging stands (or
        before), without fetching them, as :meth:`record` would in order: they stand,
        and their term is then the highest of its fence. False, judging nothing, if
        the partition already holds a higher epoch for that fence (the records are
        then fetched and dropped). (A read with a limit may stop inside a run: a limit
        counts offsets, and the commit marker of a transaction before the run took
        one.)"""
        if self.judged.get(partition, 0) < run.start:
            return False  # (out of order: never so, judging goes on from where it stands)
        if run.term is not None and self._admit(partition, *run.term):
            return False
        self.judged[partition] = max(self.judged.get(partition, 0), run.end)
        return True

    def _admit(self, partition: int, fence: str, epoch: int) -> int:
        """The rule :meth:`record` and :meth:`own_run` share: the epoch that fences a
        record of term ``epoch`` of ``fence`` judged next in ``partition``, in offset
        order (0: it stands, and its epoch is then the highest of its fence there)."""
        terms = self.terms.setdefault(partition, {})
        highest = terms.get(fence, 0)
        if epoch >= highest:
            terms[fence] = epoch
            return 0
        return highest

    def past_own(self, partition: int, offset: int, wanted: frozenset[bytes]) -> int:
        """Where a read of ``wanted`` kinds from ``offset`` goes on: past the runs of
        the log's own records there that hold none of them, judged as it goes (not
        past a run of an older term than the partition holds: that one is read)."""
        self.own.drop_before(partition, offset)  # (a reader that keeps up never judges)
        while True:
            run = self.own.at(partition, offset)
            if run is None or run.kinds & wanted:
                return offset
            if self.judged.get(partition, 0) < run.end and not self.own_run(partition, run):
                return offset
            offset = run.end

    def highest(self, partition: int, fence: str) -> int:
        """The highest epoch of ``fence`` judged in ``partition`` so far."""
        return self.terms.get(partition, {}).get(fence, 0)

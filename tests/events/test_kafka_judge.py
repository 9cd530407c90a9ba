"""The read-side judgement of terms (``events.kafka_judge``), without a broker: a run of
the log's own records is judged as its records would be one by one (the log fetches
and judges those of a run it may not pass over), so a reader that appended drops the
same records as one that did not."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from events.kafka_judge import TermJudge
from events.kafka_records import TERM_HEADER
from events.kafka_runs import Appended

TERMS = st.sampled_from([None, ("c", 1), ("c", 2), ("c", 3), ("d", 1)])
APPENDS = st.lists(st.tuples(st.integers(1, 4), TERMS), min_size=1, max_size=12)
"""Appends to one partition, back to back: (records, their term)."""


@dataclass(frozen=True)
class _Record:
    offset: int
    headers: tuple[tuple[str, bytes], ...]


def _records(appends: list[tuple[int, tuple[str, int] | None]]) -> list[_Record]:
    out: list[_Record] = []
    for count, term in appends:
        headers = () if term is None else ((TERM_HEADER, f"{term[0]}:{term[1]}".encode()),)
        out += [_Record(len(out) + i, headers) for i in range(count)]
    return out


@settings(max_examples=60, deadline=None)
@given(APPENDS)
def test_a_run_of_its_own_is_judged_as_its_records_one_by_one(
    appends: list[tuple[int, tuple[str, int] | None]],
) -> None:
    records = _records(appends)
    by_one = TermJudge()
    stale = {r.offset: by_one.record(0, r) for r in records}
    own = TermJudge()
    at = 0
    for count, term in appends:
        own.appended(
            0, Appended(list(range(at, at + count)), frozenset({b"bind"}), frozenset({term}))
        )
        at += count
    seen: dict[int, int] = {}
    while own.judged.get(0, 0) < len(records):
        start = own.judged.get(0, 0)
        run = own.own.at(0, start)
        assert run is not None
        if own.own_run(0, run):
            seen.update((o, 0) for o in range(run.start, run.end))
        else:  # fetched and judged one by one
            seen.update((r.offset, own.record(0, r)) for r in records[run.start : run.end])
    assert seen == stale
    assert own.terms == by_one.terms
    assert own.highest(0, "c") == by_one.highest(0, "c")


def test_a_record_of_an_older_term_is_dropped_and_stays_so() -> None:
    judge = TermJudge()
    newer = _Record(0, ((TERM_HEADER, b"c:2"),))
    older = _Record(1, ((TERM_HEADER, b"c:1"),))
    plain = _Record(2, ())
    assert [judge.record(0, r) for r in (newer, older, plain)] == [0, 2, 0]
    assert judge.record(0, older) == 2  # read again: the same judgement

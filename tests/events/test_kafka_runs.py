"""The runs of its own records a Kafka log remembers (``events.kafka_runs``): what a
read may pass over without fetching it (the log itself is tested in test_kafka.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from events.kafka_runs import OwnRuns

TERMS = st.sampled_from([None, ("c", 1), ("c", 2), ("ingest", 1)])
KINDS = st.sampled_from([frozenset({b"bind"}), frozenset({b"route"}), frozenset({b"pod+"})])
APPENDS = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 4), KINDS, TERMS), min_size=1, max_size=12
)
"""Appends: (offsets skipped before it: others' records, commit markers; its records;
their kinds; their term)."""


@settings(max_examples=60, deadline=None)
@given(APPENDS, st.integers(0, 60))
def test_a_run_holds_exactly_the_offsets_appended_with_their_kinds_and_term(
    appends: list[tuple[int, int, frozenset[bytes], tuple[str, int] | None]], probe: int
) -> None:
    runs = OwnRuns()
    mine: dict[int, tuple[frozenset[bytes], tuple[str, int] | None]] = {}
    at = 0
    for gap, count, kinds, term in appends:
        at += gap
        offsets = list(range(at, at + count))
        runs.add(0, offsets, kinds, term)
        mine.update((o, (kinds, term)) for o in offsets)
        at += count
    run = runs.at(0, probe)
    if probe not in mine:
        assert run is None
        return
    assert run is not None and run.start <= probe < run.end
    assert all(o in mine and mine[o][1] == run.term for o in range(run.start, run.end))
    assert mine[probe][0] <= run.kinds
    assert all(mine[o][0] <= run.kinds for o in range(run.start, run.end))
    # the next run without some kinds starts after ``probe`` and holds none of them
    wanted = frozenset({b"bind"})
    nxt = runs.next_without(0, probe, wanted)
    if nxt is not None:
        after = runs.at(0, nxt)
        assert nxt > probe and after is not None and after.start == nxt
        assert not after.kinds & wanted
    runs.drop_before(0, probe + 1)
    assert runs.at(0, probe) is (run if run.end > probe + 1 else None)


def test_only_the_last_runs_are_kept_and_other_partitions_are_apart() -> None:
    runs = OwnRuns(keep=2)
    for start in (0, 10, 20):
        runs.add(1, [start, start + 1], frozenset({b"bind"}), None)
    assert runs.at(1, 0) is None, "the oldest run is forgotten (its records are read)"
    assert runs.at(1, 11) is not None and runs.at(1, 21) is not None
    assert runs.at(0, 11) is None

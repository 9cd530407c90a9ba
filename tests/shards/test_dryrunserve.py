"""The cut of a running service's log that a dry run copies (shards.dryrunserve)."""

from __future__ import annotations

from events.types import ClockTicked, Envelope
from shards.dryrunserve import consistent_cut


def _env(offset: int, producer: str = "ingest", causation: int = -1, stream: str = "") -> Envelope:
    return Envelope(
        event=ClockTicked(), offset=offset, producer=producer, causation=causation, stream=stream
    )


def test_the_cut_drops_what_another_partition_has_not_reached() -> None:
    shard0 = [_env(0, "router", causation=0), _env(1, "shard-0", causation=0)]
    shard1 = [_env(0, "router", causation=1), _env(1, "router", causation=3)]
    control = [
        _env(0),
        _env(1),
        _env(2, "relay-0", causation=1, stream="relay"),  # shard 0's offset 1: kept
        _env(3, "relay-0", causation=2, stream="relay"),  # shard 0 has no offset 2: cut here
        _env(4),
    ]
    cut = consistent_cut([shard0, shard1, control])
    assert [[e.offset for e in p] for p in cut] == [[0, 1], [0], [0, 1, 2]]


def test_one_partition_is_taken_whole() -> None:
    records = [_env(0), _env(1)]
    assert consistent_cut([records]) == [records]

"""File log crash handling: a torn last append is dropped whole, corruption and records
out of place are errors naming the partition and offset, and nothing is skipped; logs
of the first format still open, read and take appends.

Over 500 lines: the file log's rules (torn appends, corruption, records out of place,
the first format) share their helpers for writing, cutting and rearranging a real log,
and read best side by side."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from events.errors import LogCorruptedError, LogError, NotALogError, RecordTooLargeError
from events.filelog import FILE_HEADER, RECORD_HEADER, FileLog
from events.types import Envelope, PodDeleted

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "logs-before-rebuild"


def recs(n: int, start: int = 0) -> list[Envelope]:
    return [Envelope(event=PodDeleted(pod=f"ns/pod-{i}"), time=i) for i in range(start, start + n)]


async def write(path: Path, n: int, partitions: int = 1) -> list[int]:
    """Write ``n`` records to partition 0, one append each; return each one's position."""
    log = FileLog(path, partitions=partitions)
    for i in range(n):
        await log.append(recs(1, i))
    positions = list(log._positions[0])
    await log.close()
    return positions


async def read_all(path: Path) -> list[list[Envelope]]:
    log = FileLog(path, readonly=True)
    try:
        return [await log.read(p, 0) for p in range(log.partitions)]
    finally:
        await log.close()


def records_of(path: Path) -> tuple[bytes, list[tuple[int, bytes]]]:
    """The file header of the log at ``path`` and its records in file order, each as
    (partition, the record's bytes): the raw material for tampering."""
    log = FileLog(path, readonly=True)
    starts = sorted((pos, p) for p, positions in enumerate(log._positions) for pos in positions)
    log._file.close()  # what ``close`` does read-only; callable inside an event loop
    data = path.read_bytes()
    ends = [pos for pos, _ in starts[1:]] + [len(data)]
    return data[: FILE_HEADER.size], [
        (p, data[pos:end]) for (pos, p), end in zip(starts, ends, strict=True)
    ]


# ---------------------------------------------------------------------------- basics


async def test_reopen_continues_offsets(tmp_path: Path) -> None:
    path = tmp_path / "a.events"
    await write(path, 3)
    log = FileLog(path)
    assert await log.end_offset(0) == 3
    assert await log.append(recs(2, 3)) == [3, 4]
    await log.close()
    log = FileLog(path, readonly=True)
    assert [e.event for e in await log.read(0, 0)] == [e.event for e in recs(5)]
    await log.close()


async def test_partitions_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "p.events"
    log = FileLog(path, partitions=3)
    await log.append(recs(2), partition=2)
    await log.append(recs(1), partition=0)
    await log.close()
    log = FileLog(path)
    assert log.partitions == 3
    assert await log.end_offset(2) == 2 and await log.end_offset(0) == 1
    await log.close()


async def test_a_new_file_is_written_in_version_2(tmp_path: Path) -> None:
    path = tmp_path / "n.events"
    await write(path, 1)
    assert FILE_HEADER.unpack_from(path.read_bytes()) == (b"SHOALLOG", 2)


# ---------------------------------------------------------------------------- torn tails


@pytest.mark.parametrize("cut", [1, RECORD_HEADER.size - 1, RECORD_HEADER.size + 2])
async def test_torn_last_record_is_truncated_on_open(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "t.events"
    positions = await write(path, 4)
    full = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(positions[3] + cut)
    log = FileLog(path)
    assert log.torn_bytes == cut
    assert await log.end_offset(0) == 3
    assert path.stat().st_size == positions[3]
    assert await log.append(recs(1, 3)) == [3]
    await log.close()
    assert path.stat().st_size == full


async def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    path = tmp_path / "z.events"
    await write(path, 2)
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\0" * 4096)
    log = FileLog(path)
    assert log.torn_bytes == 4096
    assert await log.end_offset(0) == 2
    await log.close()
    assert path.stat().st_size == size


async def test_a_batch_zeroed_from_its_middle_is_dropped_whole(tmp_path: Path) -> None:
    """The size of the file reached the disk, the end of the last append did not."""
    path = tmp_path / "zb.events"
    log = FileLog(path)
    await log.append(recs(2))
    whole = log._end
    await log.append(recs(3, 2))
    middle = log._positions[0][3]
    await log.close()
    data = bytearray(path.read_bytes())
    data[middle:] = bytes(len(data) - middle)
    path.write_bytes(bytes(data))
    log = FileLog(path)
    assert log.torn_bytes == len(data) - whole and await log.end_offset(0) == 2
    await log.close()
    assert path.stat().st_size == whole


async def test_readonly_open_ignores_torn_tail_without_writing(tmp_path: Path) -> None:
    path = tmp_path / "r.events"
    positions = await write(path, 3)
    with open(path, "r+b") as f:
        f.truncate(positions[2] + 5)
    size = path.stat().st_size
    log = FileLog(path, readonly=True)
    assert log.torn_bytes == 5 and await log.end_offset(0) == 2
    with pytest.raises(LogError, match="read-only"):
        await log.append(recs(1))
    await log.close()
    assert path.stat().st_size == size


Batches = Sequence[tuple[int, int]]  # (partition, records) per append

# Appends of several records each, across three partitions, one of them (2) used only
# from the third append on, and one append of a single record.
BATCHES: Batches = [(0, 3), (1, 2), (2, 4), (0, 1), (1, 3), (0, 2)]


async def write_batches(path: Path, batches: Batches) -> tuple[list[int], list[list[Envelope]]]:
    """Append ``batches`` to a new 2-partition log (partition 2 comes with the records);
    return where each batch ends in the file and every record appended, per partition."""
    top = max(p for p, _ in batches) + 1
    log = FileLog(path, partitions=top)
    ends: list[int] = []
    for number, (partition, count) in enumerate(batches):
        await log.append(recs(count, 100 * number), partition=partition)
        ends.append(log._end)
    await log.close()
    return ends, await read_all(path)


def expected_prefix(
    batches: Batches, ends: list[int], written: list[list[Envelope]], cut: int
) -> tuple[int, list[list[Envelope]]]:
    """Where the whole batches of a file cut at ``cut`` end, and their records."""
    counts = [0] * len(written)
    boundary = FILE_HEADER.size
    for (partition, count), end in zip(batches, ends, strict=True):
        if end > cut:
            break
        counts[partition] += count
        boundary = end
    return boundary, [records[:n] for records, n in zip(written, counts, strict=True)]


async def check_cut(
    path: Path, data: bytes, batches: Batches, ends: list[int], written: list[list[Envelope]]
) -> None:
    """Open ``data`` cut at every byte of it, read-only then writable, and check that
    exactly the whole batches before the cut open, then that an append follows them."""
    for cut in range(FILE_HEADER.size, len(data) + 1):
        boundary, expected = expected_prefix(batches, ends, written, cut)
        path.write_bytes(data[:cut])
        for readonly in (True, False):
            log = FileLog(path, partitions=1, readonly=readonly)
            got = [await log.read(p, 0) for p in range(log.partitions)]
            got += [[]] * (len(expected) - len(got))  # a partition no whole batch used
            assert got == expected, (cut, readonly)
            assert log.torn_bytes == cut - boundary, (cut, readonly)
            if readonly:
                await log.close()
                assert path.stat().st_size == cut  # nothing written
        assert path.stat().st_size == boundary
        start = len(expected[0])
        assert await log.append(recs(2, 1000), partition=0) == [start, start + 1]
        await log.close()
        after = await read_all(path)
        appended = [replace(e, offset=start + i, partition=0) for i, e in enumerate(recs(2, 1000))]
        assert after + [[]] * (len(expected) - len(after)) == [
            expected[0] + appended,
            *expected[1:],
        ], cut


async def test_a_torn_append_is_dropped_whole_at_every_byte(tmp_path: Path) -> None:
    path = tmp_path / "b.events"
    ends, written = await write_batches(path, BATCHES)
    data = path.read_bytes()
    await check_cut(path, data, BATCHES, ends, written)


@settings(max_examples=25, deadline=None)
@given(
    batches=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=6),
    cuts=st.lists(st.floats(0, 1), min_size=1, max_size=8),
)
def test_any_cut_keeps_exactly_the_whole_appends_before_it(
    tmp_path_factory: pytest.TempPathFactory, batches: Batches, cuts: list[float]
) -> None:
    """Whatever the appends, a file cut anywhere opens as the appends wholly before the
    cut (the test above checks every byte of one layout; this one, many layouts)."""
    path = tmp_path_factory.mktemp("cut") / "h.events"

    async def go() -> None:
        ends, written = await write_batches(path, batches)
        data = path.read_bytes()
        for share in cuts:
            cut = FILE_HEADER.size + round(share * (len(data) - FILE_HEADER.size))
            boundary, expected = expected_prefix(batches, ends, written, cut)
            path.write_bytes(data[:cut])
            log = FileLog(path)
            got = [await log.read(p, 0) for p in range(log.partitions)]
            await log.close()
            assert got + [[]] * (len(expected) - len(got)) == expected
            assert path.stat().st_size == boundary

    asyncio.run(go())


# ---------------------------------------------------------------------------- corruption


async def test_corrupted_payload_in_the_middle_names_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "c.events"
    positions = await write(path, 5)
    with open(path, "r+b") as f:
        f.seek(positions[2] + RECORD_HEADER.size + 3)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(LogCorruptedError, match="offset 2") as info:
        FileLog(path)
    assert info.value.offset == 2 and info.value.partition == 0
    size = path.stat().st_size
    with pytest.raises(LogCorruptedError):
        FileLog(path)  # a writable open must not "repair" it either
    assert path.stat().st_size == size


async def test_corrupted_header_is_corruption_not_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "h.events"
    positions = await write(path, 3)
    with open(path, "r+b") as f:
        f.seek(positions[1])
        f.write(b"\xff\xff\xff\x7f")  # an absurd length: must not be taken for a torn tail
    with pytest.raises(LogCorruptedError, match="offset 1"):
        FileLog(path)


async def test_corrupted_last_record_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "l.events"
    await write(path, 2)
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x55]))
    with pytest.raises(LogCorruptedError, match="offset 1"):
        FileLog(path)


@pytest.mark.parametrize(
    "content",
    [b"hello world, this is not a log", b"SHOAL", FILE_HEADER.pack(b"SHOALLOG", 99)],
    ids=["text", "short", "future-version"],
)
def test_not_a_log(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.events"
    path.write_bytes(content)
    with pytest.raises(NotALogError):
        FileLog(path)
    assert path.read_bytes() == content


def test_missing_file_readonly(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="no such event log"):
        FileLog(tmp_path / "nope.events", readonly=True)


async def test_fsync_mode_appends(tmp_path: Path) -> None:
    log = FileLog(tmp_path / "f.events", fsync=True)
    assert await log.append(recs(2)) == [0, 1]
    assert log.stats()["records"] == 2
    await log.close()


# ---------------------------------------------------------------------------- out of place


def real_log(path: Path) -> Path:
    """A version 2 log of the records of a recorded two-shard run (three partitions),
    appended one to four at a time, the partitions taking turns."""

    async def go() -> None:
        parts = await read_all(OLD / "batch-2.log")
        log = FileLog(path, partitions=len(parts))
        cursor = [0] * len(parts)
        size = 1
        while any(c < len(r) for c, r in zip(cursor, parts, strict=True)):
            for p, records in enumerate(parts):
                chunk = records[cursor[p] : cursor[p] + size]
                if chunk:
                    await log.append(chunk, partition=p)
                cursor[p] += len(chunk)
                size = size % 4 + 1
        await log.close()

    asyncio.run(go())
    return path


def first_out_of_place(order: list[int], partitions: list[int]) -> tuple[int, int]:
    """Where a log whose records were rearranged into ``order`` (indices of the records
    as written; ``partitions`` says each one's partition) goes wrong: the partition of
    the first record that does not follow the one written before it, and the offset
    that partition has reached there."""
    counts: dict[int, int] = {}
    previous = -1
    for index in order:
        partition = partitions[index]
        if index != previous + 1:
            return partition, counts.get(partition, 0)
        counts[partition] = counts.get(partition, 0) + 1
        previous = index
    raise AssertionError("nothing is out of place")


def remaining(record: bytes) -> int:
    return int(RECORD_HEADER.unpack_from(record)[3])


def tampered(records: list[tuple[int, bytes]], kind: str) -> list[int]:
    """A rearrangement of a real log's records (indices in file order) of ``kind``."""
    n = len(records)
    mid = [i for i in range(n // 3, n) if remaining(records[i][1]) and remaining(records[i - 1][1])]
    single = next(i for i in range(n // 3, n - 1) if not remaining(records[i][1]))
    order = list(range(n))
    if kind == "duplicate a record":
        order.insert(mid[0] + 1, mid[0])
    elif kind == "duplicate a whole append":
        order.insert(single + 1, single)
    elif kind == "drop a record":
        del order[mid[0]]
    elif kind == "drop a whole append":
        # the appends between two records that end one: the record after ``single``
        # starts an append; drop it up to the end of that append
        start = single + 1
        end = next(i for i in range(start, n) if not remaining(records[i][1]))
        del order[start : end + 1]
    elif kind == "swap two records of one append":
        order[mid[0]], order[mid[0] + 1] = order[mid[0] + 1], order[mid[0]]
    elif kind == "swap two appends of different partitions":
        a = single
        b = a + 1
        assert records[a][0] != records[b][0] and not remaining(records[b][1])
        order[a], order[b] = order[b], order[a]
    elif kind == "move a record to the end":
        order.append(order.pop(mid[0]))
    return order


KINDS = [
    "duplicate a record",
    "duplicate a whole append",
    "drop a record",
    "drop a whole append",
    "swap two records of one append",
    "swap two appends of different partitions",
    "move a record to the end",
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_record_out_of_place_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    header, records = records_of(real_log(tmp_path / "real.events"))
    order = tampered(records, kind)
    path = tmp_path / "tampered.events"
    data = header + b"".join(records[i][1] for i in order)
    path.write_bytes(data)
    partition, offset = first_out_of_place(order, [p for p, _ in records])
    for readonly in (True, False):
        with pytest.raises(LogCorruptedError, match="out of place") as info:
            FileLog(path, readonly=readonly)
        assert (info.value.partition, info.value.offset) == (partition, offset), kind
        assert f"partition {partition}, offset {offset}" in str(info.value)
    assert path.read_bytes() == data  # nothing repaired


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["duplicate", "drop", "swap"]),
    picks=st.tuples(st.floats(0, 1, exclude_max=True), st.floats(0, 1, exclude_max=True)),
)
def test_any_duplicate_drop_or_swap_is_refused(
    tmp_path_factory: pytest.TempPathFactory, kind: str, picks: tuple[float, float]
) -> None:
    """Whatever record is duplicated (to anywhere), dropped (but the last: that is a
    torn tail) or swapped with another, opening the log refuses it where it goes wrong."""
    folder = tmp_path_factory.mktemp("tamper")
    header, records = records_of(real_log(folder / "real.events"))
    n = len(records)
    i, j = (int(share * n) for share in picks)
    order = list(range(n))
    if kind == "duplicate":
        order.insert(j + 1, i)
    elif kind == "drop":
        del order[min(i, n - 2)]
    elif i != j and records[i][1] != records[j][1]:
        order[i], order[j] = order[j], order[i]
    else:
        return
    path = folder / "tampered.events"
    path.write_bytes(header + b"".join(records[k][1] for k in order))
    with pytest.raises(LogCorruptedError, match="out of place") as info:
        FileLog(path, readonly=True)
    where = first_out_of_place(order, [p for p, _ in records])
    assert (info.value.partition, info.value.offset) == where


@pytest.mark.parametrize("kind", ["duplicate a record", "drop a record", "swap two records"])
async def test_a_version_1_record_out_of_place_is_refused_when_read(
    tmp_path: Path, kind: str
) -> None:
    """A version 1 record does not carry its place in its header, but its envelope does:
    the read that reaches it refuses it."""
    header, records = records_of(OLD / "quickstart-1.log")
    order = list(range(len(records)))
    k = len(records) // 2
    if kind == "duplicate a record":
        order.insert(k + 1, k)
    elif kind == "drop a record":
        del order[k]
    else:
        order[k], order[k + 3] = order[k + 3], order[k]
    path = tmp_path / "old.events"
    path.write_bytes(header + b"".join(records[i][1] for i in order))
    log = FileLog(path, readonly=True)
    _, offset = first_out_of_place(order, [0] * len(records))
    assert await log.read(0, 0, offset)  # the records before it read
    with pytest.raises(LogCorruptedError, match="out of place") as info:
        await log.read(0, 0)
    assert (info.value.partition, info.value.offset) == (0, offset)
    with pytest.raises(LogCorruptedError, match=f"offset {offset}"):
        await log.read(0, offset, 1)
    await log.close()


@pytest.mark.parametrize("version", [1, 2])
def test_replay_refuses_a_duplicated_record_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int
) -> None:
    """End to end: ``shoal replay --verify`` of a log with a record duplicated says
    where, in one line, and exits 2 (it used to replay another outcome and exit 0)."""
    from shards.cli import main

    source = OLD / "quickstart-1.log"
    if version == 2:
        parts = asyncio.run(read_all(source))
        source = tmp_path / "v2.events"

        async def copy() -> None:
            log = FileLog(source)
            for at in range(0, len(parts[0]), 3):
                await log.append(parts[0][at : at + 3])
            await log.close()

        asyncio.run(copy())
    assert main(["replay", str(source), "--verify"]) == 0
    capsys.readouterr()
    header, records = records_of(source)
    k = len(records) // 2
    order = list(range(len(records)))
    order.insert(k + 1, k)
    path = tmp_path / "dup.events"
    path.write_bytes(header + b"".join(records[i][1] for i in order))
    with pytest.raises(SystemExit) as exited:
        main(["replay", str(path), "--verify"])
    code = exited.value.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"partition 0, offset {k + 1}" in err and "out of place" in err


# ---------------------------------------------------------------------------- version 1


async def test_a_version_1_log_takes_appends_in_version_1(tmp_path: Path) -> None:
    path = tmp_path / "old.events"
    shutil.copy(OLD / "quickstart-1.log", path)
    before = (await read_all(path))[0]
    log = FileLog(path)
    assert log.stats()["version"] == 1
    assert await log.append(recs(2, 500)) == [len(before), len(before) + 1]
    await log.close()
    assert FILE_HEADER.unpack_from(path.read_bytes()) == (b"SHOALLOG", 1)
    after = (await read_all(path))[0]
    assert after[: len(before)] == before
    assert [e.event for e in after[len(before) :]] == [e.event for e in recs(2, 500)]


async def test_a_version_1_torn_tail_drops_the_torn_record(tmp_path: Path) -> None:
    """Version 1 has no appends to keep whole: its rule stays the record."""
    path = tmp_path / "old.events"
    _, records = records_of(OLD / "quickstart-1.log")
    data = (OLD / "quickstart-1.log").read_bytes()
    path.write_bytes(data[: len(data) - len(records[-1][1]) + 7])
    log = FileLog(path)
    assert log.torn_bytes == 7 and await log.end_offset(0) == len(records) - 1
    await log.close()
    assert path.stat().st_size == len(data) - len(records[-1][1])


async def test_a_record_over_the_record_limit_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("events.filelog.MAX_RECORD", 4096)
    log = FileLog(tmp_path / "log", partitions=1)
    small = [Envelope(event=PodDeleted(pod=f"ns/p{i}")) for i in range(3)]
    with pytest.raises(RecordTooLargeError, match=r"record of .* over the limit of 4096"):
        await log.append([*small, Envelope(event=PodDeleted(pod="ns/" + "x" * 5000))])
    assert await log.end_offset(0) == 0
    assert await log.append(small) == [0, 1, 2]
    await log.close()

"""File log crash handling: torn tails are truncated, corruption is an error naming the
offset, and nothing is skipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from events.errors import LogCorruptedError, LogError, NotALogError
from events.filelog import FILE_HEADER, RECORD_HEADER, FileLog
from events.types import Envelope, PodDeleted


def recs(n: int, start: int = 0) -> list[Envelope]:
    return [Envelope(event=PodDeleted(pod=f"ns/pod-{i}"), time=i) for i in range(start, start + n)]


async def write(path: Path, n: int, partitions: int = 1) -> list[int]:
    """Write ``n`` records to partition 0 and return each record's file position."""
    log = FileLog(path, partitions=partitions)
    await log.append(recs(n))
    positions = list(log._positions[0])
    await log.close()
    return positions


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

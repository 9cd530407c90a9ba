"""Durable append-only file log.

Layout: a 12-byte file header (``SHOALLOG`` + format version), then records::

    length:u32  partition:u32  payload_crc:u32  header_crc:u32  payload[length]

all little-endian. ``header_crc`` covers the first 12 header bytes, ``payload_crc`` the
msgpack payload (one :class:`~events.types.Envelope`). Every partition's records share
the one file; offsets count records per partition.

Crash handling, decided on open:

- the file ends inside a record (short header, or a payload shorter than its valid
  header declares), or everything from some record on is zero bytes (the tail of a
  file whose size reached the disk before its data): that is a *torn* last write. A
  writable open truncates it; a read-only open ignores it. Either way ``torn_bytes``
  says how much.
- a complete record whose header or payload fails its checksum is *corruption*: opening
  fails with :class:`~events.errors.LogCorruptedError` naming the partition and offset.
  Nothing is skipped and nothing is rewritten.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import msgspec

from events.codec import DecodeError, decode, encode
from events.errors import LogCorruptedError, LogError, NotALogError
from events.log import check_partition
from events.types import Envelope

MAGIC = b"SHOALLOG"
VERSION = 1
FILE_HEADER = struct.Struct("<8sI")
RECORD_HEADER = struct.Struct("<IIII")
MAX_RECORD = 64 * 1024 * 1024
MAX_PARTITIONS = 1 << 16


class FileLog:
    """An ``EventLog`` in one append-only file; see the module docstring for the format."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        partitions: int = 1,
        readonly: bool = False,
        fsync: bool = False,
    ) -> None:
        """Open or create the log at ``path``.

        ``partitions`` is used when creating; an existing log keeps the partitions its
        records use (at least ``partitions``). ``fsync=True`` syncs after every append;
        otherwise data is flushed to the OS on every append and synced on close.
        """
        if partitions < 1:
            raise ValueError("a log needs at least one partition")
        self.path = Path(path)
        self.readonly = readonly
        self._fsync = fsync
        self._positions: list[list[int]] = [[] for _ in range(partitions)]
        self.torn_bytes = 0
        exists = self.path.exists() and self.path.stat().st_size > 0
        if readonly and not exists:
            raise LogError(f"{self.path}: no such event log")
        mode = "rb" if readonly else ("r+b" if exists else "w+b")
        try:
            self._file = open(self.path, mode)  # noqa: SIM115 - owned for the log's life
        except OSError as exc:
            raise LogError(f"{self.path}: {exc.strerror}") from None
        if exists:
            try:
                self._scan()
            except BaseException:
                self._file.close()
                raise
        else:
            self._file.write(FILE_HEADER.pack(MAGIC, VERSION))
            self._file.flush()
        self._end = self._file.seek(0, os.SEEK_END)

    def __repr__(self) -> str:
        return (
            f"FileLog({str(self.path)!r}, partitions={self.partitions}, readonly={self.readonly})"
        )

    # ------------------------------------------------------------------ opening

    def _scan(self) -> None:
        data = self._file.read()
        if len(data) < FILE_HEADER.size or data[:8] != MAGIC:
            raise NotALogError(f"{self.path}: not a shoal event log (bad header)")
        _, version = FILE_HEADER.unpack_from(data)
        if version != VERSION:
            raise NotALogError(f"{self.path}: unsupported event log version {version}")
        pos = FILE_HEADER.size
        size = len(data)
        hsize = RECORD_HEADER.size
        while pos < size:
            if size - pos < hsize:
                self._torn(pos, size)
                return
            length, partition, pcrc, hcrc = RECORD_HEADER.unpack_from(data, pos)
            offset = len(self._positions[partition]) if partition < len(self._positions) else 0
            if zlib.crc32(data[pos : pos + 12]) != hcrc:
                # A zero tail fails its header checksum, so only then is the rest of the
                # file looked at (once): checking it at every record made opening quadratic.
                if data.count(0, pos) == size - pos:
                    self._torn(pos, size)
                    return
                raise LogCorruptedError(
                    "record header checksum mismatch",
                    partition=partition if partition < MAX_PARTITIONS else -1,
                    offset=offset,
                    path=str(self.path),
                )
            if length > MAX_RECORD or partition >= MAX_PARTITIONS:
                raise LogCorruptedError(
                    "record header out of range",
                    partition=partition,
                    offset=offset,
                    path=str(self.path),
                )
            if pos + hsize + length > size:
                self._torn(pos, size)
                return
            if zlib.crc32(data[pos + hsize : pos + hsize + length]) != pcrc:
                raise LogCorruptedError(
                    "record payload checksum mismatch",
                    partition=partition,
                    offset=offset,
                    path=str(self.path),
                )
            while partition >= len(self._positions):
                self._positions.append([])
            self._positions[partition].append(pos)
            pos += hsize + length

    def _torn(self, pos: int, size: int) -> None:
        self.torn_bytes = size - pos
        if not self.readonly:
            self._file.truncate(pos)
            self._file.flush()
            os.fsync(self._file.fileno())

    # ------------------------------------------------------------------ protocol

    @property
    def partitions(self) -> int:
        return len(self._positions)

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        if self.readonly:
            raise LogError(f"{self.path}: opened read-only")
        check_partition(partition, len(self._positions))
        positions = self._positions[partition]
        start = len(positions)
        chunks: list[bytes] = []
        new_positions: list[int] = []
        pos = self._end
        replace = msgspec.structs.replace
        for i, env in enumerate(envelopes):
            payload = encode(replace(env, offset=start + i, partition=partition))
            if len(payload) > MAX_RECORD:
                raise LogError(f"record of {len(payload)} bytes exceeds {MAX_RECORD}")
            head = struct.pack("<III", len(payload), partition, zlib.crc32(payload))
            chunks.append(head + struct.pack("<I", zlib.crc32(head)) + payload)
            new_positions.append(pos)
            pos += RECORD_HEADER.size + len(payload)
        blob = b"".join(chunks)
        try:
            self._file.seek(self._end)
            self._file.write(blob)
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())
        except OSError as exc:
            # Leave the file as it was: a partial write is a torn tail for the next open.
            self._file.truncate(self._end)
            raise LogError(f"{self.path}: append failed: {exc.strerror}") from None
        self._end = pos
        positions.extend(new_positions)
        return list(range(start, start + len(envelopes)))

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        check_partition(partition, len(self._positions))
        positions = self._positions[partition]
        offset = max(offset, 0)
        stop = len(positions) if limit is None else min(len(positions), offset + limit)
        if offset >= stop:
            return []
        first = positions[offset]
        last = positions[stop - 1]
        self._file.seek(last)
        (last_len,) = struct.unpack("<I", self._file.read(4))
        self._file.seek(first)
        blob = memoryview(self._file.read(last + RECORD_HEADER.size + last_len - first))
        out: list[Envelope] = []
        hsize = RECORD_HEADER.size
        for i in range(offset, stop):
            rel = positions[i] - first
            (length,) = struct.unpack_from("<I", blob, rel)
            try:
                out.append(decode(blob[rel + hsize : rel + hsize + length]))
            except DecodeError as exc:
                raise LogCorruptedError(
                    f"record does not decode: {exc}",
                    partition=partition,
                    offset=i,
                    path=str(self.path),
                ) from None
        return out

    async def end_offset(self, partition: int) -> int:
        check_partition(partition, len(self._positions))
        return len(self._positions[partition])

    async def close(self) -> None:
        if self._file.closed:
            return
        if not self.readonly:
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()

    def stats(self) -> dict[str, int]:
        return {
            "partitions": len(self._positions),
            "records": sum(map(len, self._positions)),
            "bytes": self._end,
            "torn_bytes": self.torn_bytes,
        }

"""Durable append-only file log.

Layout: a 12-byte file header (``SHOALLOG`` + format version: u32), then records, all
little-endian. Every partition's records share the one file; offsets count records per
partition. Version 2 (written for every new file)::

    length:u32  partition:u32  offset:u64  remaining:u32  chain:u32  payload_crc:u32
    header_crc:u32  payload[length]

``payload`` is one msgpack :class:`~events.types.Envelope`, ``payload_crc`` its CRC-32
and ``header_crc`` that of the 28 header bytes before it. One ``append`` call is one
*batch*: its records follow each other, all of one partition, and ``remaining`` counts
the records of the batch after this one, so the batch is whole at the record whose
``remaining`` is 0. ``offset`` is the record's offset in its partition and ``chain`` the
``header_crc`` of the record before it in the file (for the first record, the CRC-32 of
the file header): a record (or a whole append) duplicated, dropped or moved is found on
open, because it carries another offset or follows another record than the one it was
written after. Only whole appends lost from the end of the file cannot be told from
appends never made.

Version 1, the layout of logs written before; they are still read, and a version 1 file
is appended to in version 1 (the rule: a file keeps the version it was created with,
so that no file mixes layouts and nothing is rewritten)::

    length:u32  partition:u32  payload_crc:u32  header_crc:u32  payload[length]

(``header_crc`` covers the 12 bytes before it.) Version 1 has no batches: a crash in the
middle of an append keeps the records of it that reached the disk whole and drops only
the torn one. Its records are checked against their place only when read (below).

Crash handling, decided on open:

- the file ends inside a record (short header, or a payload shorter than its valid
  header declares), everything from some record on is zero bytes (the tail of a file
  whose size reached the disk before its data), or (version 2) the last batch is not
  whole: that is a *torn* last append. In version 2 the whole batch is dropped, never a
  part of it (in version 1, the torn record): a writable open truncates the file to the
  end of the last whole batch; a read-only open ignores what follows it. Either way
  ``torn_bytes`` says how much.
- a complete record whose header or payload fails its checksum, or (version 2) that is
  out of place (an offset other than the next of its partition, a ``chain`` other than
  the record before it, a batch broken by another record), is *corruption*: opening
  fails with :class:`~events.errors.LogCorruptedError` naming the partition and offset.
  Nothing is skipped and nothing is rewritten.
- reading a record also checks that the envelope in it names the partition and offset
  it is read at (every version stores them in the envelope), and raises
  :class:`~events.errors.LogCorruptedError` otherwise.

One writer at a time: a writable open takes an exclusive ``flock`` on the file beside
the log, ``PATH.lock`` (every partition is in the one file, so one lock covers them
all), and writes "pid host" in it; a second writable open, from another process or
from this one, fails at once with :class:`~events.errors.LogInUseError` naming that
holder. Two writers would each append at their own idea of the end, overwriting each
other's records. The lock is the kernel's, so it goes with the process that held it
(a crash included), and ``close`` gives it up; the lock file stays (removing it would
let a third writer lock a new file while a second still holds the old one). The lock
is taken before the log is opened, so a writer never truncates a torn tail another
writer is still appending to, nor replaces (``replace=True``) a log in use. A
read-only open (replay) takes no lock and reads what the writer has flushed.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import msgspec

from events.codec import DecodeError, decode, encode, kind_of
from events.errors import (
    LogCorruptedError,
    LogError,
    LogInUseError,
    NotALogError,
    RecordTooLargeError,
)
from events.fence import FenceBook, term_of
from events.log import check_partition
from events.types import Envelope

MAGIC = b"SHOALLOG"
VERSION = 2
"""The format version written for new files; :data:`READ_VERSIONS` are those read."""
READ_VERSIONS = (1, 2)
FILE_HEADER = struct.Struct("<8sI")
RECORD_HEADER = struct.Struct("<IIQIIII")
"""A version 2 record header; its ``header_crc`` covers all but its last 4 bytes."""
RECORD_HEADER_V1 = struct.Struct("<IIII")
MAX_RECORD = 64 * 1024 * 1024
MAX_PARTITIONS = 1 << 16

_HEAD = struct.Struct("<IIQIII")  # a version 2 header without its checksum
_HEAD_V1 = struct.Struct("<III")
_CRC = struct.Struct("<I")

LOCK_SUFFIX = ".lock"
"""The lock file of the log at ``PATH`` is ``PATH.lock``."""


def lock_path(path: Path) -> Path:
    """Where the writer's lock of the log at ``path`` is."""
    return path.with_name(path.name + LOCK_SUFFIX)


def take_lock(path: Path) -> BinaryIO:
    """Lock the log at ``path`` for writing (see the module docstring): the open lock
    file, locked and holding "pid host", to keep open while writing (closing it
    releases the lock). :class:`~events.errors.LogInUseError` when another open holds
    it, naming the holder; :class:`~events.errors.LogError` when it cannot be taken."""
    where = lock_path(path)
    try:
        file = open(where, "a+b")  # noqa: SIM115 - held open for as long as the lock
    except OSError as exc:
        raise LogError(f"{where}: cannot open the writer's lock: {exc.strerror}") from None
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        pid, _, host = file.read(256).decode("utf-8", "replace").strip().partition(" ")
        file.close()
        holder = f"pid {pid} on host {host}" if pid and host else "another process"
        raise LogInUseError(
            f"{path}: the log is being written by {holder} (it holds {where}); "
            "one log takes one writer",
            holder=holder,
        ) from None
    except OSError as exc:
        file.close()
        raise LogError(f"{where}: cannot lock the log for writing: {exc.strerror}") from None
    file.truncate(0)
    file.write(f"{os.getpid()} {socket.gethostname()}\n".encode())
    file.flush()
    return file


class FileLog:
    """An ``EventLog`` in one append-only file; see the module docstring for the format."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        partitions: int = 1,
        readonly: bool = False,
        fsync: bool = False,
        replace: bool = False,
    ) -> None:
        """Open or create the log at ``path``.

        ``partitions`` is used when creating; an existing log keeps the partitions its
        records use (at least ``partitions``). ``fsync=True`` syncs after every append;
        otherwise data is flushed to the OS on every append and synced on close. A
        writable open holds the log's lock until :meth:`close` (``LogInUseError`` when
        another writer holds it); ``replace=True`` then starts a new, empty log in
        place of the one at ``path``.
        """
        if partitions < 1:
            raise ValueError("a log needs at least one partition")
        self.path = Path(path)
        self.readonly = readonly
        self._fsync = fsync
        self._positions: list[list[int]] = [[] for _ in range(partitions)]
        self.torn_bytes = 0
        self._fences: FenceBook | None = None
        """Fencing (``events.fence``): read from the records on first need."""
        self.version = VERSION
        self._chain = zlib.crc32(FILE_HEADER.pack(MAGIC, VERSION))
        self._lock: BinaryIO | None = None if readonly else take_lock(self.path)
        try:
            exists = self._open(replace)
        except BaseException:
            self._unlock()
            raise
        if not exists:
            self._file.write(FILE_HEADER.pack(MAGIC, VERSION))
            self._file.flush()
        self._end = self._file.seek(0, os.SEEK_END)
        self._hsize = RECORD_HEADER.size if self.version == 2 else RECORD_HEADER_V1.size

    def __repr__(self) -> str:
        return (
            f"FileLog({str(self.path)!r}, partitions={self.partitions}, readonly={self.readonly})"
        )

    def _open(self, replace: bool) -> bool:
        """Open the file (writable ones under the lock) and index it; whether it held a
        log."""
        if replace and not self.readonly:
            self.path.unlink(missing_ok=True)
        exists = self.path.exists() and self.path.stat().st_size > 0
        if self.readonly and not exists:
            raise LogError(f"{self.path}: no such event log")
        mode = "rb" if self.readonly else ("r+b" if exists else "w+b")
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
        return exists

    def _unlock(self) -> None:
        """Give up the writer's lock (closing its file releases it)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # ------------------------------------------------------------------ opening

    def _scan(self) -> None:
        data = self._file.read()
        if len(data) < FILE_HEADER.size or data[:8] != MAGIC:
            raise NotALogError(f"{self.path}: not a shoal event log (bad header)")
        _, version = FILE_HEADER.unpack_from(data)
        if version not in READ_VERSIONS:
            raise NotALogError(f"{self.path}: unsupported event log version {version}")
        self.version = version
        end = self._scan_v2(data) if version == 2 else self._scan_v1(data)
        if end < len(data):
            self.torn_bytes = len(data) - end
            if not self.readonly:
                self._file.truncate(end)
                self._file.flush()
                os.fsync(self._file.fileno())

    def _corrupt(self, message: str, partition: int) -> LogCorruptedError:
        """The error for a bad record of ``partition`` (-1 when its header cannot say),
        named by the offset the next record of that partition would have."""
        known = 0 <= partition < len(self._positions)
        return LogCorruptedError(
            message,
            partition=partition if partition < MAX_PARTITIONS else -1,
            offset=len(self._positions[partition]) if known else 0,
            path=str(self.path),
        )

    def _grow(self, partition: int) -> list[int]:
        while partition >= len(self._positions):
            self._positions.append([])
        return self._positions[partition]

    def _scan_v2(self, data: bytes) -> int:
        """Index the whole batches of a version 2 file; return where they end."""
        view = memoryview(data)
        size = len(data)
        hsize = RECORD_HEADER.size
        unpack = RECORD_HEADER.unpack_from
        crc32 = zlib.crc32
        pos = whole = FILE_HEADER.size
        used = len(self._positions)  # partitions asked for, or used by a whole batch
        chain = whole_chain = crc32(view[:pos])
        batch: list[int] = []  # the positions list of the partition of an open batch
        opened = left = 0  # records of the open batch so far, and still to come
        while pos < size:  # bounded: every pass moves ``pos`` on or leaves the loop
            if size - pos < hsize:
                break
            length, partition, offset, remaining, prev, pcrc, hcrc = unpack(data, pos)
            if crc32(view[pos : pos + hsize - 4]) != hcrc:
                # A zero tail fails its header checksum, so only then is the rest of the
                # file looked at (once): looking at every record would be quadratic.
                if data.count(0, pos) == size - pos:
                    break
                raise self._corrupt("record header checksum mismatch", partition)
            if length > MAX_RECORD or partition >= MAX_PARTITIONS:
                raise self._corrupt("record header out of range", partition)
            positions = self._grow(partition)
            if offset != len(positions):
                raise self._corrupt(f"record out of place: it carries offset {offset}", partition)
            if opened and (positions is not batch or remaining != left - 1):
                raise self._corrupt("record out of place: it breaks the batch before it", partition)
            if prev != chain:
                raise self._corrupt(
                    "record out of place: it does not follow the record before it in the file",
                    partition,
                )
            start = pos + hsize
            pos = start + length
            if pos > size:
                break
            if crc32(view[start:pos]) != pcrc:
                raise self._corrupt("record payload checksum mismatch", partition)
            positions.append(start - hsize)
            chain = hcrc
            if remaining:
                batch, opened, left = positions, opened + 1, remaining
            else:
                whole, whole_chain, opened = pos, chain, 0
                used = max(used, partition + 1)
        if opened:  # a torn batch: forget the records of it already indexed
            del batch[len(batch) - opened :]
        del self._positions[used:]  # and a partition only it used
        self._chain = whole_chain
        return whole

    def _scan_v1(self, data: bytes) -> int:
        """Index the records of a version 1 file; return where the whole ones end."""
        view = memoryview(data)
        size = len(data)
        hsize = RECORD_HEADER_V1.size
        unpack = RECORD_HEADER_V1.unpack_from
        crc32 = zlib.crc32
        pos = FILE_HEADER.size
        while pos < size:  # bounded: every pass moves ``pos`` on or leaves the loop
            if size - pos < hsize:
                break
            length, partition, pcrc, hcrc = unpack(data, pos)
            if crc32(view[pos : pos + hsize - 4]) != hcrc:
                if data.count(0, pos) == size - pos:  # see _scan_v2
                    break
                raise self._corrupt("record header checksum mismatch", partition)
            if length > MAX_RECORD or partition >= MAX_PARTITIONS:
                raise self._corrupt("record header out of range", partition)
            if pos + hsize + length > size:
                break
            if crc32(view[pos + hsize : pos + hsize + length]) != pcrc:
                raise self._corrupt("record payload checksum mismatch", partition)
            self._grow(partition).append(pos)
            pos += hsize + length
        return pos

    # ------------------------------------------------------------------ protocol

    @property
    def partitions(self) -> int:
        return len(self._positions)

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        if self.readonly:
            raise LogError(f"{self.path}: opened read-only")
        check_partition(partition, len(self._positions))
        terms = term_of(envelopes)
        if terms:  # a leader's append: refused if of an older term
            book = await self._fence_book()
            for fence, epoch in terms.items():
                book.check_term(partition, fence, epoch)
        positions = self._positions[partition]
        start = len(positions)
        chunks: list[bytes] = []
        new_positions: list[int] = []
        pos = self._end
        chain = self._chain
        replace = msgspec.structs.replace
        crc32 = zlib.crc32
        last = len(envelopes) - 1
        for i, env in enumerate(envelopes):
            payload = encode(replace(env, offset=start + i, partition=partition))
            if len(payload) > MAX_RECORD:  # before anything of the call is written
                raise RecordTooLargeError(
                    f"{self.path}: cannot append a {kind_of(env)!r} record",
                    size=len(payload),
                    limit=MAX_RECORD,
                    setting="a fixed limit of the file log's format",
                )
            if self.version == 2:
                head = _HEAD.pack(
                    len(payload), partition, start + i, last - i, chain, crc32(payload)
                )
            else:
                head = _HEAD_V1.pack(len(payload), partition, crc32(payload))
            chain = crc32(head)
            chunks.append(head + _CRC.pack(chain) + payload)
            new_positions.append(pos)
            pos += self._hsize + len(payload)
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
        self._chain = chain
        positions.extend(new_positions)
        if terms and self._fences is not None:
            self._fences.record(partition, terms)
        return list(range(start, start + len(envelopes)))

    async def _fence_book(self) -> FenceBook:
        """The highest epoch per fence stored, read from the records the first time
        (one pass over the file, for the first leader's append only)."""
        if self._fences is None:
            book = FenceBook()
            for partition in range(len(self._positions)):
                book.record(partition, await self.read(partition, 0))
            self._fences = book
        return self._fences

    async def highest_epoch(self, fence: str) -> int:
        """The highest epoch stored for ``fence`` (``events.fence.highest_epoch``)."""
        return (await self._fence_book()).highest_of(fence)

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
        hsize = self._hsize
        self._file.seek(first)
        blob = memoryview(self._file.read(last + hsize + last_len - first))
        out: list[Envelope] = []
        for i in range(offset, stop):
            rel = positions[i] - first
            (length,) = struct.unpack_from("<I", blob, rel)
            try:
                env = decode(blob[rel + hsize : rel + hsize + length])
            except DecodeError as exc:
                raise LogCorruptedError(
                    f"record does not decode: {exc}",
                    partition=partition,
                    offset=i,
                    path=str(self.path),
                ) from None
            if env.offset != i or env.partition != partition:
                raise LogCorruptedError(
                    "record out of place: its envelope says partition "
                    f"{env.partition}, offset {env.offset}",
                    partition=partition,
                    offset=i,
                    path=str(self.path),
                )
            out.append(env)
        return out

    async def end_offset(self, partition: int) -> int:
        check_partition(partition, len(self._positions))
        return len(self._positions[partition])

    async def close(self) -> None:
        if self._file.closed:
            return
        try:
            if not self.readonly:
                self._file.flush()
                os.fsync(self._file.fileno())
            self._file.close()
        finally:
            self._unlock()

    def stats(self) -> dict[str, int]:
        return {
            "version": self.version,
            "partitions": len(self._positions),
            "records": sum(map(len, self._positions)),
            "bytes": self._end,
            "torn_bytes": self.torn_bytes,
        }

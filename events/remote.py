"""The in-memory log shared by several processes: a small TCP server and its client.

``shoal loadtest --shards N`` and the process tests run each shard as its own OS
process; they talk to one another only through the log. The in-memory backend lives in
one process, so that process serves it (:class:`LogServer`, on 127.0.0.1 by default) and
every process, the server's own included, uses :class:`RemoteLog`, an ``EventLog`` like
the others (the shared contract suite runs against it). Bus URL: ``tcp://HOST:PORT``.

Wire format: frames of a 4-byte big-endian length and a msgpack array. Requests are
``[op, ...args]``; answers ``[true, result]`` or ``[false, message]``.

- ``["parts"]`` → the number of partitions;
- ``["append", partition, [[kind, record], ...]]`` → the offset of the first record;
- ``["read", partition, offset, limit, wait_ms, kinds]`` → ``[next, records, offsets]``:
  up to ``limit`` records from ``offset`` whose kind is in ``kinds`` (all when null);
  ``next`` is where the scan stopped, ``offsets`` those of the records returned (empty
  when unfiltered: they are consecutive from ``offset``). With ``wait_ms`` an empty
  answer waits that long for an append first (long polling, so idle readers cost
  nothing);
- ``["count", partition, offset, kinds]`` → ``[next, count]``: how many records from
  ``offset`` are of ``kinds``, without the records (a reader that only waits for
  progress);
- ``["end", partition]`` → the end offset.

Records travel as the client encoded them (msgpack envelopes with ``offset`` -1): the
server never decodes one, so it costs little next to the processes it serves; the
client sets ``offset`` and ``partition`` on decode. ``kind`` is the event's tag (one of
the event union's; an append with any other is refused whole), so a reader can ask for
only the kinds it needs (the router reads shards' reports only); the server keeps it as
one byte per record and counts and filters over those bytes.
The server keeps everything in memory and loses it when it stops: it is the embedded
default made shareable, not a durable log (use ``file:`` or Kafka for that).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from events.codec import TAGS, DecodeError, decode, encode, kind_of
from events.errors import InputError, LogCorruptedError, LogError
from events.log import check_partition
from events.types import Envelope

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
MAX_FRAME = 256 << 20
_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder()
_APPEND_ITEMS = list[tuple[str, bytes]]
KIND_CODES: Final = {tag: code for code, tag in enumerate(sorted(TAGS.values()))}
"""A byte for each kind of record: the tags of the event union (a few dozen). A record
of any other kind is refused on append."""


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    header = await reader.readexactly(_HEADER.size)
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is larger than {MAX_FRAME}")
    return _DEC.decode(await reader.readexactly(size))


def _write_frame(writer: asyncio.StreamWriter, message: Any) -> None:
    body = _ENC.encode(message)
    writer.write(_HEADER.pack(len(body)) + body)


class LogServer:
    """Serves an in-memory partitioned log to other processes."""

    def __init__(self, partitions: int, host: str = "127.0.0.1", port: int = 0) -> None:
        if partitions < 1:
            raise ValueError("a log needs at least one partition")
        self.host = host
        self.port = port
        self._codes: list[bytearray] = [bytearray() for _ in range(partitions)]
        """Per partition, a byte per record: its kind's code (see :meth:`_code`), so
        that counting and filtering by kind run over bytes in C, not record by record
        in Python (the harness counts every shard's decisions, the router scans shard
        partitions for their reports)."""
        self._records: list[list[bytes]] = [[] for _ in range(partitions)]
        self._grew: list[asyncio.Event] = [asyncio.Event() for _ in range(partitions)]
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.StreamWriter] = set()

    def __repr__(self) -> str:
        return f"LogServer({self.url}, records={sum(map(len, self._records))})"

    @property
    def partitions(self) -> int:
        return len(self._records)

    @property
    def url(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    async def start(self) -> LogServer:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._clients):
                writer.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> LogServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        try:
            while True:
                try:
                    request = await _read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except (ValueError, msgspec.DecodeError) as exc:
                    _write_frame(writer, [False, f"bad request: {exc}"])
                    await writer.drain()
                    return  # the stream can no longer be trusted
                try:
                    answer: list[Any] = [True, await self._handle(request)]
                except (ValueError, TypeError, IndexError, KeyError) as exc:
                    answer = [False, f"bad request: {exc}"]
                _write_frame(writer, answer)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return  # the client left, or the server is closing
        finally:
            self._clients.discard(writer)
            writer.close()

    async def _handle(self, request: Any) -> Any:
        if not isinstance(request, list) or not request or not isinstance(request[0], str):
            raise ValueError("expected [op, ...]")
        op = request[0]
        if op == "parts":
            return self.partitions
        if op == "end":
            return len(self._records[self._partition(request[1])])
        if op == "append":
            partition = self._partition(request[1])
            try:
                items = msgspec.convert(request[2], _APPEND_ITEMS, builtin_types=(bytes,))
            except msgspec.ValidationError:
                raise ValueError("append expects [[kind, record], ...]") from None
            added = [self._code(kind) for kind, _ in items]  # all checked before any lands
            records = self._records[partition]
            start = len(records)
            records.extend([record for _, record in items])
            self._codes[partition].extend(added)
            if items:
                self._grew[partition].set()
                self._grew[partition] = asyncio.Event()
            return start
        if op == "count":
            partition = self._partition(request[1])
            offset, wanted = request[2], request[3]
            if not isinstance(offset, int) or offset < 0:
                raise ValueError("offset must be a non-negative integer")
            codes = self._codes[partition]
            stop = max(len(codes), offset)
            return [stop, sum(codes.count(code, offset, stop) for code in self._wanted(wanted))]
        if op == "read":
            partition = self._partition(request[1])
            offset, limit, wait_ms, wanted = request[2], request[3], request[4], request[5]
            if not isinstance(offset, int) or offset < 0:
                raise ValueError("offset must be a non-negative integer")
            records = self._records[partition]
            if offset >= len(records) and wait_ms:
                grew = self._grew[partition]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(grew.wait(), min(float(wait_ms), 60_000) / 1000)
            stop = len(records) if limit is None else min(len(records), offset + int(limit))
            if wanted is None:
                return [max(stop, offset), records[offset:stop], []]
            picked = self._find(self._codes[partition], self._wanted(wanted), offset, stop)
            return [max(stop, offset), [records[i] for i in picked], picked]
        raise ValueError(f"unknown op {op!r}")

    @staticmethod
    def _code(kind: str) -> int:
        """The byte that stands for ``kind`` in :attr:`_codes`."""
        code = KIND_CODES.get(kind)
        if code is None:
            raise ValueError(f"unknown kind of record {kind!r:.40}")
        return code

    @staticmethod
    def _wanted(kinds: Any) -> list[int]:
        """The codes of ``kinds`` (a list of strings); a kind outside the event union
        matches no record."""
        if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
            raise ValueError("kinds must be a list of strings")
        return sorted({KIND_CODES[k] for k in kinds if k in KIND_CODES})

    @staticmethod
    def _find(codes: bytearray, wanted: list[int], start: int, stop: int) -> list[int]:
        """The offsets in ``[start, stop)`` whose code is one of ``wanted``, in order."""
        found: list[int] = []
        for code in wanted:
            at = codes.find(code, start, stop)
            while at >= 0:
                found.append(at)
                at = codes.find(code, at + 1, stop)
        if len(wanted) > 1:
            found.sort()
        return found

    def _partition(self, value: Any) -> int:
        if not isinstance(value, int):
            raise ValueError("partition must be an integer")
        check_partition(value, self.partitions)
        return value


def parse_tcp_url(url: str) -> tuple[str, int]:
    rest = url.removeprefix("tcp://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"expected tcp://HOST:PORT, got {url!r}", location="--bus")
    return host, int(port)


class RemoteLog:
    """An ``EventLog`` served by a :class:`LogServer`."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._partitions = 0

    def __repr__(self) -> str:
        return f"RemoteLog(tcp://{self.host}:{self.port})"

    @classmethod
    async def connect(cls, url: str) -> RemoteLog:
        host, port = parse_tcp_url(url)
        remote = cls(host, port)
        remote._partitions = int(await remote._call(["parts"]))
        return remote

    @property
    def partitions(self) -> int:
        return self._partitions

    async def _call(self, request: list[Any]) -> Any:
        async with self._lock:
            try:
                if self._writer is None:
                    self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
                assert self._reader is not None
                _write_frame(self._writer, request)
                await self._writer.drain()
                ok, result = await _read_frame(self._reader)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                await self._drop()
                raise LogError(f"log server tcp://{self.host}:{self.port}: {exc}") from None
        if not ok:
            raise LogError(f"log server refused {request[0]}: {result}")
        return result

    async def _drop(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        check_partition(partition, self._partitions)
        items = [[kind_of(env), encode(env)] for env in envelopes]
        start = int(await self._call(["append", partition, items]))
        return list(range(start, start + len(items)))

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        return (await self.fetch(partition, offset, limit))[1]

    async def fetch(
        self,
        partition: int,
        offset: int,
        limit: int | None = None,
        *,
        wait: float = 0.0,
        kinds: Sequence[str] | None = None,
    ) -> tuple[int, list[Envelope]]:
        """Like ``read``, and: wait up to ``wait`` seconds for something new, keep only
        ``kinds``; returns (where the scan stopped, the records)."""
        check_partition(partition, self._partitions)
        wait_ms = int(wait * 1000)
        wanted = list(kinds) if kinds is not None else None
        stop, records, offsets = await self._call(
            ["read", partition, max(offset, 0), limit, wait_ms, wanted]
        )
        force_setattr = msgspec.structs.force_setattr
        places = offsets if wanted is not None else range(max(offset, 0), stop)
        out = []
        for at, record in zip(places, records, strict=True):
            try:
                env = decode(record)
            except DecodeError as exc:
                raise LogCorruptedError(str(exc), partition=partition, offset=at) from None
            # a freshly decoded record is this call's alone: fill in where it lives
            # rather than copy it (a copy per record was a tenth of a reader's time)
            force_setattr(env, "offset", at)
            force_setattr(env, "partition", partition)
            out.append(env)
        return int(stop), out

    async def read_kinds(
        self, partition: int, offset: int, kinds: Sequence[str]
    ) -> tuple[int, list[Envelope]]:
        """Only ``kinds``, filtered by the server (see :func:`events.log.read_kinds`)."""
        return await self.fetch(partition, offset, kinds=kinds)

    async def count_kinds(
        self, partition: int, offset: int, kinds: Sequence[str]
    ) -> tuple[int, int]:
        """How many records of ``kinds`` there are from ``offset``, counted by the server
        (see :func:`events.log.count_kinds`), and where the count stopped."""
        check_partition(partition, self._partitions)
        stop, count = await self._call(["count", partition, max(offset, 0), list(kinds)])
        return int(stop), int(count)

    async def end_offset(self, partition: int) -> int:
        check_partition(partition, self._partitions)
        return int(await self._call(["end", partition]))

    async def close(self) -> None:
        async with self._lock:
            await self._drop()

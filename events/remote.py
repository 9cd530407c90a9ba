"""The in-memory log shared by several processes: a small TCP server and its client.

``shoal loadtest --shards N`` and the process tests run each shard as its own OS
process; they talk to one another only through the log. The in-memory backend lives in
one process, so that process serves it (:class:`~events.logserver.LogServer`, on
127.0.0.1 by default; ``shoal log-server`` runs one on its own) and every process, the
server's own included, uses :class:`RemoteLog`, an ``EventLog`` like the others (the
shared contract suite runs against it). Bus URL: ``tcp://HOST:PORT``.

Wire format: frames of a 4-byte big-endian length and a msgpack array. Requests are
``[op, ...args]``; answers ``[true, result]`` or ``[false, message]``.

Handshake (protocol 1). A client's first frame is ``["hello", 1, token]``: ``token`` the
bytes of the shared token (:func:`~events.wire.load_token`: ``--token-file PATH`` or the
file ``$SHOAL_LOG_TOKEN_FILE`` names), or nil without one. The server answers ``[true,
{"partitions": N, "max_frame": BYTES}]``, or refuses with ``[false, reason]`` and closes:
a reason starting ``unauthorized:`` for a missing or wrong token (the client raises
:class:`~events.errors.LogAuthError`), others for too many connections, a hello too
slow or too large, or a request before the hello (a client older than the protocol).
A server with a token compares SHA-256 digests in constant time and never logs a token;
a server without one serves only loopback addresses and says so once when it starts.
Nothing but a hello (at most about 1 KiB) is read from a client before it is accepted.

Requests, once accepted:

- ``["parts"]`` → the number of partitions;
- ``["append", partition, [[kind, record], ...]]`` → the offset of the first record.
  A request is one frame, stored whole; the client splits a larger append into
  requests that each fit the server's frame limit (learnt in the hello) with
  ``FRAME_SLACK`` to spare, so appends of any total size work, each request atomic. A
  record that alone does not fit is refused by the client, before any request, with
  :class:`~events.errors.RecordTooLargeError` naming ``log-server --max-frame-mib``;
- ``["read", partition, offset, limit, wait_ms, kinds]`` → ``[next, records, offsets,
  end]``: up to ``limit`` records from ``offset`` whose kind is in ``kinds`` (all when
  null); ``next`` is where the scan stopped, ``offsets`` those of the records returned
  (empty when unfiltered: they are consecutive from ``offset``), ``end`` the partition's
  end when the answer was made. An answer is cut to fit the server's frame limit
  (``next`` short of what was asked, at least one record scanned): the client asks again
  from ``next`` up to the first answer's ``end``. With ``wait_ms`` an empty answer waits
  that long (60 s at most by default) for an append first (long polling, so idle readers cost
  nothing);
- ``["count", partition, offset, kinds]`` → ``[next, count]``: how many records from
  ``offset`` are of ``kinds``, without the records (a reader that only waits for
  progress);
- ``["end", partition]`` → the end offset;
- ``["fappend", partition, [[kind, record], ...], [[fence, epoch], ...]]``: an append of
  a leader term (``events.fence``), with the lowest epoch per fence of its records;
  refused whole, ``[false, "fenced: FENCE EPOCH HIGHEST"]``, when the partition holds
  a higher epoch for a fence (the client raises
  :class:`~events.fence.FencedError`);
- ``["epoch", fence]`` → the highest epoch stored for ``fence`` in any partition (0
  for none);
- ``["wait", [[partition, offset], ...], wait_ms]`` → the partitions among those (at
  most one pair each) that hold a record at ``offset`` or after, answered as soon as
  one does, or ``[]`` after ``wait_ms`` (60 s at most by default): one long poll over
  several partitions, so an idle coordinator, or a harness waiting for decisions,
  costs one request per wait instead of a read of each partition every few
  milliseconds (:meth:`RemoteLog.wait_any`; a server older than this op answers
  ``unknown op``, and the client then sleeps briefly instead).

A request of a wrong shape is answered ``[false, "bad request: ..."]`` and the
connection stays open; a frame that breaks the framing (not msgpack, over the frame
limit, cut short, stalled) closes it. The server's memory bound, frame and connection
limits are described in :mod:`events.logserver`.

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
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from events.codec import DecodeError, decode, encode, kind_of
from events.errors import (
    InputError,
    LogAuthError,
    LogCorruptedError,
    LogError,
    RecordTooLargeError,
)
from events.fence import FencedError, term_of
from events.limits import ServerLimits
from events.log import check_partition
from events.logserver import FENCED, UNKNOWN_OP, LogServer
from events.types import Envelope
from events.wire import (
    FRAME_SLACK,
    KIND_CODES,
    MAX_FRAME,
    PROTOCOL,
    UNAUTHORIZED,
    encode_frame,
    read_frame,
)

IDLE_SLEEP: Final = 0.005
"""Seconds :meth:`RemoteLog.wait_any` sleeps where the server cannot hold a wait."""
ITEM_OVERHEAD: Final = 16
"""Bytes a record costs in an append request beyond itself and its kind (msgpack
headers), at most."""

__all__ = ["KIND_CODES", "LogServer", "RemoteLog", "ServerLimits", "parse_tcp_url"]


def parse_tcp_url(url: str) -> tuple[str, int]:
    rest = url.removeprefix("tcp://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"expected tcp://HOST:PORT, got {url!r}", location="--bus")
    return host, int(port)


class RemoteLog:
    """An ``EventLog`` served by a :class:`LogServer`; ``token``: the shared token, when
    the server has one. Opens its connection (hello included) on first use and again
    after one was lost."""

    def __init__(self, host: str, port: int, *, token: bytes | None = None) -> None:
        self.host = host
        self.port = port
        self._token = token
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._partitions = 0
        self._max_frame = MAX_FRAME
        self._waits = True
        """Whether the server answers ``wait`` (False: one older than that op)."""

    def __repr__(self) -> str:  # never the token
        return f"RemoteLog(tcp://{self.host}:{self.port})"

    @classmethod
    async def connect(cls, url: str, *, token: bytes | None = None) -> RemoteLog:
        """A client of the server at ``url``, connected and accepted: ``LogAuthError``
        when the server refuses the token, ``LogError`` when it cannot be reached or
        refuses for another reason."""
        host, port = parse_tcp_url(url)
        remote = cls(host, port, token=token)
        async with remote._lock:
            await remote._open()
        return remote

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def _where(self) -> str:
        return f"log server tcp://{self.host}:{self.port}"

    async def _open(self) -> None:
        """Connect and say hello (the lock held)."""
        try:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            self._writer.write(encode_frame(["hello", PROTOCOL, self._token]))
            await self._writer.drain()
            ok, result = await read_frame(self._reader)
        except (OSError, asyncio.IncompleteReadError, ValueError, TypeError) as exc:
            await self._drop()
            raise LogError(f"{self._where}: {exc or type(exc).__name__}") from None
        if not ok:
            await self._drop()
            if isinstance(result, str) and result.startswith(UNAUTHORIZED):
                raise LogAuthError(f"{self._where} refused the connection: {result}")
            raise LogError(f"{self._where} refused the connection: {result}")
        try:
            self._partitions = int(result["partitions"])
            self._max_frame = min(int(result["max_frame"]), MAX_FRAME)
        except (TypeError, KeyError, ValueError):
            await self._drop()
            raise LogError(f"{self._where}: not a shoal log server's hello") from None

    async def _call(self, request: list[Any]) -> Any:
        frame = encode_frame(request)
        async with self._lock:
            if len(frame) - 4 > self._max_frame:
                raise LogError(
                    f"{self._where}: a request of {len(frame) - 4} bytes is over the "
                    f"server's frame limit of {self._max_frame} (log-server --max-frame-mib)"
                )
            if self._writer is None:
                await self._open()
            assert self._reader is not None and self._writer is not None
            try:
                self._writer.write(frame)
                del frame
                await self._writer.drain()
                ok, result = await read_frame(self._reader)
            except (OSError, asyncio.IncompleteReadError, ValueError, TypeError) as exc:
                await self._drop()
                raise LogError(f"{self._where}: {exc or type(exc).__name__}") from None
            except BaseException:
                # cancelled mid-exchange (a deposed leader's work is cancelled at once):
                # its answer must not be read as the next call's
                await self._drop()
                raise
        if not ok:
            if isinstance(result, str) and result.startswith(FENCED):
                fence, epoch, highest = result.removeprefix(FENCED).split()
                raise FencedError(fence, int(epoch), int(highest))
            raise LogError(f"log server refused {request[0]}: {result}")
        return result

    async def _drop(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        """``EventLog.append``, in as many requests as the server's frame limit needs
        (each one atomic on the server, in order); a record that alone does not fit one
        is refused before anything is sent (:class:`RecordTooLargeError`)."""
        check_partition(partition, self._partitions)
        items = [[kind_of(env), encode(env)] for env in envelopes]
        terms = term_of(envelopes)
        fences = [[f, e] for f, e in terms.items()]
        offsets: list[int] = []
        for chunk in self._chunks(items, FRAME_SLACK + sum(len(f) + 16 for f in terms)):
            if terms:  # a leader's append: the server refuses it if of an older term
                request = ["fappend", partition, chunk, fences]
            else:
                request = ["append", partition, chunk]
            start = int(await self._call(request))
            offsets.extend(range(start, start + len(chunk)))
        return offsets

    def _chunks(self, items: list[list[Any]], reserved: int) -> list[list[list[Any]]]:
        """``items`` ([kind, record] pairs) in consecutive runs that each fit one frame
        with ``reserved`` bytes to spare (the request around them); at least one run."""
        budget = self._max_frame - reserved
        sizes = [len(record) + len(kind) + ITEM_OVERHEAD for kind, record in items]
        if sum(sizes) <= budget:
            return [items]  # the usual case: one request, no record-by-record cutting
        for kind, record in items:
            if len(record) + len(kind) + ITEM_OVERHEAD > budget:
                raise RecordTooLargeError(
                    f"{self._where}: cannot append a {kind!r} record",
                    size=len(record),
                    limit=budget - len(kind) - ITEM_OVERHEAD,
                    setting="raise it with log-server --max-frame-mib",
                )
        chunks: list[list[list[Any]]] = []
        start, size = 0, 0
        for i, cost in enumerate(sizes):
            if size + cost > budget:
                chunks.append(items[start:i])
                start, size = i, 0
            size += cost
        chunks.append(items[start:])
        return chunks

    async def wait_any(self, offsets: Mapping[int, int], seconds: float) -> None:
        """Return once a partition of ``offsets`` (partition → offset) holds a record at
        its offset or after, or after ``seconds``: one request the server holds (the
        ``wait`` op), which :func:`events.log.long_poll_or_sleep` uses. A server without
        that op is not asked again: this sleeps ``IDLE_SLEEP`` instead (at most
        ``seconds``), as a reader of such a server did. The connection carries nothing
        else meanwhile (its requests are one at a time), so a process that shares one
        client between tasks should not wait on it."""
        for partition in offsets:
            check_partition(partition, self._partitions)
        if seconds <= 0 or not offsets:
            return
        if self._waits:
            request = ["wait", [[p, max(o, 0)] for p, o in offsets.items()], int(seconds * 1000)]
            try:
                await self._call(request)
                return
            except LogError as exc:
                if f"{UNKNOWN_OP} 'wait'" not in str(exc):
                    raise
                self._waits = False
        await asyncio.sleep(min(seconds, IDLE_SLEEP))

    async def highest_epoch(self, fence: str) -> int:
        """The highest epoch the server stored for ``fence`` (``events.fence``)."""
        return int(await self._call(["epoch", fence]))

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
        offset = max(offset, 0)
        wanted = list(kinds) if kinds is not None else None
        stop, out, end = await self._fetch_once(partition, offset, limit, int(wait * 1000), wanted)
        target = end if limit is None else min(end, offset + limit)
        while stop < target:  # cut to fit a frame; each answer scans one record at least
            more_stop, more, _ = await self._fetch_once(partition, stop, target - stop, 0, wanted)
            if more_stop <= stop:
                raise LogError(f"{self._where}: a read from {stop} made no progress")
            stop = more_stop
            out.extend(more)
        return stop, out

    async def _fetch_once(
        self, partition: int, offset: int, limit: int | None, wait_ms: int, wanted: list[str] | None
    ) -> tuple[int, list[Envelope], int]:
        """One read request: (where the scan stopped, the records, the partition's end)."""
        stop, records, offsets, end = await self._call(
            ["read", partition, offset, limit, wait_ms, wanted]
        )
        force_setattr = msgspec.structs.force_setattr
        places = offsets if wanted is not None else range(offset, stop)
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
        return int(stop), out, int(end)

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

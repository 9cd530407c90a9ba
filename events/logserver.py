"""The log server: an in-memory partitioned log served over TCP to other processes.

The protocol (handshake with the shared token, then requests) is described in
:mod:`events.remote`, with the client. What this side guarantees:

- **Authentication.** With a token (:func:`~events.wire.load_token`) a client's first
  frame must be a hello carrying the same token; otherwise the server answers one
  refusal, logs one line (the peer and the reason, never a token) and closes. Without
  one it serves only a loopback address and warns once at start that it is
  unauthenticated; any other address without a token is an ``InputError`` naming
  ``--token-file``.
- **The door.** A connection that has not said hello yet is *pending*: it is closed
  unless its hello comes within ``hello_seconds``, and at most ``max_pending`` are
  kept; one more takes the place of the pending connection that has waited longest
  (closed, counted as refused). Authenticated clients are counted apart, at most
  ``max_connections``; pending ones never count against them. So connections that
  never say hello cannot lock token holders out: a client that sends its hello at
  once (as :class:`~events.remote.RemoteLog` does) is admitted unless ``max_pending``
  more connections arrive in the moment before its hello is read.
- **Bounded memory.** Bytes of frames being read or answered, across all connections,
  are held in one :class:`~events.budget.ByteBudget` (``max_buffered``). A frame's
  length is reserved once its body begins to arrive (a header alone reserves
  nothing), before the rest is read; when the budget is spent the server stops
  reading (TCP back-pressure reaches the clients) and resumes as answers go out. A
  connection holds at most one frame at a time (its request, then its answer), so
  one client's share is at most ``max_frame``, which is at most half of
  ``max_buffered``: one client stalled mid-frame leaves the other half to the rest.
  Frames are at most ``max_frame`` bytes (a client learns the limit in the hello
  answer), a read's answer is cut to fit one (the client asks again for the rest).
  Outside the count: each connection's socket buffers (at most ``READ_BUFFER`` bytes
  read ahead, the first bytes of a body among them, and the kernel's), and the copies
  of a frame that joining its first bytes to the rest and decoding it make while its
  request runs.
- **One bad client costs only its own connection.** A frame that is not msgpack, too
  large, cut short, of the wrong shape, or that stalls for ``stall_seconds`` mid-frame or
  mid-answer gets an error answer or a closed connection and one log line; every other
  client is served on. A request of the right frame but a wrong shape gets an error
  answer and the connection stays open. A client that sends a frame's header and
  stalls holds no bytes of the budget; one that stalls inside a body holds that
  frame's (at most ``max_frame``) until ``stall_seconds`` pass.
- **Quiet under a flood.** Refusals and closed connections are logged at most one line
  per kind every ``log_every_seconds`` (:class:`~events.throttle.Throttled`), the next
  line saying how many were left out; ``stats()`` counts every one.

The records themselves (the log) are the server's content, not a buffer: they grow
with every append and are lost when it stops (use ``file:`` or Kafka for a durable log).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from array import array
from bisect import bisect_right
from typing import Any, Final

import msgspec

from events.budget import ByteBudget
from events.errors import InputError
from events.limits import ServerLimits
from events.log import check_partition
from events.throttle import Throttled
from events.wire import (
    FRAME_SLACK,
    KIND_CODES,
    MAX_TOKEN,
    PROTOCOL,
    TOKEN_FILE_ENV,
    UNAUTHORIZED,
    FrameTooLarge,
    decode_body,
    digest,
    encode_frame,
    read_frame,
    read_header,
    token_matches,
)

log = logging.getLogger(__name__)

READ_BUFFER: Final = 16 << 10
"""How far ahead of the server a connection's reader may buffer (it pauses the socket
at twice this)."""
HELLO_FRAME: Final = MAX_TOKEN + 64
"""The largest hello: nothing bigger is read from a client before it is authenticated."""
RECORD_OVERHEAD: Final = 16
"""Bytes an answer spends per record beyond the record (msgpack headers, its offset)."""


class BadRequest(ValueError):
    """A request of the right frame but not of a shape the server serves."""


class FencedAppend(ValueError):
    """An append of an older leader term (``events.fence``): refused whole."""


_SHAPES: Final[dict[str, Any]] = {
    "parts": tuple[str],
    "end": tuple[str, int],
    "append": tuple[str, int, list[tuple[str, bytes]]],
    "read": tuple[str, int, int, int | None, int, list[str] | None],
    "count": tuple[str, int, int, list[str]],
    "fappend": tuple[str, int, list[tuple[str, bytes]], list[tuple[str, int]]],
    "epoch": tuple[str, str],
    "wait": tuple[str, list[tuple[int, int]], int],
}
UNKNOWN_OP: Final = "unknown op"
"""How an op the server does not know is answered (``unknown op 'OP'``): a client newer
than the server tells by it that it must do without that op."""
FENCED: Final = "fenced:"
"""How a refused append of an older leader term is answered: ``fenced: FENCE EPOCH
HIGHEST`` (``events.fence``)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"


class LogServer:
    """Serves an in-memory partitioned log to other processes; one per log."""

    def __init__(
        self,
        partitions: int,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: bytes | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        if partitions < 1:
            raise ValueError("a log needs at least one partition")
        if token is None and not is_loopback(host):
            raise InputError(
                f"serving {host} without a token lets anyone who reaches it read and write "
                f"the log; give --token-file PATH (or ${TOKEN_FILE_ENV}), or listen on 127.0.0.1",
                location="--token-file",
            )
        self.host = host
        self.port = port
        self.limits = limits or ServerLimits()
        self._digest = digest(token) if token is not None else None
        self._budget = ByteBudget(self.limits.max_buffered)
        self._answer_cap = self.limits.max_frame - FRAME_SLACK
        self._epochs: dict[tuple[int, str], int] = {}
        """The highest leader epoch stored per partition and fence (``events.fence``)."""
        self._codes: list[bytearray] = [bytearray() for _ in range(partitions)]
        """Per partition, a byte per record: its kind's code (see :meth:`_code`), so
        that counting and filtering by kind run over bytes in C, not record by record
        in Python (the harness counts every shard's decisions, the router scans shard
        partitions for their reports)."""
        self._records: list[list[bytes]] = [[] for _ in range(partitions)]
        self._ends: list[array[int]] = [array("Q") for _ in range(partitions)]
        """Per partition, where each record ends in an answer that starts at offset 0
        (its length and :data:`RECORD_OVERHEAD`, summed): a read is cut to fit a frame
        by one bisection."""
        self._grew: list[asyncio.Event] = [asyncio.Event() for _ in range(partitions)]
        self._any_grew = asyncio.Event()
        """Set (and replaced) by every append to any partition: what ``wait`` waits on."""
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self._pending: dict[asyncio.StreamWriter, None] = {}
        """Connections waiting for their hello, longest-waiting first."""
        self._quiet = Throttled(log, self.limits.log_every_seconds)
        self.refused = 0
        """Connections refused at the door or at the hello."""
        self.dropped = 0
        """Connections closed for a bad frame, a stall or a client gone mid-frame."""

    def __repr__(self) -> str:
        return f"LogServer({self.url}, records={sum(map(len, self._records))})"

    def stats(self) -> dict[str, int]:
        """Counters for debugging and for the tests of the memory bound."""
        return {
            "connections": len(self._clients),
            "pending": len(self._pending),
            "buffered_bytes": self._budget.held,
            "peak_buffered_bytes": self._budget.peak,
            "max_buffered_bytes": self._budget.limit,
            "back_pressure_waits": self._budget.waits,
            "refused": self.refused,
            "dropped": self.dropped,
            "lines_left_out": sum(self._quiet.stats().values()),
            "records": sum(map(len, self._records)),
        }

    @property
    def partitions(self) -> int:
        return len(self._records)

    @property
    def url(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    async def start(self) -> LogServer:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=READ_BUFFER
        )
        self.port = self._server.sockets[0].getsockname()[1]
        if self._digest is None:
            log.warning(
                "log server url=%s is unauthenticated: any local process may read and "
                "append (give --token-file PATH or $%s)",
                self.url,
                TOKEN_FILE_ENV,
            )
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in [*self._clients, *self._pending]:
                writer.close()
            await self._server.wait_closed()
            self._server = None
            self._quiet.flush()

    async def __aenter__(self) -> LogServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ connections

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        try:
            self._pending[writer] = None
            if len(self._pending) > self.limits.max_pending:
                self._evict_oldest()
            try:
                welcome = await self._hello(reader, writer, peer)
            finally:
                self._pending.pop(writer, None)
            if not welcome:
                return
            if len(self._clients) >= self.limits.max_connections:
                limit = self.limits.max_connections
                await self._refuse(writer, peer, f"too many connections (the limit is {limit})")
                return
            self._clients.add(writer)
            welcome_answer = {"partitions": self.partitions, "max_frame": self.limits.max_frame}
            if await self._send(writer, peer, [True, welcome_answer]):
                await self._requests(reader, writer, peer)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:  # between frames, a client leaving is ordinary
                self._drop(peer, "connection lost mid-frame")
        except (ConnectionError, asyncio.CancelledError):
            return  # the client left, or the server is closing
        except Exception as exc:  # a bug: this client loses its connection, others go on
            self.dropped += 1
            log.error("log server internal error peer=%s error=%r", peer, exc)
        finally:
            self._clients.discard(writer)
            writer.close()

    def _evict_oldest(self) -> None:
        """Close the pending connection that has waited longest for its hello."""
        oldest = next(iter(self._pending))
        del self._pending[oldest]
        self.refused += 1
        self._quiet.warning(
            "log server closed a connection that sent no hello to admit a newer one "
            "peer=%s pending_limit=%d",
            _peer(oldest),
            self.limits.max_pending,
        )
        oldest.transport.abort()

    async def _hello(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> bool:
        """Read and check the client's hello. False: refused (logged), or the
        connection was closed before it came."""
        try:
            async with asyncio.timeout(self.limits.hello_seconds):
                hello = await read_frame(reader, HELLO_FRAME)
        except TimeoutError:
            await self._refuse(writer, peer, "no hello in time")
            return False
        except ValueError as exc:
            await self._refuse(writer, peer, f"bad hello: {exc}")
            return False
        if not (isinstance(hello, list) and len(hello) == 3 and hello[0] == "hello"):
            await self._refuse(
                writer, peer, f"expected a hello (protocol {PROTOCOL}) first: an older client?"
            )
            return False
        if hello[1] != PROTOCOL:
            await self._refuse(writer, peer, f"protocol {hello[1]!r:.20} is not {PROTOCOL}")
            return False
        given = hello[2]
        if self._digest is not None:
            if not isinstance(given, bytes):
                reason = f"{UNAUTHORIZED}: no token given (this server needs one)"
                await self._refuse(writer, peer, reason)
                return False
            if not token_matches(given, self._digest):
                await self._refuse(writer, peer, f"{UNAUTHORIZED}: wrong token")
                return False
        return True

    async def _refuse(self, writer: asyncio.StreamWriter, peer: str, reason: str) -> None:
        self.refused += 1
        self._quiet.warning("log server refused a client peer=%s reason=%s", peer, reason)
        writer.write(encode_frame([False, reason]))
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(self.limits.stall_seconds):
                await writer.drain()

    def _drop(self, peer: str, reason: str) -> None:
        self.dropped += 1
        self._quiet.warning("log server closed a connection peer=%s reason=%s", peer, reason)

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        """Serve one authenticated client until it leaves or breaks the framing."""
        while True:
            try:
                size = await read_header(reader, self.limits.max_frame)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    self._drop(peer, "connection lost mid-frame")
                return
            except FrameTooLarge as exc:
                self._drop(peer, str(exc))
                await self._send(writer, peer, [False, f"bad request: {exc}"])
                return  # its body is not read: the stream can no longer be followed
            try:  # nothing is reserved for a body that has not begun to arrive
                async with asyncio.timeout(self.limits.stall_seconds):
                    first = await reader.readexactly(min(size, READ_BUFFER))
            except TimeoutError:
                self._drop(peer, f"a frame of {size} bytes stalled before its body")
                return
            async with self._budget.holding(size):  # waits here: back-pressure
                if size > len(first):  # (most requests came whole in the first read)
                    try:
                        async with asyncio.timeout(self.limits.stall_seconds):
                            rest = await reader.readexactly(size - len(first))
                    except TimeoutError:
                        self._drop(peer, f"a frame of {size} bytes stalled")
                        return
                    body = first + rest
                    del rest
                else:
                    body = first
                del first
                try:
                    request = decode_body(body)
                except ValueError as exc:
                    self._drop(peer, str(exc))
                    await self._send(writer, peer, [False, f"bad request: {exc}"])
                    return
                del body
                try:
                    answer: list[Any] = [True, await self._handle(request)]
                except BadRequest as exc:
                    self._quiet.warning("log server bad request peer=%s error=%s", peer, exc)
                    answer = [False, f"bad request: {exc}"]
                except FencedAppend as exc:
                    answer = [False, f"{FENCED} {exc}"]
                del request
            if not await self._send(writer, peer, answer):
                return

    async def _send(self, writer: asyncio.StreamWriter, peer: str, message: Any) -> bool:
        """Write ``message``, its bytes counted until the socket takes them; False when
        the client has not taken them in ``stall_seconds`` (the connection is dropped)."""
        frame = encode_frame(message)
        async with self._budget.holding(min(len(frame), self._budget.limit)):
            writer.write(frame)
            del frame
            if not writer.transport.get_write_buffer_size():
                return True  # the socket took it all (most answers): nothing to wait for
            try:
                async with asyncio.timeout(self.limits.stall_seconds):
                    await writer.drain()
            except TimeoutError:
                self._drop(peer, "the client does not take its answers")
                return False
        return True

    # ------------------------------------------------------------------ requests

    async def _handle(self, request: Any) -> Any:
        if not isinstance(request, list) or not request or not isinstance(request[0], str):
            raise BadRequest("expected [op, ...]")
        op = request[0]
        shape = _SHAPES.get(op)
        if shape is None:
            raise BadRequest(f"{UNKNOWN_OP} {op!r:.40}")
        try:
            args = msgspec.convert(request, shape, builtin_types=(bytes,))
        except msgspec.ValidationError as exc:
            raise BadRequest(f"{op}: {exc}") from None
        if op == "parts":
            return self.partitions
        if op == "epoch":
            return max((e for (_, f), e in self._epochs.items() if f == args[1]), default=0)
        if op == "wait":
            return await self._wait(args[1], args[2])
        partition = self._partition(args[1])
        if op == "end":
            return len(self._records[partition])
        if op == "append":
            return self._append(partition, args[2])
        if op == "fappend":
            return self._fenced_append(partition, args[2], args[3])
        offset = args[2]
        if offset < 0:
            raise BadRequest("offset must not be negative")
        if op == "count":
            codes = self._codes[partition]
            stop = max(len(codes), offset)
            return [stop, sum(codes.count(code, offset, stop) for code in self._wanted(args[3]))]
        limit, wait_ms, wanted = args[3], args[4], args[5]
        if limit is not None and limit < 0:
            raise BadRequest("limit must not be negative")
        if offset >= len(self._records[partition]) and wait_ms > 0:
            grew = self._grew[partition]
            with contextlib.suppress(TimeoutError):
                wait = min(wait_ms / 1000, self.limits.max_wait_seconds)
                await asyncio.wait_for(grew.wait(), wait)
        return self._read(
            partition, offset, limit, None if wanted is None else self._wanted(wanted)
        )

    async def _wait(self, pairs: list[tuple[int, int]], wait_ms: int) -> list[int]:
        """The partitions of ``pairs`` ([partition, offset], at most one per partition)
        that hold a record at ``offset`` or after, as soon as one does, waiting at most
        ``wait_ms`` (and ``max_wait_seconds``) for an append: [] when none did."""
        if len(pairs) > self.partitions:
            raise BadRequest(f"wait: {len(pairs)} partitions of {self.partitions}")
        for partition, offset in pairs:
            self._partition(partition)
            if offset < 0:
                raise BadRequest("offset must not be negative")
        records = self._records

        def grown() -> list[int]:
            return sorted({p for p, offset in pairs if len(records[p]) > offset})

        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(wait_ms, 0) / 1000, self.limits.max_wait_seconds)
        found = grown()
        while not found and pairs and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._any_grew.wait(), left)
            found = grown()
        return found

    def _append(self, partition: int, items: list[tuple[str, bytes]]) -> int:
        added = [self._code(kind) for kind, _ in items]  # all checked before any lands
        records = self._records[partition]
        start = len(records)
        ends = self._ends[partition]
        at = ends[-1] if ends else 0
        for _, record in items:
            at += len(record) + RECORD_OVERHEAD
            ends.append(at)
        records.extend([record for _, record in items])
        self._codes[partition].extend(added)
        if items:
            self._grew[partition].set()
            self._grew[partition] = asyncio.Event()
            self._any_grew.set()
            self._any_grew = asyncio.Event()
        return start

    def _fenced_append(
        self, partition: int, items: list[tuple[str, bytes]], terms: list[tuple[str, int]]
    ) -> int:
        """An append that carries its leader terms (the lowest epoch per fence of its
        records): refused whole if one is below the highest ``partition`` holds."""
        for fence, epoch in terms:
            highest = self._epochs.get((partition, fence), 0)
            if epoch < highest:
                raise FencedAppend(f"{fence} {epoch} {highest}")
        start = self._append(partition, items)
        for fence, epoch in terms:
            self._epochs[(partition, fence)] = max(epoch, self._epochs.get((partition, fence), 0))
        return start

    def _read(
        self, partition: int, offset: int, limit: int | None, wanted: list[int] | None
    ) -> list[Any]:
        """``[next, records, offsets, end]``: as asked, cut to fit one answer frame (at
        least one record when there is one: a record came in a frame, so it fits one)."""
        records, ends = self._records[partition], self._ends[partition]
        end = len(records)
        stop = end if limit is None else min(end, offset + limit)
        base = ends[offset - 1] if 0 < offset <= end else 0
        if wanted is None:
            if offset < stop:
                stop = max(bisect_right(ends, base + self._answer_cap, offset, stop), offset + 1)
            return [max(stop, offset), records[offset:stop], [], end]
        picked = self._find(self._codes[partition], wanted, offset, stop)
        size = 0
        for i, at in enumerate(picked):
            size += ends[at] - (ends[at - 1] if at else 0)
            if size > self._answer_cap and i:
                picked = picked[:i]
                stop = picked[-1] + 1
                break
        return [max(stop, offset), [records[i] for i in picked], picked, end]

    @staticmethod
    def _code(kind: str) -> int:
        """The byte that stands for ``kind`` in :attr:`_codes`."""
        code = KIND_CODES.get(kind)
        if code is None:
            raise BadRequest(f"unknown kind of record {kind!r:.40}")
        return code

    @staticmethod
    def _wanted(kinds: list[str]) -> list[int]:
        """The codes of ``kinds``; a kind outside the event union matches no record."""
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

    def _partition(self, value: int) -> int:
        try:
            check_partition(value, self.partitions)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return value

"""The log server under bad clients: garbage, oversized frames, bad requests, and a
client that vanishes; none of it loses records or stops the server. The shared token,
the limits and the memory bound are in ``test_remote_limits.py``, the fuzzers in
``test_remote_fuzz.py``."""

from __future__ import annotations

import asyncio
import struct

import msgspec
import pytest

from events.errors import InputError, LogError
from events.log import long_poll_or_sleep
from events.remote import LogServer, RemoteLog, parse_tcp_url
from events.types import Envelope, PodDeleted


async def _raw(server: LogServer, payload: bytes) -> bytes:
    """What the server answers ``payload``, sent after a hello (its answer left out)."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(_frame(["hello", 1, None]))
    (size,) = struct.unpack(">I", await reader.readexactly(4))
    ok, _ = msgspec.msgpack.decode(await reader.readexactly(size))
    assert ok is True
    writer.write(payload)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


def _frame(message: object) -> bytes:
    body = msgspec.msgpack.encode(message)
    return struct.pack(">I", len(body)) + body


def _nested(depth: int) -> bytes:
    """A frame of arrays nested ``depth`` deep: well-formed msgpack no decoder follows."""
    body = b"\x91" * depth + b"\xc0"
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\x00\x00\x05hello",  # not msgpack
        struct.pack(">I", 1 << 30),  # a frame larger than allowed
        _frame({"op": "append"}),  # not an array
        _frame(["append", 0, "records"]),
        _frame(["append", 0, [["pod-", "not bytes"]]]),
        _frame(["append", 0, [["pod-", "aGVsbG8="]]]),  # a string, even one that is base64
        _frame(["append", 0, [[7, b"\x80"]]]),  # a kind that is not a string
        _frame(["append", 0, [["pod-", b"\x80"], ["no-such-kind", b"\x80"]]]),  # none lands
        _frame(["append", 0, [["pod-", b"\x80", "extra"]]]),
        _frame(["read", 0, 0, None, 0, "bind"]),  # kinds not a list
        _frame(["read", 0, 0, None, 0, [3]]),
        _frame(["read", 9, 0, None, 0, None]),  # no such partition
        _frame(["read", 0, -1, None, 0, None]),
        _frame(["count", 0, 0, "pod-"]),  # kinds not a list
        _frame(["count", 0, -3, ["pod-"]]),
        _frame(["count", 0, 0, [["pod-"]]]),  # a kind that is not a string
        _frame(["count", 0]),
        _frame(["drop-table"]),
        _frame([]),
        _nested(100_000),  # the decoder's recursion error once escaped the server
        _frame(["read", 0, 0, float("inf"), 0, None]),  # int(inf) once escaped too
        _frame(["read", 0, 5, None, float("nan"), None]),
        _frame(["read", 0, 0, -1, 0, None]),
        _frame(["read", 0, 0, None, 0, None, "extra"]),
        _frame(["read", True, 0, None, 0, None]),  # a bool is not a partition
        _frame(["end", "0"]),
        _frame(["parts", 1]),
        _frame(["append", 0, [["pod-", b"\x80"]], "extra"]),
        _frame(["hello", 1, None]),  # a second hello is not a request
        _frame(["wait", [[0, -1]], 10]),  # a negative offset
        _frame(["wait", [[9, 0]], 10]),  # no such partition
        _frame(["wait", [[0, 0], [0, 1]], 10]),  # more pairs than partitions
        _frame(["wait", [[0, 0]]]),
        _frame(["wait", [[0, 0]], 1.5]),
        _frame(["wait", [0, 0], 10]),  # not pairs
    ],
)
async def test_bad_requests_are_refused_and_nothing_is_lost(payload: bytes) -> None:
    async with LogServer(1) as server:
        log = await RemoteLog.connect(server.url)
        await log.append([Envelope(event=PodDeleted(pod="ns/a"), producer="t")])
        answer = await _raw(server, payload)
        if answer:
            (size,) = struct.unpack(">I", answer[:4])
            ok, message = msgspec.msgpack.decode(answer[4 : 4 + size])
            assert ok is False and "bad request" in message
        records = await log.read(0, 0)
        assert [r.event for r in records] == [PodDeleted(pod="ns/a")]
        await log.close()


async def test_client_sees_a_clear_error_when_the_server_is_gone() -> None:
    server = await LogServer(1).start()
    log = await RemoteLog.connect(server.url)
    await server.close()
    with pytest.raises(LogError, match="log server"):
        await log.append([Envelope(event=PodDeleted(pod="ns/a"))])
    await log.close()


async def test_long_poll_returns_when_a_record_arrives() -> None:
    async with LogServer(1) as server:
        reader = await RemoteLog.connect(server.url)
        writer = await RemoteLog.connect(server.url)
        waiting = asyncio.create_task(reader.fetch(0, 0, wait=10.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await writer.append([Envelope(event=PodDeleted(pod="ns/a"))])
        stop, records = await asyncio.wait_for(waiting, 5)
        assert stop == 1 and records[0].offset == 0
        filtered = await reader.fetch(0, 0, kinds=["bind"])
        assert filtered == (1, [])
        await reader.close()
        await writer.close()


async def test_a_wait_over_several_partitions_returns_when_one_of_them_grows() -> None:
    """``wait_any`` (the ``wait`` op) holds until a partition it names holds a record at
    its offset or after; an append elsewhere does not end it; one already there ends it
    at once; with nothing it returns after its seconds."""
    async with LogServer(3) as server:
        reader = await RemoteLog.connect(server.url)
        writer = await RemoteLog.connect(server.url)
        await writer.append([Envelope(event=PodDeleted(pod="ns/a"))], 0)
        waiting = asyncio.create_task(reader.wait_any({0: 1, 2: 0}, 30.0))
        await writer.append([Envelope(event=PodDeleted(pod="ns/b"))], 1)  # not named
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await writer.append([Envelope(event=PodDeleted(pod="ns/c"))], 2)
        await asyncio.wait_for(waiting, 10)
        await asyncio.wait_for(reader.wait_any({0: 0, 1: 5}, 30.0), 10)  # there already
        await asyncio.wait_for(reader.wait_any({1: 1}, 0.01), 10)  # nothing: its seconds
        with pytest.raises(ValueError, match="partition 3"):
            await reader.wait_any({3: 0}, 1.0)
        await reader.close()
        await writer.close()


async def test_an_idle_reader_of_the_log_server_long_polls_rather_than_sleeps() -> None:
    """``long_poll_or_sleep`` (the coordinator's and the harness's idle wait) is ended by
    the append it waits for, not by its sleep: on this server it waits there."""
    async with LogServer(2) as server:
        reader = await RemoteLog.connect(server.url)
        writer = await RemoteLog.connect(server.url)
        waiting = asyncio.create_task(long_poll_or_sleep(reader, {0: 0, 1: 0}, 60.0, 60.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await writer.append([Envelope(event=PodDeleted(pod="ns/a"))], 1)
        await asyncio.wait_for(waiting, 10)
        await reader.close()
        await writer.close()


async def test_a_client_of_a_server_without_the_wait_op_sleeps_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server older than ``wait`` answers ``unknown op``: the client returns (after a
    short sleep) rather than fail its caller's loop, and does not ask again."""
    import events.logserver

    older = {op: shape for op, shape in events.logserver._SHAPES.items() if op != "wait"}
    monkeypatch.setattr(events.logserver, "_SHAPES", older)
    async with LogServer(1) as server:
        log = await RemoteLog.connect(server.url)
        for _ in range(3):
            await asyncio.wait_for(log.wait_any({0: 0}, 30.0), 10)
        assert log._waits is False
        await log.append([Envelope(event=PodDeleted(pod="ns/a"))])
        assert len(await log.read(0, 0)) == 1  # the connection serves on
        await log.close()


@pytest.mark.parametrize("url", ["tcp://", "tcp://host", "tcp://:80", "tcp://h:0", "tcp://h:x"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(InputError, match="tcp://HOST:PORT"):
        parse_tcp_url(url)


async def test_counts_and_filters_by_kind_over_mixed_records() -> None:
    """Kinds interleaved at random: the server's count and filtered read agree with a
    plain scan, from any offset, for any set of kinds (known, unknown or none)."""
    from random import Random

    from events.types import NodeRemoved, PodBound, PodUnschedulable

    rng = Random(7)
    makers = [
        lambda i: PodDeleted(pod=f"ns/p{i}"),
        lambda i: PodBound(pod=f"ns/p{i}", node="n", decision_id=f"d{i}", attempt=1),
        lambda i: PodUnschedulable(pod=f"ns/p{i}", attempt=1, reason="full"),
        lambda i: NodeRemoved(name=f"n{i}"),
    ]
    events = [rng.choice(makers)(i) for i in range(300)]
    async with LogServer(2) as server:
        log = await RemoteLog.connect(server.url)
        for start in range(0, 300, 37):
            await log.append([Envelope(event=e) for e in events[start : start + 37]], 1)
        kinds_of = [str(type(e).__struct_config__.tag) for e in events]
        for wanted in (["bind"], ["unsched", "bind"], ["pod-", "node-", "bind"], ["nope"], []):
            for offset in (0, 1, 150, 299, 300, 400):
                expected = [i for i in range(offset, 300) if kinds_of[i] in wanted]
                assert await log.count_kinds(1, offset, wanted) == (max(300, offset), len(expected))
                stop, records = await log.fetch(1, offset, kinds=wanted)
                assert stop == max(300, offset)
                assert [r.offset for r in records] == expected
                assert [r.event for r in records] == [events[i] for i in expected]
        assert await log.count_kinds(0, 0, ["bind"]) == (0, 0)
        await log.close()

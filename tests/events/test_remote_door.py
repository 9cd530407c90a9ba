"""The log server cannot be starved: connections that never say hello do not lock token
holders out, a client stalled after a frame's header holds none of the memory budget,
and a flood of refusals writes a bounded number of log lines."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable

import msgspec
import pytest

from events.errors import LogAuthError
from events.remote import LogServer, RemoteLog, ServerLimits
from events.throttle import Throttled
from events.types import Envelope, PodDeleted

TOKEN = b"a-token-for-the-tests-0123456789"


async def _until(condition: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    """Wait until ``condition`` holds (a generous deadline: the machine is shared)."""
    async with asyncio.timeout(limit):
        while not condition():
            await asyncio.sleep(0.01)
    assert condition(), what


def _frame(message: object) -> bytes:
    body = msgspec.msgpack.encode(message)
    return struct.pack(">I", len(body)) + body


def _pod(i: int, pad: int = 0) -> Envelope:
    return Envelope(event=PodDeleted(pod=f"ns/p{i}-" + "x" * pad))


async def _silent(
    server: LogServer, n: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``n`` connections that never send a byte."""
    return [await asyncio.open_connection(server.host, server.port) for _ in range(n)]


async def test_connections_that_never_say_hello_do_not_lock_token_holders_out() -> None:
    """More silent connections than clients may be served, and no hello deadline to
    rescue anyone: a token holder still connects and appends."""
    limits = ServerLimits(max_connections=4, hello_seconds=600)
    async with LogServer(1, token=TOKEN, limits=limits) as server:
        silent = await _silent(server, 20)
        await _until(lambda: server.stats()["pending"] == 20, "all twenty are pending")
        clients = [await RemoteLog.connect(server.url, token=TOKEN) for _ in range(4)]
        for i, client in enumerate(clients):
            assert await client.append([_pod(i)]) == [i]
        assert server.stats()["connections"] == 4
        for client in clients:
            await client.close()
        for _, writer in silent:
            writer.close()


async def test_past_the_pending_limit_the_longest_waiting_silent_connection_makes_room() -> None:
    limits = ServerLimits(max_pending=8, hello_seconds=600)
    async with LogServer(1, token=TOKEN, limits=limits) as server:
        silent = await _silent(server, 30)
        await _until(lambda: server.stats()["refused"] == 22, "the oldest 22 closed")
        assert server.stats()["pending"] == 8
        client = await RemoteLog.connect(server.url, token=TOKEN)
        assert await client.append([_pod(1)]) == [0]
        stats = server.stats()
        assert stats["connections"] == 1 and stats["pending"] <= 8
        await client.close()
        assert await asyncio.wait_for(silent[0][0].read(), 60) == b""  # closed, unanswered
        for _, writer in silent:
            writer.close()


async def test_clients_stalled_after_a_header_or_inside_a_body_do_not_block_the_others() -> None:
    """Two clients announce a frame of half the budget each and send nothing more; a
    third sends part of such a frame's body and stalls. None of them is dropped (the
    stall limit is long), and another client's appends and reads go through."""
    limits = ServerLimits(max_buffered=1 << 20, max_frame=512 << 10, stall_seconds=600)
    async with LogServer(1, limits=limits) as server:
        stalled = []
        for body in (b"", b"", b"\x93" + bytes(20 << 10)):
            _, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(_frame(["hello", 1, None]) + struct.pack(">I", 512 << 10) + body)
            await writer.drain()
            stalled.append(writer)
        await _until(lambda: server.stats()["buffered_bytes"] == 512 << 10, "the body's held")
        log = await RemoteLog.connect(server.url)
        for i in range(3):
            assert await asyncio.wait_for(log.append([_pod(i, 100 << 10)]), 60) == [i]
        assert len(await asyncio.wait_for(log.read(0, 0), 60)) == 3
        assert server.stats()["dropped"] == 0
        await log.close()
        for writer in stalled:
            writer.close()


async def test_a_flood_of_refusals_writes_a_bounded_number_of_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "events")
    limits = ServerLimits(max_pending=4, hello_seconds=600)
    async with LogServer(1, token=TOKEN, limits=limits) as server:
        for _ in range(40):
            with pytest.raises(LogAuthError):
                await RemoteLog.connect(server.url, token=b"another-token-of-the-same-length")
        silent = await _silent(server, 40)
        await _until(lambda: server.stats()["refused"] == 40 + 36, "every refusal counted")
        for _, writer in silent:
            writer.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "events.logserver"]
    assert len(lines) <= 6, lines
    assert any("wrong token" in line for line in lines)
    assert any("more like" in line for line in lines)  # said when the server stopped


def test_throttled_writes_one_line_per_kind_and_interval_then_the_count_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "t")
    now = [0.0]
    quiet = Throttled(logging.getLogger("t"), 10.0, clock=lambda: now[0])
    for i in range(5):
        quiet.warning("refused peer=%s", i)
        quiet.warning("dropped peer=%s", i)
    now[0] = 10.0
    quiet.warning("refused peer=%s", 5)
    quiet.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "refused peer=0",
        "dropped peer=0",
        "refused peer=5 (and 4 more like it left out)",
        "4 more like 'dropped' left out",
    ]

"""The log server's door and its bounds: the shared token, the connection and frame
limits, reads cut to fit a frame, and the memory bound shared by every connection."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.errors import InputError, LogAuthError, LogError, RecordTooLargeError
from events.memory import MemoryLog
from events.remote import LogServer, RemoteLog, ServerLimits
from events.types import Envelope, NodeRemoved, PodBound, PodDeleted
from events.wire import TOKEN_FILE_ENV, load_token
from shards.bus import open_bus

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


# --------------------------------------------------------------------------- the token


async def test_the_right_token_is_served(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "events")
    async with LogServer(2, token=TOKEN) as server:
        log = await RemoteLog.connect(server.url, token=TOKEN)
        assert log.partitions == 2
        await log.append([_pod(1)], 1)
        assert [r.event for r in await log.read(1, 0)] == [_pod(1).event]
        await log.close()
    assert "unauthenticated" not in caplog.text


@pytest.mark.parametrize(
    ("given_token", "reason"),
    [(None, "no token given"), (b"another-token-of-the-same-length", "wrong token")],
)
async def test_a_missing_or_wrong_token_is_refused_on_both_sides(
    caplog: pytest.LogCaptureFixture, given_token: bytes | None, reason: str
) -> None:
    caplog.set_level(logging.INFO, "events")
    async with LogServer(1, token=TOKEN) as server:
        with pytest.raises(LogAuthError, match=f"unauthorized: {reason}") as refused:
            await RemoteLog.connect(server.url, token=given_token)
        await _until(lambda: server.stats()["connections"] == 0, "the connection closed")
        assert server.stats()["refused"] == 1
        good = await RemoteLog.connect(server.url, token=TOKEN)  # the server goes on
        assert await good.end_offset(0) == 0
        await good.close()
    lines = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0].getMessage()
    for secret in (TOKEN, given_token or TOKEN):
        assert secret.decode() not in caplog.text
        assert secret.decode() not in str(refused.value)


async def test_a_client_older_than_the_handshake_is_told_so() -> None:
    async with LogServer(1, token=TOKEN) as server:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(_frame(["append", 0, [["pod-", b"\x80"]]]))
        answer = await asyncio.wait_for(reader.read(), 30)  # then the server closes
        writer.close()
        ok, message = msgspec.msgpack.decode(answer[4:])
        assert ok is False and "expected a hello" in message
        assert server.stats()["records"] == 0


async def test_nothing_large_is_read_before_the_hello() -> None:
    async with LogServer(1, token=TOKEN) as server:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(struct.pack(">I", 200 << 20))  # 200 MiB announced, none sent
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        ok, message = msgspec.msgpack.decode(answer[4:])
        assert ok is False and "bad hello" in message and "larger than" in message
        assert server.stats()["peak_buffered_bytes"] < 4096


async def test_without_a_token_only_loopback_is_served(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "events")
    for host in ("0.0.0.0", "10.1.2.3", "scheduler.example", "::"):
        with pytest.raises(InputError, match="--token-file"):
            LogServer(1, host)
        LogServer(1, host, token=TOKEN)  # with one, any address
    async with LogServer(1, "127.0.0.1"):
        pass
    warnings = [r for r in caplog.records if "unauthenticated" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_the_token_comes_from_the_flag_else_the_variable(tmp_path: Path) -> None:
    flag, env = tmp_path / "flag", tmp_path / "env"
    flag.write_bytes(TOKEN + b"\n")  # what echo writes
    env.write_bytes(b"  token-named-by-the-environment \n")
    environ = {TOKEN_FILE_ENV: str(env)}
    assert load_token(str(flag), environ=environ) == TOKEN
    assert load_token(None, environ=environ) == b"token-named-by-the-environment"
    assert load_token(None, environ={}) is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the token file"),
        (b"", "is empty"),
        (b" \n", "is empty"),
        (b"short", "5 bytes"),
        (b"y" * 5000, "bytes; it must be"),
    ],
)
def test_a_bad_token_file_is_named_never_shown(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_bytes(content)
    for flag, environ, where in (
        (str(path), {}, "--token-file"),
        (None, {TOKEN_FILE_ENV: str(path)}, f"${TOKEN_FILE_ENV}"),
    ):
        with pytest.raises(InputError, match=message) as bad:
            load_token(flag, environ=environ)
        assert bad.value.location == where and str(path) in str(bad.value)
        if content and content.strip():
            assert content.decode().strip() not in str(bad.value)


async def test_open_bus_names_where_a_refused_token_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_bytes(b"not-the-token-the-server-has")
    async with LogServer(1, token=TOKEN) as server:
        with pytest.raises(InputError, match="wrong token") as refused:
            await open_bus(server.url, token_file=str(wrong))
        assert refused.value.location == "--token-file"
        monkeypatch.setenv(TOKEN_FILE_ENV, str(wrong))
        with pytest.raises(InputError, match="wrong token") as refused:
            await open_bus(server.url)
        assert refused.value.location == f"${TOKEN_FILE_ENV}"
        right = tmp_path / "right"
        right.write_bytes(TOKEN)
        monkeypatch.setenv(TOKEN_FILE_ENV, str(right))
        log = await open_bus(server.url)
        assert log.partitions == 1
        await log.close()


# --------------------------------------------------------------------------- limits


async def test_connections_past_the_limit_are_refused_until_one_leaves() -> None:
    async with LogServer(1, limits=ServerLimits(max_connections=2)) as server:
        first = await RemoteLog.connect(server.url)
        second = await RemoteLog.connect(server.url)
        with pytest.raises(LogError, match="too many connections") as refused:
            await RemoteLog.connect(server.url)
        assert not isinstance(refused.value, LogAuthError)
        await first.close()
        await _until(lambda: server.stats()["connections"] == 1, "the first one gone")
        third = await RemoteLog.connect(server.url)
        assert await third.end_offset(0) == await second.end_offset(0) == 0
        await second.close()
        await third.close()


async def test_a_record_over_the_frame_limit_is_refused_before_anything_is_sent() -> None:
    """A record that alone does not fit a frame can never be appended: the client
    refuses the whole call before sending any of it (no retry could succeed), naming
    the limit and the flag that raises it; the connection stays good."""
    limits = ServerLimits(max_frame=64 << 10, max_buffered=1 << 20)
    async with LogServer(1, limits=limits) as server:
        log = await RemoteLog.connect(server.url)
        batch = [_pod(i, 1000) for i in range(10)] + [_pod(10, 70_000)]
        with pytest.raises(RecordTooLargeError, match="--max-frame-mib") as info:
            await log.append(batch)
        assert info.value.limit < 64 << 10 < info.value.size
        assert not isinstance(info.value, LogError), "a permanent refusal: not retried"
        assert server.stats()["peak_buffered_bytes"] < 4096  # nothing of it was read
        assert await log.end_offset(0) == 0
        assert await log.append([_pod(1)]) == [0]  # the connection is still good
        await log.close()


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(0, 38_000), max_size=30), before=st.integers(0, 3))
def test_an_append_of_any_size_is_stored_in_frames_as_one_call_would_be(
    sizes: list[int], before: int
) -> None:
    """Whatever its total size, an append through a server whose frames hold a few of
    its records stores them all, in order, at consecutive offsets, as the in-memory log
    does in one call: the client sends as many requests as the frames need."""

    async def check() -> None:
        envelopes = [_pod(i, size) for i, size in enumerate(sizes)]
        memory = MemoryLog(1)
        limits = ServerLimits(max_frame=40_000, max_buffered=200_000)
        async with LogServer(1, limits=limits) as server:
            remote = await RemoteLog.connect(server.url)
            for i in range(before):
                assert await remote.append([_pod(-i)]) == await memory.append([_pod(-i)])
            assert await remote.append(envelopes) == await memory.append(envelopes)
            assert await remote.read(0, 0) == await memory.read(0, 0)
            await remote.close()

    asyncio.run(check())


async def test_a_frame_announced_over_the_limit_closes_that_connection() -> None:
    limits = ServerLimits(max_frame=64 << 10, max_buffered=1 << 20)
    async with LogServer(1, limits=limits) as server:
        log = await RemoteLog.connect(server.url)
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(_frame(["hello", 1, None]) + struct.pack(">I", 1 << 30))
        answers = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        assert b"larger than 65536" in answers
        assert server.stats()["dropped"] == 1
        assert await log.append([_pod(1)]) == [0]
        await log.close()


@given(
    sizes=st.lists(st.integers(0, 30_000), max_size=40),
    offset=st.integers(0, 45),
    limit=st.none() | st.integers(0, 50),
    kinds=st.none() | st.lists(st.sampled_from(["pod-", "bind", "node-", "nope"]), max_size=3),
)
def test_reads_cut_to_fit_a_frame_return_what_an_uncut_log_does(
    sizes: list[int], offset: int, limit: int | None, kinds: list[str] | None
) -> None:
    """Whatever the records' sizes, a read through a server whose frames hold only a
    few of them returns what the in-memory log returns (the client asks again)."""

    def event(i: int, size: int) -> Envelope:
        makers = [
            lambda: PodDeleted(pod="ns/" + "p" * size),
            lambda: PodBound(pod="ns/p", node="n" * size, decision_id=f"d{i}", attempt=1),
            lambda: NodeRemoved(name="n" * size),
        ]
        return Envelope(event=makers[i % 3]())

    async def check() -> None:
        envelopes = [event(i, size) for i, size in enumerate(sizes)]
        memory = MemoryLog(1)
        limits = ServerLimits(max_frame=40_000, max_buffered=200_000)
        async with LogServer(1, limits=limits) as server:
            remote = await RemoteLog.connect(server.url)
            for envelope in envelopes:  # one at a time: each fits a frame
                await remote.append([envelope])
                await memory.append([envelope])
            expected = await memory.read(0, offset, limit)
            if kinds is not None:
                got = await remote.fetch(0, offset, limit, kinds=kinds)
                wanted = [e for e in expected if str(type(e.event).__struct_config__.tag) in kinds]
                end = len(sizes) if limit is None else min(len(sizes), offset + limit)
                assert got == (max(end, offset), wanted)
            else:
                assert await remote.read(0, offset, limit) == expected
            await remote.close()

    asyncio.run(check())


# --------------------------------------------------------------------------- memory


async def test_many_clients_appending_large_batches_stay_under_the_global_bound() -> None:
    """Eight clients, each appending batches of about 160 KiB at once, to a server that
    may hold 512 KiB: it makes some wait (back-pressure), never holds more, and every
    append completes."""
    limits = ServerLimits(max_buffered=512 << 10, max_frame=256 << 10)
    async with LogServer(1, limits=limits) as server:
        clients = [await RemoteLog.connect(server.url) for _ in range(8)]
        batch = [_pod(i, 40 << 10) for i in range(4)]
        seen: list[int] = []

        async def appends(client: RemoteLog) -> None:
            for _ in range(6):
                await client.append(batch)
                seen.append(server.stats()["buffered_bytes"])

        await asyncio.wait_for(asyncio.gather(*(appends(c) for c in clients)), 120)
        stats = server.stats()
        assert stats["peak_buffered_bytes"] <= limits.max_buffered
        assert max(seen) <= limits.max_buffered
        assert stats["back_pressure_waits"] > 0
        assert await clients[0].end_offset(0) == 8 * 6 * 4
        assert len(await clients[1].read(0, 0)) == 8 * 6 * 4  # answers cut to fit, too
        await _until(lambda: server.stats()["buffered_bytes"] == 0, "everything released")
        for client in clients:
            await client.close()


async def test_with_the_budget_spent_the_server_reads_nothing_until_it_is_freed() -> None:
    limits = ServerLimits(max_buffered=256 << 10, max_frame=128 << 10)
    async with LogServer(1, limits=limits) as server:
        log = await RemoteLog.connect(server.url)
        budget = server._budget
        await budget.reserve(budget.limit)  # as if other clients held it all
        pending = asyncio.create_task(log.append([_pod(1, 50 << 10)]))
        await _until(lambda: server.stats()["back_pressure_waits"] == 1, "the append waits")
        assert not pending.done() and server.stats()["records"] == 0
        budget.release(budget.limit)
        assert await asyncio.wait_for(pending, 60) == [0]
        await log.close()


async def test_a_client_that_stalls_mid_frame_is_dropped_and_frees_its_bytes() -> None:
    limits = ServerLimits(stall_seconds=0.2, max_buffered=1 << 20, max_frame=512 << 10)
    async with LogServer(1, limits=limits) as server:
        log = await RemoteLog.connect(server.url)
        _reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(_frame(["hello", 1, None]))
        writer.write(struct.pack(">I", 400 << 10) + b"\x93" + os.urandom(1000))
        await writer.drain()
        await _until(lambda: server.stats()["dropped"] == 1, "the stalled client dropped")
        await _until(lambda: server.stats()["buffered_bytes"] == 0, "its bytes released")
        assert await log.append([_pod(1)]) == [0]
        writer.close()
        await log.close()


async def test_a_connection_that_sends_no_hello_is_closed() -> None:
    limits = ServerLimits(hello_seconds=0.2)
    async with LogServer(1, token=TOKEN, limits=limits) as server:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        answer = await asyncio.wait_for(reader.read(), 60)
        writer.close()
        assert b"no hello in time" in answer
        assert server.stats()["refused"] == 1


async def test_a_client_that_never_takes_its_answers_is_dropped_and_frees_its_bytes() -> None:
    limits = ServerLimits(stall_seconds=0.3, max_buffered=1 << 20, max_frame=256 << 10)
    async with LogServer(1, limits=limits) as server:
        log = await RemoteLog.connect(server.url)
        await log.append([_pod(i, 20 << 10) for i in range(10)])  # about 200 KiB per read
        _reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(_frame(["hello", 1, None]))
        writer.write(_frame(["read", 0, 0, None, 0, None]) * 400)  # 80 MiB of answers
        await writer.drain()
        await _until(lambda: server.stats()["dropped"] == 1, "the deaf client dropped")
        await _until(lambda: server.stats()["buffered_bytes"] == 0, "its answer released")
        assert len(await log.read(0, 0)) == 10
        writer.close()
        await log.close()

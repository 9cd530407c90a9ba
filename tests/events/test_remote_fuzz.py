"""Hostile clients against the log server, generated: random bytes, truncated frames,
huge declared lengths, well-formed msgpack of the wrong types, clients that leave
mid-frame, before and after the hello.

For each, the server answers with errors or closes that one connection, logs single
lines at warning level at most (never the token), holds no bytes afterwards, and goes
on serving a well-behaved client. An event-loop exception handler records anything
that escapes (an exception in a connection's task, "Task exception was never
retrieved"): any such record fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import struct
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from events.remote import LogServer, RemoteLog, ServerLimits
from events.types import Envelope, PodDeleted

TOKEN = b"a-token-for-the-fuzzers-0123456789"
LIMITS = ServerLimits(
    max_buffered=1 << 20,
    max_frame=64 << 10,
    max_connections=8,
    stall_seconds=5.0,
    hello_seconds=5.0,
    max_wait_seconds=0.01,  # a fuzzed long poll must not hold the test up
)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _frame(message: object) -> bytes:
    body = msgspec.msgpack.encode(message)
    return struct.pack(">I", len(body)) + body


def _answers(data: bytes) -> list[Any]:
    """The frames in what the server sent (a cut last one left out)."""
    out: list[Any] = []
    at = 0
    while at + 4 <= len(data):
        (size,) = struct.unpack(">I", data[at : at + 4])
        if at + 4 + size > len(data):
            break
        out.append(msgspec.msgpack.decode(data[at + 4 : at + 4 + size]))
        at += 4 + size
    return out


def attack(payload: bytes, *, hello: bool, token: bytes | None = None) -> None:
    """Send ``payload`` (after a hello when ``hello``) on a connection of its own, then
    close its sending side, and check the server and a good client on another
    connection (see the module's docstring)."""
    escaped: list[dict[str, Any]] = []
    logged = _Records()
    logger = logging.getLogger("events")
    logger.addHandler(logged)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: escaped.append(context))
        async with LogServer(1, token=token, limits=LIMITS) as server:
            good = await RemoteLog.connect(server.url, token=token)
            await good.append([Envelope(event=PodDeleted(pod="ns/before"))])
            reader, writer = await asyncio.open_connection(server.host, server.port)
            if hello:
                writer.write(_frame(["hello", 1, token]))
            writer.write(payload)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
                writer.write_eof()
            received = b""
            with contextlib.suppress(ConnectionError):
                received = await asyncio.wait_for(reader.read(), 60)  # until the server closes
            writer.close()
            answers = _answers(received)
            if hello:
                assert answers and answers[0][0] is True, answers[:1]
                answers = answers[1:]
            for answer in answers:
                assert isinstance(answer, list) and len(answer) == 2
                assert isinstance(answer[0], bool)
                if answer[0] is False:
                    assert isinstance(answer[1], str) and answer[1]
            await good.append([Envelope(event=PodDeleted(pod="ns/after"))])
            pods = [e.event.pod for e in await good.read(0, 0) if isinstance(e.event, PodDeleted)]
            assert pods[0] == "ns/before" and pods[-1] == "ns/after"
            await good.close()
            async with asyncio.timeout(60):
                while server.stats()["connections"] or server.stats()["buffered_bytes"]:
                    await asyncio.sleep(0.01)
        gc.collect()  # a task whose exception nobody retrieved reports it when collected
        await asyncio.sleep(0)

    try:
        asyncio.run(scenario())
        gc.collect()
    finally:
        logger.removeHandler(logged)
        logger.setLevel(old_level)
    assert not escaped, escaped
    for record in logged.records:
        message = record.getMessage()
        assert record.levelno <= logging.WARNING, message
        assert record.exc_info is None and "\n" not in message, message
        assert TOKEN.decode() not in message


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=24)
    | st.sampled_from(["pod-", "bind", "node-", "nope"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)
_requests = st.builds(
    lambda op, args: [op, *args],
    st.sampled_from(["parts", "end", "append", "read", "count", "wait", "hello", "nope", ""]),
    st.lists(_values, max_size=7),
)


FUZZ = settings(max_examples=max(10, settings.default.max_examples // 2))
"""Each example runs a log server of its own (about 0.4 s): half the profile's examples
in the suite, 200 with ``HYPOTHESIS_PROFILE=big``."""


@FUZZ
@given(st.lists(_requests, min_size=1, max_size=4))
def test_well_formed_frames_of_the_wrong_types(requests: list[list[Any]]) -> None:
    attack(b"".join(_frame(r) for r in requests), hello=True)


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes_after_the_hello(payload: bytes) -> None:
    attack(payload, hello=True)


@FUZZ
@given(st.binary(max_size=300), st.sampled_from([None, TOKEN]))
def test_random_bytes_instead_of_a_hello(payload: bytes, token: bytes | None) -> None:
    attack(payload, hello=False, token=token)


@FUZZ
@given(st.lists(_requests, min_size=1, max_size=3), st.data())
def test_frames_cut_short_by_a_client_that_leaves(
    requests: list[list[Any]], data: st.DataObject
) -> None:
    stream = b"".join(_frame(r) for r in requests)
    cut = data.draw(st.integers(1, len(stream) - 1), label="cut at")
    attack(stream[:cut], hello=True)


@FUZZ
@given(
    st.integers(0, 2**32 - 1), st.binary(max_size=64), st.booleans(), st.sampled_from([None, TOKEN])
)
def test_huge_declared_lengths(size: int, body: bytes, hello: bool, token: bytes | None) -> None:
    attack(struct.pack(">I", size) + body, hello=hello, token=token)


@given(st.sampled_from([None, b"", b"not-the-token-at-all-0123456789", 7, "text", [TOKEN]]))
def test_hellos_with_a_wrong_token_of_any_type(given_token: Any) -> None:
    attack(_frame(["hello", 1, given_token]), hello=False, token=TOKEN)

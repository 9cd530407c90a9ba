"""What the log server and its clients share: frames, the handshake and the token.

The protocol itself is described in :mod:`events.remote`. A frame is a 4-byte big-endian
length and a msgpack body. The shared token is read from a file, never from the command
line (where ``ps`` shows it) and never logged: only its SHA-256 digest is kept, and two
tokens are compared digest to digest in constant time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import struct
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from events.codec import TAGS
from events.errors import InputError

HEADER: Final = struct.Struct(">I")
MAX_FRAME: Final = 256 << 20
"""The largest frame a client accepts from a server; a server's own limit (see
:class:`~events.logserver.ServerLimits`) is at most this."""
PROTOCOL: Final = 1
"""The version a client names in its hello; a server refuses any other."""
TOKEN_FILE_ENV: Final = "SHOAL_LOG_TOKEN_FILE"
"""The environment variable naming the token FILE (a Kubernetes Secret mounted as a
file), used when no ``--token-file`` is given."""
MIN_TOKEN: Final = 16
MAX_TOKEN: Final = 1024
UNAUTHORIZED: Final = "unauthorized"
"""How a refusal of the token begins, so that the client can tell it from other refusals."""
KIND_CODES: Final = {tag: code for code, tag in enumerate(sorted(TAGS.values()))}
"""A byte for each kind of record: the tags of the event union (a few dozen). A record
of any other kind is refused on append."""
FRAME_SLACK: Final = 1024
"""Bytes of a frame an append leaves to the request around its records, and a read's
answer leaves below the frame limit: so that any record appended also fits, alone, in
an answer to a read (``events.remote`` cuts appends, ``events.logserver`` answers)."""

_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder()


class FrameTooLarge(ValueError):
    """A frame's declared length is over the reader's limit."""


async def read_header(reader: asyncio.StreamReader, limit: int) -> int:
    """The length of the next frame; ``FrameTooLarge`` past ``limit``."""
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > limit:
        raise FrameTooLarge(f"frame of {size} bytes is larger than {limit}")
    return int(size)


def decode_body(body: bytes) -> Any:
    """The message in a frame's body; ``ValueError`` for anything that is not msgpack
    (nesting too deep included)."""
    try:
        return _DEC.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ValueError(f"not msgpack: {exc}") from None


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME) -> Any:
    size = await read_header(reader, limit)
    return decode_body(await reader.readexactly(size))


def encode_frame(message: Any) -> bytes:
    body = _ENC.encode(message)
    return HEADER.pack(len(body)) + body


def digest(token: bytes) -> bytes:
    """What a server keeps of a token, and what it compares."""
    return hashlib.sha256(token).digest()


def token_matches(given: bytes, expected_digest: bytes) -> bool:
    """Whether ``given`` is the token whose digest is ``expected_digest``, in time that
    does not depend on where they differ (nor on the given token's length)."""
    return hmac.compare_digest(digest(given), expected_digest)


def load_token(path: str | None = None, *, environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The shared token: the content of ``path`` (``--token-file``), else of the file
    that ``$SHOAL_LOG_TOKEN_FILE`` names, else ``None`` (no token).

    Whitespace around it (the newline ``echo`` adds) is dropped. ``InputError`` naming
    the flag or the variable and the file, never the content, when the file cannot be
    read, is empty, or holds fewer than 16 or more than 1024 bytes."""
    where = "--token-file"
    if path is None:
        path = environ.get(TOKEN_FILE_ENV) or None
        where = f"${TOKEN_FILE_ENV}"
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            token = file.read(MAX_TOKEN * 4 + 1).strip()
    except OSError as exc:
        raise InputError(
            f"cannot read the token file {path}: {exc.strerror or exc}", location=where
        ) from None
    if not token:
        raise InputError(f"the token file {path} is empty", location=where)
    if not MIN_TOKEN <= len(token) <= MAX_TOKEN:
        raise InputError(
            f"the token in {path} is {len(token)} bytes; it must be {MIN_TOKEN} to "
            f"{MAX_TOKEN} (make one with: openssl rand -hex 32)",
            location=where,
        )
    return token


def new_token_file(folder: str) -> str:
    """A fresh random token (32 random bytes, in hex) in a new file ``token`` of
    ``folder`` that only this user may read; its path."""
    path = os.path.join(folder, "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_hex(32))
    return path

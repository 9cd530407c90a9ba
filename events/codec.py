"""Codecs: msgpack for the log, JSON for people.

Encoders and decoders are built once and reused: they are on every hot path.
"""

from __future__ import annotations

from typing import Any, Final, get_args

import msgspec

from events.errors import ShoalError
from events.types import Envelope, Event

_MSGPACK_ENC = msgspec.msgpack.Encoder()
_MSGPACK_DEC = msgspec.msgpack.Decoder(Envelope)
_JSON_ENC = msgspec.json.Encoder()
_JSON_DEC = msgspec.json.Decoder(Envelope)


class DecodeError(ShoalError):
    """Bytes are not a valid encoded envelope."""


def kind_of(envelope: Envelope) -> str:
    """The tag of the envelope's event (``"pod+"``, ``"bind"``...): what log backends
    keep beside a record so that readers can skip the kinds they do not want."""
    return TAGS[type(envelope.event)]


TAGS: Final = {kind: str(kind.__struct_config__.tag) for kind in get_args(Event)}
"""Each event type's tag, looked up once (every append asks for one per record)."""


def encode(envelope: Envelope) -> bytes:
    """Encode one envelope to msgpack (the log's record payload)."""
    return _MSGPACK_ENC.encode(envelope)


def decode(data: bytes | memoryview) -> Envelope:
    """Decode one msgpack record; raises :class:`DecodeError` with msgspec's reason."""
    try:
        return _MSGPACK_DEC.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from None


def encode_json(envelope: Envelope) -> bytes:
    """Encode one envelope as a JSON object (``shoal replay --json``)."""
    return _JSON_ENC.encode(envelope)


def decode_json(data: bytes | str) -> Envelope:
    """Decode an envelope from JSON; raises :class:`DecodeError`."""
    try:
        return _JSON_DEC.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from None


def to_builtins(envelope: Envelope) -> dict[str, Any]:
    """The envelope as plain dicts and lists, ready for any JSON writer."""
    result: dict[str, Any] = msgspec.to_builtins(envelope)
    return result

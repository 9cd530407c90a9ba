"""How the Kafka log (``events.kafka``) stores an envelope as a record, and what it
makes of a record that does not decode back.

A record's value is one msgpack envelope (``events.codec``) as stored: its partition
set, its offset unknown (-1) until Kafka assigns one. Its key is the event's kind
(``pod+``, ``bind``...), so that a reader that wants some kinds only skips the others
without decoding them. A record a leader term appended carries the term in a header
(:data:`TERM_HEADER`: ``FENCE:EPOCH``), which readers judge (``events.kafka_judge``).
A record that alone is over ``max_batch_bytes`` (less :data:`RECORD_OVERHEAD`) is
refused before anything of its append is sent: the broker would refuse it for ever.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import msgspec

from events.codec import DecodeError, decode, encode, kind_of
from events.errors import LogCorruptedError, RecordTooLargeError
from events.kafka_settings import KafkaSettings
from events.types import Envelope

TERM_HEADER = "shoal-term"
"""The record header that carries a leader's term: ``FENCE:EPOCH`` (``events.fence``)."""
RECORD_OVERHEAD = 128
"""Bytes a record costs in a batch beyond its key and value (Kafka's varints and
attributes, the term header): a record whose key and value leave less than this of
``max_batch_bytes`` is refused, as no batch can hold it."""

Record = tuple[bytes, bytes, list[tuple[str, bytes]]]
"""A record to send: its key, value and headers."""
Term = tuple[str, int]
"""A leader's term: ``(FENCE, EPOCH)``."""


def encode_records(
    envelopes: Sequence[Envelope], partition: int, settings: KafkaSettings
) -> tuple[list[Record], frozenset[bytes], frozenset[Term | None]]:
    """The records of ``envelopes`` appended to ``partition``, every one checked against
    the batch limit before any is sent; and, gathered on the way, their kinds (keys)
    and terms (None: a record with no term)."""
    records = []
    limit = settings.max_batch_bytes
    terms: dict[Term, list[tuple[str, bytes]]] = {}
    kinds: set[bytes] = set()
    plain = False
    """Whether a record has no term."""
    for env in envelopes:
        as_stored = env.partition == partition and env.offset == -1  # (no copy then)
        value = encode(env if as_stored else replace_partition(env, partition))
        key = kind_of(env).encode()
        kinds.add(key)
        headers = []
        if env.epoch:  # (a call's records share a term or two: its header made once)
            term = (env.fence, env.epoch)
            headers = terms.get(term) or terms.setdefault(
                term, [(TERM_HEADER, f"{env.fence}:{env.epoch}".encode())]
            )
        else:
            plain = True
        if len(value) + len(key) + RECORD_OVERHEAD > limit:
            raise RecordTooLargeError(
                f"kafka {settings.bootstrap}: cannot append a {key.decode()!r} record",
                size=len(value),
                limit=limit - len(key) - RECORD_OVERHEAD,
                setting="raise it with max_batch_bytes in the --bus URL or "
                "SHOAL_KAFKA_MAX_BATCH_BYTES, and the broker's message.max.bytes with it",
            )
        records.append((key, value, headers))
    held: set[Term | None] = {*terms, None} if plain else set(terms)
    return records, frozenset(kinds), frozenset(held)


def replace_partition(env: Envelope, partition: int) -> Envelope:
    """The envelope as stored: offset unknown until Kafka assigns it."""
    return msgspec.structs.replace(env, partition=partition, offset=-1)


def undecodable(value: bytes | None, partition: int, offset: int, topic: str) -> NoReturn:
    """Raise what is wrong with a record of ``topic`` that did not decode, naming where
    it is."""
    if value is None:
        raise LogCorruptedError("record has no value", partition=partition, offset=offset)
    try:
        decode(value)
    except DecodeError as exc:
        raise LogCorruptedError(
            f"record does not decode: {exc}",
            partition=partition,
            offset=offset,
            path=f"kafka:{topic}",
        ) from None
    raise LogCorruptedError("record does not decode", partition=partition, offset=offset)

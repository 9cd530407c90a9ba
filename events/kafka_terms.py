"""Leader terms on Kafka: a transactional producer per term, so that the broker refuses
a deposed leader's appends (``events.kafka`` says how the log uses it).

Every replica of a role shares one transactional id per topic (``shoal-<topic>-<fence>``).
A term's producer, as it starts (``InitProducerId``), bumps the id's producer epoch: the
broker aborts the earlier producer's open transaction and refuses its later appends
(``ProducerFenced``, ``InvalidProducerEpoch``). The broker fences whichever producer
started first, which is not always the older term's (a deposed leader whose clients
start again after a broker outage fences the current leader's), so the log decides: a
producer just started, and an append the broker refused, go on only while the log holds
no later term for the fence (``highest_epoch``); above it, the term is over
(:class:`~events.fence.FencedError`). The current leader, refused because a deposed
one's producer started again, starts its own again (fencing that one) and tries again.

Cost, per append of a term: one transaction (``AddPartitionsToTxn``, the produce
request, ``EndTxn``: three round trips to the broker where a plain append takes one;
about 5 ms back to back against 1 ms, on one local Apache Kafka 4.4 broker) and a
commit marker, which takes an offset of the partition; per term (and after a broker
outage), a producer start and a scan of the topic's record headers from where the log
last judged them. Readers of a partition a term writes wait for its open transaction
to end (milliseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import InvalidProducerEpoch, KafkaError, KafkaTimeoutError, ProducerFenced
from aiokafka.producer import sender as aiokafka_sender

from events.errors import LogError
from events.fence import FencedError
from events.kafka_runs import Appended
from events.kafka_settings import KafkaSettings
from events.types import Envelope

TRANSACTION_TIMEOUT_MS = 10_000
"""How long the broker lets a term's transaction stay open before it aborts it. An open
transaction holds back every ``read_committed`` reader of the partitions it wrote (one
append takes milliseconds); a writer that dies in the middle holds them back until the
next term's producer starts (which aborts it) or this time passes."""
TERM_TRIES = 3
"""Transactions an append tries while the broker fences its producer and the log holds
no later term (another process's producer of the same id started since: a deposed
leader starting again, which then finds itself deposed)."""
NEXT_TRANSACTION_RETRY_S = 0.002
"""How soon a transaction asks again to add a partition while the previous one's commit
markers are still being written (the broker answers ``CONCURRENT_TRANSACTIONS``).
aiokafka waits a fixed 20 ms (``BACKOFF_OVERRIDE``, after KAFKA-5477), and has no
setting for it: back-to-back appends of a term, which is how the coordinator writes,
then take 25 ms each, 5 ms with this (Apache Kafka 4.4, one local broker)."""
REFUSED = (ProducerFenced, InvalidProducerEpoch)
"""What a transactional producer raises once another with its id has started."""

Call = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]
"""``KafkaLog._call``: run a call with the log's clients, any failure a ``LogError``."""
Send = Callable[[AIOKafkaProducer, Sequence[Envelope], int], Awaitable[Appended]]
"""Append envelopes to a partition with the producer given, in record batches."""


class _Refused(Exception):
    """The broker fenced this term's producer; whether the term is over, the log says."""


class _Failed(Exception):
    """A transaction failed otherwise (the term's producer is dropped). Not a failure of
    the log's shared clients: a fenced producer can fail in ways aiokafka does not name
    (``Unexpected error during batch delivery``), so the log says whether a later term
    explains it."""


class _Term:
    """A leader term's transactional producer, and the epoch it was started for."""

    def __init__(self, epoch: int, producer: AIOKafkaProducer) -> None:
        self.epoch = epoch
        self.producer = producer
        self.checked = False
        """Whether the log was found to hold no later term once it had started."""


class TermProducers:
    """The transactional producers of the leader terms one ``KafkaLog`` writes, one per
    fence. ``call``, ``send`` and ``highest_epoch`` are the log's; ``stop`` stops clients
    in the background (the log keeps the task)."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        call: Call,
        send: Send,
        highest_epoch: Callable[[str], Awaitable[int]],
        stop: Callable[[Sequence[Any]], object],
    ) -> None:
        self.settings = settings
        self._call = call
        self._send = send
        self._highest_epoch = highest_epoch
        self._stop = stop
        self._held: dict[str, _Term] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        """Per fence: one transaction at a time through its producer."""

    def __repr__(self) -> str:
        held = {fence: term.epoch for fence, term in self._held.items()}
        return f"TermProducers({self.settings.topic!r}, held={held})"

    def transactional_id(self, fence: str) -> str:
        """The transactional id of ``fence``'s terms on this topic: every replica that
        can lead the role shares it, so each term's producer fences the one before."""
        return f"shoal-{self.settings.topic}-{fence}"

    def release(self) -> list[AIOKafkaProducer]:
        """Forget every producer held and hand them over, to be stopped (the log's
        clients are closing)."""
        producers = [term.producer for term in self._held.values()]
        self._held.clear()
        return producers

    async def append(
        self, envelopes: Sequence[Envelope], partition: int, fence: str, epoch: int
    ) -> Appended:
        """Append ``envelopes`` in one transaction of term ``epoch`` of ``fence``; raise
        :class:`FencedError` once the log holds a later term (nothing of the call is
        then stored)."""
        async with self._locks.setdefault(fence, asyncio.Lock()):
            for _ in range(TERM_TRIES):
                term = await self._call("append", lambda: self._start(fence, epoch))
                if not term.checked:
                    await self._check(fence, epoch)
                    term.checked = True
                try:
                    appended: Appended = await self._call(
                        "append",
                        lambda held=term: self._transaction(held, fence, envelopes, partition),  # type: ignore[misc]
                    )
                    return appended
                except _Refused:
                    await self._check(fence, epoch)
                except _Failed as failed:
                    await self._check(fence, epoch)
                    raise LogError(
                        f"kafka append of {fence} epoch {epoch} failed: {failed}"
                    ) from None
            raise LogError(
                f"kafka append of {fence} epoch {epoch}: the broker fenced its producer "
                f"{TERM_TRIES} times while the log holds no later term"
            )

    async def _check(self, fence: str, epoch: int) -> None:
        """Raise :class:`FencedError` (the term's producer stopped) if the log holds a
        later term of ``fence`` than ``epoch``."""
        highest = await self._highest_epoch(fence)
        if highest > epoch:
            self._drop(fence)
            raise FencedError(
                fence,
                epoch,
                highest,
                f"the log holds epoch {highest}: another leader took over, and the "
                "broker fences this term's producer",
            )

    async def _start(self, fence: str, epoch: int) -> _Term:
        """The producer of term ``epoch`` of ``fence``: the one held, or a new one,
        whose start (``InitProducerId``) makes the broker fence every earlier producer
        of the id and abort its open transaction."""
        held = self._held.get(fence)
        if held is not None and held.epoch > epoch:
            raise FencedError(fence, epoch, held.epoch, "this process began a later term")
        if held is not None and held.epoch == epoch:
            return held
        self._drop(fence)
        _retry_next_transaction_sooner()
        s = self.settings
        producer = AIOKafkaProducer(
            **s.client_options(),
            acks="all",
            enable_idempotence=True,
            linger_ms=s.linger_ms,
            max_batch_size=max(s.max_batch_bytes + 4096, 16384),
            max_request_size=s.max_batch_bytes + 65536,
            transactional_id=self.transactional_id(fence),
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
        )
        term = self._held[fence] = _Term(epoch, producer)  # released on close from now on
        try:
            await asyncio.wait_for(producer.start(), s.request_timeout_ms / 1000)
        except TimeoutError:
            self._drop(fence, term)
            raise KafkaTimeoutError("no producer id for the term") from None
        except BaseException:
            self._drop(fence, term)
            raise
        return term

    async def _transaction(
        self, term: _Term, fence: str, envelopes: Sequence[Envelope], partition: int
    ) -> Appended:
        """One transaction of ``term``'s producer holding ``envelopes``. On any failure
        the producer is dropped (its transaction aborted where it can be): the next
        append starts another."""
        producer = term.producer
        try:
            await producer.begin_transaction()
            appended = await self._send(producer, envelopes, partition)
            try:
                await asyncio.wait_for(
                    producer.commit_transaction(), self.settings.request_timeout_ms / 1000
                )
            except TimeoutError:
                raise KafkaTimeoutError("no answer to a commit") from None
            return appended
        except REFUSED:
            self._drop(fence, term)
            raise _Refused from None
        except KafkaError as exc:
            self._drop(fence, term)
            inner = exc.__cause__
            why = f"{exc}" + (f" ({type(inner).__name__}: {inner})" if inner else "")
            raise _Failed(why) from None
        except BaseException:
            self._drop(fence, term)
            raise

    def _drop(self, fence: str, term: _Term | None = None) -> None:
        """Stop ``fence``'s producer (``term``'s only, if given), in the background."""
        held = self._held.get(fence)
        if held is None or (term is not None and held is not term):
            return
        del self._held[fence]
        self._stop([held.producer])


def _retry_next_transaction_sooner() -> None:
    """``NEXT_TRANSACTION_RETRY_S`` in place of aiokafka's fixed wait (every
    transactional producer of the process: only they ask), if aiokafka still has it."""
    if isinstance(getattr(aiokafka_sender, "BACKOFF_OVERRIDE", None), float):
        aiokafka_sender.BACKOFF_OVERRIDE = NEXT_TRANSACTION_RETRY_S


async def settle(producer: AIOKafkaProducer) -> None:
    """End a transactional producer's transaction before it stops: abort one still open
    (else it holds back ``read_committed`` readers until it times out), and take the
    error the broker's fencing left in its waiters (else asyncio logs each, at ERROR, as
    never retrieved). aiokafka has no public handle on either."""
    txn = getattr(producer, "_txn_manager", None)
    if txn is None or txn.transactional_id is None:
        return
    if txn.is_in_transaction():
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.abort_transaction(), 5)
    waiters = [txn.wait_for_transaction_end()]
    batches = getattr(getattr(producer, "_message_accumulator", None), "_batches", {})
    waiters += [getattr(b, "_drain_waiter", None) for queue in batches.values() for b in queue]
    for waiter in waiters:
        if isinstance(waiter, asyncio.Future) and waiter.done() and not waiter.cancelled():
            waiter.exception()


__all__ = ["TRANSACTION_TIMEOUT_MS", "TermProducers", "settle"]

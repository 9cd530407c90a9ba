"""The clients of the Kafka log (``events.kafka``) and their life: started together,
restarted together after the broker went away, stopped together, and how a call
through them fails (a :class:`~events.errors.LogError`, the SASL password scrubbed).

:class:`KafkaClients` holds them; :class:`~events.kafka.KafkaLog`, the log built on
them, calls it (``start``, ``close``, ``_call``), never the other way round. The
clients are aiokafka's: a producer, the consumers a read fetches with, one that learns
where partitions end, and one that waits for partitions to grow (started at its first
use). A term's transactional producers are ``events.kafka_terms``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import ConsumerStoppedError, KafkaError

from events.errors import LogError
from events.kafka_settings import KafkaSettings, guard_client_logs, redact
from events.kafka_terms import settle
from events.tasks import being_cancelled

FAILURES = (KafkaError, ConsumerStoppedError, OSError)
"""What a client raises when the broker goes away, or when another caller sharing this
log restarted the clients under it: each becomes a :class:`LogError`."""
T = TypeVar("T")


class KafkaClients:
    """The aiokafka clients of one log on one topic. ``await start()`` before use."""

    def __init__(self, settings: KafkaSettings) -> None:
        settings.validate()
        self.settings = settings
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        """Fetches the records of a read (waits up to ``catch_up_wait_ms``)."""
        self._probe_consumer: AIOKafkaConsumer | None = None
        """Fetches a read's first records (waits up to ``fetch_max_wait_ms``)."""
        self._ends: AIOKafkaConsumer | None = None
        """Learns where partitions end (``ListOffsets``; it never fetches)."""
        self._waiter: AIOKafkaConsumer | None = None
        """Waits for a partition to grow (``KafkaLog.wait_for``; started at its first use)."""
        self._restart_lock = asyncio.Lock()
        self._needs_restart = False
        self._secret: str | None = None
        """The SASL password the clients were started with: scrubbed from errors."""
        self._generation = 0
        """Bumped by every (re)start: a call that fails with clients of an older
        generation must not stop the new ones another caller has just started."""
        self._stopping: set[asyncio.Future[None]] = set()
        """Clients being stopped by a :meth:`close` whose caller was cancelled."""

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"{type(self).__name__}({s.bootstrap!r}, topic={s.topic!r}, partitions={s.partitions})"
        )

    async def start(self) -> None:
        """Connect, and check the topic exists with enough partitions."""
        self._generation += 1
        options = self.settings.client_options()
        self._secret = options.get("sasl_plain_password")
        guard_client_logs(self._secret)
        try:
            self._producer = AIOKafkaProducer(
                **options, **self._producer_options(), enable_idempotence=self.settings.idempotence
            )
            await self._producer.start()
            self._consumer = AIOKafkaConsumer(
                **options,
                enable_auto_commit=False,
                isolation_level="read_committed",
                fetch_max_wait_ms=self.settings.catch_up_wait_ms,
                max_partition_fetch_bytes=4 * 1024 * 1024,
            )
            await self._consumer.start()
            self._probe_consumer = AIOKafkaConsumer(
                **options,
                enable_auto_commit=False,
                isolation_level="read_committed",
                fetch_max_wait_ms=self.settings.fetch_max_wait_ms,
                max_partition_fetch_bytes=1024 * 1024,
            )
            await self._probe_consumer.start()
            # (read_uncommitted: the latest offset it is told is the high-water mark)
            self._ends = AIOKafkaConsumer(**options, enable_auto_commit=False)
            await self._ends.start()
            # every topic the broker has (a client asks about none until told which)
            found = None
            if self.settings.topic in await self._consumer.topics():
                found = await self._producer.partitions_for(self.settings.topic)
        except (KafkaError, OSError, TimeoutError) as exc:
            await self.close()
            raise LogError(
                redact(f"kafka {self.settings.bootstrap}: {exc}", self._secret)
            ) from None
        except BaseException:  # cancelled half-way: never leave a client running
            await asyncio.shield(self.close())
            raise
        if not found or len(found) < self.settings.partitions:
            await self.close()
            have = len(found) if found else 0
            raise LogError(
                f"kafka topic {self.settings.topic!r} has {have} partitions, "
                f"{self.settings.partitions} needed (create it with `shoal kafka init`)"
            )

    def _producer_options(self) -> dict[str, Any]:
        s = self.settings
        return {
            "acks": s.acks if s.acks == "all" else int(s.acks),
            "linger_ms": s.linger_ms,
            "max_batch_size": max(s.max_batch_bytes + 4096, 16384),
            "max_request_size": s.max_batch_bytes + 65536,
        }

    def _stop_in_background(self, clients: Sequence[Any]) -> asyncio.Future[None]:
        stopping = asyncio.ensure_future(_stop_clients(clients))
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)
        return stopping

    async def _call(self, what: str, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` with the current clients; any way they fail (the broker went
        away, or another caller restarted them under this call) is a :class:`LogError`,
        and the clients are started again by the next call."""
        await self._ensure()
        generation = self._generation
        try:
            return await work()
        except FAILURES as exc:
            await self._broken(generation)
            raise LogError(redact(f"kafka {what} failed: {_why(exc)}", self._secret)) from None
        except asyncio.CancelledError:
            await self._stopped_under_us(generation)
            raise LogError(f"kafka {what} failed: the client was restarted under it") from None

    async def close(self) -> None:
        """Stop the clients. A caller cancelled meanwhile (a deposed leader's work is
        cancelled at once) gets its ``CancelledError``, and the clients are stopped all
        the same: none is left running unowned (nor is a client handed to
        :meth:`_stop_in_background` earlier and still stopping)."""
        clients = (self._producer, self._consumer, self._probe_consumer, self._ends, self._waiter)
        self._producer = self._consumer = self._probe_consumer = self._ends = self._waiter = None
        self._stop_in_background(clients)
        await asyncio.shield(asyncio.gather(*self._stopping))

    async def _broken(self, generation: int | None = None) -> None:
        """A client of ``generation`` failed (the broker went away): drop both; the
        next call starts new ones, since clients that lived through a broker restart
        can misbehave. Clients already replaced since are left alone."""
        if generation is not None and generation != self._generation:
            return
        self._needs_restart = True
        with contextlib.suppress(Exception):
            await self.close()

    async def _stopped_under_us(self, generation: int) -> None:
        """A ``CancelledError`` reached a call: if the calling task is being cancelled,
        let it through; otherwise it came from a client another caller stopped (a
        restart after the broker went away), and the call failed like any other."""
        if being_cancelled():
            raise asyncio.CancelledError
        await self._broken(generation)

    async def _ensure(self) -> None:
        if not self._needs_restart:
            return
        async with self._restart_lock:  # callers share the log: restart it once
            if self._needs_restart:
                await self.start()  # raises LogError while the broker is still away
                self._needs_restart = False

    @staticmethod
    def _need(client: Any) -> Any:
        if client is None:
            raise LogError("the Kafka log is not started (await start())")
        return client


async def _stop_clients(clients: Sequence[Any]) -> None:
    for client in clients:
        if client is not None:
            try:  # each one stopped, whatever the other did
                if isinstance(client, AIOKafkaProducer):
                    await settle(client)
                await client.stop()
            except asyncio.CancelledError:
                # a client whose tasks were already cancelled says so on stop(); this
                # task is shielded from its caller's cancellation, so it goes on
                pass
            except Exception:  # stopping a broken client: nothing more to do
                pass


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__

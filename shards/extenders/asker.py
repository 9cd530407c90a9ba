"""Sending an engine's asks for the component that runs it (a shard, the coordinator).

The component calls :meth:`Asker.run` after each pass: the asks the pass made are sent
(:class:`~shards.extenders.client.ExtenderClient`) and their answers appended to the
component's partition as ``ExtenderAnswered`` inputs, for the next pass to read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from engine.extenders import ExtenderConfig
from engine.model.extenders import Ask
from engine.model.shard import ShardModel
from events.log import EventLog
from events.types import Envelope, PodSpec
from shards.extenders.client import ExtenderClient, ExtenderStats

logger = logging.getLogger(__name__)


class Asker:
    """Sends an engine's asks and appends the answers, for the component that runs the
    engine: at once (``background`` False: the simulator, whose loop must see the
    answers before time moves on) or in tasks of its own (the service: a slow or dead
    extender then delays only the pods that wait for it, never a pass)."""

    def __init__(self, *, background: bool = False) -> None:
        self.client = ExtenderClient()
        self.background = background
        self._tasks: set[asyncio.Task[int]] = set()

    def __repr__(self) -> str:
        return f"Asker(background={self.background}, in_flight={len(self._tasks)}, {self.client!r})"

    @property
    def stats(self) -> ExtenderStats:
        return self.client.stats

    async def run(
        self,
        engine: ShardModel,
        extenders: Iterable[ExtenderConfig],
        log_: EventLog,
        partition: int,
        producer: str,
    ) -> int:
        """Send the asks ``engine``'s passes made; the answers appended (0 when sent in
        the background: they come as inputs)."""
        asks = engine.extenders.take()
        if not asks:
            return 0
        specs = {a.pod: engine.pods[a.pod].spec for a in asks if a.pod in engine.pods}
        send = self._send(asks, tuple(extenders), specs, engine, log_, partition, producer)
        if not self.background:
            return await send
        task = asyncio.create_task(send)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return 0

    def _done(self, task: asyncio.Task[int]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("extender answers not recorded error=%s", task.exception())

    async def _send(
        self,
        asks: list[Ask],
        extenders: tuple[ExtenderConfig, ...],
        specs: dict[str, PodSpec],
        engine: ShardModel,
        log_: EventLog,
        partition: int,
        producer: str,
    ) -> int:
        answers = await self.client.answer(asks, extenders, specs, engine.state)
        if not answers:
            return 0
        await log_.append(
            [Envelope(event=a, time=engine.now, producer=producer) for a in answers], partition
        )
        return len(answers)

    async def close(self) -> None:
        """Cancel the calls in flight (their asks are sent again by a recovered worker)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

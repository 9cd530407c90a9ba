"""Fencing: a deposed leader's late appends never take effect.

A leader (ingest, coordinator, binder in ``shoal serve``) holds a Lease; each of its
terms has an **epoch** that is higher than every earlier term's of the same Lease (the
*fence*, named after the Lease). Everything the leader appends carries both
(``Envelope.fence``, ``Envelope.epoch``; :class:`FencedLog` stamps them), and the first
thing a term appends to each partition it writes is a ``TermBegan`` marker.

One rule, per partition: reading a partition in order, a record whose epoch is below
the highest already seen *in that partition* for its fence is of a deposed leader.

- **append side** (memory, file and log-server backends, :class:`FenceBook`; Kafka by
  a transactional producer per term, ``events.kafka``): such an append is refused
  whole with :class:`FencedError`, and nothing of it is stored; the writer learns at
  once that its term is over and stops leading. On Kafka the refusal is per term, not
  per partition: once a later term has begun in any partition of the topic, the
  broker refuses everything the earlier term's producer appends;
- **read side** (:class:`ReadFence`, and Kafka's readers): a record of an older term
  that a log holds all the same (Kafka with ``transactions=false``, for a broker
  without transactions; a log written before Kafka appends were fenced) is dropped by
  every reader: it sees a ``RecordFenced`` in its place (offsets stay as they were).
  The judgement is a function of the partition's order, so folds and replay agree.

A log that refuses on append never holds a record the read side would drop. The rule is
per partition, not per log, so that a partition copied on its own (``simulate --log``
copies a bus into a file partition by partition) keeps every record; since a new term
appends its ``TermBegan`` to every partition its role writes before anything else, a
deposed leader is fenced wherever it could still write.

Where the epoch comes from (``shards.kube.lease``): the Lease's ``leaseTransitions`` as
the term's holder wrote it, raised to at least one above the highest epoch the log has
seen for the fence (:func:`highest_epoch`), so that a Lease deleted and created again
does not restart the count below terms the log already holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import msgspec

from events.errors import ShoalError
from events.log import EventLog, read_rest
from events.types import Envelope, RecordFenced, TermBegan

log = logging.getLogger(__name__)


class FencedError(ShoalError):
    """An append of an older term: the log has seen a higher epoch for ``fence``. The
    writer is deposed; it must stop leading (a retry can never succeed)."""

    def __init__(self, fence: str, epoch: int, highest: int, why: str = "") -> None:
        self.fence = fence
        self.epoch = epoch
        self.highest = highest
        super().__init__(
            f"fenced: an append of {fence} epoch {epoch} refused: "
            + (why or f"the log has seen epoch {highest} (another leader took over)")
        )


def term_of(envelopes: Sequence[Envelope]) -> dict[str, int]:
    """The lowest epoch per fence among ``envelopes`` (those that carry one)."""
    terms: dict[str, int] = {}
    for env in envelopes:
        if env.epoch:
            low = terms.get(env.fence)
            if low is None or env.epoch < low:
                terms[env.fence] = env.epoch
    return terms


class FenceBook:
    """The highest epoch per partition and fence a log has stored: the append-side
    check."""

    def __init__(self) -> None:
        self.highest: dict[tuple[int, str], int] = {}

    def __repr__(self) -> str:
        return f"FenceBook({self.highest})"

    def check(self, envelopes: Sequence[Envelope], partition: int) -> dict[str, int]:
        """Raise :class:`FencedError` if any of ``envelopes`` is of an older term than
        ``partition`` holds; return the terms of the batch (for :meth:`record`, once it
        is stored)."""
        terms = term_of(envelopes)
        for fence, epoch in terms.items():
            self.check_term(partition, fence, epoch)
        return terms

    def check_term(self, partition: int, fence: str, epoch: int) -> None:
        highest = self.highest.get((partition, fence), 0)
        if epoch and epoch < highest:
            raise FencedError(fence, epoch, highest)

    def record(self, partition: int, terms: dict[str, int] | Sequence[Envelope]) -> None:
        """Remember what was stored (a batch's terms, or the records themselves)."""
        if not isinstance(terms, dict):
            terms = {e.fence: e.epoch for e in terms if e.epoch}
            # (the last per fence is the highest: epochs stored never fall)
        for fence, epoch in terms.items():
            if epoch > self.highest.get((partition, fence), 0):
                self.highest[(partition, fence)] = epoch

    def highest_of(self, fence: str) -> int:
        """The highest epoch stored for ``fence`` in any partition (0 for none)."""
        return max((e for (_, f), e in self.highest.items() if f == fence), default=0)


class ReadFence:
    """The read-side rule for one partition read in order from offset 0."""

    def __init__(self) -> None:
        self.highest: dict[str, int] = {}
        self.dropped = 0

    def admit(self, env: Envelope) -> Envelope:
        """``env``, or a ``RecordFenced`` in its place when an older term wrote it."""
        if not env.epoch:
            return env
        highest = self.highest.get(env.fence, 0)
        if env.epoch >= highest:
            self.highest[env.fence] = env.epoch
            return env
        self.dropped += 1
        return fenced(env, highest)


def fenced(env: Envelope, highest: int) -> Envelope:
    """What a reader sees in place of ``env``, which an older term appended: the same
    place and term, time 0 (it moves no clock), the kind it had."""
    return msgspec.structs.replace(
        env,
        event=RecordFenced(kind=type(env.event).__name__, highest=highest),
        time=0,
        causation=-1,
    )


async def highest_epoch(bus: EventLog, fence: str) -> int:
    """The highest epoch ``bus`` holds for ``fence`` (0 for none): the log's own count
    where it keeps one (``highest_epoch``), else a scan of every partition."""
    own = getattr(bus, "highest_epoch", None)
    if own is not None:
        return int(await own(fence))
    highest = 0
    for partition in range(bus.partitions):
        records, _, _ = await read_rest(bus, partition)
        for env in records:
            if env.fence == fence and env.epoch > highest:
                highest = env.epoch
    return highest


class FencedLog:
    """``bus`` as one leader term writes it: every appended envelope is stamped with
    ``fence`` and ``epoch``; reads pass through. ``valid`` says whether the term still
    holds (the elector's renew deadline): past it an append raises :class:`FencedError`
    before it is sent, so a process resumed after a freeze stops before the log has to
    refuse it. A backend whose writer itself is fenced per term has an ``append_term``
    (Kafka: a transactional producer of the term's own), which appends go through."""

    def __init__(
        self, bus: EventLog, *, fence: str, epoch: int, valid: Callable[[], bool] = lambda: True
    ) -> None:
        if epoch < 1:
            raise ValueError("a term's epoch is at least 1")
        self.bus = bus
        self.fence = fence
        self.epoch = epoch
        self.valid = valid

    def __repr__(self) -> str:
        return f"FencedLog({self.bus!r}, fence={self.fence!r}, epoch={self.epoch})"

    def __getattr__(self, name: str) -> object:
        # read_kinds, count_kinds, fetch...: the backend's own, unchanged
        return getattr(self.bus, name)

    @property
    def partitions(self) -> int:
        return self.bus.partitions

    async def begin(self, partitions: Sequence[int], holder: str, now: int) -> None:
        """Append the term's ``TermBegan`` to each of ``partitions``."""
        for partition in partitions:
            marker = Envelope(
                event=TermBegan(fence=self.fence, epoch=self.epoch, holder=holder),
                time=now,
                producer=self.fence,
            )
            await self.append([marker], partition)

    async def append(self, envelopes: Sequence[Envelope], partition: int = 0) -> list[int]:
        if not self.valid():
            raise FencedError(
                self.fence, self.epoch, self.epoch, "the term's renew deadline has passed"
            )
        replace = msgspec.structs.replace
        stamped = [replace(e, fence=self.fence, epoch=self.epoch) for e in envelopes]
        own = getattr(self.bus, "append_term", None)
        if own is not None:  # a backend whose writer is fenced by the term (Kafka)
            offsets = await own(stamped, partition, fence=self.fence, epoch=self.epoch)
            return list(offsets)
        return await self.bus.append(stamped, partition)

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Envelope]:
        return await self.bus.read(partition, offset, limit)

    async def end_offset(self, partition: int) -> int:
        return await self.bus.end_offset(partition)

    async def close(self) -> None:
        """The bus is the caller's: closing a term closes nothing."""

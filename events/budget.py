"""A bound on bytes held at once, shared by several tasks: the log server's memory bound.

A task reserves the bytes it is about to hold and releases them when done; a
reservation that does not fit waits, first come first served, until enough is
released. The log server reserves a frame's length before it reads the frame, so while
it waits it reads nothing from that client, and TCP's own flow control holds the client
back (back-pressure) instead of the server buffering more.
"""

from __future__ import annotations

import asyncio
from collections import deque


class ByteBudget:
    """At most ``limit`` bytes reserved at once, across every task that shares it.

    Invariant: ``0 <= held <= limit``, and ``peak`` is the most ``held`` has been. A
    task that never gets its bytes is one whose reservation is larger than ``limit``:
    :meth:`reserve` refuses those at once.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a byte budget needs a limit of at least one byte")
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.waits = 0
        """How many reservations had to wait (how often back-pressure was applied)."""
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def __repr__(self) -> str:
        return f"ByteBudget(held={self.held}, limit={self.limit}, waiting={len(self._waiting)})"

    async def reserve(self, size: int) -> None:
        """Hold ``size`` more bytes, waiting until they fit. First come, first served:
        a reservation never overtakes one that waits before it. ``ValueError`` for a
        size that could never fit. Cancelled while waiting, it holds nothing."""
        if not 0 <= size <= self.limit:
            raise ValueError(f"{size} bytes can never fit in a budget of {self.limit}")
        if not self._waiting and self.held + size <= self.limit:
            self._take(size)
            return
        self.waits += 1
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, granted)
        self._waiting.append(entry)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(size)  # granted just before the cancellation arrived
            elif entry in self._waiting:
                self._waiting.remove(entry)
                self._grant()  # the head may have changed
            raise

    def release(self, size: int) -> None:
        """Give back ``size`` bytes of an earlier reservation and wake who now fits."""
        if not 0 <= size <= self.held:
            raise ValueError(f"releasing {size} bytes of the {self.held} held")
        self.held -= size
        self._grant()

    def holding(self, size: int) -> _Holding:
        """Hold ``size`` bytes for the body of an ``async with`` (a plain object, not a
        generator: the log server enters two per request)."""
        return _Holding(self, size)

    def _take(self, size: int) -> None:
        self.held += size
        self.peak = max(self.peak, self.held)

    def _grant(self) -> None:
        while self._waiting and self.held + self._waiting[0][0] <= self.limit:
            size, granted = self._waiting.popleft()
            if not granted.done():  # not cancelled on its way out
                self._take(size)
                granted.set_result(None)


class _Holding:
    """``async with budget.holding(size)``: reserved on entry, released on exit."""

    __slots__ = ("budget", "size")

    def __init__(self, budget: ByteBudget, size: int) -> None:
        self.budget = budget
        self.size = size

    async def __aenter__(self) -> None:
        await self.budget.reserve(self.size)

    async def __aexit__(self, *exc: object) -> None:
        self.budget.release(self.size)

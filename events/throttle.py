"""Log lines that a flood cannot multiply: at most one line per kind per interval.

The log server says why it refused or closed each connection; a scan or a client in a
reconnect loop made that thousands of lines a minute, burying the rest. A
:class:`Throttled` logger writes the first line of a kind at once, counts those that
follow within ``every`` seconds, and says how many it left out in the next line it
writes (or in :meth:`Throttled.flush`, when the server stops). The counts that matter
stay exact in the server's ``stats()``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any


class Throttled:
    """Warnings on ``logger``, at most one per kind (the format string) every
    ``every`` seconds; ``clock`` is monotonic seconds (a test may pass its own)."""

    def __init__(
        self,
        logger: logging.Logger,
        every: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.every = every
        self.clock = clock
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"Throttled({self.logger.name}, every={self.every}s, left_out={self.stats()})"

    def stats(self) -> dict[str, int]:
        """Lines left out since the last one written, by kind."""
        return {kind: n for kind, n in self._left_out.items() if n}

    def warning(self, message: str, *args: Any) -> None:
        """``logger.warning(message, *args)``, unless a line of the same ``message``
        was written less than ``every`` seconds ago (then it is counted)."""
        now = self.clock()
        last = self._last.get(message)
        if last is not None and now - last < self.every:
            self._left_out[message] = self._left_out.get(message, 0) + 1
            return
        self._last[message] = now
        left_out = self._left_out.pop(message, 0)
        if left_out:
            self.logger.warning(message + " (and %d more like it left out)", *args, left_out)
        else:
            self.logger.warning(message, *args)

    def flush(self) -> None:
        """Say how many lines of each kind were left out since the last written."""
        for message, n in sorted(self._left_out.items()):
            if n:
                self.logger.warning("%d more like %r left out", n, message.split(" peer=")[0])
        self._left_out.clear()

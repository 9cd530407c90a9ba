"""Progress of long steps (reading a large scenario, simulating it), on stderr.

A step that ends within :data:`QUIET_SECONDS` prints nothing, so small inputs stay
quiet; a longer one prints a line then, and another at most every
:data:`EVERY_SECONDS` (on a terminal: one line rewritten in place, twice a second),
and its last state when it ends. Lines go to stderr only: ``--json`` keeps stdout one
JSON object, and shows progress too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Final, Protocol, TextIO

QUIET_SECONDS: Final = 2.0
EVERY_SECONDS: Final = 2.0
TERMINAL_EVERY_SECONDS: Final = 0.5


class Progress(Protocol):
    def __call__(self, step: str, done: int, total: int, detail: str = "") -> None:
        """``done`` of ``total`` units of ``step`` are through (``detail``: what they
        are). Cheap to call often: it prints only when a line is due."""


class ProgressLines:
    """A :class:`Progress` that prints lines on ``stream`` (stderr)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        quiet_seconds: float | None = None,
        every_seconds: float | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = self.stream.isatty()
        self.clock = clock
        self.quiet_seconds = QUIET_SECONDS if quiet_seconds is None else quiet_seconds
        if every_seconds is None:
            every_seconds = TERMINAL_EVERY_SECONDS if self.terminal else EVERY_SECONDS
        self.every_seconds = every_seconds
        self._step = ""
        self._started = 0.0
        self._last = 0.0
        self._shown = False
        self._open = False
        """A line rewritten in place awaits its newline (on a terminal)."""
        self.lines = 0

    def __repr__(self) -> str:
        return f"ProgressLines(step={self._step!r}, lines={self.lines})"

    def __call__(self, step: str, done: int, total: int, detail: str = "") -> None:
        now = self.clock()
        if step != self._step:
            self._close()
            self._step, self._started, self._shown = step, now, False
        finished = done >= total
        if not self._shown and now - self._started < self.quiet_seconds:
            return
        if self._shown and not finished and now - self._last < self.every_seconds:
            return
        self._last = now
        self._shown = True
        percent = f" ({100 * done // total}%)" if total > 0 else ""
        text = f"shoal: {step}: {done:,}/{total:,}{percent}{f' {detail}' if detail else ''}"
        if finished:
            text += f", done in {now - self._started:.1f}s"
        if self.terminal:
            self.stream.write(f"\r\x1b[K{text}")
            self._open = not finished
            if finished:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.lines += 1
        if finished:
            self._step = ""

    def _close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False

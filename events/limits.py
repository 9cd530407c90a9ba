"""What one log server may hold at once (:class:`ServerLimits`); what each bound
protects is described in :mod:`events.logserver`."""

from __future__ import annotations

from dataclasses import dataclass

from events.errors import InputError
from events.wire import MAX_FRAME


@dataclass(frozen=True, kw_only=True)
class ServerLimits:
    """What one log server may hold at once (see :mod:`events.logserver`)."""

    max_buffered: int = 128 << 20
    """Bytes of frames read or being answered, across all connections."""
    max_frame: int = 16 << 20
    """Bytes in one frame, either way; at most half of ``max_buffered``."""
    max_connections: int = 128
    """Authenticated clients served at once."""
    max_pending: int = 64
    """Connections kept while they have not said hello; the longest-waiting makes room."""
    stall_seconds: float = 60.0
    """How long a frame, once begun, may take to arrive, and an answer to be taken."""
    hello_seconds: float = 5.0
    """How long a new connection may take to send its hello."""
    log_every_seconds: float = 10.0
    """At most one log line per kind of refusal or closed connection this often."""
    max_wait_seconds: float = 60.0
    """The longest a read waits for an append (long polling)."""

    def __post_init__(self) -> None:
        for name in ("max_buffered", "max_frame", "max_connections", "max_pending"):
            if getattr(self, name) < 1:
                raise InputError("must be at least 1", location=f"--{name.replace('_', '-')}")
        if self.max_frame > min(self.max_buffered // 2, MAX_FRAME):
            raise InputError(
                "a frame may not be larger than half of --max-buffered (one client "
                f"stalled mid-frame must leave the rest to the others) nor {MAX_FRAME >> 20} MiB",
                location="--max-frame",
            )
        if not (self.stall_seconds > 0 and self.hello_seconds > 0 and self.max_wait_seconds > 0):
            raise ValueError("time-outs must be positive")
        if self.log_every_seconds < 0:
            raise ValueError("log_every_seconds must not be negative")

"""The project's error types.

``ShoalError`` is the one root: callers catch it to tell a shoal failure from a bug.
Subclasses name what a caller can act on. They live in ``events`` because it is the
lowest layer; every other package imports from here.
"""

from __future__ import annotations


class ShoalError(Exception):
    """Root of every error shoal raises on purpose."""


class InputError(ShoalError):
    """User input (a scenario, a configuration, a flag) is malformed.

    ``location`` names where: file, document and field, so the command line can print
    one clear line and exit with status 2.
    """

    def __init__(self, message: str, *, location: str = "") -> None:
        self.message = message
        self.location = location
        super().__init__(f"{location}: {message}" if location else message)


class LogError(ShoalError):
    """An event log cannot be opened, read or appended to."""


class NotALogError(LogError):
    """The file is not a shoal event log (wrong or missing header)."""


class LogInUseError(LogError):
    """Another writer holds the event log's lock (another process, or another open in
    this one): two writers would each append at their own idea of the end and lose
    each other's records. ``holder`` says who holds it ("pid 123 on host h")."""

    def __init__(self, message: str, *, holder: str) -> None:
        self.holder = holder
        super().__init__(message)


class LogCorruptedError(LogError):
    """A record inside the log fails its checksum or cannot be decoded.

    Never skipped: the offset and partition of the bad record are named.
    """

    def __init__(self, message: str, *, partition: int, offset: int, path: str = "") -> None:
        self.reason = message
        self.partition = partition
        self.offset = offset
        self.path = path
        where = f"{path}: " if path else ""
        super().__init__(f"{where}partition {partition}, offset {offset}: {message}")


class ReplayMismatchError(ShoalError):
    """Replay derived a decision that differs from the recorded one."""

    def __init__(self, message: str, *, offset: int) -> None:
        self.offset = offset
        super().__init__(f"offset {offset}: {message}")


class UnverifiableLogError(ReplayMismatchError):
    """The log was recorded under rules this version does not re-derive (an earlier
    coordinator protocol): it replays and reports, but its decisions cannot be checked."""

    def __init__(self, message: str) -> None:
        ShoalError.__init__(self, message)
        self.offset = 0


class StuckError(ShoalError):
    """A run stopped making progress (components kept exchanging records without the
    system settling): a bug in a protocol, reported instead of looping for ever."""


class RecordTooLargeError(ShoalError):
    """A record that alone is larger than the bus carries (the log server's frame, a
    Kafka batch, the file log's record limit). Permanent: sending the same bytes again
    is refused again, so it is deliberately not a :class:`LogError` (which the roles
    retry after a back-off) and a role that meets it stops, naming the limit and the
    setting that raises it. Raised before any record of the append is stored.

    Appends of many records are never refused for their total size: each bus splits
    them into chunks under its limit (see :mod:`events.log`)."""

    def __init__(self, message: str, *, size: int, limit: int, setting: str) -> None:
        self.size = size
        self.limit = limit
        self.setting = setting
        """What raises the limit (a flag, a URL parameter), or why nothing does."""
        super().__init__(
            f"{message}: a record of {size} bytes is over the limit of {limit} bytes ({setting})"
        )


class LogAuthError(LogError):
    """A log server refused the shared token (missing or wrong); the message says which,
    never the token."""


def cause(exc: BaseException) -> str:
    """What went wrong, in one line, for a log or an error message: the innermost
    exceptions of a group (a ``TaskGroup`` says only "unhandled errors in a TaskGroup"),
    and the type's name where the text is empty (a ``TimeoutError()``)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(cause(inner) for inner in exc.exceptions[:3]) + (
            f"; and {len(exc.exceptions) - 3} more" if len(exc.exceptions) > 3 else ""
        )
    text = str(exc).strip()
    return (
        f"{type(exc).__name__}: {text}"
        if text and not isinstance(exc, ShoalError)
        else (text or type(exc).__name__)
    )

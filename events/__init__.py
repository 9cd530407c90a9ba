"""Events: the types, codecs and logs that every other package builds on."""

from events.errors import (
    InputError,
    LogAuthError,
    LogCorruptedError,
    LogError,
    LogInUseError,
    NotALogError,
    ReplayMismatchError,
    ShoalError,
)
from events.filelog import FileLog
from events.log import EventLog
from events.memory import MemoryLog
from events.types import SECOND, Envelope, Event, is_decision

__all__ = [
    "SECOND",
    "Envelope",
    "Event",
    "EventLog",
    "FileLog",
    "InputError",
    "LogAuthError",
    "LogCorruptedError",
    "LogError",
    "LogInUseError",
    "MemoryLog",
    "NotALogError",
    "ReplayMismatchError",
    "ShoalError",
    "is_decision",
]

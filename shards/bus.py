"""Open an event log from a ``--bus`` URL: ``memory``, ``file:PATH``."""

from __future__ import annotations

from pathlib import Path

from events.errors import InputError
from events.filelog import FileLog
from events.log import EventLog
from events.memory import MemoryLog


def check_new_log(path: Path, *, overwrite: bool) -> None:
    """Refuse to replace an existing, non-empty log unless ``overwrite``."""
    if path.is_dir():
        raise InputError(f"{path} is a directory", location="--log")
    if path.exists() and path.stat().st_size > 0 and not overwrite:
        raise InputError(
            f"{path} already exists; shoal never rewrites a log (pass --overwrite to replace it)",
            location="--log",
        )


def open_bus(url: str, *, partitions: int = 1, overwrite: bool = False) -> EventLog:
    """The log named by ``url``; a new file log refuses to overwrite unless told to."""
    if url == "memory":
        return MemoryLog(partitions)
    if url.startswith("file:"):
        path = Path(url.removeprefix("file:"))
        if not url.removeprefix("file:"):
            raise InputError("file: needs a path", location="--bus")
        check_new_log(path, overwrite=overwrite)
        if path.exists():
            path.unlink()
        return FileLog(path, partitions=partitions)
    if url.startswith("kafka://"):
        raise InputError("the Kafka bus is not part of this build yet", location="--bus")
    raise InputError(
        f"unknown bus {url!r} (memory, file:PATH, kafka://HOST:PORT)", location="--bus"
    )

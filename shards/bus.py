"""Open an event log from a ``--bus`` URL: ``memory``, ``file:PATH``, ``kafka://HOST:PORT``,
``tcp://HOST:PORT`` (a log server)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from events.errors import InputError, LogAuthError, LogError
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


async def open_bus(
    url: str,
    *,
    partitions: int = 1,
    overwrite: bool = False,
    resume: bool = False,
    token_file: str | None = None,
) -> EventLog:
    """The log named by ``url``, ready to use. A file log that exists is continued when
    ``resume`` (a long-running service started again on its own log), replaced when
    ``overwrite``, and refused otherwise (a new run never writes over an old one); one
    another process writes is refused (``LogInUseError``, naming it) either way. A
    Kafka topic must exist (``shoal kafka init``). A log server (``tcp://``) gets the
    token in ``token_file`` (``--token-file``), else in the file
    ``$SHOAL_LOG_TOKEN_FILE`` names, else none; a refused token is an ``InputError``
    naming where the token came from; a server that cannot be reached, a ``LogError``."""
    if url == "memory":
        return MemoryLog(partitions)
    if url.startswith("file:"):
        path = Path(url.removeprefix("file:"))
        if not url.removeprefix("file:"):
            raise InputError("file: needs a path", location="--bus")
        if resume and not overwrite:
            if path.is_dir():
                raise InputError(f"{path} is a directory", location="--bus")
            return FileLog(path, partitions=partitions)
        check_new_log(path, overwrite=overwrite)
        # replaced under the writer's lock: a log another process writes stays whole
        return FileLog(path, partitions=partitions, replace=True)
    if url.startswith("kafka://"):
        from events.kafka import KafkaLog, KafkaSettings

        settings = KafkaSettings.from_url(url)
        if "partitions=" not in url:
            settings = dataclasses.replace(settings, partitions=partitions)
        if settings.partitions < partitions:
            raise InputError(
                f"needs at least {partitions} partitions, the URL says {settings.partitions}",
                location="--bus",
            )
        log = KafkaLog(settings)
        await log.start()
        return log
    if url.startswith("tcp://"):
        from events.remote import RemoteLog
        from events.wire import TOKEN_FILE_ENV, load_token

        token = load_token(token_file)
        try:
            remote = await RemoteLog.connect(url, token=token)
        except LogAuthError as exc:
            where = "--token-file" if token_file is not None else f"${TOKEN_FILE_ENV}"
            raise InputError(str(exc), location=where) from None
        except LogError as exc:
            raise LogError(f"cannot reach the log server at {url}: {exc}") from None
        if remote.partitions < partitions:
            await remote.close()
            raise InputError(
                f"needs at least {partitions} partitions, the server has {remote.partitions}",
                location="--bus",
            )
        return remote
    raise InputError(
        f"unknown bus {url!r} (memory, file:PATH, kafka://HOST:PORT, tcp://HOST:PORT)",
        location="--bus",
    )

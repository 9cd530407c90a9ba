"""One writer per file log: a second writable open, in another process or this one, is
refused naming the holder, before it touches the file; readers need no lock; the lock
goes with the process that held it.

Two writers used to open one file each at its own idea of the end: every append was
acknowledged, and the file kept only one writer's records."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from events.errors import LogError, LogInUseError
from events.filelog import FileLog, lock_path
from events.types import Envelope, PodDeleted

ROOT = Path(__file__).resolve().parents[2]
HOLDER = f"pid {os.getpid()} on host {socket.gethostname()}"


def _recs(*names: str) -> list[Envelope]:
    return [Envelope(event=PodDeleted(pod=f"ns/{name}")) for name in names]


async def _pods(path: Path) -> list[str]:
    log = FileLog(path, readonly=True)
    try:
        return [e.event.pod for e in await log.read(0, 0) if isinstance(e.event, PodDeleted)]
    finally:
        await log.close()


@pytest.mark.parametrize("existing", [False, True])
async def test_a_second_writer_in_the_same_process_is_refused_naming_the_holder(
    tmp_path: Path, existing: bool
) -> None:
    path = tmp_path / "one.events"
    if existing:
        log = FileLog(path)
        await log.append(_recs("before"))
        await log.close()
    first = FileLog(path)
    await first.append(_recs("a1"))
    for replace in (False, True):
        with pytest.raises(LogInUseError, match=HOLDER) as refused:
            FileLog(path, replace=replace)
        assert refused.value.holder == HOLDER
    await first.append(_recs("a2"))  # the refused opens changed nothing
    assert await _pods(path) == ["ns/before"] * existing + ["ns/a1", "ns/a2"]  # a reader
    await first.close()
    second = FileLog(path)  # once the first has closed, the next writer continues it
    assert await second.append(_recs("b1")) == [2 + existing]
    await second.close()
    assert await _pods(path) == ["ns/before"] * existing + ["ns/a1", "ns/a2", "ns/b1"]


async def test_a_writer_that_fails_to_open_gives_the_lock_back(tmp_path: Path) -> None:
    path = tmp_path / "bad.events"
    path.write_bytes(b"not a log at all")
    with pytest.raises(LogError, match="not a shoal event log"):
        FileLog(path)
    path.unlink()
    log = FileLog(path)  # not refused as "in use" by the failed open
    with pytest.raises(LogInUseError):  # and it holds the lock itself
        FileLog(path)
    await log.close()


async def test_the_lock_goes_with_a_process_that_dies(tmp_path: Path) -> None:
    path = tmp_path / "killed.events"
    code = (
        "import asyncio, sys\n"
        "from events.filelog import FileLog\n"
        "from events.types import Envelope, PodDeleted\n"
        "log = FileLog(sys.argv[1])\n"
        "asyncio.run(log.append([Envelope(event=PodDeleted(pod='ns/held'))]))\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == b"held\n"
            with pytest.raises(LogInUseError, match=f"pid {holder.pid} on host"):
                FileLog(path)
            assert await _pods(path) == ["ns/held"]  # read while it is held
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(60)
    assert lock_path(path).exists()
    log = FileLog(path)  # killed, not closed: its lock went with it
    assert await log.append(_recs("after")) == [1]
    await log.close()
    assert await _pods(path) == ["ns/held", "ns/after"]

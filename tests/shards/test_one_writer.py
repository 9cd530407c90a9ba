"""One writer per file log, on the command line: while another process writes a log,
``shoal serve --bus file:SAME`` exits 2 with one line naming it (its pid and host),
and ``shoal simulate --log SAME --overwrite`` neither replaces the log nor runs.

(The writer here is a small process holding the log open; a whole ``shoal serve``
takes the same lock through the same ``open_bus``, but starts too slowly for a test
of this size.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shards.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "examples" / "quickstart.yaml")
WRITER = """
import asyncio, sys
from events.filelog import FileLog
from events.types import Envelope, PodDeleted
log = FileLog(sys.argv[1])
asyncio.run(log.append([Envelope(event=PodDeleted(pod="ns/held"))]))
print("held", flush=True)
sys.stdin.read()
"""


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``shoal ARGV``; it must exit 2 with one line on stderr, returned."""
    with pytest.raises(SystemExit) as refused:
        main(list(argv))
    assert refused.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_second_writer_on_a_file_log_exits_2_naming_the_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.events"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(log)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    ) as writer:
        try:
            assert writer.stdout is not None
            assert writer.stdout.readline() == b"held\n"
            holder = f"pid {writer.pid} on host {socket.gethostname()}"
            before = log.read_bytes(), log.stat().st_ino
            serve = ["serve", "--bus", f"file:{log}", "--host", "http://127.0.0.1:9"]
            line = _fails(capsys, *serve, "--listen", "127.0.0.1:0")
            assert holder in line and str(log) in line, line
            simulate = ["simulate", QUICKSTART, "--log", str(log), "--overwrite", "--json"]
            line = _fails(capsys, *simulate)
            assert holder in line, line
            assert (log.read_bytes(), log.stat().st_ino) == before  # neither touched it
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait(60)

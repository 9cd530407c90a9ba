"""kube-scheduler as a process: the peer shoal is compared with (the differential test
of ``tests/kube/``, ``shoal loadtest kube --peer``).

Started with a ``KubeSchedulerConfiguration`` of one profile (``scheduler_name``: pods
naming another, shoal's included, are not its; ``profiles`` adds more, each with a
name of its own), no leader election, its secure port on
127.0.0.1 on a free port (its health is read there), and the feature gates Kubernetes'
own Workload and PodGroup need (``GenericWorkload``: its ``GangScheduling`` plugin then
runs in the default profile). Stopped by its PID, SIGTERM then SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Final, TextIO

FEATURE_GATES: Final = "GenericWorkload=true"
"""What v1.37's gang scheduling through the Workload API needs (beta, off by default)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KubeScheduler:
    """One kube-scheduler process against the API server of ``kubeconfig``."""

    def __init__(
        self,
        binary: Path,
        kubeconfig: str,
        run: Path,
        *,
        scheduler_name: str = "kube-scheduler",
        feature_gates: str = FEATURE_GATES,
        verbosity: int = 1,
        profiles: list[dict[str, object]] | None = None,
    ) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.run = run
        self.scheduler_name = scheduler_name
        self.feature_gates = feature_gates
        self.verbosity = verbosity
        self.profiles = list(profiles or [])
        """More profiles after the first, each naming its own ``schedulerName``."""
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log: TextIO | None = None

    def __repr__(self) -> str:
        pid = self.process.pid if self.process else None
        return f"KubeScheduler({self.scheduler_name!r}, pid={pid})"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.run / f"kube-scheduler-{self.scheduler_name}.log"

    def config(self) -> dict[str, object]:
        """Its ``KubeSchedulerConfiguration`` (JSON is YAML)."""
        return {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": self.kubeconfig, "qps": 5000, "burst": 5000},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": self.scheduler_name}, *self.profiles],
        }

    def start(self, timeout: float = 60.0) -> None:
        """Start it and wait until it answers healthy (raises, with its log's tail, if it
        exits or does not within ``timeout`` seconds)."""
        self.run.mkdir(parents=True, exist_ok=True)
        path = self.run / f"kube-scheduler-{self.scheduler_name}.yaml"
        path.write_text(json.dumps(self.config()))
        self.port = _free_port()
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [
                str(self.binary),
                f"--config={path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--feature-gates={self.feature_gates}",
                f"--cert-dir={self.run / 'kube-scheduler-certs'}",
                f"--v={self.verbosity}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text()[-2000:]
                raise RuntimeError(f"kube-scheduler did not start: {tail}")
            time.sleep(0.2)

    def healthy(self) -> bool:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # its own self-signed serving certificate
        try:
            url = f"https://127.0.0.1:{self.port}/healthz"
            with urllib.request.urlopen(url, context=context, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(3)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

"""``shoal loadtest kube --realkube BUILD``: shoal and kube-scheduler alternated, run by
run, each on a fresh etcd and kube-apiserver.

For each of ``--alternate`` rounds, kube-scheduler first, then shoal: the build's
``tools/realkube137/start.sh`` starts etcd and kube-apiserver on free ports in a run
folder of their own (shoal's CRDs applied, the Leases' namespace made), the scheduler is
started as a process (kube-scheduler from the build, with a profile ``kube-scheduler``
and the v1.37 settings of ``loadtest/kubescheduler.py``; ``shoal serve --role all --bus
memory`` with a profile ``shoal``, ``--shoal-shards`` shards), the SchedulingBasic shape of
``loadtest/kube.py`` is measured with the CPU of the scheduler, the API server and
etcd, and everything is stopped. Each run's result is the one ``loadtest kube`` reports,
with ``"peer"`` (which scheduler) and ``"round"``; a table of both follows.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import yaml

from events.errors import InputError
from loadtest.kube import Api, measure, target
from loadtest.kubescheduler import KubeScheduler

ROOT: Final = Path(__file__).resolve().parents[1]
START: Final = ROOT / "tools" / "realkube137" / "start.sh"
CRDS: Final = ROOT / "deploy" / "crds"
TOKEN: Final = "admin-token-0123456789"
PEERS: Final = ("kube-scheduler", "shoal")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check(args: argparse.Namespace) -> Path:
    """The build folder, refused (exit 2) when it cannot run here or with flags this
    mode decides itself."""
    build = Path(args.realkube).expanduser()
    for binary in ("kube-apiserver", "kube-scheduler", "etcd"):
        if not (build / "bin" / binary).is_file():
            raise InputError(
                f"no bin/{binary} in {build} (./dev kube build)", location="--realkube"
            )
    if not START.is_file():
        raise InputError(f"needs {START} (a checkout of shoal)", location="--realkube")
    for flag in ("alternate", "shoal_shards"):
        if getattr(args, flag) < 1:
            raise InputError("must be at least 1", location=f"--{flag.replace('_', '-')}")
    if args.proc:
        raise InputError("--realkube measures its own processes", location="--proc")
    if args.scheduler_name != "shoal":
        raise InputError("--realkube names the schedulers itself", location="--scheduler-name")
    return build


class Server:
    """etcd + kube-apiserver of one run (``start.sh``), its PIDs by name."""

    def __init__(self, build: Path, run: Path) -> None:
        self.build = build
        self.run = run
        self.env = {
            **os.environ,
            "RK": str(build),
            "API_PORT": str(_free_port()),
            "ETCD_PORT": str(_free_port()),
            "ETCD_PEER": str(_free_port()),
            "ETCD_METRICS": str(_free_port()),
        }
        self.kubeconfig = str(run / "admin.kubeconfig")

    def up(self) -> None:
        done = subprocess.run(
            ["bash", str(START), "up", str(self.run)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            self.down()
            raise RuntimeError(f"kube-apiserver did not start: {done.stderr[-2000:]}")
        for crd in sorted(CRDS.glob("*.yaml")):
            for doc in yaml.safe_load_all(crd.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    self.call(
                        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc
                    )
        self.call("POST", "/api/v1/namespaces", {"metadata": {"name": "shoal"}})

    def call(self, method: str, path: str, body: Any) -> None:
        url = (self.run / "url").read_text().strip()
        request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method=method)
        request.add_header("Authorization", f"Bearer {TOKEN}")
        request.add_header("Content-Type", "application/json")
        context = ssl.create_default_context(cafile=str(self.build / "pki" / "ca.crt"))
        with urllib.request.urlopen(request, context=context, timeout=30):
            pass

    def pids(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in (self.run / "pids").read_text().splitlines():
            name, _, pid = line.partition(" ")
            out[name] = int(pid)
        return out

    def down(self) -> None:
        subprocess.run(
            ["bash", str(START), "down", str(self.run)],
            env=self.env,
            capture_output=True,
            timeout=120,
            check=False,
        )


class Shoal:
    """``shoal serve --role all --bus memory`` as a process, with a profile ``shoal``."""

    def __init__(self, kubeconfig: str, run: Path, shards: int) -> None:
        self.kubeconfig = kubeconfig
        self.run = run
        self.shards = shards
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 180.0) -> None:
        config = self.run / "shoal-scheduler.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "profiles": [{"schedulerName": "shoal"}],
                }
            )
        )
        log = (self.run / "shoal.log").open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shards.cli",
                "serve",
                "--role",
                "all",
                "--bus",
                "memory",
                "--shards",
                str(self.shards),
                "--kubeconfig",
                self.kubeconfig,
                "--config",
                str(config),
                "--namespace",
                "shoal",
                "--identity",
                "shoal-0",
                "--listen",
                f"127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.run / "shoal.log").read_text()[-2000:]
                raise RuntimeError(f"shoal serve did not get ready: {tail}")
            time.sleep(0.5)

    def _ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


async def _one(
    args: argparse.Namespace, build: Path, peer: str, tag: str, progress: Callable[[str], None]
) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(prefix=f"shoal-kube-{tag}-"))
    server = Server(build, run)
    scheduler: KubeScheduler | Shoal
    if peer == "kube-scheduler":
        scheduler = KubeScheduler(
            build / "bin" / "kube-scheduler", server.kubeconfig, run, scheduler_name=peer
        )
    else:
        scheduler = Shoal(server.kubeconfig, run, args.shoal_shards)
    try:
        progress(f"{tag}: starting etcd and kube-apiserver")
        await asyncio.to_thread(server.up)
        progress(f"{tag}: starting {peer}")
        await asyncio.to_thread(scheduler.start)
        pids = server.pids()
        processes = {
            "scheduler": scheduler.pid,
            "apiserver": pids["apiserver"],
            "etcd": pids["etcd"],
        }
        measured = copy.copy(args)
        measured.kubeconfig, measured.api, measured.scheduler_name = server.kubeconfig, None, peer
        measured.tag = tag
        api = Api(await target(measured), args.creators + 8)
        try:
            result = await measure(
                api, measured, processes, lambda line: progress(f"{tag}: {line}")
            )
        finally:
            await api.close()
    finally:
        await asyncio.to_thread(scheduler.stop)
        await asyncio.to_thread(server.down)
    return {"peer": peer, "round": int(tag.rsplit("-", 1)[1]), **result}


async def alternate(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    """Every round, kube-scheduler then shoal, each on a fresh server."""
    build = check(args)
    runs: list[dict[str, Any]] = []
    for round_ in range(1, args.alternate + 1):
        for peer in PEERS:
            runs.append(await _one(args, build, peer, f"{peer}-{round_}", progress))
    return {"runs": runs}


def table(result: dict[str, Any]) -> str:
    """One line per run: bound pods/s, p50/p99 create→bound, CPU ms per bound pod."""
    lines = [
        "scheduler        round  bound  pods/s  p50 ms  p99 ms  "
        "CPU ms/pod: scheduler apiserver etcd"
    ]
    for run in result["runs"]:
        latency, cpu = run["latency_ms"], run["cpu_ms_per_bound_pod"]
        lines.append(
            f"{run['peer']:<16} {run['round']:>5}  {run['bound']:>5}  "
            f"{run['pods_per_second']:>6.1f}  {latency['p50'] or 0:>6.0f}  "
            f"{latency['p99'] or 0:>6.0f}  {cpu['scheduler']:>21.2f} "
            f"{cpu['apiserver']:>9.2f} {cpu['etcd']:>4.2f}"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    """``loadtest kube --realkube``: the table (or the JSON with ``--json``); exit 1 if a
    run left pods unbound or over-committed a node."""

    def progress(line: str) -> None:
        print(f"\r{line:<70}", end="", file=sys.stderr, flush=True)

    result = await alternate(args, progress)
    print(file=sys.stderr)
    print(json.dumps(result) if args.json else table(result))
    bad = [r for r in result["runs"] if not r["all_bound"] or r["overcommitted_nodes"]]
    return 1 if bad else 0

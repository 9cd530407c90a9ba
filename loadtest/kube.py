"""``shoal loadtest kube``: scheduler_perf's SchedulingBasic shape through a real API
server, for shoal or any scheduler named by ``--scheduler-name``.

The scheduler runs on its own (``shoal serve``, kube-scheduler...); this drives the
cluster: nodes (4 CPU, 32Gi, 110 pods, Ready, no kubelet: nothing runs), then
``--init-pods`` pods, waited for until bound, then ``--pods`` measured pods created by
``--creators`` concurrent clients, each 100m CPU / 500Mi, ``schedulerName`` as given.
A watch on the measured namespace sees each pod bound; every second the number bound in
that second is sampled (as scheduler_perf's throughput collector samples, from the
first create until the last is bound); per pod, the latency from just before its create
request to the watch event that shows it bound. ``--proc NAME=PID`` (repeatable) adds
each process's CPU seconds over the measured phase (from ``/proc``); the whole machine's
busy cores while the pods are being created and after (``/proc/stat``) show whether the
machine itself was the limit, and the bound pods/s of both phases show where a scheduler
is held back. At the end no node
may hold more than it has (CPU, memory, pods): the over-commit check.

Every call is bounded: a create is retried on 429/5xx and connection errors at most
``RETRIES`` times with back-off; binding is waited for at most ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson

from events.errors import InputError

RETRIES: Final = 20
CPU_MILLI: Final = 4000
MEMORY_MI: Final = 32 * 1024
PODS_PER_NODE: Final = 110
POD_CPU_MILLI: Final = 100
POD_MEMORY_MI: Final = 500
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--api", help="API server URL (with --token)")
    where.add_argument("--kubeconfig", help="a kubeconfig file")
    where.add_argument(
        "--realkube",
        metavar="BUILD",
        help="a build of Kubernetes v1.37 (./dev kube build: ~/.cache/shoal/realkube-v1.37.2): "
        "alternate kube-scheduler and shoal run by run, each on a fresh etcd and API server "
        "(loadtest/kubepeer.py)",
    )
    parser.add_argument("--token", default="", help="bearer token for --api")
    parser.add_argument(
        "--insecure", action="store_true", help="with --api https: do not verify its certificate"
    )
    parser.add_argument("--scheduler-name", default="shoal", help="schedulerName of the pods")
    parser.add_argument("--nodes", type=int, default=5000, help="nodes to create (5000)")
    parser.add_argument("--init-pods", type=int, default=1000, help="pods placed first (1000)")
    parser.add_argument("--pods", type=int, default=10000, help="measured pods (10000)")
    parser.add_argument("--creators", type=int, default=30, help="concurrent creators (30)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait (900)")
    parser.add_argument("--tag", default="0", help="namespace suffix of this run")
    parser.add_argument(
        "--alternate",
        type=int,
        default=2,
        metavar="ROUNDS",
        help="with --realkube: rounds of kube-scheduler then shoal (2)",
    )
    parser.add_argument(
        "--shoal-shards", type=int, default=1, help="with --realkube: shoal's shards (1)"
    )
    parser.add_argument(
        "--proc",
        action="append",
        default=[],
        metavar="NAME=PID",
        help="a process whose CPU to report",
    )


@dataclass(frozen=True)
class Target:
    server: str
    headers: dict[str, str]
    ssl: ssl.SSLContext | bool


async def target(args: argparse.Namespace) -> Target:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if args.api:
        if not args.api.startswith(("http://", "https://")):
            raise InputError(f"must be an http(s) URL, got {args.api!r}", location="--api")
        if args.token:
            headers["Authorization"] = f"Bearer {args.token}"
        context: ssl.SSLContext | bool = True
        if args.api.startswith("https://") and args.insecure:
            context = False
        return Target(args.api.rstrip("/"), headers, context)
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        await config.load_kube_config(
            config_file=args.kubeconfig, client_configuration=configuration
        )
    except (OSError, ValueError, config.ConfigException) as exc:
        raise InputError(f"cannot load it: {exc}", location="--kubeconfig") from None
    auth = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken")
    if auth:
        headers["Authorization"] = auth if auth.startswith("Bearer ") else f"Bearer {auth}"
    host = str(configuration.host or "")
    if not host:
        raise InputError("names no server", location="--kubeconfig")
    context = True
    if host.startswith("https://"):
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file and configuration.key_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return Target(host.rstrip("/"), headers, context)


def node_body(name: str) -> dict[str, Any]:
    resources = {"cpu": "4", "memory": "32Gi", "pods": str(PODS_PER_NODE)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def pod_body(name: str, namespace: str, scheduler: str) -> dict[str, Any]:
    requests = {"cpu": f"{POD_CPU_MILLI}m", "memory": f"{POD_MEMORY_MI}Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "pause",
                    "image": "pause",
                    "resources": {"requests": requests, "limits": requests},
                }
            ],
        },
    }


class Api:
    def __init__(self, where: Target, connections: int) -> None:
        self.server = where.server
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, ssl=where.ssl),
            headers=where.headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )

    async def close(self) -> None:
        await self.session.close()

    async def post(self, path: str, body: dict[str, Any]) -> None:
        """Create; 409 (it exists) is fine. 429/5xx and connection errors are tried
        again, at most ``RETRIES`` times."""
        data = orjson.dumps(body)
        delay = 0.05
        for _ in range(RETRIES):
            try:
                async with self.session.post(self.server + path, data=data) as response:
                    text = await response.read()
                    if response.status in (200, 201, 202, 409):
                        return
                    if response.status not in (429, 500, 502, 503, 504):
                        raise RuntimeError(f"POST {path}: {response.status} {text[:300]!r}")
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise RuntimeError(f"POST {path}: no success in {RETRIES} tries")

    async def get(self, path: str) -> Any:
        async with self.session.get(self.server + path) as response:
            data = await response.read()
            if response.status != 200:
                raise RuntimeError(f"GET {path}: {response.status} {data[:300]!r}")
            return orjson.loads(data)


async def in_parallel(count: int, workers: int, make: Callable[[int], Awaitable[None]]) -> None:
    numbers = iter(range(count))

    async def worker() -> None:
        for i in numbers:
            await make(i)

    await asyncio.gather(*(worker() for _ in range(max(1, workers))))


@dataclass
class Watcher:
    """Pods of one namespace: when each was first seen bound, and where."""

    api: Api
    namespace: str
    bound_at: dict[str, float] = field(default_factory=dict)
    node_of: dict[str, str] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    version: str = ""

    async def start(self) -> None:
        listed = await self.api.get(f"/api/v1/namespaces/{self.namespace}/pods")
        for pod in listed.get("items") or []:
            self._see(pod)
        self.version = str((listed.get("metadata") or {}).get("resourceVersion", ""))
        self.task = asyncio.create_task(self._watch())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def _see(self, pod: dict[str, Any]) -> None:
        name = (pod.get("metadata") or {}).get("name", "")
        node = (pod.get("spec") or {}).get("nodeName")
        if node and name not in self.node_of:
            self.bound_at[name] = time.monotonic()
            self.node_of[name] = node

    async def _watch(self) -> None:
        while True:
            url = (
                f"{self.api.server}/api/v1/namespaces/{self.namespace}/pods?watch=1"
                f"&resourceVersion={self.version}&allowWatchBookmarks=true&timeoutSeconds=600"
            )
            async with self.api.session.get(url) as response:
                if response.status == 410:
                    await self.start_over()
                    return
                if response.status != 200:
                    raise RuntimeError(f"watch: {response.status} {await response.text()}")
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        await self.start_over()
                        return
                    self.version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._see(obj)

    async def start_over(self) -> None:
        """Relist (the watch's version expired): what is bound now is seen now."""
        await self.start()


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from ``/proc/stat``."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]] + [0] * 8
    # user, nice, system, irq, softirq, steal: each only grows (iowait can go back)
    busy = sum(fields[i] for i in (0, 1, 2, 5, 6, 7))
    return busy / CLK_TCK, (busy + fields[3] + fields[4]) / CLK_TCK


def busy_cores(before: tuple[float, float], after: tuple[float, float]) -> float:
    """How many of the machine's cores were busy, on average, between two readings."""
    busy, total = after[0] - before[0], after[1] - before[1]
    cores = os.cpu_count() or 1
    return min(max(cores * busy / total, 0.0), float(cores)) if total > 0 else 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


async def wait_bound(watcher: Watcher, names: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(n in watcher.bound_at for n in names):
            return True
        await asyncio.sleep(0.05)
    return False


def _processes(specs: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for spec in specs:
        name, _, pid = spec.partition("=")
        if not name or not pid.isdigit() or not os.path.exists(f"/proc/{pid}/stat"):
            raise InputError(
                f"expected NAME=PID of a running process, got {spec!r}", location="--proc"
            )
        out[name] = int(pid)
    return out


async def run_kube(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    for flag in ("nodes", "init_pods", "pods", "creators"):
        if getattr(args, flag) < 0 or (flag in ("pods", "creators") and getattr(args, flag) < 1):
            raise InputError("must be a positive number", location=f"--{flag.replace('_', '-')}")
    processes = _processes(args.proc)
    api = Api(await target(args), args.creators + 8)
    try:
        return await measure(api, args, processes, progress)
    finally:
        await api.close()


async def measure(
    api: Api, args: argparse.Namespace, processes: dict[str, int], progress: Callable[[str], None]
) -> dict[str, Any]:
    scheduler = args.scheduler_name
    init_ns, measured_ns = f"init-{args.tag}", f"measured-{args.tag}"
    started = time.monotonic()
    await in_parallel(
        args.nodes, args.creators, lambda i: api.post("/api/v1/nodes", node_body(f"node-{i:05d}"))
    )
    for namespace in (init_ns, measured_ns):
        await api.post(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
    progress(f"{args.nodes} nodes in {time.monotonic() - started:.1f} s")
    result: dict[str, Any] = {
        "shape": {
            "workload": "SchedulingBasic",
            "nodes": args.nodes,
            "init_pods": args.init_pods,
            "pods": args.pods,
            "creators": args.creators,
            "scheduler": scheduler,
        }
    }
    init = Watcher(api, init_ns)
    await init.start()
    init_names = [f"init-{i:05d}" for i in range(args.init_pods)]
    await in_parallel(
        args.init_pods,
        args.creators,
        lambda i: api.post(
            f"/api/v1/namespaces/{init_ns}/pods", pod_body(init_names[i], init_ns, scheduler)
        ),
    )
    if not await wait_bound(init, init_names, args.timeout):
        init.stop()
        raise RuntimeError(
            f"init pods not all bound in {args.timeout:g} s: {len(init.bound_at)}/{args.init_pods}"
        )
    progress(f"{args.init_pods} init pods bound")
    measured = Watcher(api, measured_ns)
    await measured.start()
    names = [f"pod-{i:05d}" for i in range(args.pods)]
    created_at: dict[str, float] = {}
    samples: list[int] = []
    cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    machine_start = machine_busy()
    start = time.monotonic()

    async def sample() -> None:
        last, due = 0, start + 1
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            due += 1
            count = len(measured.bound_at)
            samples.append(count - last)
            last = count
            progress(f"{count}/{args.pods} bound")

    sampler = asyncio.create_task(sample())

    async def create(i: int) -> None:
        created_at[names[i]] = time.monotonic()
        await api.post(
            f"/api/v1/namespaces/{measured_ns}/pods", pod_body(names[i], measured_ns, scheduler)
        )

    await in_parallel(args.pods, args.creators, create)
    created = time.monotonic()
    machine_created = machine_busy()
    bound_while_creating = sum(1 for t in measured.bound_at.values() if t <= created)
    complete = await wait_bound(measured, names, args.timeout)
    end = max(measured.bound_at.values(), default=time.monotonic())
    sampler.cancel()
    cpu_after = {name: cpu_seconds(pid) for name, pid in processes.items()}
    machine_end = machine_busy()
    measured.stop()
    init.stop()
    whole = int(end - start)
    samples = samples[:whole] if whole else samples
    latencies = [measured.bound_at[n] - created_at[n] for n in names if n in measured.bound_at]
    wall = max(end - start, 1e-9)
    bound = len(measured.bound_at)
    per_node: dict[str, int] = {}
    for node in [*measured.node_of.values(), *init.node_of.values()]:
        per_node[node] = per_node.get(node, 0) + 1
    result.update(
        {
            "all_bound": complete,
            "bound": bound,
            "pods_per_second": bound / wall,
            "create_seconds": created - start,
            "bound_while_creating": bound_while_creating,
            "pods_per_second_while_creating": bound_while_creating / max(created - start, 1e-9),
            "pods_per_second_after_creating": (bound - bound_while_creating)
            / max(end - created, 1e-9),
            "machine": {
                "cores": os.cpu_count() or 1,
                "busy_cores_while_creating": busy_cores(machine_start, machine_created),
                "busy_cores_after_creating": busy_cores(machine_created, machine_end),
            },
            "wall_seconds": wall,
            "throughput": {
                "average": statistics.mean(samples) if samples else 0.0,
                "p50": percentile([float(s) for s in samples], 50) if samples else 0.0,
                "p90": percentile([float(s) for s in samples], 90) if samples else 0.0,
                "p99": percentile([float(s) for s in samples], 99) if samples else 0.0,
                "samples": samples,
            },
            "latency_ms": {
                f"p{q}": percentile(latencies, q) * 1000 if latencies else None
                for q in (50, 90, 99)
            },
            "cpu_seconds": {n: cpu_after[n] - cpu_before[n] for n in processes},
            "cpu_ms_per_bound_pod": {
                n: 1000 * (cpu_after[n] - cpu_before[n]) / max(bound, 1) for n in processes
            },
            "nodes_used": len(per_node),
            "overcommitted_nodes": sum(
                1
                for count in per_node.values()
                if count * POD_CPU_MILLI > CPU_MILLI
                or count * POD_MEMORY_MI > MEMORY_MI
                or count > PODS_PER_NODE
            ),
        }
    )
    return result


async def run(args: argparse.Namespace) -> int:
    """The ``loadtest kube`` command: the result as JSON with ``--json``, else a line."""

    def progress(line: str) -> None:
        print(f"\r{line:<60}", end="", file=sys.stderr, flush=True)

    result = await run_kube(args, progress)
    print(file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps(result))
    else:
        latency = result["latency_ms"]
        print(
            f"{result['bound']}/{args.pods} bound at {result['pods_per_second']:.1f} pods/s "
            f"(p50 {latency['p50']:.0f} ms, p99 {latency['p99']:.0f} ms create→bound; "
            f"{result['pods_per_second_while_creating']:.0f}/s while creating with "
            f"{result['machine']['busy_cores_while_creating']:.1f} of "
            f"{result['machine']['cores']} cores busy, "
            f"{result['pods_per_second_after_creating']:.0f}/s after); "
            f"{result['overcommitted_nodes']} over-committed nodes"
        )
    return 0 if result["all_bound"] and not result["overcommitted_nodes"] else 1

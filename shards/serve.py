"""``shoal serve``: shoal as a service against a real cluster.

Roles, one or all per process:

- ``ingest`` — watches the cluster (``shards.kube.ingest``) while it holds the
  ``shoal-ingest`` Lease; a standby waits its turn;
- ``shard`` — folds the log and schedules (one shard today: ``--shard-id``, by default
  the StatefulSet ordinal at the end of the host name); appends a ``ClockTicked`` when
  a back-off expires, so replay sees time pass exactly as the shard did;
- ``binder`` — applies decisions through the Binding and Eviction APIs
  (``shards.kube.binder``) while it holds the ``shoal-binder`` Lease;
- ``all`` — the three in one process (the only way with ``--bus memory``).

Each process serves ``/healthz`` (alive), ``/readyz`` (its roles are serving: the bus
answered recently, ingest has listed everything) and ``/metrics`` (Prometheus) on
``--listen``, 127.0.0.1:9090 by default. SIGTERM or SIGINT stops it cleanly: in-flight
work finishes, the bus is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from engine.config import SchedulerConfig, default_config
from engine.scheduler import Engine
from events.errors import InputError, LogError
from events.log import EventLog
from events.types import ClockTicked, Envelope, SchedulerConfigured
from shards.bus import open_bus
from shards.kube.binder import KubeBinder
from shards.kube.client import api_client
from shards.kube.ingest import KubeIngest
from shards.kube.lease import LeaderElector
from shards.metrics import Metrics
from shards.worker import ShardWorker

log = logging.getLogger(__name__)
ROLES = ("ingest", "shard", "binder", "all")


@dataclass
class ServeOptions:
    role: str = "all"
    bus: str = "memory"
    kubeconfig: str | None = None
    host: str | None = None
    token: str | None = None
    shard_id: int | None = None
    config: SchedulerConfig | None = None
    listen: str = "127.0.0.1:9090"
    namespace: str = "shoal"
    identity: str = field(default_factory=socket.gethostname)
    poll_interval: float = 0.05
    watch_seconds: int = 30
    lease_seconds: int = 15
    stale_after: float = 10.0
    """Seconds without a successful bus operation after which /readyz says 503."""

    def validate(self) -> None:
        if self.role not in ROLES:
            raise InputError(
                f"unknown role {self.role!r} (one of {', '.join(ROLES)})", location="--role"
            )
        if self.bus == "memory" and self.role != "all":
            raise InputError("--bus memory works only with --role all", location="--bus")
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise InputError(f"expected HOST:PORT, got {self.listen!r}", location="--listen")


def shard_ordinal(hostname: str) -> int:
    """The StatefulSet ordinal at the end of a pod's host name (``shoal-shard-2`` → 2)."""
    match = re.search(r"-(\d+)$", hostname)
    return int(match.group(1)) if match else 0


class Service:
    """The running roles of one process, their health and metrics."""

    def __init__(self, options: ServeOptions, clock: Callable[[], int] = time.time_ns) -> None:
        self.options = options
        self.clock = clock
        self.metrics = Metrics()
        self.stop = asyncio.Event()
        self.bus: EventLog | None = None
        self.last_poll = 0.0
        self.ingest: KubeIngest | None = None
        self.worker: ShardWorker | None = None
        self.binder: KubeBinder | None = None
        self.leaders: dict[str, LeaderElector] = {}
        self.lag = 0
        self.lag_end = 0
        self.url = ""

    def __repr__(self) -> str:
        return f"Service(role={self.options.role}, bus={self.options.bus!r})"

    def ready(self) -> tuple[bool, str]:
        if self.bus is None:
            return False, "the bus is not open"
        if time.monotonic() - self.last_poll > self.options.stale_after:
            return False, f"the bus has not answered for {self.options.stale_after:g}s"
        leading = self.ingest is not None and self.leaders["ingest"].leader
        if leading and not all(r.synced.is_set() for r in self.ingest.reflectors):  # type: ignore[union-attr]
            return False, "ingest is still listing the cluster"
        return True, "ok"

    # ------------------------------------------------------------------ http

    async def _http(self) -> web.AppRunner:
        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        async def readyz(_: web.Request) -> web.Response:
            ok, why = self.ready()
            return web.Response(text=why + "\n", status=200 if ok else 503)

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(
                text=self.metrics.render(), content_type="text/plain", charset="utf-8"
            )

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        host, _, port = self.options.listen.rpartition(":")
        site = web.TCPSite(runner, host, int(port))
        await site.start()
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        self.url = f"http://{bound[0]}:{bound[1]}"
        return runner

    # ------------------------------------------------------------------ roles

    async def run(self) -> None:
        options = self.options
        runner = await self._http()
        self.bus = await open_bus(options.bus)
        self.last_poll = time.monotonic()
        try:
            async with asyncio.TaskGroup() as tasks:
                roles = ("ingest", "shard", "binder") if options.role == "all" else (options.role,)
                api = None
                if "ingest" in roles or "binder" in roles:
                    api = await api_client(
                        host=options.host, kubeconfig=options.kubeconfig, token=options.token
                    )
                if "shard" in roles:
                    tasks.create_task(self._shard())
                for role in ("ingest", "binder"):
                    if role in roles and api is not None:
                        self.leaders[role] = LeaderElector(
                            api,
                            namespace=options.namespace,
                            name=f"shoal-{role}",
                            identity=options.identity,
                            lease_seconds=options.lease_seconds,
                        )
                        tasks.create_task(
                            self.leaders[role].run(self.stop, renew_every=options.lease_seconds / 3)
                        )
                        tasks.create_task(self._led(role, api))
                tasks.create_task(self._lag())
                await self.stop.wait()
            if api is not None:
                await api.close()
        finally:
            await self.bus.close()
            await runner.cleanup()

    async def _led(self, role: str, api: ApiClient) -> None:
        """Run ``role`` while this process leads it; stand by otherwise."""
        elector = self.leaders[role]
        while not self.stop.is_set():
            if not elector.leader:
                await self._sleep(self.options.poll_interval * 4)
                continue
            lost = asyncio.Event()
            assert self.bus is not None
            if role == "ingest":
                self.ingest = KubeIngest(
                    api,
                    self.bus,
                    scheduler_names=self._served(),
                    watch_seconds=self.options.watch_seconds,
                    clock=self.clock,
                )
                work = asyncio.create_task(self.ingest.run(lost))
            else:
                self.binder = KubeBinder(api, self.bus, clock=self.clock)
                work = asyncio.create_task(self._bind(lost))
            while elector.leader and not self.stop.is_set() and not work.done():
                await self._sleep(self.options.poll_interval * 4)
            lost.set()
            try:
                await asyncio.wait_for(work, 10)
            except Exception as exc:
                log.warning("role failed; restarting it role=%s error=%s", role, exc)
                self.metrics.inc(
                    "bus_errors_total", "Bus operations that failed.", 1, {"role": role}
                )
                await self._sleep(1.0)

    def _served(self) -> list[str]:
        config = self.options.config or default_config()
        return [p.scheduler_name for p in config.profiles]

    async def _bind(self, lost: asyncio.Event) -> None:
        binder = self.binder
        assert binder is not None
        backoff = self.options.poll_interval
        while not lost.is_set():
            before = dict(binder.counters)
            try:
                applied = await binder.poll()
            except LogError as exc:
                backoff = await self._bus_failed("binder", exc, backoff)
                continue
            backoff = self.options.poll_interval
            self.last_poll = time.monotonic()
            for key, value in binder.counters.items():
                if value > before[key]:
                    self.metrics.inc(
                        "binder_actions_total",
                        "Binder actions by kind.",
                        value - before[key],
                        {"kind": key},
                    )
            if applied == 0 and binder.position >= self.lag_end:
                await self._sleep(self.options.poll_interval)

    async def _shard(self) -> None:
        options = self.options
        shard = (
            options.shard_id if options.shard_id is not None else shard_ordinal(options.identity)
        )
        config = options.config or default_config()
        engine = Engine(config, shard=shard)
        assert self.bus is not None
        source = config.source
        await self.bus.append(
            [
                Envelope(
                    event=SchedulerConfigured(
                        config=json.dumps(source, sort_keys=True, default=str) if source else ""
                    ),
                    time=self.clock(),
                    producer=f"shard-{shard}",
                )
            ]
        )
        self.worker = worker = ShardWorker(engine, self.bus)
        self.metrics.gauge(
            "queue_pods", "Pods in the scheduling queue.", lambda: self._queue("all")
        )
        for where in ("active", "backoff", "unschedulable"):
            self.metrics.gauge(
                "queue_depth",
                "Pods in the scheduling queue by sub-queue.",
                _depth(self, where),
                {"queue": where},
            )
        self.metrics.gauge(
            "consumer_lag_records", "Records in the log not yet folded.", lambda: self.lag
        )
        backoff = options.poll_interval
        while not self.stop.is_set():
            before = engine.stats()
            started = time.perf_counter()
            try:
                decided = await worker.poll()
            except LogError as exc:
                # Decisions may have been applied but not recorded: rebuild the engine
                # from the log (a pure fold), as a restarted shard would.
                backoff = await self._bus_failed("shard", exc, backoff)
                try:
                    self.worker = worker = await ShardWorker.recover(self.bus, config, shard=shard)
                except LogError as again:
                    backoff = await self._bus_failed("shard", again, backoff)
                    continue
                engine = worker.engine
                continue
            backoff = options.poll_interval
            self.last_poll = time.monotonic()
            after = engine.stats()
            attempts = after["attempts"] - before["attempts"]
            if attempts:
                self.metrics.observe(
                    "scheduling_attempt_seconds",
                    "Mean time of a scheduling attempt, per pass.",
                    (time.perf_counter() - started) / attempts,
                )
                for result in ("bound", "unschedulable", "preempted"):
                    if after[result] > before[result]:
                        self.metrics.inc(
                            "schedule_attempts_total",
                            "Scheduling attempts by result.",
                            after[result] - before[result],
                            {"result": result},
                        )
            wake = engine.next_wakeup()
            now = self.clock()
            if wake is not None and wake <= now:
                await self.bus.append(
                    [Envelope(event=ClockTicked(), time=now, producer=f"clock-{shard}")]
                )
                continue
            if decided == 0:
                await self._sleep(options.poll_interval)

    def _queue(self, where: str) -> float:
        """Pods in the (current) shard's queue: all, or one sub-queue."""
        if self.worker is None:
            return 0
        queue = self.worker.engine.queue
        return len(queue) if where == "all" else queue.stats()[where]

    async def _lag(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                assert self.bus is not None
                end = await self.bus.end_offset(0)
                self.lag_end = end
                position = self.worker.position if self.worker else end
                self.lag = max(end - position, 0)
            await self._sleep(1.0)

    async def _bus_failed(self, role: str, exc: Exception, backoff: float) -> float:
        """Count and log a bus failure, wait, and return the next back-off."""
        log.warning("bus failed; retrying role=%s in=%.2fs error=%s", role, backoff, exc)
        self.metrics.inc("bus_errors_total", "Bus operations that failed.", 1, {"role": role})
        await self._sleep(backoff)
        return min(backoff * 2, 5.0)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)


def _depth(service: Service, where: str) -> Callable[[], float]:
    return lambda: service._queue(where)


async def serve(options: ServeOptions, *, ready: Callable[[Service], None] | None = None) -> int:
    """Run until SIGTERM/SIGINT (or ``service.stop``); 0 on a clean stop."""
    options.validate()
    service = Service(options)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, service.stop.set)
    task = asyncio.create_task(service.run())
    while not service.url and not task.done():
        await asyncio.sleep(0.01)
    if ready is not None and service.url:
        ready(service)
    log.info(
        "serving role=%s bus=%s listen=%s pid=%d",
        options.role,
        options.bus,
        service.url,
        os.getpid(),
    )
    await task
    return 0

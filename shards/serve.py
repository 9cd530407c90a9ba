"""``shoal serve``: shoal as a service against a real cluster.

Roles, one or all per process:

- ``ingest`` — watches the cluster (``shards.kube.ingest``) while it holds the
  ``shoal-ingest`` Lease; a standby waits its turn. With several shards it writes the
  sharding configuration (``--shards``, ``--sharding``) and the scheduler configuration
  into the control partition before anything else, and refuses to run against a log
  that was set up for a different sharding;
- ``shard`` — folds its partition and schedules (``--shard-id``, by default the
  StatefulSet ordinal at the end of the host name); it rebuilds its state from the log
  when it starts. It appends a ``ClockTicked`` when a back-off or reservation time-out
  comes due, so replay sees time pass exactly as the shard did;
- ``coordinator`` — with several shards: the router and cross-shard gang coordinator
  (``shards.control``) while it holds the ``shoal-coordinator`` Lease. A new leader
  folds the control partition and appends only what its predecessor had not;
- ``binder`` — applies the decisions of every shard through the Binding and Eviction
  APIs (``shards.kube.binder``) while it holds the ``shoal-binder`` Lease;
- ``all`` — everything in one process, every shard included (the only way with
  ``--bus memory``).

The leader-elected roles (ingest, coordinator, binder) follow client-go's leader
election (``shards.kube.lease``: ``--lease-seconds``, ``--renew-deadline``,
``--retry-period``). Each term of a role writes through a
:class:`~events.fence.FencedLog` with the term's epoch, after a ``TermBegan`` in each
partition the role writes: once another replica's term has begun, the log refuses what
this one appends late (on Kafka, the broker: each term writes through a transactional
producer of its own), and the role stops at once (``deposed``, one warning). A leader
past its renew deadline (a process frozen and resumed, a hung API server) stops its
work at once, in-flight requests included.

With ``--shards N`` (N > 1) the log has N + 1 partitions: one per shard and the control
partition last, as with ``shoal simulate --shards N``; every process of a deployment
must be given the same N.

Each process serves ``/healthz``, ``/readyz``, ``/metrics`` (Prometheus,
``shards.metrics``), the live view (``/ui/``, ``shards.web``) and, where it holds the
whole cluster's view, dry runs of jobs (``POST /api/whatif``, ``shards.web.whatif``) on
``--listen``,
127.0.0.1:9090 by default. SIGTERM or SIGINT stops
it cleanly: in-flight work finishes, the bus is closed.

- ``/readyz`` says whether the process can do its work now: the bus answered recently;
  where it runs ingest, the coordinator or the binder, the API server answered its
  Lease loops within ``--lease-seconds`` and none of them is failing (unreachable, the
  Lease's namespace missing, forbidden...: ``shards.kube.apihealth``; a standby whose
  Lease another process holds is ready); ingest, once leading, has listed everything.
  503 with the reason otherwise. Each kind of failure is logged once at ERROR with its
  cause and remedy, and ``recovered`` once at INFO.
- ``/healthz`` says whether the process is alive: it fails only when a role it leads
  has made no progress for ``--stuck-after`` (a bus down, a record that crashes it
  again and again), so that Kubernetes restarts it. An API server outage does not fail
  it: the electors lose leadership (no role is then led, so none is stuck) and
  restarting the process would not bring the server back.

Why one module of over 500 lines: the roles share one service object (its options,
its bus, its health and its metrics), and the metrics read the roles' state directly;
the Kubernetes I/O itself lives in ``shards/kube/``.
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
from typing import TypeVar

from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from engine.config import SchedulerConfig, default_config
from engine.engine import Engine
from engine.model.pools import MAX_SHARDS, Sharding
from events.errors import InputError, LogError, RecordTooLargeError, cause
from events.fence import FencedError, FencedLog, highest_epoch
from events.log import EventLog, read_past_unreadable
from events.tasks import being_cancelled
from events.types import (
    ClockTicked,
    Envelope,
    Event,
    SchedulerConfigured,
    ShardingConfigured,
    TermBegan,
)
from shards import plugins
from shards.bus import open_bus
from shards.control import ControlWorker
from shards.coordinator.coordinator import Coordinator
from shards.kube.apihealth import ApiHealth
from shards.kube.binder import KubeBinder
from shards.kube.client import RateLimit, api_client
from shards.kube.ingest import KubeIngest
from shards.kube.lease import LeaderElector
from shards.metrics import Metrics
from shards.processes import recorded_sharding, tick_if_due, warm_up_when_idle
from shards.web.app import add_routes
from shards.web.sources import LiveSource
from shards.web.whatif import add_whatif
from shards.worker import ShardWorker

log = logging.getLogger(__name__)
E = TypeVar("E", bound=BaseException)
EXTENDER_METRICS = {
    "calls": "HTTP calls to extenders (filter and prioritize verbs).",
    "failures": "Extender calls that failed (time-out, error, malformed answer).",
    "timeouts": "Extender calls that got no answer within httpTimeout.",
}
"""The extender counts exported per role, as counters (``shoal_extender_calls_total{role=
"shard-0"}``...; before prometheus_client, gauges named without ``_total``)."""
ROLES = ("ingest", "shard", "coordinator", "binder", "all")


@dataclass
class ServeOptions:
    role: str = "all"
    bus: str = "memory"
    kubeconfig: str | None = None
    host: str | None = None
    token: str | None = None
    shard_id: int | None = None
    shards: int = 1
    sharding: Sharding | None = None
    """Pools, tenants and time-outs for ``shards`` shards (``--sharding``); default:
    pools spread over the shards in order of appearance."""
    config: SchedulerConfig | None = None
    snapshot_every: int = 0
    """Records between a shard's snapshots (0: never)."""
    snapshot_per_pod: int = 0
    """And at least this many between them per pod held (0: no such floor)."""
    listen: str = "127.0.0.1:9090"
    ui_token: str | None = None
    """The token the live view (/ui/, /api/: ``shards.web``) asks for (None: none)."""
    namespace: str = "shoal"
    identity: str = field(default_factory=socket.gethostname)
    poll_interval: float = 0.05
    watch_seconds: int = 30
    lease_seconds: int = 15
    renew_deadline: float | None = None
    """A leader that has not renewed within this steps down (default 2/3 of the lease,
    client-go's 10 s of 15)."""
    retry_period: float | None = None
    """Seconds between leader-election rounds (default 2/15 of the lease: 2 s of 15)."""
    stale_after: float = 10.0
    """Seconds without a successful bus operation (or, for the roles that use it, an
    answer from the API server, at least ``lease_seconds``) after which /readyz says
    503."""
    bind_in_flight: int = 16
    """Bindings the binder sends at once, at most."""
    kube_qps: float = 0.0
    """The binder's API requests a second, on average (0: no limit)."""
    kube_burst: int = 100
    """And at once, past that average."""
    stuck_after: float = 120.0
    """``/healthz`` fails once a running role has made no progress for this long (a
    bus down, a record that crashes it again and again), so that Kubernetes restarts
    the process rather than leave it retrying for ever."""

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
        if not 1 <= self.shards <= MAX_SHARDS:
            raise InputError(
                f"expected 1 to {MAX_SHARDS} shards, got {self.shards}", location="--shards"
            )
        if self.role == "coordinator" and self.shards == 1:
            raise InputError(
                "the coordinator routes between several shards: give --shards N (N > 1)",
                location="--role",
            )
        if self.sharding is not None and self.sharding.shards != self.shards:
            raise InputError(
                f"the sharding configuration is for {self.sharding.shards} shards, "
                f"--shards says {self.shards}",
                location="--sharding",
            )
        renew, retry = self.lease_timing()
        if not 0 < retry < renew < self.lease_seconds:
            raise InputError(
                "leader election needs 0 < --retry-period < --renew-deadline < "
                f"--lease-seconds (got {retry:g}, {renew:g}, {self.lease_seconds:g})",
                location="--renew-deadline",
            )
        if self.role == "shard" and self.shard_index() >= self.shards:
            raise InputError(
                f"shard {self.shard_index()} does not exist: there are {self.shards} "
                f"(0..{self.shards - 1}); the StatefulSet's replicas must equal --shards",
                location="--shard-id",
            )

    def lease_timing(self) -> tuple[float, float]:
        """(renew deadline, retry period), the defaults filled in."""
        renew = self.renew_deadline
        retry = self.retry_period
        return (
            renew if renew is not None else self.lease_seconds * 2 / 3,
            retry if retry is not None else self.lease_seconds * 2 / 15,
        )

    def shard_index(self) -> int:
        return self.shard_id if self.shard_id is not None else shard_ordinal(self.identity)

    def layout(self) -> Sharding | None:
        """The sharding: ``--sharding``'s (its pools and tenants hold at one shard too),
        else an even spread over several shards, else None (one shard, no pools)."""
        if self.sharding is not None or self.shards == 1:
            return self.sharding
        return Sharding(shards=self.shards)


def shard_ordinal(hostname: str) -> int:
    """The StatefulSet ordinal at the end of a pod's host name (``shoal-shard-2`` → 2)."""
    match = re.search(r"-(\d+)$", hostname)
    return int(match.group(1)) if match else 0


def _shard_of(role: str) -> int:
    """The shard a role's name names (``shard-2`` → 2)."""
    return int(role.removeprefix("shard-"))


def _recorded_config(config: SchedulerConfig) -> SchedulerConfigured:
    source = config.source
    return SchedulerConfigured(
        config=json.dumps(source, sort_keys=True, default=str) if source else "",
        plugins=plugins.for_config(config).used,
    )


class Service:
    """The running roles of one process, their health and metrics."""

    def __init__(self, options: ServeOptions, clock: Callable[[], int] = time.time_ns) -> None:
        self.options = options
        self.clock = clock
        self.metrics = Metrics()
        self.stop = asyncio.Event()
        self.bus: EventLog | None = None
        self.last_poll = 0.0
        self.alive: dict[str, float] = {}
        """Per running role, when it last made progress (see :meth:`stuck`)."""
        self.sharding = options.layout()
        self.routed = options.shards > 1
        """Several shards: one partition each and the control partition, a coordinator."""
        self.partitions = options.shards + 1 if self.routed else 1
        self.control_partition = self.partitions - 1
        """Where cluster inputs go: the control partition, or the only one."""
        self.ingest: KubeIngest | None = None
        self.workers: dict[int, ShardWorker] = {}
        self.coordinator: ControlWorker | None = None
        self.binders: list[KubeBinder] = []
        self.leaders: dict[str, LeaderElector] = {}
        self.api_health = ApiHealth()
        """What the API server last did for the Lease loops (``ready`` reads it)."""
        self.ends = [0] * self.partitions
        """The end of each partition, as last measured (for consumer lag)."""
        self.url = ""
        self._coordinated = {"prepared": 0, "committed": 0, "aborted": 0, "handbacks": 0}
        self._retired: dict[tuple[str, str], int] = {}
        """(role, extender count) → what the folds of that role replaced so far had."""

    def __repr__(self) -> str:
        return (
            f"Service(role={self.options.role}, bus={self.options.bus!r}, "
            f"shards={self.options.shards})"
        )

    @property
    def worker(self) -> ShardWorker | None:
        """The shard this process runs (the first, with ``--role all``)."""
        return next(iter(self.workers.values()), None)

    @property
    def binder(self) -> KubeBinder | None:
        return self.binders[0] if self.binders else None

    def stuck(self) -> list[str]:
        """The running roles (shards, the coordinator and binder where this process
        leads them) whose last progress (a poll that succeeded) is older than
        ``stuck_after``."""
        now = time.monotonic()
        return sorted(r for r, t in self.alive.items() if now - t > self.options.stuck_after)

    def _progress(self, role: str) -> None:
        self.last_poll = self.alive[role] = time.monotonic()

    def ready(self) -> tuple[bool, str]:
        if self.bus is None:
            return False, "the bus is not open"
        if time.monotonic() - self.last_poll > self.options.stale_after:
            return False, f"the bus has not answered for {self.options.stale_after:g}s"
        if self.leaders:
            within = max(self.options.lease_seconds, self.options.stale_after)
            problem = self.api_health.problem(within=within)
            if problem is not None:
                return False, problem
        leading = self.ingest is not None and self.leaders["ingest"].leader
        if leading and not all(r.synced.is_set() for r in self.ingest.reflectors):  # type: ignore[union-attr]
            return False, "ingest is still listing the cluster"
        return True, "ok"

    def whatif_refusal(self) -> str | None:
        """Why this process does not dry-run jobs (``/api/whatif``): only one that holds
        the whole cluster's view does (``all``; with several shards the coordinator's,
        with one the shard's); None where it does."""
        role = self.options.role
        if role in {"all", "coordinator"} or (role == "shard" and not self.routed):
            return None
        ask = "--role coordinator" if self.routed else "--role shard"
        return (
            f"this process runs --role {role}, which does not hold the whole cluster's "
            f"view: ask the process that runs {ask} (or --role all)"
        )

    # ------------------------------------------------------------------ http

    async def _http(self) -> web.AppRunner:
        async def healthz(_: web.Request) -> web.Response:
            stuck = self.stuck()
            if stuck:
                return web.Response(
                    text=f"stuck: {', '.join(stuck)} made no progress for over "
                    f"{self.options.stuck_after:g}s\n",
                    status=503,
                )
            return web.Response(text="ok\n")

        async def readyz(_: web.Request) -> web.Response:
            ok, why = self.ready()
            return web.Response(text=why + "\n", status=200 if ok else 503)

        async def metrics(request: web.Request) -> web.Response:
            body, content_type = self.metrics.exposition(request.headers.get("Accept", ""))
            return web.Response(body=body, headers={"Content-Type": content_type})

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        live = LiveSource(
            lambda: self.bus, lambda: [w.engine for w in self.workers.values()], self.partitions
        )
        add_routes(app, live, self.options.ui_token)
        add_whatif(app, self, self.options.ui_token)
        runner = web.AppRunner(app)
        await runner.setup()
        host, _, port = self.options.listen.rpartition(":")
        site = web.TCPSite(runner, host, int(port))
        await site.start()
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        self.url = f"http://{bound[0]}:{bound[1]}"
        return runner

    # ------------------------------------------------------------------ roles

    def roles(self) -> tuple[str, ...]:
        if self.options.role != "all":
            return (self.options.role,)
        if not self.routed:
            return ("ingest", "shard", "binder")
        return ("ingest", "shard", "coordinator", "binder")

    async def run(self) -> None:
        options = self.options
        runner = await self._http()
        try:
            self.bus = await open_bus(options.bus, partitions=self.partitions, resume=True)
        except BaseException:
            await runner.cleanup()
            raise
        self.last_poll = time.monotonic()
        try:
            if self.bus.partitions != self.partitions:
                raise InputError(
                    f"the bus has {self.bus.partitions} partitions; {options.shards} "
                    f"shard(s) need {self.partitions}"
                    + (" (one per shard and the control partition)" if self.routed else ""),
                    location="--bus",
                )
            roles = self.roles()
            if self.sharding is not None and ("ingest" in roles or "coordinator" in roles):
                await self._check_sharding(self.sharding)
            async with asyncio.TaskGroup() as tasks:
                api = None
                if {"ingest", "binder", "coordinator"} & set(roles):
                    api = await api_client(
                        host=options.host, kubeconfig=options.kubeconfig, token=options.token
                    )
                if "shard" in roles:
                    shards = (
                        range(options.shards) if options.role == "all" else [options.shard_index()]
                    )
                    for shard in shards:
                        tasks.create_task(self._shard(shard))
                renew, retry = options.lease_timing()
                for role in ("ingest", "coordinator", "binder"):
                    if role in roles and api is not None:
                        self.leaders[role] = LeaderElector(
                            api,
                            namespace=options.namespace,
                            name=f"shoal-{role}",
                            identity=options.identity,
                            lease_seconds=options.lease_seconds,
                            health=self.api_health,
                            renew_deadline=renew,
                            retry_period=retry,
                        )
                        tasks.create_task(self.leaders[role].run(self.stop))
                        tasks.create_task(self._led(role, api))
                tasks.create_task(self._lag())
                await self.stop.wait()
            if api is not None:
                await api.close()
        finally:
            await self.bus.close()
            await runner.cleanup()

    async def _check_sharding(self, sharding: Sharding) -> None:
        """Refuse a log set up for another sharding (its partition layout is fixed)."""
        assert self.bus is not None
        recorded = await recorded_sharding(self.bus)
        if recorded is None:
            head, _, _ = await read_past_unreadable(self.bus, self.control_partition, 0, 16)
            if any(
                not isinstance(e.event, SchedulerConfigured | ClockTicked | TermBegan) for e in head
            ):
                raise InputError(
                    "the log was set up without a sharding configuration (its pools and "
                    "tenants would not hold for what it already holds): start without "
                    "--sharding, or use a new topic",
                    location="--sharding",
                )
            return
        try:
            before = Sharding.from_json(recorded.config)
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(
                f"the log's sharding configuration is unreadable: {exc}", location="--bus"
            ) from None
        if before.protocol != sharding.protocol:
            raise InputError(
                f"the log was recorded under coordinator protocol {before.protocol} by an "
                f"earlier version (this one runs {sharding.protocol}): replay it with "
                "shoal replay, and serve on a new topic",
                location="--bus",
            )
        if before != sharding:
            raise InputError(
                f"the log was set up for another sharding ({before.shards} shards, "
                f"pools {dict(before.pools) or 'spread'}): start with the same --shards and "
                "--sharding, or use a new topic",
                location="--sharding",
            )

    async def _record_configuration(self, bus: EventLog) -> None:
        """Before ingest's first event: the sharding, once, and with several shards the
        scheduler configuration, which the coordinator forwards to every shard (a shard
        given the configuration it already has changes nothing; one shard records its
        own)."""
        assert self.sharding is not None
        head: list[Event] = []
        if await recorded_sharding(bus) is None:
            head.append(ShardingConfigured(config=self.sharding.to_json()))
        if self.routed:
            head.append(_recorded_config(self.options.config or default_config()))
        if not head:
            return
        now = self.clock()
        await bus.append(
            [Envelope(event=e, time=now, producer="ingest") for e in head], self.control_partition
        )

    def _written_by(self, role: str) -> list[int]:
        """The partitions ``role`` appends to (where its term begins)."""
        if role == "ingest":
            return [self.control_partition]
        if role == "binder":
            return list(range(max(self.partitions - 1, 1)))
        return list(range(self.partitions))  # the coordinator routes into every shard's

    async def _term(self, role: str) -> FencedLog | None:
        """Begin this process's term as leader of ``role``: its epoch at least one
        above any the log holds for the role's Lease, a ``TermBegan`` in each partition
        the role writes; the bus the role then writes through (every append stamped
        with the term). None when the term could not begin (the lease was lost, or
        another term already began: it stepped down)."""
        elector = self.leaders[role]
        assert self.bus is not None
        fence = elector.name
        elector.floor = await highest_epoch(self.bus, fence) + 1
        if not await elector.advance_epoch():
            return None
        term = FencedLog(self.bus, fence=fence, epoch=elector.epoch, valid=elector.leading)
        await term.begin(self._written_by(role), holder=self.options.identity, now=self.clock())
        log.info("leading role=%s lease=%s epoch=%d", role, fence, elector.epoch)
        return term

    async def _led(self, role: str, api: ApiClient) -> None:
        """Run ``role`` while this process leads it; stand by otherwise. The role
        writes through its term's :class:`FencedLog`: once the log has seen a later
        term, or this one's renew deadline has passed, its appends are refused
        (``FencedError``) and it stops at once; so does it when the lease is lost."""
        elector = self.leaders[role]
        while not self.stop.is_set():
            if not elector.leading():
                self.alive.pop(role, None)  # standing by is not being stuck
                await self._sleep(self.options.poll_interval * 4)
                continue
            if role != "ingest":  # its watches retry on their own
                self.alive.setdefault(role, time.monotonic())
            lost = asyncio.Event()
            try:
                term = await self._term(role)
            except FencedError as exc:
                self._deposed(role, exc)
                continue
            except LogError as exc:
                await self._bus_failed(role, exc, 1.0)
                continue
            if term is None:
                continue
            if role == "ingest":
                work = asyncio.create_task(self._ingest(api, lost, term))
            elif role == "coordinator":
                work = asyncio.create_task(self._coordinate(lost, term))
            else:
                self.binders = [
                    KubeBinder(
                        api,
                        term,
                        partition=p,
                        clock=self.clock,
                        in_flight=self.options.bind_in_flight,
                        rate=RateLimit(self.options.kube_qps, self.options.kube_burst),
                        control=self.control_partition if self.routed and p == 0 else None,
                    )
                    for p in self._written_by("binder")
                ]
                for binder in self.binders:
                    self._lag_gauge(f"binder-{binder.partition}", binder.partition)
                work = asyncio.create_task(self._bind(lost))
            while elector.leading() and not self.stop.is_set() and not work.done():
                await self._sleep(self.options.poll_interval * 4)
            lost.set()
            if not self.stop.is_set() and not work.done():
                # the lease is lost: stop leading at once, in-flight work included
                log.warning("lost the lease; stopping role=%s epoch=%d", role, term.epoch)
                work.cancel()
            try:
                await asyncio.wait_for(work, 10)
            except asyncio.CancelledError:
                if being_cancelled():
                    raise  # this process is stopping
                if elector.leading():
                    log.warning("role cancelled under it; restarting it role=%s", role)
                await self._sleep(1.0)
            except Exception as exc:
                deposed = _fenced(exc)
                if deposed is not None:
                    self._deposed(role, deposed)
                    continue
                refused = _found(exc, RecordTooLargeError)
                if refused is not None:
                    # the bus refuses the record for good: running the role again
                    # would send it again, for ever; stop, saying what to raise
                    log.error("role stopped role=%s error=%s", role, refused)
                    raise refused from None
                log.warning("role failed; restarting it role=%s error=%s", role, cause(exc))
                self.metrics.inc(
                    "bus_errors_total", "Bus operations that failed.", 1, {"role": role}
                )
                await self._sleep(1.0)

    def _deposed(self, role: str, exc: FencedError) -> None:
        """The log refused this term's append: another leader's term began. Stop
        leading the role (the elector stands by until the lease is free again)."""
        log.warning("deposed; stopped leading role=%s error=%s", role, exc)
        self.metrics.inc("leader_deposed_total", "Terms the log fenced off.", 1, {"role": role})
        self.leaders[role].step_down(f"deposed: {exc}")

    def _served(self) -> list[str]:
        config = self.options.config or default_config()
        return [p.scheduler_name for p in config.profiles]

    async def _ingest(self, api: ApiClient, lost: asyncio.Event, bus: EventLog) -> None:
        if self.sharding is not None:
            await self._record_configuration(bus)
        self.ingest = KubeIngest(
            api,
            bus,
            partition=self.control_partition,
            scheduler_names=self._served(),
            watch_seconds=self.options.watch_seconds,
            clock=self.clock,
        )
        await self.ingest.run(lost)

    async def _bind(self, lost: asyncio.Event) -> None:
        backoff = self.options.poll_interval
        while not lost.is_set():
            idle = True
            for binder in self.binders:
                before = dict(binder.counters)
                try:
                    applied = await binder.poll()
                except LogError as exc:
                    backoff = await self._bus_failed("binder", exc, backoff)
                    idle = False
                    break
                backoff = self.options.poll_interval
                self._progress("binder")
                for key, value in binder.counters.items():
                    if value > before[key]:
                        self.metrics.inc(
                            "binder_actions_total",
                            "Binder actions by kind.",
                            value - before[key],
                            {"kind": key},
                        )
                if applied or binder.position < self.ends[binder.partition]:
                    idle = False
            if idle:
                await self._sleep(self.options.poll_interval)

    async def _coordinate(self, lost: asyncio.Event, bus: EventLog) -> None:
        """The router and coordinator while this process leads: a fold of the control
        partition. After a bus failure it is rebuilt from the log (the fold's state may
        be ahead of what was appended), as a restarted coordinator would be."""
        assert self.sharding is not None and self.routed
        backoff = self.options.poll_interval
        recorded = None
        while recorded is None and not lost.is_set():
            try:
                recorded = await recorded_sharding(bus)
            except LogError as exc:
                backoff = await self._bus_failed("coordinator", exc, backoff)
                continue
            if recorded is None:
                await self._sleep(self.options.poll_interval * 4)  # ingest writes it first
        if recorded is None:
            return
        sharding = Sharding.from_json(recorded.config)  # checked at start: ours
        worker = self._new_coordinator(sharding, bus)
        self._lag_gauge("coordinator", self.control_partition)
        for what, help_ in EXTENDER_METRICS.items():
            self.metrics.counted(
                f"extender_{what}",
                help_,
                self._extender_count("coordinator", what),
                {"role": "coordinator"},
            )
        self.metrics.gauge(
            "records_quarantined",
            "Records the current fold skipped because they could not be decoded or folded "
            "(RecordQuarantined; a rebuilt fold counts again).",
            lambda: float(len(self.coordinator.quarantined) if self.coordinator else 0),
            {"role": "coordinator"},
        )
        self.metrics.gauge(
            "coordinator_inflight",
            "Units the coordinator handed to shards and has not heard back about.",
            lambda: float(len(self.coordinator.control.flights) if self.coordinator else 0),
        )
        while not lost.is_set():
            try:
                moved = await worker.poll()
            except LogError as exc:
                backoff = await self._bus_failed("coordinator", exc, backoff)
                worker = self._new_coordinator(sharding, bus)
                continue
            backoff = self.options.poll_interval
            self._progress("coordinator")
            self._coordinator_metrics(worker)
            wake = worker.control.next_wakeup()
            with contextlib.suppress(LogError):  # a tick that failed is retried next round
                if await tick_if_due(bus, self.control_partition, wake, self.clock(), "clock"):
                    continue
            if not moved and not warm_up_when_idle():
                await self._sleep(self.options.poll_interval)

    def _control_worker(self, sharding: Sharding, bus: EventLog) -> ControlWorker:
        every, per_pod = self.options.snapshot_every, self.options.snapshot_per_pod
        worker = ControlWorker(
            Coordinator(sharding, self.options.config),
            bus,
            snapshot_every=every,
            snapshot_per_pod=per_pod,
            config=self.options.config,
        )
        worker.asker.background = True  # a slow extender delays only the pods it judges
        return worker

    def _coordinator_metrics(self, worker: ControlWorker) -> None:
        """Counters from the fold's totals: a rebuilt fold counts from zero again, so
        only what goes beyond the highest total seen is new."""
        counters = worker.control.counters
        for key, seen in self._coordinated.items():
            value = counters.get(key, 0)
            if value > seen:
                self._coordinated[key] = value
                if key == "handbacks":
                    self.metrics.inc(
                        "coordinator_handbacks_total",
                        "Pods and gangs shards handed back to the router.",
                        value - seen,
                    )
                else:
                    self.metrics.inc(
                        "coordinator_gangs_total",
                        "Cross-shard gangs by step: prepared, committed, aborted.",
                        value - seen,
                        {"step": key},
                    )
        for seconds in worker.commit_seconds:
            self.metrics.observe(
                "coordinator_commit_seconds",
                "Seconds from appending a cross-shard gang's prepare to its commit.",
                seconds,
            )
        worker.commit_seconds.clear()

    def _new_coordinator(self, sharding: Sharding, bus: EventLog) -> ControlWorker:
        """A fresh fold of the control partition, in place of the last one."""
        self._retire("coordinator", self.coordinator)
        self.coordinator = self._control_worker(sharding, bus)
        return self.coordinator

    def _retire(self, role: str, fold: ShardWorker | ControlWorker | None) -> None:
        """Keep the extender counts of a fold being replaced, for the counters."""
        if fold is not None:
            for what in EXTENDER_METRICS:
                key = (role, what)
                self._retired[key] = self._retired.get(key, 0) + getattr(fold.asker.stats, what)

    def _extender_count(self, role: str, what: str) -> Callable[[], float]:
        """Extender calls (failures, time-outs) of ``role``'s folds so far: those
        replaced since (a bus failure, a new leadership) and the current one."""

        def read() -> float:
            fold = self.coordinator if role == "coordinator" else self.workers.get(_shard_of(role))
            now = getattr(fold.asker.stats, what) if fold is not None else 0
            return float(self._retired.get((role, what), 0) + now)

        return read

    async def _shard(self, shard: int) -> None:
        options = self.options
        config = options.config or default_config()
        assert self.bus is not None
        bus = self.bus
        partition = shard if self.routed else 0
        labels = {"shard": str(shard)}
        self.metrics.gauge(
            "queue_pods", "Pods in the scheduling queue.", self._queue(shard, "all"), labels
        )
        for where in ("active", "backoff", "unschedulable"):
            self.metrics.gauge(
                "queue_depth",
                "Pods in the scheduling queue by sub-queue.",
                self._queue(shard, where),
                {**labels, "queue": where},
            )
        self._lag_gauge(f"shard-{shard}", partition)
        self.metrics.gauge(
            "records_quarantined",
            "Records the current fold skipped because they could not be decoded or folded "
            "(RecordQuarantined; a rebuilt fold counts again).",
            lambda: float(len(self.workers[shard].quarantined)) if shard in self.workers else 0.0,
            {"role": f"shard-{shard}"},
        )
        for what, help_ in EXTENDER_METRICS.items():
            self.metrics.counted(
                f"extender_{what}",
                help_,
                self._extender_count(f"shard-{shard}", what),
                {"role": f"shard-{shard}"},
            )
        backoff = options.poll_interval
        worker: ShardWorker | None = None
        self.alive[f"shard-{shard}"] = time.monotonic()
        while not self.stop.is_set():
            if worker is None:
                # a fresh start and a failed bus alike: rebuild the engine from the log
                # (a pure fold; decisions may have been applied but not recorded)
                try:
                    worker = await ShardWorker.recover(
                        bus,
                        config,
                        shard=shard,
                        partition=partition,
                        snapshot_every=options.snapshot_every,
                        snapshot_per_pod=options.snapshot_per_pod,
                    )
                    worker.asker.background = True  # a slow extender delays its pods only
                    if not self.routed and shard not in self.workers:
                        # one shard: it records its own configuration (several: ingest)
                        await bus.append(
                            [
                                Envelope(
                                    event=_recorded_config(config),
                                    time=self.clock(),
                                    producer=f"shard-{shard}",
                                )
                            ]
                        )
                except LogError as exc:
                    backoff = await self._bus_failed("shard", exc, backoff)
                    continue
                self._retire(f"shard-{shard}", self.workers.get(shard))
                self.workers[shard] = worker
            engine = worker.engine
            before = engine.stats()
            started = time.perf_counter()
            try:
                decided = await worker.poll()
            except LogError as exc:
                backoff = await self._bus_failed("shard", exc, backoff)
                worker = None
                continue
            backoff = options.poll_interval
            self._progress(f"shard-{shard}")
            self._shard_metrics(engine, before, time.perf_counter() - started, labels)
            try:
                ticked = await tick_if_due(
                    bus, partition, engine.next_wakeup(), self.clock(), f"clock-{shard}"
                )
            except LogError as exc:
                backoff = await self._bus_failed("shard", exc, backoff)
                worker = None
                continue
            if ticked:
                continue
            if decided == 0 and not warm_up_when_idle():
                await self._sleep(options.poll_interval)

    def _shard_metrics(
        self, engine: Engine, before: dict[str, int], seconds: float, labels: dict[str, str]
    ) -> None:
        after = engine.stats()
        attempts = after["attempts"] - before["attempts"]
        if not attempts:
            return
        self.metrics.observe(
            "scheduling_attempt_seconds",
            "Mean time of a scheduling attempt, per pass.",
            seconds / attempts,
            labels,
        )
        for result in ("bound", "unschedulable", "preempted"):
            if after[result] > before[result]:
                self.metrics.inc(
                    "schedule_attempts_total",
                    "Scheduling attempts by result.",
                    after[result] - before[result],
                    {**labels, "result": result},
                )

    def _queue(self, shard: int, where: str) -> Callable[[], float]:
        """Pods in a shard's queue: all, or one sub-queue."""

        def read() -> float:
            worker = self.workers.get(shard)
            if worker is None:
                return 0
            queue = worker.engine.queue
            return len(queue) if where == "all" else queue.stats()[where]

        return read

    def _consumers(self) -> list[tuple[str, int, int]]:
        """(consumer, partition, position) of everything this process reads."""
        out = [(f"shard-{s}", w.partition, w.position) for s, w in self.workers.items()]
        if self.coordinator is not None:
            out.append(("coordinator", self.control_partition, self.coordinator.position))
        out.extend((f"binder-{b.partition}", b.partition, b.position) for b in self.binders)
        return out

    async def _lag(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                assert self.bus is not None
                for partition in range(self.partitions):
                    self.ends[partition] = await self.bus.end_offset(partition)
            await self._sleep(1.0)

    def _lag_gauge(self, consumer: str, partition: int) -> None:
        self.metrics.gauge(
            "consumer_lag_records",
            "Records in the log not yet read, by consumer (the end measured each second).",
            self._lag_of(consumer),
            {"consumer": consumer, "partition": str(partition)},
        )

    def _lag_of(self, consumer: str) -> Callable[[], float]:
        def read() -> float:
            for name, partition, position in self._consumers():
                if name == consumer:
                    return max(self.ends[partition] - position, 0)
            return 0

        return read

    async def _bus_failed(self, role: str, exc: Exception, backoff: float) -> float:
        """Count and log a bus failure, wait, and return the next back-off."""
        log.warning("bus failed; retrying role=%s in=%.2fs error=%s", role, backoff, cause(exc))
        self.metrics.inc("bus_errors_total", "Bus operations that failed.", 1, {"role": role})
        await self._sleep(backoff)
        return min(backoff * 2, 5.0)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)


def _fenced(exc: BaseException) -> FencedError | None:
    """The ``FencedError`` in ``exc`` (a role's task group wraps it), if any."""
    return _found(exc, FencedError)


def _found(exc: BaseException, kind: type[E]) -> E | None:
    """The ``kind`` error in ``exc``, itself or inside a task group's, if any."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _found(inner, kind)
            if found is not None:
                return found
    return None


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
        "serving role=%s shards=%d bus=%s listen=%s pid=%d",
        options.role,
        options.shards,
        options.bus,
        service.url,
        os.getpid(),
    )
    await task
    return 0
